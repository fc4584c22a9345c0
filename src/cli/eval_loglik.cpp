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
#include "tandem/routing.h"

namespace tandem::cli {

using json = nlohmann::json;
namespace fs = std::filesystem;
using namespace tandem::eval;

namespace {

// The models of a run. The cloud's log-probabilities come from exactly one of two sources: a
// local copy of the cloud model (--cloud-model, run here) or a cloud server (--cloud URL).
struct Models {
  std::unique_ptr<Model> edge;
  std::unique_ptr<Model> cloud_local;   // --cloud-model, else null
  std::unique_ptr<HttpCloudRows> http;  // --cloud URL, else null
};

// Refuses, before any model loads, a cloud that cannot give prompt log-probabilities.
void check_cloud_source(const WikitextEvalOptions& o) {
  if (o.api == "llamacpp") {
    throw Error(
        "llama-server returns no prompt log-probabilities; give --cloud-model FILE or a "
        "tandem/openai/sglang cloud");
  }
  if (o.cloud_url.empty() && o.cloud_model.empty()) {
    throw Error(
        "--task wikitext needs the cloud's log-probabilities: --cloud URL or --cloud-model FILE");
  }
}

Models load_models(const WikitextEvalOptions& o) {
  Models m;
  m.edge = Model::load(o.edge_model);
  if (!o.cloud_model.empty()) {
    m.cloud_local = Model::load(o.cloud_model);
    if (m.cloud_local->info().vocab_hash != m.edge->info().vocab_hash) {
      throw Error("--cloud-model " + o.cloud_model + " has another vocabulary than " +
                  o.edge_model);
    }
    return m;
  }
  CloudOptions co;
  co.url = o.cloud_url;
  co.api = o.api;
  co.api_key = o.api_key;
  co.insecure = o.insecure;
  co.ca_file = o.ca_file;
  co.timeout_s = o.timeout_s;
  m.http = std::make_unique<HttpCloudRows>(co, m.edge->vocab_size());
  return m;
}

// The chunks scored: [chunk_offset, chunk_offset + n_chunks) of the split's chunks of
// chunk_tokens tokens, the second half of each (rows first_scored .. chunk_tokens - 2).
struct ChunkPlan {
  std::vector<TokenId> all;  // the whole split as one token stream
  int total_chunks = 0, n_chunks = 0, first_scored = 0;
};

ChunkPlan plan_chunks(const WikitextEvalOptions& o, const Model& edge) {
  const int L = o.chunk_tokens;
  ChunkPlan plan;
  plan.all = wikitext_tokens(o.data_dir, edge, o.split);
  plan.total_chunks = static_cast<int>(plan.all.size() / L);
  plan.n_chunks = std::min<int>(o.chunks, plan.total_chunks - o.chunk_offset);
  if (plan.n_chunks < 1) {
    throw Error("the text has " + std::to_string(plan.total_chunks) + " chunks of " +
                std::to_string(L) + " tokens; --chunk-offset " + std::to_string(o.chunk_offset) +
                " leaves none");
  }
  plan.first_scored = L / 2;
  std::fprintf(stderr,
               "[wikitext] %d chunks of %d tokens from chunk %d of %d, the second half of each "
               "scored\n",
               plan.n_chunks, L, o.chunk_offset, plan.total_chunks);
  return plan;
}

// The policies scored side by side over the same forward passes: the three heuristics, then
// each trained router ("mlp" alone, "mlp-STEM" for several).
class Policies {
 public:
  Policies(const WikitextEvalOptions& o, const Model& edge) : o_(o), edge_(edge) {
    for (const std::string& file : o.routers)
      names_.push_back(o.routers.size() == 1 ? "mlp" : "mlp-" + fs::path(file).stem().string());
  }

  const std::vector<std::string>& names() const { return names_; }
  size_t size() const { return names_.size(); }

  // Policy k's router as a device would start it for a target rate (a trained router through
  // resolve_routing, as `run` and task evals load it: threshold, seeded window and the
  // signal's top-k all from the file). rate 0: no target, for scoring only.
  EdgeOptions config_for(size_t k, double rate) const {
    EdgeOptions opts;
    const bool trained = k >= kHeuristics;
    RoutingSpec spec;
    if (trained)
      spec.router_file = o_.routers[k - kHeuristics];
    else
      spec.policy = names_[k];
    if (rate > 0) spec.target_rate = rate;
    spec.target_gain = o_.rate_gain;
    resolve_routing(spec, edge_, o_.edge_model, opts);
    return opts;
  }

