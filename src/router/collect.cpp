// Trace collection (tandem/router_tools.h): the edge teacher-forced over each source, the cloud
// over the same tokens, one TraceRecord per recorded row, written a whole sequence at a time.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/splitmix.h"
#include "router/trace.h"
#include "tandem/router.h"
#include "tandem/router_tools.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string hms(double s) {
  char buf[32];
  const long t = std::lround(std::max(0.0, s));
  std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  return buf;
}

// Rows per forward pass: each row's logits are n_vocab floats (1 MiB for Gemma's 262k).
constexpr int kMaxRows = 128;

class TraceCollector {
 public:
  TraceCollector(const Model& edge, const std::vector<TraceSource>& sources,
                 const TraceCollection& c)
      : edge_(edge), c_(c), writer_(c.out, header(), c.resume) {
    if (writer_.n_present()) {
      std::fprintf(stderr, "[collect] resuming %s: %zu sequences present%s\n", c.out.c_str(),
                   writer_.n_present(),
                   writer_.cut_bytes() ? (", cut a half-written tail of " +
                                          std::to_string(writer_.cut_bytes()) + " bytes")
                                             .c_str()
                                       : "");
    }
    int max_len = 0;
    for (const TraceSource& src : sources)
      max_len = std::max(max_len, static_cast<int>(src.tokens.size()));
    ContextParams cp;
    cp.n_ctx = max_len;
    cp.n_threads = c.n_threads;
    edge_ctx_ = std::make_unique<Context>(edge, cp);
    if (c.cloud_model) cloud_ctx_ = std::make_unique<Context>(*c.cloud_model, cp);
    make_probe(max_len);
  }

  void run(const std::vector<TraceSource>& sources) {
    const auto t0 = Clock::now();
    int done = 0, todo = 0;
    for (const TraceSource& src : sources) todo += !writer_.has(src.id);
    size_t records = 0;
    for (const TraceSource& src : sources) {
      if (writer_.has(src.id)) continue;
      router::TraceSequence seq = trace(src);
      if (probe_ && chosen_for_outcome(seq.id)) measure_outcomes(src, seq, done, todo);
      records += seq.records.size();
      writer_.append(seq);
      ++done;
      const double el = seconds_since(t0);
      std::fprintf(stderr, "\r[collect] sequence %d/%d  %.2f s each  elapsed %s  ETA %s   ", done,
                   todo, el / done, hms(el).c_str(), hms(el / done * (todo - done)).c_str());
    }
    std::fprintf(stderr, "\n[collect] wrote %zu positions in %d sequences to %s (%zu in all)\n",
                 records, done, c_.out.c_str(), writer_.n_present());
    if (probe_) std::fprintf(stderr, "[collect] outcomes continued both ways: %zu\n", outcomes_);
  }

 private:
  router::TraceHeader header() const {
    router::TraceHeader h;
    h.n_embd = static_cast<uint32_t>(edge_.info().n_embd);
    h.top_k = static_cast<uint32_t>(c_.top_k);
    h.n_vocab = static_cast<uint32_t>(edge_.info().n_vocab);
    // vocab_hash is the fingerprint as 16 hex digits.
    h.vocab_fingerprint = std::strtoull(edge_.info().vocab_hash.c_str(), nullptr, 16);
    h.model_name = edge_.info().name;
    return h;
  }

  void make_probe(int max_len) {
    if (c_.outcome_share <= 0) return;
    const int n = c_.outcome_tokens, threads = c_.n_threads;
    if (c_.judge_answer) {
      // Only the edge continues (the cloud gives its top-1): room for a whole answer.
      probe_ = std::make_unique<OutcomeProbe>(edge_, nullptr, max_len, n, threads);
    } else if (c_.cloud_model) {
      probe_ = std::make_unique<OutcomeProbe>(edge_, *c_.cloud_model, max_len, n, threads);
    } else {
      probe_ = std::make_unique<OutcomeProbe>(edge_, c_.cloud_continuation, max_len, n, threads);
    }
  }

