#include <chrono>

#include "common/error.h"
#include "runtime/model_internals.h"
#include "tandem/engine.h"
#include "tokenizer/tokenizer.h"

namespace tandem {

GenerateResult generate(Context& ctx, std::span<const TokenId> prompt, int n_predict,
                        Sampler& sampler, const std::function<bool(std::string_view)>& on_text,
                        int seq) {
  using Clock = std::chrono::steady_clock;
  const Tokenizer& tok = ModelInternals::tokenizer(ctx.model());
  GenerateResult res;
  res.n_prompt = static_cast<int>(prompt.size());
  if (prompt.empty()) throw Error("generate: the prompt is empty (no tokens to start from)");
  const int start = ctx.seq_length(seq);
  if (start + static_cast<int>(prompt.size()) > ctx.n_ctx()) {
    throw Error("generate: the prompt has " + std::to_string(prompt.size()) + " tokens but only " +
                std::to_string(ctx.n_ctx() - start) + " positions are left in the context (-c " +
                std::to_string(ctx.n_ctx()) + ")");
  }
  for (TokenId t : prompt) sampler.accept(t);

  // Prefill in chunks so the scratch stays bounded for long prompts.
  const auto t0 = Clock::now();
  constexpr int kChunk = 512;
  std::vector<BatchToken> batch;
  for (size_t b = 0; b < prompt.size(); b += kChunk) {
    const size_t e = std::min(prompt.size(), b + kChunk);
    batch.clear();
    for (size_t i = b; i < e; ++i) {
      batch.push_back({prompt[i], static_cast<int32_t>(start + i), seq, i + 1 == prompt.size()});
    }
    ctx.decode(batch);
  }
  const auto t1 = Clock::now();
  res.prompt_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();

  StreamDecoder stream(tok);
  std::span<const float> logits = ctx.logits(static_cast<int>(batch.size()) - 1);
  for (int i = 0; i < n_predict; ++i) {
    const TokenId next = sampler.sample(logits);
    if (tok.is_eog(next)) {
      res.stopped_at_eog = true;
      res.stop = StopReason::EndOfGeneration;
      break;
    }
    sampler.accept(next);
    res.ids.push_back(next);
    const std::string piece = stream.push(next);
    res.text += piece;
    if (on_text && !piece.empty() && !on_text(piece)) {
      res.stop = StopReason::Callback;
      break;
    }
    if (i + 1 == n_predict) break;
    if (ctx.seq_length(seq) >= ctx.n_ctx()) {  // context full: stop and say so, do not wrap
      res.stop = StopReason::ContextFull;
      break;
    }
    const BatchToken bt{next, ctx.seq_length(seq), seq, true};
    ctx.decode(std::span<const BatchToken>(&bt, 1));
    logits = ctx.logits(0);
  }
  const std::string tail = stream.flush();
  res.text += tail;
  if (on_text && !tail.empty()) on_text(tail);
  res.gen_ms = std::chrono::duration<double, std::milli>(Clock::now() - t1).count();
  return res;
}

}  // namespace tandem
