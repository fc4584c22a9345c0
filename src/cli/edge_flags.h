// Flags shared by the commands that decode on the device (`tandem run`, `tandem ui`): the small
// model, the cloud, the mode and router, sampling and context. Each command registers them on its
// own subcommand and then turns them into EdgeOptions and CloudOptions with resolve().
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>

#include "tandem/client.h"

namespace tandem::cli {

struct EdgeFlags {
  std::string model;
  std::string mode = "route";
  std::string policy = "confidence";
  std::string router_file;
  std::optional<double> threshold, target_rate;
  double target_gain = kDefaultRateGain;
  long long seed = -1;
  bool no_sync_ahead = false;
  int n_predict = 128;
  CloudOptions cloud;
  EdgeOptions options;  // complete after resolve()

  void add_to(CLI::App& sub);
  // Fills `options` (mode, router, seed, sync-ahead) and the cloud timeout from the flags;
  // throws tandem::Error naming the flag when they do not fit together.
  void resolve();
  // --router R.gguf, once the small model is loaded: the trained (mlp) router, checked against
  // that model (refused, naming what differs, when it was made for another); its threshold is
  // --threshold, or the calibration's for a 7% cloud share, and --target-rate starts from the
  // calibration's score distribution. Nothing without --router.
  void load_router(const Model& edge_model);
  // The cloud backend for --cloud (null in local mode); throws tandem::Error for a bad URL.
  std::unique_ptr<CloudBackend> make_backend(const Model& edge_model) const;
};

}  // namespace tandem::cli