  // Whether a sequence is in the outcome sample: a fixed hash of its id, so that a resumed or
  // extended collection picks the same ones.
  bool chosen_for_outcome(uint64_t id) const {
    if (c_.outcome_share >= 1) return true;
    uint64_t state = id;
    return unit_interval(splitmix64(state)) < c_.outcome_share;
  }

  // One row of the edge: its features, and the cloud's view where it came first (over HTTP);
  // otherwise its log-probabilities wait in edge_logp_ for the local cloud's row.
  void on_edge_row(const std::vector<TokenId>& chunk, int first, int i,
                   std::span<const float> logits, std::span<const float> hidden,
                   router::TraceSequence& seq) {
    router::TraceRecord r;
    r.position = i;
    r.true_token = chunk[i + 1];
    r.edge_top1 = argmax(logits);
    const double lse = log_sum_exp(logits);
    r.edge_lp_true = static_cast<float>(logits[chunk[i + 1]] - lse);
    const RouterSignal s = router_signal_from_logits(logits, i, c_.top_k);
    r.entropy = s.entropy;
    r.margin = s.margin;
    for (float p : s.top_probs) r.log_top.push_back(std::log(p));
    r.hidden.assign(hidden.begin(), hidden.end());
    if (!http_rows_.empty()) {
      add_http_cloud(http_rows_[i - first], logits, lse, r);
      seq.records.push_back(std::move(r));
      return;
    }
    seq.records.push_back(std::move(r));
    const int V = edge_.info().n_vocab;
    const size_t at = edge_logp_.size();
    edge_logp_.resize(at + V);
    for (int v = 0; v < V; ++v) edge_logp_[at + v] = static_cast<float>(logits[v] - lse);
  }

  // The cloud's top-n of a row (HTTP): the edge token's log-probability is exact when among
  // them (else bounded by the n-th), the KL sums over them.
  static void add_http_cloud(const CloudRow& c, std::span<const float> logits, double lse,
                             router::TraceRecord& r) {
    r.cloud_lp_true = c.true_logprob;
    r.cloud_top1 = c.top.front().first;
    r.cloud_lp_edge = c.top.back().second;
    r.flags |= router::kCloudEdgeLogprobIsBound | router::kKlOverCloudTopN;
    double kl = 0;
    for (const auto& [tok_id, lp] : c.top) {
      if (tok_id == r.edge_top1) {
        r.cloud_lp_edge = lp;
        r.flags &= ~router::kCloudEdgeLogprobIsBound;
      }
      kl += std::exp(static_cast<double>(lp)) * (lp - (logits[tok_id] - lse));
    }
    r.kl_cloud_edge = static_cast<float>(std::max(0.0, kl));
  }

  // The local cloud's row i, against the edge's log-probabilities of the same row
  // (`row` rows into edge_logp_).
  void add_local_cloud(const std::vector<TokenId>& chunk, int i, size_t row,
                       std::span<const float> logits, router::TraceRecord& r) const {
    const int V = edge_.info().n_vocab;
    const float* le = edge_logp_.data() + row * V;
    const double lse = log_sum_exp(logits);
    r.cloud_top1 = argmax(logits);
    r.cloud_lp_edge = static_cast<float>(logits[r.edge_top1] - lse);
    r.cloud_lp_true = static_cast<float>(logits[chunk[i + 1]] - lse);
    double kl = 0;
    for (int v = 0; v < V; ++v) {
      const double lc = logits[v] - lse;
      kl += std::exp(lc) * (lc - le[v]);
    }
    r.kl_cloud_edge = static_cast<float>(std::max(0.0, kl));
  }

