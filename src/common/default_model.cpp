#include "tandem/default_model.h"

#include <cstdlib>

namespace tandem {

std::string default_model_path() {
  if (const char* env = std::getenv("TANDEM_MODEL"); env && *env) return env;
  std::string cache;
  if (const char* c = std::getenv("TANDEM_CACHE"); c && *c) {
    cache = c;
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    cache = std::string(home) + "/.cache/tandem";
  } else {
    cache = ".cache/tandem";
  }
  return cache + "/models/gemma-3-270m-q4_k_m.gguf";
}

}  // namespace tandem
