// A sequential, bounds-checked reader over bytes from outside (a GGUF file image, a router
// trace): every read checks what is left first, and every error names the input, the byte
// offset and the field it was reading. The one reader both file formats use.
//
//   ByteReader in(data, size, "model.gguf");
//   uint32_t magic = in.read<uint32_t>("magic");          // little-endian host assumed
//   std::string_view name = in.read_string("name", 1024);  // u64 length, then the bytes
//   const uint8_t* rows = in.skip(n_bytes, "tensor data");
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include "common/error.h"

namespace tandem {

// The input ended inside a field (a caller may treat a truncated tail differently from damage).
class TruncatedInput : public Error {
 public:
  using Error::Error;
};

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size, std::string name)
      : data_(data), size_(size), name_(std::move(name)) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }
  const std::string& name() const { return name_; }
  const uint8_t* at(size_t offset) const { return data_ + offset; }

  // Throws tandem::Error "NAME: byte offset AT: WHAT".
  [[noreturn]] void fail(size_t at, const std::string& what) const {
    throw Error(name_ + ": byte offset " + std::to_string(at) + ": " + what);
  }

  // Throws TruncatedInput unless `n` more bytes are there.
  void need(uint64_t n, const char* what) const {
    if (n <= remaining()) return;
    std::string msg = name_;
    msg.append(": byte offset ").append(std::to_string(pos_)).append(": truncated: expected ");
    msg.append(std::to_string(n)).append(" bytes for ").append(what).append(", found only ");
    msg.append(std::to_string(remaining())).append(" before the end of the file");
    throw TruncatedInput(msg);
  }

  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  // A u64 length, then that many bytes (GGUF's string); lengths over `max_len` fail first.
  std::string_view read_string(const char* what, uint64_t max_len = UINT64_MAX) {
    const size_t at = pos_;
    const uint64_t len = read<uint64_t>(what);
    if (len > max_len) {
      fail(at, std::string(what) + ": length " + std::to_string(len) + " exceeds limit " +
                   std::to_string(max_len));
    }
    need(len, what);
    std::string_view s(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return s;
  }

  // The next `n` bytes, in place; the reader moves past them.
  const uint8_t* skip(uint64_t n, const char* what) {
    need(n, what);
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  std::string name_;
  size_t pos_ = 0;
};

}  // namespace tandem
