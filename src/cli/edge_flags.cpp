#include "cli/edge_flags.h"

#include "cli/commands.h"

#include <cstdio>
#include <filesystem>

#include "tandem/default_model.h"
#include "tandem/error.h"

namespace tandem::cli {

void CloudFlags::add_to(CLI::App& sub, unsigned members) {
  if (members & kUrl) {
    sub.add_option("--cloud", options.url, "Cloud URL: http(s)://HOST:PORT[/PREFIX]");
  }
  if (members & kApi) {
    sub.add_option("--cloud-api", options.api,
                   "Cloud API: tandem (native, stateful sessions) | openai (/v1/completions) | "
                   "sglang (/generate) | llamacpp (/completion): stateless, token-id prompts")
        ->capture_default_str();
  }
  if (members & kApiKey) {
    sub.add_option("--api-key", options.api_key, "Cloud API key (Authorization: Bearer)");
  }
  if (members & kTls) {
    sub.add_flag("--insecure", options.insecure, "https: do not verify the certificate");
    sub.add_option("--ca-file", options.ca_file, "https: CA bundle (PEM) to verify against");
  }
  if (members & kTimeout) {
    sub.add_option("--cloud-timeout", options.timeout_s,
                   "Seconds a cloud request may take (connect included) before it counts as "
                   "failed (on the device: decoded there instead)")
        ->check(CLI::Range(0.001, 3600.0))
        ->capture_default_str();
  }
}

namespace {

void add_model_flags(CLI::App& sub, EdgeFlags& f, unsigned members) {
  if (members & EdgeFlags::kModel) {
    f.model_flag.add_to(sub, ModelRole::Edge, "Small (edge) GGUF model");
  }
  if (members & EdgeFlags::kContext) {
    sub.add_option("-c,--ctx-size", f.options.context.n_ctx,
                   "Context size of the small model (0: model default, at most 4096)")
        ->check(CLI::Range(0, 1 << 20));
    add_kv_cache_flags(&sub, f.options.context.type_k, f.options.context.type_v);
  }
  if (members & EdgeFlags::kThreads) {
    sub.add_option("-t,--threads", f.options.context.n_threads, "Threads (default: all cores)");
  }
}

void add_policy_flags(CLI::App& sub, EdgeFlags& f) {
  f.policy_option =
      sub.add_option("--policy", f.policy,
                     "Router: confidence | entropy | margin | random:RATE[:SEED] | always | never "
                     "(default: the router that ships for the device model of a known pair, "
                     "docs/router.md; else confidence)");
  sub.add_option("--router", f.router_file,
                 "Trained router (GGUF, `tandem router train`) instead of --policy; "
                 "--target-rate starts from its calibration table, --threshold is its score");
  auto* thr = f.threshold_option =
      sub.add_option("--threshold", f.threshold,
                     "Route when the policy's score exceeds this (default per policy: "
                     "confidence 0.5, entropy 2, margin 0.8)");
  sub.add_option("--target-rate", f.target_rate,
                 "Keep the cloud share of tokens near R (0..1) instead of a threshold")
      ->check(CLI::Range(0.0, 1.0))
      ->excludes(thr);
}

void add_control_flags(CLI::App& sub, EdgeFlags& f) {
  sub.add_option("--target-gain", f.target_gain,
                 "With a target rate: how hard the controller corrects the share it has realised "
                 "(quantile level per token of error; higher holds each 256-token window closer "
                 "to R, lower routes more strictly by score)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  sub.add_option("--route-span", f.options.route_span, "Cloud tokens per route event")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  sub.add_option("--draft", f.options.draft, "Speculative: drafts per verify")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub.add_flag("--no-sync-ahead", f.no_sync_ahead,
               "Do not push locally decided tokens to the cloud in the background (a route "
               "event sends what the cloud lacks; greedy answers are the same)");
  sub.add_flag("--pipeline,!--no-pipeline", f.options.pipeline,
               "Route and speculative mode: decode on while a consultation is out (past a routed "
               "position; the next block of drafts), going back only when the cloud answers "
               "otherwise (the same output; default on; --no-pipeline waits)")
      ->capture_default_str();
  sub.add_option("--branches", f.options.branches,
                 "Pipelined route mode (greedy, --route-span 1): while a consultation is out, "
                 "also decode the small model's next N choices there side by side, and take "
                 "over the one the cloud answers instead of decoding it again (the same output; "
                 "each fork takes as many as pay, by the answers' ranks and the rows' cost so "
                 "far, so a pair whose cloud rarely disagrees forks none; 0: off)")
      ->check(CLI::Range(0, 8))
      ->capture_default_str();
  sub.add_flag("--branches-fixed", f.options.branches_fixed,
               "Fork all --branches at every consultation, not only as many as the running "
               "estimates say pay (for measuring)");
  sub.add_option("--sync-every", f.options.sync_every,
                 "Sync ahead once N local tokens have gathered (1: after every token)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
}

void add_sampling_flags(CLI::App& sub, EdgeFlags& f) {
  SamplingParams& s = f.options.sampling;
  sub.add_option("-n,--n-predict", f.n_predict,
                 "Tokens to generate per answer (-1: until end or context)")
      ->capture_default_str();
  sub.add_option("--temp", s.temp, "Temperature (0: greedy)")->capture_default_str();
  sub.add_option("--top-k", s.top_k, "Top-k (0: off)")->capture_default_str();
  sub.add_option("--top-p", s.top_p, "Top-p (1: off)")->capture_default_str();
  sub.add_option("--min-p", s.min_p, "Min-p (0: off)")->capture_default_str();
}

}  // namespace

void EdgeFlags::add_to(CLI::App& sub, unsigned members) {
  add_model_flags(sub, *this, members);
  if (members & kMode) {
    sub.add_option("--mode", mode, "local | route | speculative | cloud")->capture_default_str();
  }
  if (members & kPolicy) add_policy_flags(sub, *this);
  if (members & kControl) add_control_flags(sub, *this);
  if (members & kSampling) add_sampling_flags(sub, *this);
  if (members & kSeed) sub.add_option("-s,--seed", seed, "RNG seed (-1: random)");
}

// Declared in cli/commands.h; defined here, in the library the tools and tests link.
void add_kv_cache_flags(CLI::App* sub, KvCacheType& type_k, KvCacheType& type_v) {
  // The enum's CLI11 spelling is its number: the names are mapped to it, anything else is named
  // in the error.
  const auto kv_type = [](std::string value) -> std::string {
    try {
      return std::to_string(static_cast<int>(parse_kv_cache_type(value)));
    } catch (const Error& e) {
      throw CLI::ValidationError(e.what());
    }
  };
  sub->add_option("--cache-type-k", type_k,
                  "KV cache type of keys: f32 or f16 (half the memory; -ctk as in llama.cpp)")
      ->transform(kv_type, "f32|f16")
      ->default_str("f32");
  sub->add_option("--cache-type-v", type_v, "KV cache type of values: f32 or f16 (-ctv)")
      ->transform(kv_type, "f32|f16")
      ->default_str("f32");
}

void EdgeFlags::resolve(const CloudOptions& cloud) {
  model = model_flag.resolve(ModelRole::Edge);
  if (seed >= 0) options.sampling.seed = static_cast<uint64_t>(seed);
  options.sync_ahead = !no_sync_ahead;
  options.cloud_chunk = 16;
  options.cloud_timeout_s = cloud.timeout_s;
  try {
    options.mode = parse_edge_mode(mode);
  } catch (const std::invalid_argument& e) {
    throw Error(e.what());
  }
  check_routing(routing());
}

RoutingSpec EdgeFlags::routing() const {
  return {policy, router_file, threshold, target_rate, target_gain, options.route_span};
}

void DeviceFlags::add_to(CLI::App& sub) {
  // The order of --help: the model, the cloud, then how to route and decode.
  edge.add_to(sub, EdgeFlags::kModel);
  cloud.add_to(sub, CloudFlags::kAll & ~CloudFlags::kTimeout);
  edge.add_to(sub, EdgeFlags::kMode | EdgeFlags::kPolicy | EdgeFlags::kControl);
  cloud.add_to(sub, CloudFlags::kTimeout);
  edge.add_to(sub, EdgeFlags::kAll & ~(EdgeFlags::kModel | EdgeFlags::kMode | EdgeFlags::kPolicy |
                                       EdgeFlags::kControl));
}

void DeviceFlags::resolve() {
  edge.resolve(cloud.options);
  if (edge.options.mode != EdgeMode::Local && cloud.options.url.empty()) {
    throw Error("--mode " + edge.mode + " needs --cloud URL (a `tandem serve` address)");
  }
  if (edge.options.mode == EdgeMode::Speculative && edge.options.sampling.temp > 0) {
    std::fprintf(stderr,
                 "tandem: speculative mode is greedy (the cloud verifies greedily); --temp is "
                 "used only for tokens decoded locally when the cloud is unavailable\n");
  }
}

bool EdgeFlags::routing_chosen() const {
  const auto given = [](const CLI::Option* o) { return o && o->count() > 0; };
  return !router_file.empty() || given(policy_option) || given(threshold_option);
}

void DeviceFlags::load_router(const Model& edge_model) {
  if (edge.options.mode == EdgeMode::Route && !edge.routing_chosen()) {
    edge.router_file = shipped_router_for(edge.model);
    if (!edge.router_file.empty()) {
      std::fprintf(stderr,
                   "tandem: routing with %s, the router that ships for this model "
                   "(--policy confidence to route by confidence instead)\n",
                   edge.router_file.c_str());
    }
  }
  resolve_routing(edge.routing(), edge_model, edge.model, edge.options);
}

std::unique_ptr<CloudBackend> DeviceFlags::make_backend(const Model& edge_model) const {
  if (edge.options.mode == EdgeMode::Local || cloud.options.url.empty()) return nullptr;
  try {
    return make_cloud_backend(cloud.options, edge_model);
  } catch (const std::invalid_argument& e) {
    throw Error(e.what());
  }
}

std::string default_data_dir() {
  return (std::filesystem::path(TANDEM_SOURCE_DIR) / ".." / "shared" / "data").string();
}

void add_data_flag(CLI::App& sub, std::string& dir) {
  dir = default_data_dir();
  sub.add_option("--data", dir, "The benchmark data folder")->capture_default_str();
}

void ChatFormFlags::add_to(CLI::App& sub) {
  sub.add_flag("--chat", chat,
               "Ask each item as a chat (instruct models): the model's own chat template, the "
               "shots as earlier turns, answers as \"The answer is (X)\" (docs/eval.md)");
  sub.add_option("--system", system, "With --chat: a system message before the turns");
  sub.add_option("--chat-answer", answer,
                 "With --chat, multiple choice: reason (one short sentence, then \"The answer is "
                 "(X)\"), letter (the letter alone) or choice (\"The answer is (X)\" and the "
                 "choice's text)")
      ->check(CLI::IsMember({"reason", "letter", "choice"}))
      ->capture_default_str();
}

void ChatFormFlags::check(const CLI::App& sub, const std::string& task) const {
  if (!chat && (sub.count("--system") > 0 || sub.count("--chat-answer") > 0))
    throw Error("--system and --chat-answer go with --chat");
  if (chat && (task == "wikitext" || task == "wikitext-valid"))
    throw Error("--chat asks a task's items as chat turns; --task " + task + " scores text");
  if (chat && task == "humaneval")
    throw Error("--chat: humaneval is asked as a plain completion of the function's prompt");
}

void ChatFormFlags::apply(eval::Task& task) const {
  if (chat) eval::use_chat_form(task, {system, eval::parse_chat_answer(answer)});
}

void add_cloud_model_flag(CLI::App& sub, std::string& file) {
  sub.add_option("--cloud-model", file,
                 "The cloud model as a local GGUF file instead of --cloud (teacher-forced rows: "
                 "eval --task wikitext, router collect)");
}

}  // namespace tandem::cli
