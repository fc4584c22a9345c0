// A check that runs over client-supplied JSON text before any parser or tree walk sees it.
//
// The JSON library's parser keeps its own stack, but copying, dumping and comparing a value recurse
// once per nesting level, and so does any reader that walks a document: a 200 KB body of nested
// arrays is enough to overflow a thread's stack. Every document that comes from outside (request
// bodies on the server and the browser view, cloud answers on the device) passes this check
// first; it is one linear pass over the bytes with no recursion and no allocation. Public (owned
// by src/common), so that the browser view, which includes only include/tandem/, checks its
// request bodies with the server's check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem {

// The nesting allowed in a client document: every tandem request or answer needs at most 5.
inline constexpr int kMaxJsonDepth = 64;

// The most heap a parsed tree (the JSON library's) takes per value that scan_json_shape counts,
// measured with g++ 12 / libstdc++ on 64-bit, vector growth included: 17 bytes for a number in
// an array, 49 for an empty array, 81 for an empty object in an array, 80 for an object's
// member (key and value). Strings longer than 15 bytes add their own bytes. So the tree built
// from a text whose `values` are at most V takes at most kJsonBytesPerValue x V + the text's
// size.
inline constexpr size_t kJsonBytesPerValue = 128;

struct JsonShape {
  int depth = 0;          // deepest nesting of arrays and objects seen (1 for `[]`)
  size_t containers = 0;  // arrays and objects opened
  // At least the number of values (and object keys) a parser builds from the text:
  // 1 + containers + commas outside strings (every value but the first of its container
  // follows a comma, and each container has one first value).
  size_t values = 1;
  bool too_deep = false;  // stopped early: depth went over the limit
  bool too_many = false;  // stopped early: values went over the limit
};

// Scans `text` as JSON tokens (strings are skipped, with their escapes), measures how deep
// arrays and objects nest and bounds how many values they hold, stopping at the first level
// over `max_depth` or the first value over `max_values`. It does not validate the document;
// the parser that runs afterwards does. One linear pass, no recursion, no allocation.
JsonShape scan_json_shape(std::string_view text, int max_depth = kMaxJsonDepth,
                          size_t max_values = SIZE_MAX);

// Empty when `text` nests at most `max_depth` deep; otherwise a message that names the limit,
// e.g. "the JSON nests deeper than 64 levels", prefixed by `what` when given.
std::string json_depth_error(std::string_view text, int max_depth = kMaxJsonDepth,
                             std::string_view what = {});

// Empty when `text` nests at most `max_depth` deep and holds at most `max_values` values; else
// a message that names the limit that was passed, e.g. "the JSON holds more than 4096 values",
// prefixed by `what` when given. With max_values = budget / kJsonBytesPerValue, the tree the
// parser then builds stays within about `budget` bytes, whatever the text.
std::string json_shape_error(std::string_view text, int max_depth, size_t max_values,
                             std::string_view what = {});

}  // namespace tandem
