// The one error type of tandem's public API: every parser and every public function reports bad
// input as a tandem::Error whose message names what was wrong: the file or input, the place
// (byte offset, field, key) and what was expected against what was found.
#pragma once

#include <stdexcept>
#include <string>

namespace tandem {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace tandem
