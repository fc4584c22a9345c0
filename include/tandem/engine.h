// tandem engine: the public C++ API.
//
//   auto model = tandem::Model::load("gemma-3-270m-q4_k_m.gguf");
//   tandem::Context ctx(*model, {.n_ctx = 2048, .n_seq = 4});
//   std::vector<tandem::BatchToken> batch = {{.token = model->bos(), .pos = 0, .seq = 0},
//                                            {.token = 9707, .pos = 1, .want_logits = true}};
//   ctx.decode(batch);
//   std::span<const float> logits = ctx.logits(batch.size() - 1);
//
// A Model is immutable once loaded and may be shared by several Contexts. A Context owns a KV
// cache with n_seq independent sequence slots; each slot can be rolled back to any earlier
// position (truncate) so a caller can verify drafts or resume after a rejected token. All
// errors are reported as tandem::Error with a message that names what was wrong.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tandem/batch.h"  // BatchToken
#include "tandem/chat.h"
#include "tandem/error.h"

namespace tandem {

using TokenId = int32_t;

// Summary of a loaded model, for callers that do not need the internals.
struct ModelInfo {
  std::string arch;  // "llama", "qwen2", "qwen3", "gemma3"
  std::string name;
  std::string path;
  int n_vocab = 0;
  std::string vocab_hash;  // the vocabulary's fingerprint, 16 hex digits (same tokens, same hash)
  int n_embd = 0;
  int n_layer = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int n_ctx_train = 0;
  uint64_t n_params = 0;
  uint64_t file_bytes = 0;
  uint64_t packed_bytes = 0;  // weight copies made by LoadOptions::repack
};

struct LoadOptions {
  // Dequantize every weight matrix to f32 at load and compute in f32 throughout (no activation
  // rounding). Slower and larger; reproduces an exact-f32 reference of the same weights.
  bool dequantize_to_f32 = false;
  // Also keep each quantized weight matrix in the layout the batched kernels multiply from
  // (kernels::PackedWeights), made once at load: a batch of a few rows (a server's decode rows
  // of many sessions) then skips decoding every weight per call. Costs about one more copy of
  // the weights in memory; outputs are bit for bit the same. For servers, not single-stream use.
  bool repack = false;
};

class Model {
 public:
  // Memory-maps the GGUF file, reads its configuration, binds every tensor and loads the
  // tokenizer. Throws tandem::Error.
  static std::unique_ptr<Model> load(const std::string& path, const LoadOptions& options = {});
  ~Model();

  const ModelInfo& info() const { return info_; }

  // ---- text: the model's vocabulary, tokenized and detokenized as llama.cpp's does ----
  // (info().vocab_hash is its fingerprint.)

  // Tokens in the vocabulary: at most info().n_vocab, the embedding's rows, which may have
  // padding rows past the last token.
  int vocab_size() const;
  // Text to tokens. add_special: BOS (and EOS) where the vocabulary asks for them; parse_special:
  // control-token texts in the text ("<start_of_turn>") become single tokens. Any bytes are
  // accepted (invalid UTF-8 never throws).
  std::vector<TokenId> tokenize(std::string_view text, bool add_special, bool parse_special) const;
  // Tokens to text (llama_detokenize): remove_special drops BOS/EOS; unparse_special writes
  // control tokens as their text instead of nothing.
  std::string detokenize(std::span<const TokenId> ids, bool remove_special = false,
                         bool unparse_special = true) const;
  // The exact bytes of one token (llama_token_to_piece): "" for an id out of range; special:
  // control tokens as their text. Pieces may split a UTF-8 character (TextStream joins them).
  std::string token_piece(TokenId id, bool special = true) const;
  // Whether generation ends at this token (llama.cpp's end-of-generation set: EOS, EOT, ...).
  bool is_end_of_generation(TokenId id) const;
  TokenId bos() const;
  TokenId eos() const;
  bool adds_bos() const;  // whether tokenize(..., add_special = true) starts with bos()
  // The conversation in the model's chat template (tokenizer.chat_template, else the one its
  // architecture implies), BOS not included; add_generation_prompt: end with the opening of
  // the assistant's turn. Throws tandem::Error when the model has no template tandem knows.
  std::string chat_prompt(const std::vector<ChatMessage>& messages,
                          bool add_generation_prompt) const;
  // What takes a chat on by one user turn, after an assistant turn generated up to (not
  // including) its end of turn: the close of that turn and the new user turn, ending with the
  // opening of the next assistant turn, as the template renders them. Tokenize it with
  // add_special false and parse_special true and append it to the history, so a cloud session
  // receives only these tokens. Throws tandem::Error as chat_prompt does.
  std::string chat_continuation(const std::string& user) const;

