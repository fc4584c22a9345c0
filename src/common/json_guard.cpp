#include "tandem/json_guard.h"

namespace tandem {

JsonShape scan_json_shape(std::string_view text, int max_depth) {
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
  if (!scan_json_shape(text, max_depth).too_deep) return {};
  std::string msg(what);
  if (!msg.empty()) msg += ": ";
  msg += "the JSON nests deeper than " + std::to_string(max_depth) + " levels";
  return msg;
}

}  // namespace tandem
