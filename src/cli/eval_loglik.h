// tandem eval --task wikitext (eval_loglik.cpp).
#pragma once

#include <string>
#include <vector>

#include "tandem/router.h"

namespace tandem::cli {

struct WikitextEvalOptions {
  std::string command;  // the command line, for the results file
  std::string edge_model;
  std::string cloud_url, api = "tandem", api_key;
  bool insecure = false;
  std::string ca_file;      // https: a CA bundle (PEM) to verify against
  std::string cloud_model;  // a local copy of the cloud model instead of a URL
  std::string data_dir, out_dir;
  std::string split = "test";  // WikiText-2 file: "test" (reported) or "valid" (for choosing)
  std::vector<double> rates;
  double rate_gain = kDefaultRateGain;  // RouterConfig::rate_gain
  int chunks = 8, chunk_tokens = 512, threads = 0;
  int chunk_offset = 0;  // first chunk scored (held-out halves: train on [0, n/2), score the rest)
  // Trained routers (GGUF): one is scored as the "mlp" policy, several as "mlp-STEM" each (STEM
  // the file's name without .gguf), next to the heuristics and over the same forward passes.
  std::vector<std::string> routers;
  double timeout_s = 60;
  bool plots = true, json = false;
};

int run_wikitext_eval(const WikitextEvalOptions& options);

}  // namespace tandem::cli