  // The file, configuration, weights and tokenizer behind this API are the engine's own: the
  // layers inside src/ reach them through runtime/model_internals.h, callers never.
  struct Parts;
  friend struct ModelInternals;

 private:
  Model();
  ModelInfo info_;
  std::unique_ptr<Parts> parts_;
};

// Generated tokens to text as they come: push returns only complete UTF-8 characters and holds
// back a character split between pieces; flush returns what is held (an incomplete character
// as U+FFFD) and starts over. The pieces joined are Model::token_piece's, with no leading-space
// removal or clean-up pass (as llama.cpp's streaming).
class TextStream {
 public:
  explicit TextStream(const Model& model, bool special = true);
  ~TextStream();
  TextStream(const TextStream&) = delete;
  TextStream& operator=(const TextStream&) = delete;
  std::string push(TokenId id);
  std::string flush();

 private:
  struct Decoder;  // the tokenizer's streaming decoder
  std::unique_ptr<Decoder> decoder_;
};

// Element type of the KV cache's keys or values (llama.cpp's --cache-type-k/-v). F16 halves
// the cache's memory and the bytes attention reads per token; keys and values are rounded to
// f16 when stored and widened back to f32 for the arithmetic, so results differ from F32 by
// that rounding only (and are batch invariant either way).
enum class KvCacheType { F32, F16 };
// "f32" / "f16".
const char* kv_cache_type_name(KvCacheType t);
// Parses "f32" or "f16"; throws tandem::Error naming the choices otherwise.
KvCacheType parse_kv_cache_type(const std::string& name);

struct ContextParams {
  int n_ctx = 0;      // positions per sequence; 0 = min(training context, 4096)
  int n_seq = 1;      // independent sequence slots
  int n_threads = 0;  // 0 = number of available cores
  KvCacheType type_k = KvCacheType::F32;
  KvCacheType type_v = KvCacheType::F32;
};

class Context {
 public:
  Context(const Model& model, const ContextParams& params = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // Runs the batch through the model, appending its keys/values to the cache. Each sequence's
  // tokens must continue it: positions seq_length(seq), seq_length(seq)+1, ... in batch order.
  // Throws tandem::Error (and leaves the cache unchanged) for a token id out of range, a bad
  // sequence slot, a position gap or a full context.
  void decode(std::span<const BatchToken> batch);

  // Outputs of the last decode, by index into its batch. Throws if not requested.
  std::span<const float> logits(int batch_index) const;  // [n_vocab]
  std::span<const float> hidden(int batch_index) const;  // [n_embd], output of the final norm

  int seq_length(int seq) const;
  // Keeps positions [0, n_keep) of a sequence and forgets the rest.
  void truncate(int seq, int n_keep);
  void clear(int seq) { truncate(seq, 0); }
  // Forks a sequence: dst keeps its first `from` positions (which the caller knows it shares
  // with src), takes positions [from, to) from src, and holds `to` positions after it. For a
  // caller that decodes several continuations of one prefix side by side. Throws tandem::Error
  // for a bad slot, from > seq_length(dst) or to > seq_length(src).
  void copy_positions(int src, int dst, int from, int to);
  // Forgets a sequence and gives its cache pages back to the operating system, so a server can
  // keep its resident memory within a KV budget while slots come and go.
  void release(int seq);

  int n_ctx() const { return n_ctx_; }
  int n_seq() const { return n_seq_; }
  int n_threads() const;
  KvCacheType type_k() const;
  KvCacheType type_v() const;
  // KV cache bytes one position of one sequence takes (all layers, keys and values).
  size_t kv_bytes_per_position() const;
  const Model& model() const { return model_; }

  // Test/probe hook: called with the residual stream [n_tokens][n_embd] after every layer.
  void set_layer_probe(std::function<void(int layer, const float* x, int n_tokens)> probe);

 private:
  struct Engine;  // the thread pool, KV cache, forward pass and its outputs (src/runtime)
  const Model& model_;
  int n_ctx_ = 0;
  int n_seq_ = 1;
  std::unique_ptr<Engine> engine_;
  std::vector<int32_t> out_row_;  // batch index -> output row, -1 if none
  std::vector<uint8_t> out_has_logits_;
  std::function<void(int, const float*, int)> probe_;
};

// ---- sampling ----

// The seed that asks for a random one. Every other value, 0xFFFFFFFF included (llama.cpp's
// "default seed"), is a seed: a client that names a seed gets the same draws every time.
inline constexpr uint64_t kRandomSeed = UINT64_MAX;

struct SamplingParams {
  float temp = 0.8f;            // <= 0: greedy
  int top_k = 40;               // <= 0: off
  float top_p = 0.95f;          // >= 1: off
  float min_p = 0.05f;          // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off
  int repeat_last_n = 64;
  uint64_t seed = kRandomSeed;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // Picks the next token from a logits row (penalties, top-k, top-p, min-p, temperature, then a
  // draw; the argmax when temp <= 0).
  TokenId sample(std::span<const float> logits);
  // True when sample() is the first largest logit (temp <= 0 and no repetition penalty), so a
  // caller that has the argmax already (kernels' logit_stats) may take it instead.
  bool greedy() const;
  // Records a token that is now part of the context (for the repetition penalty).
  void accept(TokenId token);
  void reset();
  const SamplingParams& params() const { return params_; }
  // What sample() and accept() change -- the random stream and the penalty window -- for a
  // caller that decodes ahead and may go back (pipelined routing); a copy of the whole sampler
  // would also copy its n_vocab-sized scratch.
  struct State {
    uint64_t rng = 0;
    std::vector<TokenId> history;
  };
  State state() const { return {rng_state_, history_}; }
  void restore(State state) {
    rng_state_ = state.rng;
    history_ = std::move(state.history);
  }

