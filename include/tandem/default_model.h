// The model pairs tandem knows by name, and where the tools and tests find their files.
//
//   pair    device (edge) model                        cloud model
//   qwen    Qwen2.5-Coder-0.5B-Instruct Q4_K_M         Qwen2.5-Coder-1.5B-Instruct Q4_K_M (default)
//   gemma   Gemma 3 270M Q2_K (scripts/make_pair.sh)   Gemma 3 270M Q4_K_M                  (tests)
//
// Each pair may ship a trained router for its device model under routers/.
//
// Files live in ${TANDEM_CACHE:-$HOME/.cache/tandem}/models/, where scripts/fetch_model.sh and
// scripts/make_pair.sh put them. Public (owned by src/common), so that the CLI's -m defaults
// need no internal header.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem {

enum class ModelRole { Edge, Cloud };

// "qwen", "gemma".
std::vector<std::string> model_pair_names();

// $TANDEM_PAIR when set, else "qwen".
std::string default_pair_name();

// The cache path of a pair's model for a role. Throws tandem::Error naming the known pairs
// when `pair` is none of them.
std::string pair_model_path(std::string_view pair, ModelRole role);

// What a command's -m defaults to: $TANDEM_MODEL when set, else the default pair's model for
// the role (the device's model for every command but serve).
std::string default_model_path(ModelRole role = ModelRole::Edge);

// One line for --help: "Qwen2.5-Coder-0.5B-Instruct Q4_K_M, the device model of the default
// pair (qwen)".
std::string describe_default_model(ModelRole role);

// The router trained for a pair's device model that ships in routers/ of the source tree
// (docs/router.md, "Routers that ship"); "" when the pair ships none. Throws for an unknown pair.
std::string pair_router_path(std::string_view pair);
// The shipped router of the pair whose device model file `edge_model_path` is (the same file),
// when that file exists; "" otherwise. What run, ui and eval route with when neither --policy
// nor --router is given.
std::string shipped_router_for(const std::string& edge_model_path);

// The real model the test suite reads: $TANDEM_MODEL when set, else the gemma pair's cloud
// model (Gemma 3 270M Q4_K_M, small and fast).
std::string test_model_path();

}  // namespace tandem
