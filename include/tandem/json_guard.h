// A check that runs over client-supplied JSON text before any parser or tree walk sees it.
//
// nlohmann's parser keeps its own stack, but copying, dumping and comparing a json value recurse
// once per nesting level, and so does any reader that walks a document: a 200 KB body of nested
// arrays is enough to overflow a thread's stack. Every document that comes from outside (request
// bodies on the server and the browser view, cloud answers on the device) passes this check
// first; it is one linear pass over the bytes with no recursion and no allocation. Public (owned
// by src/common), so that the browser view, which includes only include/tandem/, checks its
// request bodies with the server's check.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace tandem {

// The nesting allowed in a client document: every tandem request or answer needs at most 5.
inline constexpr int kMaxJsonDepth = 64;

struct JsonShape {
  int depth = 0;          // deepest nesting of arrays and objects seen (1 for `[]`)
  size_t containers = 0;  // arrays and objects opened
  bool too_deep = false;  // stopped early: depth went over the limit
};

// Scans `text` as JSON tokens (strings are skipped, with their escapes) and measures how deep
// arrays and objects nest, stopping at the first level over `max_depth`. It does not validate
// the document; the parser that runs afterwards does.
JsonShape scan_json_shape(std::string_view text, int max_depth = kMaxJsonDepth);

// Empty when `text` nests at most `max_depth` deep; otherwise a message that names the limit,
// e.g. "the JSON nests deeper than 64 levels", prefixed by `what` when given.
std::string json_depth_error(std::string_view text, int max_depth = kMaxJsonDepth,
                             std::string_view what = {});

}  // namespace tandem