 private:
  SamplingParams params_;
  uint64_t rng_state_;
  std::vector<TokenId> history_;
  std::vector<std::pair<float, TokenId>> cand_;
};

// ---- generation ----

enum class StopReason {
  Length,           // n_predict tokens were generated
  EndOfGeneration,  // the model produced an end-of-generation token
  ContextFull,      // the sequence reached n_ctx positions
  Callback,         // on_text returned false
};

struct GenerateResult {
  std::vector<TokenId> ids;  // generated tokens (the end-of-generation token excluded)
  std::string text;
  StopReason stop = StopReason::Length;
  bool stopped_at_eog = false;
  int n_prompt = 0;
  double prompt_ms = 0;  // prefill time
  double gen_ms = 0;     // time for the generated tokens
};

// Prefills `prompt` into sequence slot `seq` (after whatever it already holds) and samples up
// to n_predict tokens, stopping at an end-of-generation token. on_text receives each newly
// complete piece of UTF-8 text as it is produced; returning false stops early.
GenerateResult generate(Context& ctx, std::span<const TokenId> prompt, int n_predict,
                        Sampler& sampler, const std::function<bool(std::string_view)>& on_text = {},
                        int seq = 0);

// The SIMD target the kernels dispatch to on this CPU (e.g. "AVX3_DL", "AVX2", "NEON").
std::string simd_target();
// Pins the kernels to another compiled target this CPU supports (e.g. "AVX2", to measure what a
// CPU without AVX-512 would get); "" restores the best. Throws std::invalid_argument, naming the
// choices, for any other name.
void set_simd_target(const std::string& name);

}  // namespace tandem
