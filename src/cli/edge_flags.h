// The flags of the commands that decode on the device or talk to a cloud, each defined once here
// (name, help text, default, check) and registered by every command that takes it:
//
//   CloudFlags   --cloud --cloud-api --api-key --insecure --ca-file --cloud-timeout
//   EdgeFlags    -m -c -t --cache-type-k/v; --mode; --policy --router --threshold --target-rate;
//                --target-gain --route-span --draft --no-sync-ahead --pipeline --sync-every;
//                -n --temp --top-k --top-p --min-p; -s/--seed
//   DeviceFlags  both groups whole: `tandem run` and `tandem ui`
//   add_data_flag  --data, the benchmark data folder (eval, router collect)
//   add_cloud_model_flag  --cloud-model, the cloud as a local file (eval's wikitext, router
//   collect)
//   ChatFormFlags  --chat --system --chat-answer: a task's items as chat turns (eval, router
//   collect)
//
// `tandem eval` takes the cloud group whole and the edge group without the flags it spells its
// own way (--modes, a list of --policy heuristics, several --router files, --rates) or has no use
// for (greedy answers of a task's length); `router collect` takes the cloud URL, API, key and
// timeout, the model and the threads. A command may change a member's default before add_to
// (the help then shows its own).
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>

#include "cli/model_flag.h"
#include "tandem/client.h"
#include "tandem/eval_tasks.h"
#include "tandem/routing.h"

namespace tandem::cli {

struct CloudFlags {
  // Which flags add_to registers.
  enum Member : unsigned {
    kUrl = 1u << 0,      // --cloud
    kApi = 1u << 1,      // --cloud-api
    kApiKey = 1u << 2,   // --api-key
    kTls = 1u << 3,      // --insecure, --ca-file
    kTimeout = 1u << 4,  // --cloud-timeout
    kAll = (1u << 5) - 1,
  };
  CloudOptions options;

  void add_to(CLI::App& sub, unsigned members = kAll);
};

struct EdgeFlags {
  // Which flags add_to registers.
  enum Member : unsigned {
    kModel = 1u << 0,     // -m
    kContext = 1u << 1,   // -c, --cache-type-k, --cache-type-v
    kThreads = 1u << 2,   // -t
    kMode = 1u << 3,      // --mode
    kPolicy = 1u << 4,    // --policy, --router, --threshold, --target-rate
    kControl = 1u << 5,   // --target-gain, --route-span, --draft, --no-sync-ahead, --pipeline,
                          // --sync-every
    kSampling = 1u << 6,  // -n, --temp, --top-k, --top-p, --min-p
    kSeed = 1u << 7,      // -s, --seed
    kAll = (1u << 8) - 1,
  };
  std::string model;  // the file resolve() chose from model_flag
  ModelFlag model_flag;
  std::string mode = "route";
  std::string policy;  // empty: confidence, or the --router file
  std::string router_file;
  std::optional<double> threshold, target_rate;
  double target_gain = kDefaultRateGain;
  long long seed = -1;
  bool no_sync_ahead = false;
  int n_predict = 128;
  EdgeOptions options;  // complete after resolve()
  // Set by add_to (kPolicy), to tell a flag given from its default.
  CLI::Option* policy_option = nullptr;
  CLI::Option* threshold_option = nullptr;

  void add_to(CLI::App& sub, unsigned members = kAll);
  // Whether the command line chose how to route: --router, --policy or --threshold.
  bool routing_chosen() const;
  // What --policy, --router, --threshold, --target-rate, --target-gain and --route-span ask for.
  RoutingSpec routing() const;
  // Fills `options` (mode, seed, sync-ahead, the cloud's timeout) and the model path's default
  // from the flags, and checks the routing flags (check_routing); throws tandem::Error naming
  // the flag for a bad mode, or the rule the routing flags break. The router itself is made
  // once the model is loaded (DeviceFlags::load_router).
  void resolve(const CloudOptions& cloud);
};

// Both groups whole, for the commands that decode on the device with one mode (run, ui).
struct DeviceFlags {
  CloudFlags cloud;
  EdgeFlags edge;

  void add_to(CLI::App& sub);
  // EdgeFlags::resolve, and the checks that need both groups: a mode other than local needs
  // --cloud; throws tandem::Error naming the flag.
  void resolve();
  // The router, once the small model is loaded: resolve_routing of the routing flags (a --router
  // file checked against that model). In route mode with no routing chosen, the router that
  // ships for the device model of a known pair (shipped_router_for), said on stderr.
  void load_router(const Model& edge_model);
  // The cloud backend for --cloud (null in local mode); throws tandem::Error for a bad URL.
  std::unique_ptr<CloudBackend> make_backend(const Model& edge_model) const;
};

// The benchmark data folder that --data names by default: ../shared/data beside this source tree.
std::string default_data_dir();
// --data DIR; `dir` is set to default_data_dir() first.
void add_data_flag(CLI::App& sub, std::string& dir);
// --cloud-model FILE: the cloud model read here instead of asked over --cloud, for the
// teacher-forced rows of `eval --task wikitext` and `router collect`.
void add_cloud_model_flag(CLI::App& sub, std::string& file);

// A task's prompt form: plain completions, or with --chat the items as chat turns in the
// model's own template, answered in --chat-answer's form (tandem/eval_tasks.h).
struct ChatFormFlags {
  bool chat = false;
  std::string system, answer = "reason";

  void add_to(CLI::App& sub);
  // Throws tandem::Error for --system or --chat-answer without --chat, and for --chat with a
  // task that scores text (wikitext, wikitext-valid) or runs code (humaneval).
  void check(const CLI::App& sub, const std::string& task) const;
  // use_chat_form with these settings when --chat was given.
  void apply(eval::Task& task) const;
};

}  // namespace tandem::cli
