// tandem eval --task wikitext: teacher-forced log-likelihood of WikiText-2 under routing. The
// edge model runs here; the cloud's log-probability of every true token comes from the cloud
// (prompt log-probabilities: tandem serve's or vLLM's /v1/completions `prompt_logprobs`, SGLang's
// /generate `input_token_logprobs`) or from a local copy (--cloud-model). Each router policy runs
// online with its target-rate controller over the scored positions in order, as it would on a
// device; the oracle at the same share is the ceiling.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/eval_loglik.h"
#include "tandem/client.h"
#include "tandem/cloud_rows.h"
#include "tandem/engine.h"
#include "tandem/error.h"
#include "tandem/eval_loglik.h"
#include "tandem/eval_report.h"
#include "tandem/router.h"
#include "tandem/router_tools.h"

namespace tandem::cli {

using json = nlohmann::json;
namespace fs = std::filesystem;
using namespace tandem::eval;

int run_wikitext_eval(const WikitextEvalOptions& o) {
  if (o.api == "llamacpp") {
    throw Error(
        "llama-server returns no prompt log-probabilities; give --cloud-model FILE or a "
        "tandem/openai/sglang cloud");
  }
  if (o.cloud_url.empty() && o.cloud_model.empty()) {
    throw Error(
        "--task wikitext needs the cloud's log-probabilities: --cloud URL or --cloud-model FILE");
  }
  const std::string path = o.data_dir + "/wikitext-2/" + o.split + ".txt";
  auto edge = Model::load(o.edge_model);
  std::unique_ptr<Model> cloud_local;
  std::unique_ptr<HttpCloudRows> http;
  if (!o.cloud_model.empty()) {
    cloud_local = Model::load(o.cloud_model);
    if (cloud_local->info().vocab_hash != edge->info().vocab_hash) {
      throw Error("--cloud-model " + o.cloud_model + " has another vocabulary than " +
                  o.edge_model);
    }
  } else {
    CloudOptions co;
    co.url = o.cloud_url;
    co.api = o.api;
    co.api_key = o.api_key;
    co.insecure = o.insecure;
    co.ca_file = o.ca_file;
    co.timeout_s = o.timeout_s;
    http = std::make_unique<HttpCloudRows>(co);
  }

  const int L = o.chunk_tokens;
  const std::vector<TokenId> all = wikitext_tokens(o.data_dir, *edge, o.split);
  const int total_chunks = static_cast<int>(all.size() / L);
  const int n_chunks = std::min<int>(o.chunks, total_chunks - o.chunk_offset);
  if (n_chunks < 1) {
    throw Error("the text has " + std::to_string(total_chunks) + " chunks of " + std::to_string(L) +
                " tokens; --chunk-offset " + std::to_string(o.chunk_offset) + " leaves none");
  }
  const int first_scored = L / 2;
  std::fprintf(stderr,
               "[wikitext] %d chunks of %d tokens from chunk %d of %d, the second half of each "
               "scored\n",
               n_chunks, L, o.chunk_offset, total_chunks);

  ContextParams cp;
  cp.n_ctx = L;
  cp.n_threads = o.threads;
  Context edge_ctx(*edge, cp);
  std::unique_ptr<Context> cloud_ctx;
  if (cloud_local) cloud_ctx = std::make_unique<Context>(*cloud_local, cp);

  std::vector<std::string> policies = {"confidence", "entropy", "margin"};
  const size_t n_heuristics = policies.size();
  for (const std::string& file : o.routers)
    policies.push_back(o.routers.size() == 1 ? "mlp" : "mlp-" + fs::path(file).stem().string());
  // Every policy's router as a device would start it for a target rate (a trained router
  // through load_trained_router, as `run` and task evals load it: threshold, seeded window and
  // the signal's top-k all from the file). rate 0: no target, for scoring only.
  auto config_for = [&](size_t k, double rate) {
    EdgeOptions opts;
    opts.router = parse_router_policy(k < n_heuristics ? policies[k] : "confidence");
    if (rate > 0) opts.router.target_rate = rate;
    opts.router.rate_gain = o.rate_gain;
    if (k >= n_heuristics) {
      load_trained_router(o.routers[k - n_heuristics], *edge, o.edge_model, std::nullopt, opts);
    }
    return opts;
  };
  // One signal per position serves every policy, so the routers must agree on its top-k.
  int top_k_signal = EdgeOptions{}.top_k_signal;
  for (size_t k = n_heuristics; k < policies.size(); ++k) {
    const int top_k = config_for(k, 0).top_k_signal;
    if (k > n_heuristics && top_k != top_k_signal) {
      throw Error(o.routers[k - n_heuristics] + " reads the top " + std::to_string(top_k) +
                  " log-probabilities, " + o.routers.front() + " the top " +
                  std::to_string(top_k_signal) + "; score them in separate runs");
    }
    top_k_signal = top_k;
  }
  std::vector<std::vector<float>> hiddens;  // [scored position][n_embd], for the mlp policy
  std::vector<Position> positions;
  std::vector<RouterSignal> signals;
  std::vector<std::vector<float>> scores(policies.size());
  std::vector<Router> scorers;
  for (size_t k = 0; k < policies.size(); ++k) scorers.emplace_back(config_for(k, 0).router);
  const bool want_hidden = !o.routers.empty();
  for (int c = 0; c < n_chunks; ++c) {
    const std::vector<TokenId> chunk = text_chunk(all, o.chunk_offset + c, L, *edge);
    const size_t base = positions.size();
    run_chunk(edge_ctx, chunk, first_scored, want_hidden,
              [&](int i, std::span<const float> logits, std::span<const float> hidden) {
                Position p;
                p.edge_logprob = log_prob(logits, chunk[i + 1]);
                positions.push_back(p);
                // Row i decides token i + 1: the history then holds i + 1 tokens.
                signals.push_back(router_signal_from_logits(logits, i + 1, top_k_signal));
                hiddens.emplace_back(hidden.begin(), hidden.end());
                signals.back().hidden = hiddens.back();
                for (size_t k = 0; k < policies.size(); ++k)
                  scores[k].push_back(scorers[k].score(signals.back()));
              });
    std::vector<float> cloud_lp;
    if (cloud_ctx) {
      run_chunk(*cloud_ctx, chunk, first_scored, false,
                [&](int i, std::span<const float> logits, std::span<const float>) {
                  cloud_lp.push_back(log_prob(logits, chunk[i + 1]));
                });
    } else {
      for (const CloudRow& r : http->rows(chunk, first_scored, 0))
        cloud_lp.push_back(r.true_logprob);
    }
    for (size_t i = 0; i < cloud_lp.size(); ++i) positions[base + i].cloud_logprob = cloud_lp[i];
    std::fprintf(stderr, "\r[wikitext] chunk %d/%d", c + 1, n_chunks);
  }
  std::fprintf(stderr, "\n");
  // The hidden rows no longer move: point every signal at its own.
  for (size_t i = 0; i < signals.size(); ++i) signals[i].hidden = hiddens[i];

  const double nll_edge = mean_nll_edge(positions), nll_cloud = mean_nll_cloud(positions);
  json results = {
      {"command", o.command},
      {"task", o.split == "test" ? "wikitext" : "wikitext-" + o.split},
      {"source", path},
      {"chunks", n_chunks},
      {"chunk_offset", o.chunk_offset},
      {"router", o.routers.empty() ? std::string() : o.routers.front()},
      {"routers", o.routers},
      {"chunk_tokens", L},
      {"scored_positions", positions.size()},
      {"edge", {{"path", o.edge_model}, {"nll", nll_edge}, {"ppl", std::exp(nll_edge)}}},
      {"cloud",
       {{"source", o.cloud_model.empty() ? o.cloud_url : o.cloud_model},
        {"nll", nll_cloud},
        {"ppl", std::exp(nll_cloud)}}},
      {"gap_nats", nll_edge - nll_cloud}};
  json rows = json::array();
  for (size_t k = 0; k < policies.size(); ++k) {
    for (double rate : o.rates) {
      // Online, as on a device: the controller sees the scores in order.
      std::vector<bool> flags;
      for (const RouteDecision& d : replay_decisions(config_for(k, rate).router, signals))
        flags.push_back(d.cloud);
      const RoutedLoglik online = routed(positions, flags);
      const WindowShares windows = window_shares(flags, rate, kShareWindow);
      std::vector<Position> with_scores = positions;
      for (size_t i = 0; i < positions.size(); ++i) with_scores[i].score = scores[k][i];
      const RoutedLoglik hindsight = by_score_quantile(with_scores, rate);
      const RoutedLoglik best = oracle(positions, online.share);
      rows.push_back({{"policy", policies[k]},
                      {"target", rate},
                      {"share", online.share},
                      {"windows_within_1pt", windows.within_1pt},
                      {"max_window_deviation", windows.max_deviation},
                      {"nll", online.nll},
                      {"gap_recovered", online.gap_recovered},
                      {"hindsight_threshold_gap_recovered", hindsight.gap_recovered},
                      {"oracle_gap_recovered", best.gap_recovered},
                      {"oracle_nll", best.nll},
                      {"of_oracle",
                       best.gap_recovered > 0 ? online.gap_recovered / best.gap_recovered : 0.0}});
    }
  }
  results["routes"] = rows;
  json curve = json::array();
  for (double s : {0.0, 0.01, 0.02, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5}) {
    curve.push_back({{"share", s}, {"gap_recovered", oracle(positions, s).gap_recovered}});
  }
  results["oracle_curve"] = curve;

  fs::create_directories(o.out_dir);
  std::ofstream(fs::path(o.out_dir) / "results.json") << results.dump(1) << "\n";
  write_loglik_report(o.out_dir, results, policies, o.plots);
  std::fprintf(stderr, "edge NLL %.4f, cloud NLL %.4f, gap %.3f nats; results in %s\n", nll_edge,
               nll_cloud, nll_edge - nll_cloud, o.out_dir.c_str());
  if (o.json) std::printf("%s\n", results.dump(1).c_str());
  return 0;
}

}  // namespace tandem::cli
