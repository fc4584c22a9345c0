// Training a router from traces and reading a router file, for the CLI (`tandem router train`,
// `tandem router bench`), so that it includes no header of src/router: the training options (one
// per flag), the whole of `router train` (read the traces, train, print the validation curves,
// write the router GGUF) and the MLP of a router file. Traces, labels and the file layout are
// described in src/router/trace.h, train.h and router_file.h, and in docs/router.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/router_mlp.h"

namespace tandem::router {

struct TrainOptions {
  std::vector<int> hidden = {64};  // widths of the hidden layers (1 or 2 of them)
  int epochs = 60, batch = 128, patience = 6;
  double lr = 1e-3, weight_decay = 1e-4;
  double val_fraction = 0.2;  // of the sequences
  bool class_weighting = true;
  uint64_t seed = 1;
  bool verbose = true;  // per-epoch lines on stderr
};

// What `router train` reads and writes.
struct RouterTraining {
  std::vector<std::string> traces;  // from `router collect`; their headers must agree
  std::string out;                  // the router GGUF file to write
  std::string cloud_name;           // the cloud of the pair, recorded in the file when given
  std::string label = "kl";         // disagree | critical[:TAU] | gain | gain:Q | kl | kl:log
  int min_position = 0;             // train and validate on positions from this one on
  // Also train, on the same split, the cloud-aware reference MLP for the `gain` label (printed,
  // not written).
  bool cloud_aware_reference = false;
  TrainOptions train;
};

// Reads the traces, trains the router, prints its validation curves on stderr, writes it to
// training.out and returns the training summary as JSON text: the very text the file records as
// tandem_router.training. Throws tandem::Error naming a bad label, trace or file.
std::string train_router_file(const RouterTraining& training);

// The MLP of a router file; throws tandem::Error naming the file and what is wrong with it.
std::shared_ptr<const MlpRouterModel> load_router_model(const std::string& path);

}  // namespace tandem::router
