// Ids handed to clients (server/random_id.h): 128 bits from the kernel's CSPRNG.
#include "server/random_id.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "common/error.h"

namespace tandem::server {
namespace {

constexpr size_t kIdBytes = 16;  // 128 bits per id

// Fills `out` from the kernel's CSPRNG: getrandom(2), or /dev/urandom where that call is missing.
void os_random(uint8_t* out, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = getrandom(out + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r < 0 && errno == EINTR) {
      continue;
    } else if (r < 0 && errno == ENOSYS) {
      break;
    } else {
      throw Error(std::string("getrandom failed: ") + std::strerror(errno));
    }
  }
  if (got == n) return;
  const int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(std::string("cannot open /dev/urandom: ") + std::strerror(errno));
  while (got < n) {
    const ssize_t r = read(fd, out + got, n - got);
    if (r <= 0 && !(r < 0 && errno == EINTR)) {
      close(fd);
      throw Error("cannot read /dev/urandom");
    }
    if (r > 0) got += static_cast<size_t>(r);
  }
  close(fd);
}

}  // namespace

std::string random_id_hex() {
  uint8_t bytes[kIdBytes];
  os_random(bytes, kIdBytes);
  static const char digits[] = "0123456789abcdef";
  std::string out(2 * kIdBytes, '0');
  for (size_t i = 0; i < kIdBytes; ++i) {
    out[2 * i] = digits[bytes[i] >> 4];
    out[2 * i + 1] = digits[bytes[i] & 15];
  }
  return out;
}

}  // namespace tandem::server
