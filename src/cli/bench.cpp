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
#include "tandem/error.h"
#include "tandem/engine.h"

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
    sub_->add_option("-m,--model", model_, "GGUF model file")->default_str(default_model_path());
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
    if (model_.empty()) model_ = default_model_path();
    LoadOptions lo;
    lo.repack = repack_;
    auto model = Model::load(model_, lo);
    ContextParams cp;
    cp.n_ctx = std::max(n_prompt_, depth_ + n_gen_) + 1;
    cp.n_threads = threads_;
    cp.type_k = type_k_;
    cp.type_v = type_v_;
    cp.n_seq = std::max(1, n_parallel_);
    Context ctx(*model, cp);
    std::mt19937 rng(42);
    std::uniform_int_distribution<int> dist(0, model->info().n_vocab - 1);
    using Clock = std::chrono::steady_clock;

    // Sequence `seq` from empty to n random tokens, batch_ tokens per forward pass; the last
    // token's logits wanted if asked (a prompt's, as llama-bench's pp test).
    auto prefill = [&](int seq, int n, bool last_logits) {
      ctx.clear(seq);
      std::vector<BatchToken> batch;
      for (int b = 0; b < n; b += batch_) {
        const int e = std::min(n, b + batch_);
        batch.clear();
        for (int i = b; i < e; ++i) batch.push_back({dist(rng), i, seq, last_logits && i + 1 == n});
        ctx.decode(batch);
      }
    };
    auto run_pp = [&]() {
      const auto t0 = Clock::now();
      prefill(0, n_prompt_, true);
      return n_prompt_ / std::chrono::duration<double>(Clock::now() - t0).count();
    };
    auto run_tg = [&]() {
      ctx.clear(0);
      const auto t0 = Clock::now();
      for (int i = 0; i < n_gen_; ++i) {
        const BatchToken bt{dist(rng), i, 0, true};
        ctx.decode(std::span<const BatchToken>(&bt, 1));
      }
      return n_gen_ / std::chrono::duration<double>(Clock::now() - t0).count();
    };
    // n_parallel sequences decoding together: every step is one batch of a token per sequence,
    // each wanting its logits (as the server's decode rows do). Tokens of all sequences per second.
    // With --depth, every sequence first holds depth_ tokens (prefilled once, kept between
    // repetitions: each one truncates back to them).
    bool depth_filled = false;
    auto run_tg_parallel = [&]() {
      if (!depth_filled) {
        for (int s = 0; s < n_parallel_; ++s) prefill(s, depth_, false);
        depth_filled = true;
      }
      for (int s = 0; s < n_parallel_; ++s) ctx.truncate(s, depth_);
      std::vector<BatchToken> batch(static_cast<size_t>(n_parallel_));
      const auto t0 = Clock::now();
      for (int i = 0; i < n_gen_; ++i) {
        for (int s = 0; s < n_parallel_; ++s) batch[s] = {dist(rng), depth_ + i, s, true};
        ctx.decode(batch);
      }
      return double(n_gen_) * n_parallel_ /
             std::chrono::duration<double>(Clock::now() - t0).count();
    };
    auto measure = [&](auto&& fn, const char* label) {
      fn();  // warm-up
      std::vector<double> v;
      for (int r = 0; r < reps_; ++r) {
        v.push_back(fn());
        if (stderr_is_tty()) std::fprintf(stderr, "\r%s: %d/%d", label, r + 1, reps_);
      }
      if (stderr_is_tty()) std::fprintf(stderr, "\r\033[K");
      return summarize(v);
    };

    nlohmann::json j;
    j["model"] = model_;
    j["arch"] = model->info().arch;
    j["threads"] = ctx.n_threads();
    j["type_k"] = kv_cache_type_name(ctx.type_k());  // llama-bench's names
    j["type_v"] = kv_cache_type_name(ctx.type_v());
    j["simd_target"] = simd_target();
    j["repetitions"] = reps_;
    j["model_bytes"] = model->info().file_bytes;
    j["packed_bytes"] = model->info().packed_bytes;
    std::fprintf(stderr, "model %s (%s, %.1f MiB), %d threads, SIMD %s", model_.c_str(),
                 model->info().arch.c_str(), model->info().file_bytes / 1048576.0, ctx.n_threads(),
                 simd_target().c_str());
    if (repack_) std::fprintf(stderr, ", packed %.1f MiB", model->info().packed_bytes / 1048576.0);
    std::fprintf(stderr, "\n");
    if (n_prompt_ > 0) {
      const Stats s = measure(run_pp, "pp");
      j["pp"] = {{"n", n_prompt_}, {"tok_s", s.mean}, {"sd", s.sd}, {"samples", s.samples}};
      std::fprintf(stderr, "pp%-5d %10.2f ± %.2f tok/s\n", n_prompt_, s.mean, s.sd);
    }
    if (n_gen_ > 0) {
      const Stats s = measure(run_tg, "tg");
      j["tg"] = {{"n", n_gen_}, {"tok_s", s.mean}, {"sd", s.sd}, {"samples", s.samples}};
      std::fprintf(stderr, "tg%-5d %10.2f ± %.2f tok/s\n", n_gen_, s.mean, s.sd);
    }
    if (n_parallel_ > 0 && n_gen_ > 0) {
      const Stats s = measure(run_tg_parallel, "tg parallel");
      j["tg_parallel"] = {{"n", n_gen_},     {"n_parallel", n_parallel_},
                          {"depth", depth_}, {"tok_s", s.mean},
                          {"sd", s.sd},      {"samples", s.samples}};
      std::fprintf(stderr, "tg%d x %d seqs @ d%d %8.2f ± %.2f tok/s\n", n_gen_, n_parallel_, depth_,
                   s.mean, s.sd);
    }
    struct rusage usage {};
    getrusage(RUSAGE_SELF, &usage);
    const double peak_rss_mib = usage.ru_maxrss / 1024.0;  // ru_maxrss is in KiB on Linux
    j["peak_rss_mib"] = peak_rss_mib;
    std::fprintf(stderr, "peak RSS %.1f MiB\n", peak_rss_mib);
    if (json_) std::printf("%s\n", j.dump().c_str());
    return 0;
  }

 private:
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
