#include "cli/model_flag.h"

namespace tandem::cli {

void ModelFlag::add_to(CLI::App& sub, ModelRole role, const std::string& what) {
  auto* m =
      sub.add_option("-m,--model", path, what + " (default: " + describe_default_model(role) + ")");
  std::string names;
  for (const auto& n : model_pair_names()) names += (names.empty() ? "" : " | ") + n;
  sub.add_option("--pair", pair,
                 "Use this known pair's " +
                     std::string(role == ModelRole::Edge ? "device" : "cloud") +
                     " model: " + names + " (scripts/make_pair.sh NAME fetches it)")
      ->excludes(m);
}

std::string ModelFlag::resolve(ModelRole role) const {
  if (!path.empty()) return path;
  if (!pair.empty()) return pair_model_path(pair, role);
  return default_model_path(role);
}

}  // namespace tandem::cli
