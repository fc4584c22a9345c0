// tandem bench: prompt processing (pp) and text generation (tg) speed, measured separately
// like llama-bench: one warm-up run, then -r timed repetitions; mean and standard deviation of
// tokens per second.
#include <sys/resource.h>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/commands.h"
#include "cli/model_flag.h"
#include "tandem/engine.h"
#include "tandem/error.h"

namespace tandem::cli {
namespace {

struct Stats {
  double mean = 0, sd = 0;
  std::vector<double> samples;
};

Stats summarize(const std::vector<double>& v) {
  Stats s;
  s.samples = v;
  if (v.empty()) return s;
  for (double x : v) s.mean += x;
  s.mean /= v.size();
  if (v.size() > 1) {
    double ss = 0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(ss / (v.size() - 1));
  }
  return s;
}

class BenchCommand : public Command {
 public:
  explicit BenchCommand(CLI::App& app)
      : Command(app.add_subcommand("bench", "Measure prompt processing and generation speed")) {
    model_flag_.add_to(*sub_, ModelRole::Edge, "GGUF model file");
    sub_->add_option("-p,--n-prompt", n_prompt_, "Prompt tokens for the pp test (0: skip)")
        ->capture_default_str()
        ->check(CLI::Range(0, 1 << 16));
    sub_->add_option("-n,--n-gen", n_gen_, "Generated tokens for the tg test (0: skip)")
        ->capture_default_str()
        ->check(CLI::Range(0, 1 << 16));
    sub_->add_option("-t,--threads", threads_, "Threads")->capture_default_str();
    add_kv_cache_flags(sub_, type_k_, type_v_);
    sub_->add_option("-r,--repetitions", reps_, "Timed repetitions")
        ->capture_default_str()
        ->check(CLI::Range(1, 1000));
    sub_->add_option("-b,--batch-size", batch_, "Tokens per forward pass in pp")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 16));
    sub_->add_option("--n-parallel", n_parallel_,
                     "Also time batched decode: this many sequences generating -n tokens each, "
                     "one token of every sequence per forward pass (a server's load; 0: skip)")
        ->check(CLI::Range(0, 256))
        ->capture_default_str();
    sub_->add_option("--depth", depth_,
                     "Context already in each --n-parallel sequence before its timed tokens "
                     "(random tokens, prefilled once; as llama-bench's -d): attention's cost "
                     "at a server's context lengths")
        ->check(CLI::Range(0, 65536))
        ->capture_default_str();
    sub_->add_flag("--repack", repack_,
                   "Load with packed weights for the batched kernels, as tandem serve does");
    sub_->add_flag("--json", json_, "Print results as JSON on stdout");
  }

  int run() override {
    model_ = model_flag_.resolve(ModelRole::Edge);
    LoadOptions lo;
    lo.repack = repack_;
    auto model = Model::load(model_, lo);
    Context ctx(*model, context_params());
    Workloads work(*this, ctx, model->info().n_vocab);
    nlohmann::json j = describe(*model, ctx);
    if (n_prompt_ > 0) {
      const Stats s = measure([&] { return work.pp(); }, "pp");
      j["pp"] = {{"n", n_prompt_}, {"tok_s", s.mean}, {"sd", s.sd}, {"samples", s.samples}};
      std::fprintf(stderr, "pp%-5d %10.2f ± %.2f tok/s\n", n_prompt_, s.mean, s.sd);
    }
    if (n_gen_ > 0) {
      const Stats s = measure([&] { return work.tg(); }, "tg");
      j["tg"] = {{"n", n_gen_}, {"tok_s", s.mean}, {"sd", s.sd}, {"samples", s.samples}};
      std::fprintf(stderr, "tg%-5d %10.2f ± %.2f tok/s\n", n_gen_, s.mean, s.sd);
    }
    if (n_parallel_ > 0 && n_gen_ > 0) {
      const Stats s = measure([&] { return work.tg_parallel(); }, "tg parallel");
      j["tg_parallel"] = {{"n", n_gen_},     {"n_parallel", n_parallel_},
                          {"depth", depth_}, {"tok_s", s.mean},
                          {"sd", s.sd},      {"samples", s.samples}};
      std::fprintf(stderr, "tg%d x %d seqs @ d%d %8.2f ± %.2f tok/s\n", n_gen_, n_parallel_, depth_,
                   s.mean, s.sd);
    }
    report_peak_rss(j);
    if (json_) std::printf("%s\n", j.dump().c_str());
    return 0;
  }

 private:
  using Clock = std::chrono::steady_clock;

  // The timed work, each returning tokens per second. Tokens are random (one seeded generator
  // for the whole run): the speed does not depend on which tokens they are.
  class Workloads {
   public:
    Workloads(const BenchCommand& b, Context& ctx, int n_vocab)
        : b_(b), ctx_(ctx), dist_(0, n_vocab - 1) {}

    // pp: a prompt of n_prompt tokens from empty, its last token's logits wanted.
    double pp() {
      const auto t0 = Clock::now();
      prefill(0, b_.n_prompt_, true);
      return b_.n_prompt_ / std::chrono::duration<double>(Clock::now() - t0).count();
    }

