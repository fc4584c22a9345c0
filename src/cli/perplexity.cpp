// tandem perplexity: perplexity of a model on a text, like llama.cpp's llama-perplexity, and
// optionally the KL divergence and top-1 agreement against a base model (--kl-base).
//
// The text is tokenized whole (BOS as the vocab says), cut into non-overlapping chunks of n_ctx
// tokens; the first token of every chunk is replaced by BOS when the vocab adds one; each chunk
// is evaluated from an empty cache and only its second half is scored (logits at positions
// n_ctx/2 .. n_ctx-2 predict the tokens after them). Statistics: include/tandem/perplexity.h.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/model_flag.h"
#include "tandem/engine.h"
#include "tandem/error.h"
#include "tandem/perplexity.h"

namespace tandem::cli {
namespace {

class PerplexityCommand : public Command {
 public:
  explicit PerplexityCommand(CLI::App& app)
      : Command(app.add_subcommand(
            "perplexity",
            "Perplexity on a text file, like llama-perplexity: non-overlapping chunks of -c "
            "tokens, the second half of each scored; prints [chunk]running-PPL and the final "
            "PPL +/- standard error. --kl-base also reports KL(base||model) and top-1 "
            "agreement.")) {
    model_flag_.add_to(*sub_, ModelRole::Edge, "GGUF model file");
    sub_->add_option("-f,--file", file_, "Text file")->required();
    sub_->add_option("-c,--ctx-size", n_ctx_, "Tokens per chunk")
        ->capture_default_str()
        ->check(CLI::Range(4, 1 << 20));
    sub_->add_option("-b,--batch-size", n_batch_, "Tokens per forward pass (default: -c)")
        ->check(CLI::Range(1, 1 << 20));
    sub_->add_option("-t,--threads", threads_, "Threads (default: all cores)")
        ->check(CLI::Range(0, 1024));
    add_kv_cache_flags(sub_, type_k_, type_v_);
    sub_->add_option("--chunks", max_chunks_, "Evaluate at most this many chunks (0: all)")
        ->check(CLI::Range(0, 1 << 30));
    sub_->add_option("--kl-base", kl_base_,
                     "Base model (same vocabulary): also report mean KL(base||model) and top-1 "
                     "agreement on the same tokens");
    sub_->add_flag("--json", json_, "Print the results as JSON on stdout");
  }

  int run() override {
    model_ = model_flag_.resolve(ModelRole::Edge);
    if (n_batch_ <= 0 || n_batch_ > n_ctx_) n_batch_ = n_ctx_;
    const std::string text = read_text();

    const auto t0 = std::chrono::steady_clock::now();
    auto model = Model::load(model_);
    const std::unique_ptr<Model> base = load_base(*model);
    const std::vector<TokenId> tokens = model->tokenize(text, true, false);
    const int n_chunk = count_chunks(tokens.size());
    std::fprintf(
        stderr, "perplexity: %s: %zu tokens, %d chunks of %d (scoring %d per chunk), batch %d%s\n",
        model_.c_str(), tokens.size(), n_chunk, n_ctx_, n_ctx_ - 1 - eval::first_scored(n_ctx_),
        n_batch_, base ? (", KL base " + kl_base_).c_str() : "");

    ContextParams cp;
    cp.n_ctx = n_ctx_;
    cp.n_threads = threads_;
    cp.type_k = type_k_;
    cp.type_v = type_v_;
    Context ctx(*model, cp);
    std::unique_ptr<Context> bctx;
    if (base) bctx = std::make_unique<Context>(*base, cp);

    const Tally tally = score_chunks(*model, tokens, n_chunk, ctx, bctx.get(), t0);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    print_summary(tally, bctx != nullptr, secs);
    if (json_) print_json(tally, tokens.size(), n_chunk, bctx != nullptr, secs);
    return 0;
  }

 private:
  // What the scored positions add up to.
  struct Tally {
    eval::PplStats ppl, base_ppl;  // the model's, and the base's (--kl-base)
    eval::KlStats kl;              // KL(base||model) and top-1 agreement (--kl-base)
    std::vector<double> running;   // the model's PPL after each chunk
  };

  std::string read_text() const {
    std::ifstream in(file_, std::ios::binary);
    if (!in) throw Error("cannot read text file '" + file_ + "'");
    return std::string((std::istreambuf_iterator<char>(in)), {});
  }

  // The --kl-base model (null without it); it must score over the same vocabulary.
  std::unique_ptr<Model> load_base(const Model& model) const {
    if (kl_base_.empty()) return nullptr;
    auto base = Model::load(kl_base_);
    if (base->info().n_vocab != model.info().n_vocab) {
      throw Error("--kl-base: '" + kl_base_ + "' has " + std::to_string(base->info().n_vocab) +
                  " tokens, '" + model_ + "' has " + std::to_string(model.info().n_vocab));
    }
    return base;
  }

  // The chunks to evaluate (--chunks at most); a text too short for one is an error.
  int count_chunks(size_t n_tokens) const {
    const int n_chunk = eval::n_chunks(static_cast<int64_t>(n_tokens), n_ctx_, max_chunks_);
    if (n_chunk == 0) {
      throw Error("'" + file_ + "' has " + std::to_string(n_tokens) +
                  " tokens; need at least 2 * n_ctx = " + std::to_string(2 * n_ctx_) +
                  " for a useful estimate and at least n_ctx for one chunk (try a smaller -c)");
    }
    return n_chunk;
  }