  router::TraceSequence trace(const TraceSource& src) {
    const std::vector<TokenId>& chunk = src.tokens;
    const int L = static_cast<int>(chunk.size());
    const int first = src.first;
    router::TraceSequence seq;
    seq.id = src.id;
    edge_logp_.clear();
    http_rows_.clear();
    if (c_.cloud_rows) http_rows_ = c_.cloud_rows(chunk, first);
    auto on_edge = [&](int i, std::span<const float> logits, std::span<const float> hidden) {
      on_edge_row(chunk, first, i, logits, hidden, seq);
    };
    keep_shared_prefix(chunk, first);
    if (cloud_ctx_) {
      // Both models advance one window at a time: rows of n_vocab floats stay bounded.
      while (edge_ctx_->seq_length(0) < L) {
        const int end = std::min(L, std::max(edge_ctx_->seq_length(0), first) + kMaxRows);
        const size_t first_record = seq.records.size();
        edge_logp_.clear();
        extend_chunk(*edge_ctx_, chunk, end, first, true, on_edge);
        extend_chunk(*cloud_ctx_, chunk, end, first, false,
                     [&](int i, std::span<const float> logits, std::span<const float>) {
                       add_local_cloud(chunk, i, i - first - first_record, logits,
                                       seq.records[i - first]);
                     });
      }
    } else {
      while (edge_ctx_->seq_length(0) < L) {
        const int end = std::min(L, std::max(edge_ctx_->seq_length(0), first) + kMaxRows);
        extend_chunk(*edge_ctx_, chunk, end, first, true, on_edge);
      }
    }
    return seq;
  }

  // The tokens each context holds from the sequence before stay where the new one shares them
  // (a task's items share their few-shot header, which is then prefilled once, not per item);
  // never the row before `first`, whose logits are wanted.
  void keep_shared_prefix(const std::vector<TokenId>& chunk, int first) {
    const int L = static_cast<int>(chunk.size());
    int keep = 0;
    while (keep < static_cast<int>(held_.size()) && keep < L && held_[keep] == chunk[keep]) ++keep;
    keep = std::min(keep, first);
    edge_ctx_->truncate(0, std::min(keep, edge_ctx_->seq_length(0)));
    if (cloud_ctx_) cloud_ctx_->truncate(0, std::min(keep, cloud_ctx_->seq_length(0)));
    held_ = chunk;
  }

  void measure_outcomes(const TraceSource& src, router::TraceSequence& seq, int done, int todo) {
    OutcomeProbe::AnswerJudge judge;
    if (c_.judge_answer) judge = c_.judge_answer(src);
    int divergent = 0, measured = 0;
    for (const router::TraceRecord& r : seq.records) divergent += r.edge_top1 != r.cloud_top1;
    for (router::TraceRecord& r : seq.records) {
      r.outcome =
          c_.judge_answer
              ? probe_->measure_answer(src.tokens, r.position, r.edge_top1, r.cloud_top1, judge)
              : probe_->measure(src.tokens, r.position, r.edge_top1, r.cloud_top1);
      if (r.edge_top1 == r.cloud_top1) continue;
      ++outcomes_;
      // An item of GSM8K takes minutes: say how far its continuations are.
      std::fprintf(stderr, "\r[collect] sequence %d/%d: outcome %d/%d   ", done + 1, todo,
                   ++measured, divergent);
    }
  }

  const Model& edge_;
  const TraceCollection& c_;
  router::TraceWriter writer_;
  std::unique_ptr<Context> edge_ctx_, cloud_ctx_;
  std::unique_ptr<OutcomeProbe> probe_;
  size_t outcomes_ = 0;
  std::vector<TokenId> held_;  // the tokens the contexts hold from the sequence before
  // The edge's rows of one window as log-probabilities, [rows][n_vocab], kept until the cloud's
  // rows of the same window give the KL divergence.
  std::vector<float> edge_logp_;
  std::vector<CloudRow> http_rows_;  // the cloud's rows of the sequence, asked for first
};

}  // namespace

void collect_traces(const Model& edge, const std::vector<TraceSource>& sources,
                    const TraceCollection& collection) {
  TraceCollector collector(edge, sources, collection);
  collector.run(sources);
}

}  // namespace tandem
