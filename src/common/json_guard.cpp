#include "tandem/json_guard.h"

namespace tandem {

JsonShape scan_json_shape(std::string_view text, int max_depth, size_t max_values) {
  JsonShape shape;
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        ++shape.containers;
        if (++depth > shape.depth) shape.depth = depth;
        if (depth > max_depth) {
          shape.too_deep = true;
          return shape;
        }
        [[fallthrough]];
      case ',':
        if (++shape.values > max_values) {
          shape.too_many = true;
          return shape;
        }
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      default:
        break;
    }
  }
  return shape;
}

std::string json_depth_error(std::string_view text, int max_depth, std::string_view what) {
  return json_shape_error(text, max_depth, SIZE_MAX, what);
}

std::string json_shape_error(std::string_view text, int max_depth, size_t max_values,
                             std::string_view what) {
  const JsonShape shape = scan_json_shape(text, max_depth, max_values);
  if (!shape.too_deep && !shape.too_many) return {};
  std::string msg(what);
  if (!msg.empty()) msg += ": ";
  msg += shape.too_deep ? "the JSON nests deeper than " + std::to_string(max_depth) + " levels"
                        : "the JSON holds more than " + std::to_string(max_values) + " values";
  return msg;
}

}  // namespace tandem
