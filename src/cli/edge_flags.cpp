#include "cli/edge_flags.h"

#include "cli/commands.h"

#include <algorithm>
#include <cstdio>

#include "common/default_model.h"
#include "tandem/error.h"

namespace tandem::cli {

void EdgeFlags::add_to(CLI::App& sub) {
  sub.add_option("-m,--model", model, "Small (edge) GGUF model")->default_str(default_model_path());
  sub.add_option("--cloud", cloud.url, "Cloud URL: http(s)://HOST:PORT[/PREFIX]");
  sub.add_option("--cloud-api", cloud.api,
                 "Cloud API: tandem (native, stateful sessions) | openai (/v1/completions) | "
                 "sglang (/generate) | llamacpp (/completion): stateless, token-id prompts")
      ->capture_default_str();
  sub.add_option("--api-key", cloud.api_key, "Cloud API key (Authorization: Bearer)");
  sub.add_flag("--insecure", cloud.insecure, "https: do not verify the certificate");
  sub.add_option("--ca-file", cloud.ca_file, "https: CA bundle (PEM) to verify against");
  sub.add_option("--mode", mode, "local | route | speculative | cloud")->capture_default_str();
  sub.add_option("--policy", policy,
                 "Router: confidence | entropy | margin | random:RATE[:SEED] | always | never")
      ->capture_default_str();
  sub.add_option("--router", router_file,
                 "Trained router (GGUF, `tandem router train`) instead of --policy; "
                 "--target-rate starts from its calibration table, --threshold is its score");
  auto* thr = sub.add_option("--threshold", threshold,
                             "Route when the policy's score exceeds this (default per policy: "
                             "confidence 0.5, entropy 2, margin 0.8)");
  sub.add_option("--target-rate", target_rate,
                 "Keep the cloud share of tokens near R (0..1) instead of a threshold")
      ->check(CLI::Range(0.0, 1.0))
      ->excludes(thr);
  sub.add_option("--target-gain", target_gain,
                 "With --target-rate: how hard the controller corrects the share it has realised "
                 "(quantile level per token of error; higher holds each 256-token window closer "
                 "to R, lower routes more strictly by score)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  sub.add_option("--route-span", options.route_span, "Cloud tokens per route event")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  sub.add_option("--draft", options.draft, "Speculative: drafts per verify")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub.add_flag("--no-sync-ahead", no_sync_ahead,
               "Do not push locally decided tokens to the cloud in the background");
  sub.add_option("--sync-every", options.sync_every,
                 "Sync ahead once N local tokens have gathered (1: after every token)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  sub.add_option("--cloud-timeout", options.cloud_timeout_s,
                 "Seconds a cloud request may take (connect included) before the device "
                 "decodes the token itself")
      ->check(CLI::Range(0.001, 3600.0))
      ->capture_default_str();
  sub.add_option("-n,--n-predict", n_predict,
                 "Tokens to generate per answer (-1: until end or context)")
      ->capture_default_str();
  sub.add_option("-c,--ctx-size", options.context.n_ctx,
                 "Context size of the small model (0: model default, at most 4096)")
      ->check(CLI::Range(0, 1 << 20));
  sub.add_option("-t,--threads", options.context.n_threads, "Threads (default: all cores)");
  add_kv_cache_flags(&sub, options.context.type_k, options.context.type_v);
  sub.add_option("--temp", options.sampling.temp, "Temperature (0: greedy)")->capture_default_str();
  sub.add_option("--top-k", options.sampling.top_k, "Top-k (0: off)")->capture_default_str();
  sub.add_option("--top-p", options.sampling.top_p, "Top-p (1: off)")->capture_default_str();
  sub.add_option("--min-p", options.sampling.min_p, "Min-p (0: off)")->capture_default_str();
  sub.add_option("-s,--seed", seed, "RNG seed (-1: random)");
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

void EdgeFlags::resolve() {
  if (model.empty()) model = default_model_path();
  if (seed >= 0) options.sampling.seed = static_cast<uint64_t>(seed);
  options.sync_ahead = !no_sync_ahead;
  options.cloud_chunk = 16;
  try {
    options.mode = parse_edge_mode(mode);
    options.router = parse_router_policy(policy);
  } catch (const std::invalid_argument& e) {
    throw Error(e.what());
  }
  if (threshold) options.router.threshold = *threshold;
  if (target_rate) options.router.target_rate = *target_rate;
  options.router.rate_gain = target_gain;
  if (options.mode != EdgeMode::Local && cloud.url.empty()) {
    throw Error("--mode " + mode + " needs --cloud URL (a `tandem serve` address)");
  }
  if (options.mode == EdgeMode::Speculative && options.sampling.temp > 0) {
    std::fprintf(stderr,
                 "tandem: speculative mode is greedy (the cloud verifies greedily); --temp is "
                 "used only for tokens decoded locally when the cloud is unavailable\n");
  }
  cloud.timeout_s = options.cloud_timeout_s;
}

void EdgeFlags::load_router(const Model& edge_model) {
  if (router_file.empty()) return;
  load_trained_router(router_file, edge_model, model, threshold, options);
}

std::unique_ptr<CloudBackend> EdgeFlags::make_backend(const Model& edge_model) const {
  if (options.mode == EdgeMode::Local || cloud.url.empty()) return nullptr;
  try {
    return make_cloud_backend(cloud, edge_model);
  } catch (const std::invalid_argument& e) {
    throw Error(e.what());
  }
}

}  // namespace tandem::cli
