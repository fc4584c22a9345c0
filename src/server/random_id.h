// Ids the server hands to clients: session ids and completion ids. Each is 128 bits from the
// kernel's CSPRNG (getrandom, else /dev/urandom) written as 32 lowercase hex digits; nothing in
// one depends on any other id, an address or the time, so holding ids of one's own tells
// nothing about anyone else's or about the server's memory.
#pragma once

#include <string>

namespace tandem::server {

// Throws tandem::Error when the kernel gives no random bytes.
std::string random_id_hex();

}  // namespace tandem::server
