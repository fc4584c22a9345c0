// Trained routers as GGUF files: `tandem router train` writes them, `tandem run --router` and
// `tandem eval --router` read them. Layout (docs/router.md):
//
//   general.architecture        "tandem-router"
//   tandem_router.version       u32, 1
//   tandem_router.features      string, RouterFeatureSpec::describe()
//   tandem_router.n_embd, .top_k, .n_layers          u32
//   tandem_router.edge.vocab_hash   16 hex digits (Tokenizer::fingerprint), .edge.n_vocab u32,
//   tandem_router.edge.name         the edge model's general.name
//   tandem_router.cloud.name        the cloud model the traces were collected against (optional)
//   tandem_router.label, .training  string (label spec; JSON summary of data and metrics)
//   tandem_router.calibration.threshold / .share   f32 arrays (ascending / descending)
//   tandem_router.weights_hash  u64, FNV-1a over every tensor's bytes in file order
//   tensors (F32): feature.mean [F], feature.scale [F], layer.N.weight [n_in, n_out] (ggml
//                  order: n_in contiguous), layer.N.bias [n_out]
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "tandem/router_mlp.h"

namespace tandem::router {

struct RouterFileInfo {
  std::string vocab_hash;  // 16 lowercase hex digits
  uint32_t n_vocab = 0;
  std::string edge_name;
  std::string cloud_name;  // "" when not recorded
  std::string label;
  std::string training_json;  // a summary of the training data, labels and metrics
};

void save_router(const std::string& path, const MlpRouterModel& model, const RouterFileInfo& info);

struct LoadedRouter {
  std::shared_ptr<const MlpRouterModel> model;
  RouterFileInfo info;
};

// What the loading side expects; a field left empty/zero is not checked.
struct RouterExpectations {
  std::string vocab_hash;
  uint32_t n_vocab = 0;
  int n_embd = 0;
  std::string edge_path;  // for the error message
};

// Reads and validates a router file; throws tandem::Error naming the file and what is wrong or
// differs (a router made for another model, a damaged file).
LoadedRouter load_router(const std::string& path, const RouterExpectations& expect = {});

}  // namespace tandem::router