    // tg: n_gen tokens from empty, one per forward pass.
    double tg() {
      ctx_.clear(0);
      const auto t0 = Clock::now();
      for (int i = 0; i < b_.n_gen_; ++i) {
        const BatchToken bt{dist_(rng_), i, 0, true};
        ctx_.decode(std::span<const BatchToken>(&bt, 1));
      }
      return b_.n_gen_ / std::chrono::duration<double>(Clock::now() - t0).count();
    }

    // n_parallel sequences decoding together: every step is one batch of a token per sequence,
    // each wanting its logits (as the server's decode rows do). Tokens of all sequences per
    // second. With --depth, every sequence first holds depth tokens (prefilled once, kept
    // between repetitions: each one truncates back to them).
    double tg_parallel() {
      const int n_parallel = b_.n_parallel_, depth = b_.depth_;
      if (!depth_filled_) {
        for (int s = 0; s < n_parallel; ++s) prefill(s, depth, false);
        depth_filled_ = true;
      }
      for (int s = 0; s < n_parallel; ++s) ctx_.truncate(s, depth);
      std::vector<BatchToken> batch(static_cast<size_t>(n_parallel));
      const auto t0 = Clock::now();
      for (int i = 0; i < b_.n_gen_; ++i) {
        for (int s = 0; s < n_parallel; ++s) batch[s] = {dist_(rng_), depth + i, s, true};
        ctx_.decode(batch);
      }
      return double(b_.n_gen_) * n_parallel /
             std::chrono::duration<double>(Clock::now() - t0).count();
    }

   private:
    // Sequence `seq` from empty to n random tokens, batch_ tokens per forward pass; the last
    // token's logits wanted if asked (a prompt's, as llama-bench's pp test).
    void prefill(int seq, int n, bool last_logits) {
      ctx_.clear(seq);
      std::vector<BatchToken> batch;
      for (int b = 0; b < n; b += b_.batch_) {
        const int e = std::min(n, b + b_.batch_);
        batch.clear();
        for (int i = b; i < e; ++i)
          batch.push_back({dist_(rng_), i, seq, last_logits && i + 1 == n});
        ctx_.decode(batch);
      }
    }

    const BenchCommand& b_;
    Context& ctx_;
    std::mt19937 rng_{42};
    std::uniform_int_distribution<int> dist_;
    bool depth_filled_ = false;
  };

  // One context for every test: long enough for the longest, a sequence per --n-parallel.
  ContextParams context_params() const {
    ContextParams cp;
    cp.n_ctx = std::max(n_prompt_, depth_ + n_gen_) + 1;
    cp.n_threads = threads_;
    cp.type_k = type_k_;
    cp.type_v = type_v_;
    cp.n_seq = std::max(1, n_parallel_);
    return cp;
  }

  // One warm-up run, then reps_ timed ones (progress on a terminal).
  template <class Fn>
  Stats measure(Fn&& fn, const char* label) const {
    fn();  // warm-up
    std::vector<double> v;
    for (int r = 0; r < reps_; ++r) {
      v.push_back(fn());
      if (stderr_is_tty()) std::fprintf(stderr, "\r%s: %d/%d", label, r + 1, reps_);
    }
    if (stderr_is_tty()) std::fprintf(stderr, "\r\033[K");
    return summarize(v);
  }

  // The results' header (model, threads, cache types, SIMD, sizes), and its line on stderr.
  nlohmann::json describe(const Model& model, const Context& ctx) const {
    nlohmann::json j;
    j["model"] = model_;
    j["arch"] = model.info().arch;
    j["threads"] = ctx.n_threads();
    j["type_k"] = kv_cache_type_name(ctx.type_k());  // llama-bench's names
    j["type_v"] = kv_cache_type_name(ctx.type_v());
    j["simd_target"] = simd_target();
    j["repetitions"] = reps_;
    j["model_bytes"] = model.info().file_bytes;
    j["packed_bytes"] = model.info().packed_bytes;
    std::fprintf(stderr, "model %s (%s, %.1f MiB), %d threads, SIMD %s", model_.c_str(),
                 model.info().arch.c_str(), model.info().file_bytes / 1048576.0, ctx.n_threads(),
                 simd_target().c_str());
    if (repack_) std::fprintf(stderr, ", packed %.1f MiB", model.info().packed_bytes / 1048576.0);
    std::fprintf(stderr, "\n");
    return j;
  }

  static void report_peak_rss(nlohmann::json& j) {
    struct rusage usage {};
    getrusage(RUSAGE_SELF, &usage);
    const double peak_rss_mib = usage.ru_maxrss / 1024.0;  // ru_maxrss is in KiB on Linux
    j["peak_rss_mib"] = peak_rss_mib;
    std::fprintf(stderr, "peak RSS %.1f MiB\n", peak_rss_mib);
  }

  ModelFlag model_flag_;
  std::string model_;
  KvCacheType type_k_ = KvCacheType::F32, type_v_ = KvCacheType::F32;
  int n_prompt_ = 512, n_gen_ = 128, threads_ = 2, reps_ = 5, batch_ = 512, n_parallel_ = 0,
      depth_ = 0;
  bool json_ = false, repack_ = false;
};

}  // namespace

std::unique_ptr<Command> make_bench_command(CLI::App& app) {
  return std::make_unique<BenchCommand>(app);
}

}  // namespace tandem::cli
