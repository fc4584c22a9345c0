// Error type used across tandem. Messages name what was wrong: the file or input, the place
// (byte offset, field, key) and what was expected versus found.
#pragma once

#include <stdexcept>
#include <string>

namespace tandem {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace tandem