  // One signal per position serves every policy, so the routers must agree on its top-k.
  int signal_top_k() const {
    int top_k_signal = EdgeOptions{}.top_k_signal;
    for (size_t k = kHeuristics; k < names_.size(); ++k) {
      const int top_k = config_for(k, 0).top_k_signal;
      if (k > kHeuristics && top_k != top_k_signal) {
        throw Error(o_.routers[k - kHeuristics] + " reads the top " + std::to_string(top_k) +
                    " log-probabilities, " + o_.routers.front() + " the top " +
                    std::to_string(top_k_signal) + "; score them in separate runs");
      }
      top_k_signal = top_k;
    }
    return top_k_signal;
  }

 private:
  static constexpr size_t kHeuristics = 3;  // the first names: confidence, entropy, margin
  const WikitextEvalOptions& o_;
  const Model& edge_;
  std::vector<std::string> names_ = {"confidence", "entropy", "margin"};
};

// Every scored position of every chunk, in text order: index i of each per-position vector is
// position i.
struct Scored {
  std::vector<Position> positions;
  std::vector<RouterSignal> signals;        // what a router sees there; hidden points into hiddens
  std::vector<std::vector<float>> hiddens;  // [position][n_embd], for the mlp policy
  std::vector<std::vector<float>> scores;   // [policy][position]: each scorer's score
};

// Where a chunk's forward passes run: the edge here, the cloud here (cloud_local) or remote.
struct Passes {
  Context& edge;
  Context* cloud_local;  // null: the cloud's rows come from http
  HttpCloudRows* http;
};

// The edge's pass over one chunk: for each scored row, the true token's log-probability, the
// router signal (row i decides token i + 1) and every policy's score of it.
void score_edge_rows(Context& ctx, const std::vector<TokenId>& chunk, int first_scored,
                     bool want_hidden, int top_k_signal, std::vector<Router>& scorers, Scored& s) {
  run_chunk(ctx, chunk, first_scored, want_hidden,
            [&](int i, std::span<const float> logits, std::span<const float> hidden) {
              Position p;
              p.edge_logprob = log_prob(logits, chunk[i + 1]);
              s.positions.push_back(p);
              // Row i decides token i + 1: the history then holds i + 1 tokens.
              s.signals.push_back(router_signal_from_logits(logits, i + 1, top_k_signal));
              s.hiddens.emplace_back(hidden.begin(), hidden.end());
              s.signals.back().hidden = s.hiddens.back();
              for (size_t k = 0; k < scorers.size(); ++k)
                s.scores[k].push_back(scorers[k].score(s.signals.back()));
            });
}

// The cloud's log-probability of the true token at each scored row of one chunk.
std::vector<float> cloud_logprobs(const Passes& passes, const std::vector<TokenId>& chunk,
                                  int first_scored) {
  std::vector<float> cloud_lp;
  if (passes.cloud_local) {
    run_chunk(*passes.cloud_local, chunk, first_scored, false,
              [&](int i, std::span<const float> logits, std::span<const float>) {
                cloud_lp.push_back(log_prob(logits, chunk[i + 1]));
              });
  } else {
    for (const CloudRow& r : passes.http->rows(chunk, first_scored, 0))
      cloud_lp.push_back(r.true_logprob);
  }
  return cloud_lp;
}

// Runs every planned chunk through the edge and the cloud, progress on stderr.
Scored score_chunks(const WikitextEvalOptions& o, const ChunkPlan& plan, const Model& edge,
                    const Policies& policies, int top_k_signal, const Passes& passes) {
  Scored s;
  s.scores.resize(policies.size());
  std::vector<Router> scorers;
  for (size_t k = 0; k < policies.size(); ++k)
    scorers.emplace_back(policies.config_for(k, 0).router);
  const bool want_hidden = !o.routers.empty();
  for (int c = 0; c < plan.n_chunks; ++c) {
    const std::vector<TokenId> chunk =
        text_chunk(plan.all, o.chunk_offset + c, o.chunk_tokens, edge);
    const size_t base = s.positions.size();
    score_edge_rows(passes.edge, chunk, plan.first_scored, want_hidden, top_k_signal, scorers, s);
    const std::vector<float> cloud_lp = cloud_logprobs(passes, chunk, plan.first_scored);
    for (size_t i = 0; i < cloud_lp.size(); ++i) s.positions[base + i].cloud_logprob = cloud_lp[i];
    std::fprintf(stderr, "\r[wikitext] chunk %d/%d", c + 1, plan.n_chunks);
  }
  std::fprintf(stderr, "\n");
  // The hidden rows no longer move: point every signal at its own.
  for (size_t i = 0; i < s.signals.size(); ++i) s.signals[i].hidden = s.hiddens[i];
  return s;
}

// results.json without its routes and oracle curve: the run's settings and the two models' NLL.
json results_head(const WikitextEvalOptions& o, const ChunkPlan& plan, size_t scored_positions,
                  double nll_edge, double nll_cloud) {
  const std::string path = o.data_dir + "/wikitext-2/" + o.split + ".txt";
  return {{"command", o.command},
          {"task", o.split == "test" ? "wikitext" : "wikitext-" + o.split},
          {"source", path},
          {"chunks", plan.n_chunks},
          {"chunk_offset", o.chunk_offset},
          {"router", o.routers.empty() ? std::string() : o.routers.front()},
          {"routers", o.routers},
          {"chunk_tokens", o.chunk_tokens},
          {"scored_positions", scored_positions},
          {"edge", {{"path", o.edge_model}, {"nll", nll_edge}, {"ppl", std::exp(nll_edge)}}},
          {"cloud",
           {{"source", o.cloud_model.empty() ? o.cloud_url : o.cloud_model},
            {"nll", nll_cloud},
            {"ppl", std::exp(nll_cloud)}}},
          {"gap_nats", nll_edge - nll_cloud}};
}

// One row of results.json's "routes": policy k at a target rate, run online as on a device
// (the controller sees the scores in order), against the hindsight threshold and the oracle.
json route_row(const Policies& policies, size_t k, double rate, const Scored& s) {
  std::vector<bool> flags;
  for (const RouteDecision& d : replay_decisions(policies.config_for(k, rate).router, s.signals))
    flags.push_back(d.cloud);
  const RoutedLoglik online = routed(s.positions, flags);
  const WindowShares windows = window_shares(flags, rate, kShareWindow);
  std::vector<Position> with_scores = s.positions;
  for (size_t i = 0; i < s.positions.size(); ++i) with_scores[i].score = s.scores[k][i];
  const RoutedLoglik hindsight = by_score_quantile(with_scores, rate);
  const RoutedLoglik best = oracle(s.positions, online.share);
  return {{"policy", policies.names()[k]},
          {"target", rate},
          {"share", online.share},
          {"windows_within_1pt", windows.within_1pt},
          {"max_window_deviation", windows.max_deviation},
          {"nll", online.nll},
          {"gap_recovered", online.gap_recovered},
          {"hindsight_threshold_gap_recovered", hindsight.gap_recovered},
          {"oracle_gap_recovered", best.gap_recovered},
          {"oracle_nll", best.nll},
          {"of_oracle", best.gap_recovered > 0 ? online.gap_recovered / best.gap_recovered : 0.0}};
}

// The oracle's gap recovered at fixed shares: the ceiling curve of the plots.
json oracle_curve(const std::vector<Position>& positions) {
  json curve = json::array();
  for (double s : {0.0, 0.01, 0.02, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5}) {
    curve.push_back({{"share", s}, {"gap_recovered", oracle(positions, s).gap_recovered}});
  }
  return curve;
}

}  // namespace

int run_wikitext_eval(const WikitextEvalOptions& o) {
  check_cloud_source(o);
  const Models models = load_models(o);
  const ChunkPlan plan = plan_chunks(o, *models.edge);

  ContextParams cp;
  cp.n_ctx = o.chunk_tokens;
  cp.n_threads = o.threads;
  Context edge_ctx(*models.edge, cp);
  std::unique_ptr<Context> cloud_ctx;
  if (models.cloud_local) cloud_ctx = std::make_unique<Context>(*models.cloud_local, cp);

  const Policies policies(o, *models.edge);
  const int top_k_signal = policies.signal_top_k();
  const Scored scored = score_chunks(o, plan, *models.edge, policies, top_k_signal,
                                     Passes{edge_ctx, cloud_ctx.get(), models.http.get()});

  const double nll_edge = mean_nll_edge(scored.positions);
  const double nll_cloud = mean_nll_cloud(scored.positions);
  json results = results_head(o, plan, scored.positions.size(), nll_edge, nll_cloud);
  json rows = json::array();
  for (size_t k = 0; k < policies.size(); ++k) {
    for (double rate : o.rates) rows.push_back(route_row(policies, k, rate, scored));
  }
  results["routes"] = rows;
  results["oracle_curve"] = oracle_curve(scored.positions);

  fs::create_directories(o.out_dir);
  std::ofstream(fs::path(o.out_dir) / "results.json") << results.dump(1) << "\n";
  write_loglik_report(o.out_dir, results.dump(), policies.names(), o.plots);
  std::fprintf(stderr, "edge NLL %.4f, cloud NLL %.4f, gap %.3f nats; results in %s\n", nll_edge,
               nll_cloud, nll_edge - nll_cloud, o.out_dir.c_str());
  if (o.json) std::printf("%s\n", results.dump(1).c_str());
  return 0;
}

}  // namespace tandem::cli
