#include "tandem/default_model.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "common/error.h"

namespace tandem {
namespace {

struct PairFiles {
  const char* name;
  const char* edge_file;
  const char* edge_desc;
  const char* cloud_file;
  const char* cloud_desc;
  const char* router_file;  // under routers/ in the source tree; nullptr: none ships
};

// The table of known pairs: the first is the default.
constexpr PairFiles kPairs[] = {
    {"qwen", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
     "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
     "qwen2.5-coder-0.5b-csqa-choice-fixes.gguf"},
    {"gemma", "gemma-3-270m-q2_k.gguf", "Gemma 3 270M Q2_K", "gemma-3-270m-q4_k_m.gguf",
     "Gemma 3 270M Q4_K_M", "gemma-3-270m-q2_k-lambada-fixes.gguf"},
};

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : "";
}

std::string cache_dir() {
  if (auto c = env_or_empty("TANDEM_CACHE"); !c.empty()) return c;
  if (auto home = env_or_empty("HOME"); !home.empty()) return home + "/.cache/tandem";
  return ".cache/tandem";
}

const PairFiles* lookup_pair(std::string_view name) {
  for (const auto& p : kPairs) {
    if (name == p.name) return &p;
  }
  return nullptr;
}

// "qwen, gemma", leaving out `except`.
std::string pair_list(std::string_view except = "") {
  std::string list;
  for (const auto& p : kPairs) {
    if (p.name != except) list += std::string(list.empty() ? "" : ", ") + p.name;
  }
  return list;
}

std::string unknown_pair(std::string_view name) {
  return "unknown model pair '" + std::string(name) + "': expected one of " + pair_list();
}

const PairFiles& find_pair(std::string_view name) {
  if (const PairFiles* p = lookup_pair(name)) return *p;
  throw Error(unknown_pair(name));
}

}  // namespace

std::vector<std::string> model_pair_names() {
  std::vector<std::string> names;
  for (const auto& p : kPairs) names.emplace_back(p.name);
  return names;
}

std::string default_pair_name() {
  if (auto env = env_or_empty("TANDEM_PAIR"); !env.empty()) return env;
  return kPairs[0].name;
}

std::string pair_model_path(std::string_view pair, ModelRole role) {
  const PairFiles& p = find_pair(pair);
  return cache_dir() + "/models/" + (role == ModelRole::Edge ? p.edge_file : p.cloud_file);
}

std::string default_model_path(ModelRole role) {
  if (auto env = env_or_empty("TANDEM_MODEL"); !env.empty()) return env;
  return pair_model_path(default_pair_name(), role);
}

std::string describe_default_model(ModelRole role) {
  if (auto env = env_or_empty("TANDEM_MODEL"); !env.empty()) return env + " ($TANDEM_MODEL)";
  const std::string pair = default_pair_name();
  // --help is built before any command runs: an unknown $TANDEM_PAIR is said here, and refused
  // (as an error) only by a command that needs the default model.
  const PairFiles* p = lookup_pair(pair);
  if (!p) return "none: $TANDEM_PAIR: " + unknown_pair(pair);
  const bool edge = role == ModelRole::Edge;
  return std::string(edge ? p->edge_desc : p->cloud_desc) + ", the " + (edge ? "device" : "cloud") +
         " model of the default pair (" + pair + "; --pair " + pair_list(pair) +
         " for another): " + pair_model_path(pair, role);
}

std::string pair_router_path(std::string_view pair) {
  const PairFiles& p = find_pair(pair);
  if (!p.router_file) return "";
  return (std::filesystem::path(TANDEM_SOURCE_DIR) / "routers" / p.router_file).string();
}

std::string shipped_router_for(const std::string& edge_model_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& p : kPairs) {
    if (!p.router_file) continue;
    if (!fs::equivalent(edge_model_path, pair_model_path(p.name, ModelRole::Edge), ec)) continue;
    std::string router = pair_router_path(p.name);
    return fs::exists(router, ec) ? router : "";
  }
  return "";
}

std::string test_model_path() {
  if (auto env = env_or_empty("TANDEM_MODEL"); !env.empty()) return env;
  return pair_model_path("gemma", ModelRole::Cloud);
}

}  // namespace tandem