  // Every chunk in turn, with progress on stderr ("[chunk]running-PPL," as llama-perplexity,
  // and on a terminal an estimate of the time left after the first).
  Tally score_chunks(const Model& model, const std::vector<TokenId>& tokens, int n_chunk,
                     Context& ctx, Context* bctx, std::chrono::steady_clock::time_point t0) const {
    Tally tally;
    const bool tty = stderr_is_tty();
    for (int c = 0; c < n_chunk; ++c) {
      score_chunk(model, tokens, static_cast<size_t>(c) * n_ctx_, ctx, bctx, tally);
      tally.running.push_back(tally.ppl.ppl());
      if (tty && c == 0) {
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::fprintf(stderr, "first chunk took %.2f s, about %.1f s for all\n", s, s * n_chunk);
      }
      std::fprintf(stderr, "[%d]%.4f,", c + 1, tally.ppl.ppl());
      std::fflush(stderr);
    }
    std::fprintf(stderr, "\n");
    return tally;
  }

  // One chunk, tokens[start, start + n_ctx), from empty caches in passes of n_batch_ tokens
  // (its first token BOS where the vocabulary adds one). Rows first .. n_ctx - 2 are scored:
  // row p's logits predict token p + 1.
  void score_chunk(const Model& model, const std::vector<TokenId>& tokens, size_t start,
                   Context& ctx, Context* bctx, Tally& tally) const {
    const int first = eval::first_scored(n_ctx_);
    const bool add_bos = model.adds_bos();
    ctx.clear(0);
    if (bctx) bctx->clear(0);
    std::vector<BatchToken> batch;
    for (int b0 = 0; b0 < n_ctx_; b0 += n_batch_) {
      const int b1 = std::min(n_ctx_, b0 + n_batch_);
      batch.clear();
      for (int p = b0; p < b1; ++p) {
        TokenId t = tokens[start + p];
        if (p == 0 && add_bos) t = model.bos();
        const bool want = p >= first && p <= n_ctx_ - 2;
        batch.push_back({t, p, 0, want, false});
      }
      ctx.decode(batch);
      if (bctx) bctx->decode(batch);
      for (int p = std::max(b0, first); p < b1 && p <= n_ctx_ - 2; ++p) {
        const auto l = ctx.logits(p - b0);
        const TokenId next = tokens[start + p + 1];
        tally.ppl.add_logprob(eval::token_logprob(l, next));
        if (bctx) {
          const auto bl = bctx->logits(p - b0);
          tally.base_ppl.add_logprob(eval::token_logprob(bl, next));
          tally.kl.add(bl, l);
        }
      }
    }
  }

  // The final estimate on stderr, in llama-perplexity's words.
  static void print_summary(const Tally& t, bool has_base, double secs) {
    std::fprintf(stderr, "Final estimate: PPL = %.4f +/- %.5f\n", t.ppl.ppl(), t.ppl.ppl_error());
    if (has_base) {
      std::fprintf(stderr, "Base PPL = %.4f +/- %.5f\n", t.base_ppl.ppl(), t.base_ppl.ppl_error());
      std::fprintf(stderr, "Mean ln(PPL(model)/PPL(base)) = %.6f\n",
                   t.ppl.mean_nll() - t.base_ppl.mean_nll());
      std::fprintf(stderr, "Mean KLD = %.6f +/- %.6f\n", t.kl.mean_kl(), t.kl.kl_error());
      std::fprintf(stderr, "Same top-1 = %.3f +/- %.3f %%\n", 100 * t.kl.top1(),
                   100 * t.kl.top1_error());
    }
    std::fprintf(stderr, "%lld tokens scored in %.2f s\n", static_cast<long long>(t.ppl.count),
                 secs);
  }

  // --json: the same figures as one line on stdout.
  void print_json(const Tally& t, size_t n_tokens, int n_chunk, bool has_base, double secs) const {
    nlohmann::json j;
    j["model"] = model_;
    j["file"] = file_;
    j["n_ctx"] = n_ctx_;
    j["n_tokens"] = n_tokens;
    j["n_chunks"] = n_chunk;
    j["n_scored"] = t.ppl.count;
    j["ppl"] = t.ppl.ppl();
    j["ppl_se"] = t.ppl.ppl_error();
    j["running_ppl"] = t.running;
    j["seconds"] = secs;
    if (has_base) {
      j["kl_base"] = kl_base_;
      j["base_ppl"] = t.base_ppl.ppl();
      j["base_ppl_se"] = t.base_ppl.ppl_error();
      j["kl"] = t.kl.mean_kl();
      j["kl_se"] = t.kl.kl_error();
      j["top1"] = t.kl.top1();
      j["top1_se"] = t.kl.top1_error();
    }
    std::printf("%s\n", j.dump().c_str());
  }

  ModelFlag model_flag_;
  std::string model_, file_, kl_base_;
  int n_ctx_ = 512, n_batch_ = 0, threads_ = 0, max_chunks_ = 0;
  KvCacheType type_k_ = KvCacheType::F32, type_v_ = KvCacheType::F32;
  bool json_ = false;
};

}  // namespace

std::unique_ptr<Command> make_perplexity_command(CLI::App& app) {
  return std::make_unique<PerplexityCommand>(app);
}

}  // namespace tandem::cli
