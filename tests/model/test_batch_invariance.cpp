// Batch invariance of the forward pass: a token row's logits and final hidden state are bit for
// bit the same whatever else is in its batch.
//
// Sequence A (slot 0) is run several ways and every one of its positions is compared by memcmp
// with the first way:
//   (a) the prompt prefilled in one batch, then every further token decoded alone;
//   (b) every token alone;
//   (c) chunks of 3, 5 and 17 tokens;
//   (d) each step of A (prompt chunks or single decode tokens) inside batches with other
//       sequences' prefill chunks and decode rows, A first, in the middle, last or interleaved
//       token by token with the others, batches of 2 to 40 tokens.
// A continuous-batching server relies on this: what a session gets must not depend on the
// sessions it was batched with. Every tiny test model of ../shared/testdata (each architecture,
// the quantized, 16-bit and f32 variants) runs on every SIMD target this CPU supports; the real
// model (TANDEM_MODEL or the cache path, skipped when absent) on the best target.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/default_model.h"
#include "common/testdata.h"
#include "kernels/kernels.h"
#include "tandem/engine.h"

namespace tandem {
namespace {

// A's outputs by position.
struct Outputs {
  std::vector<std::vector<float>> logits, hidden;
};

// How the other sequences join A's steps in scenario (d).
enum class Place { Alone, First, Middle, Last, Interleaved };

struct Scenario {
  std::string name;
  std::vector<int> chunks;  // A's tokens per step (the last chunk size repeats)
  Place place = Place::Alone;
  int max_batch = 0;  // (d): largest batch
};

class Runner {
 public:
  Runner(const Model& model, int n_ctx, int n_seq, KvCacheType kv = KvCacheType::F32)
      : model_(model), n_ctx_(n_ctx), n_seq_(n_seq), kv_(kv) {}

  // Runs A's tokens through a fresh context according to the scenario.
  Outputs run(const std::vector<TokenId>& a_tokens, const Scenario& sc, uint32_t seed) const {
    ContextParams cp;
    cp.n_ctx = n_ctx_;
    cp.n_seq = n_seq_;
    cp.n_threads = 2;
    cp.type_k = cp.type_v = kv_;
    Context ctx(model_, cp);
    std::mt19937 rng(seed);
    const int n_vocab = model_.info().n_vocab;
    std::uniform_int_distribution<int> token(3, std::min(n_vocab, 4096) - 1);
    const int n = static_cast<int>(a_tokens.size());
    Outputs out;
    out.logits.resize(n);
    out.hidden.resize(n);
    int pos = 0;
    for (size_t step = 0; pos < n; ++step) {
      const int len = std::min(n - pos, sc.chunks[std::min(step, sc.chunks.size() - 1)]);
      std::vector<BatchToken> a;
      for (int i = 0; i < len; ++i) a.push_back({a_tokens[pos + i], pos + i, 0, true, true});
      // The other sequences' runs: prefill chunks (2-17 tokens) and decode rows, up to the
      // batch size drawn for this step.
      std::vector<std::vector<BatchToken>> others;
      if (sc.place != Place::Alone) {
        const int target = std::uniform_int_distribution<int>(std::min(sc.max_batch, len + 1),
                                                              std::max(len + 1, sc.max_batch))(rng);
        int total = len;
        for (int s = 1; s < n_seq_ && total < target; ++s) {
          const bool decode_row = rng() % 2 == 0;
          const int want = decode_row ? 1
                                      : std::uniform_int_distribution<int>(
                                            2, std::max(2, std::min(17, target - total)))(rng);
          const int m = std::min(want, target - total);
          if (ctx.seq_length(s) + m > n_ctx_) ctx.clear(s);
          std::vector<BatchToken> run;
          const bool logits = rng() % 3 != 0;
          for (int i = 0; i < m; ++i) {
            run.push_back({token(rng), ctx.seq_length(s) + i, s,
                           logits && (i + 1 == m || rng() % 2), rng() % 4 == 0});
          }
          others.push_back(std::move(run));
          total += m;
        }
      }
      std::vector<BatchToken> batch;
      const auto append = [&](const std::vector<BatchToken>& r) {
        batch.insert(batch.end(), r.begin(), r.end());
      };
      switch (sc.place) {
        case Place::Alone:
          append(a);
          break;
        case Place::First:
          append(a);
          for (const auto& r : others) append(r);
          break;
        case Place::Last:
          for (const auto& r : others) append(r);
          append(a);
          break;
        case Place::Middle: {
          const size_t half = others.size() / 2;
          for (size_t i = 0; i < half; ++i) append(others[i]);
          append(a);
          for (size_t i = half; i < others.size(); ++i) append(others[i]);
          break;
        }
        case Place::Interleaved: {
          // Round robin over the runs, one token each: every run is cut into single tokens.
          others.insert(others.begin() + static_cast<long>(rng() % (others.size() + 1)), a);
          std::vector<size_t> next(others.size(), 0);
          for (bool any = true; any;) {
            any = false;
            for (size_t r = 0; r < others.size(); ++r) {
              if (next[r] < others[r].size()) {
                batch.push_back(others[r][next[r]++]);
                any = true;
              }
            }
          }
          break;
        }
      }
      ctx.decode(batch);
      for (size_t i = 0; i < batch.size(); ++i) {
        if (batch[i].seq != 0) continue;
        const auto l = ctx.logits(static_cast<int>(i));
        const auto h = ctx.hidden(static_cast<int>(i));
        out.logits[batch[i].pos].assign(l.begin(), l.end());
        out.hidden[batch[i].pos].assign(h.begin(), h.end());
      }
      pos += len;
    }
    return out;
  }

 private:
  const Model& model_;
  int n_ctx_, n_seq_;
  KvCacheType kv_;
};

// The first position where `got` differs from `want` in any bit, or -1.
int FirstMismatch(const Outputs& want, const Outputs& got, std::string* what) {
  for (size_t p = 0; p < want.logits.size(); ++p) {
    for (const auto& [w, g, name] : {std::tuple(&want.logits[p], &got.logits[p], "logits"),
                                     std::tuple(&want.hidden[p], &got.hidden[p], "hidden")}) {
      if (w->size() != g->size() ||
          std::memcmp(w->data(), g->data(), w->size() * sizeof(float)) != 0) {
        double max_diff = 0;
        for (size_t i = 0; i < std::min(w->size(), g->size()); ++i)
          max_diff = std::max(max_diff, std::fabs(static_cast<double>((*w)[i]) - (*g)[i]));
        *what = std::string(name) + " differ by up to " + std::to_string(max_diff);
        return static_cast<int>(p);
      }
    }
  }
  return -1;
}

std::vector<Scenario> Scenarios(int n_prompt) {
  return {
      {"(a) prompt at once, then decode alone", {n_prompt, 1}},
      {"(b) token by token", {1}},
      {"(c) chunks of 3", {3}},
      {"(c) chunks of 5", {5}},
      {"(c) chunks of 17", {17}},
      {"(d) prompt then decode, A first, batches up to 40", {n_prompt, 1}, Place::First, 40},
      {"(d) prompt then decode, A in the middle, batches up to 24",
       {n_prompt, 1},
       Place::Middle,
       24},
      {"(d) prompt then decode, A last, batches up to 9", {n_prompt, 1}, Place::Last, 9},
      {"(d) chunks of 5, A last, batches up to 40", {5}, Place::Last, 40},
      {"(d) token by token, A in the middle, batches up to 40", {1}, Place::Middle, 40},
      {"(d) token by token, A first, batches of 2-3", {1}, Place::First, 3},
      {"(d) chunks of 3, interleaved, batches up to 40", {3}, Place::Interleaved, 40},
      {"(d) prompt then decode, interleaved, batches up to 12",
       {n_prompt, 1},
       Place::Interleaved,
       12},
  };
}

// Runs every scenario and compares it with the first one; returns the number of mismatches.
void CheckModel(const Model& model, int n_prompt, int n_decode, int n_ctx, uint32_t seed,
                const std::string& label, KvCacheType kv = KvCacheType::F32) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> token(3, std::min(model.info().n_vocab, 4096) - 1);
  std::vector<TokenId> a_tokens;
  for (int i = 0; i < n_prompt + n_decode; ++i) a_tokens.push_back(token(rng));
  const Runner runner(model, n_ctx, 6, kv);
  const auto scenarios = Scenarios(n_prompt);
  const Outputs ref = runner.run(a_tokens, scenarios[0], seed);
  for (size_t s = 1; s < scenarios.size(); ++s) {
    const Outputs got = runner.run(a_tokens, scenarios[s], seed + static_cast<uint32_t>(s));
    std::string what;
    const int p = FirstMismatch(ref, got, &what);
    EXPECT_EQ(p, -1) << label << ": " << scenarios[s].name << " vs " << scenarios[0].name
                     << ": position " << p << " (of " << a_tokens.size() << "): " << what;
  }
}

struct TinyModel {
  std::string file;
  bool f32 = false;  // LoadOptions::dequantize_to_f32
};

void PrintTo(const TinyModel& m, std::ostream* os) {
  *os << m.file << (m.f32 ? " (f32)" : "");
}

std::string ParamName(const ::testing::TestParamInfo<TinyModel>& info) {
  std::string n = info.param.file.substr(6, info.param.file.size() - 11);  // synth-X.gguf
  for (char& c : n)
    if (c == '-') c = '_';
  return n + (info.param.f32 ? "_f32" : "");
}

class BatchInvariance : public ::testing::TestWithParam<TinyModel> {};

TEST_P(BatchInvariance, LogitsAndHiddenBitExactAcrossBatches) {
  const auto path = tandem::testing::testdata_path("models/" + GetParam().file);
  LoadOptions opts;
  opts.dequantize_to_f32 = GetParam().f32;
  const auto model = Model::load(path, opts);
  for (const std::string& target : kernels::simd_targets()) {
    kernels::set_simd_target(target);
    CheckModel(*model, 13, 9, 96, 7, GetParam().file + " on " + target);
  }
  kernels::set_simd_target("");
}

INSTANTIATE_TEST_SUITE_P(
    TinyModels, BatchInvariance,
    ::testing::Values(TinyModel{"synth-gemma3-Q4_K_M.gguf"}, TinyModel{"synth-llama-F16.gguf"},
                      TinyModel{"synth-llama-Q2_K.gguf"}, TinyModel{"synth-llama-Q3_K.gguf"},
                      TinyModel{"synth-llama-Q4_0.gguf"}, TinyModel{"synth-llama-Q4_1.gguf"},
                      TinyModel{"synth-llama-Q4_K.gguf"}, TinyModel{"synth-llama-Q4_K_M.gguf"},
                      TinyModel{"synth-llama-Q5_0.gguf"}, TinyModel{"synth-llama-Q5_1.gguf"},
                      TinyModel{"synth-llama-Q5_K.gguf"}, TinyModel{"synth-llama-Q6_K.gguf"},
                      TinyModel{"synth-llama-Q8_0.gguf"}, TinyModel{"synth-llama-Q8_0.gguf", true},
                      TinyModel{"synth-qwen2-F16.gguf"}, TinyModel{"synth-qwen2-Q4_K_M.gguf"},
                      TinyModel{"synth-qwen3-BF16.gguf"}, TinyModel{"synth-qwen3-Q4_K_M.gguf"}),
    ParamName);

// Logits of n_seq sequences prefilled together (n_prompt tokens each, one batch) and then decoded
// together for n_decode steps (one token of each per batch): [step][seq][n_vocab], step 0 the
// prefill's last position.
std::vector<float> BatchedLogits(const Model& model, int n_seq, int n_prompt, int n_decode,
                                 KvCacheType kv = KvCacheType::F32) {
  Context ctx(model, {.n_ctx = n_prompt + n_decode + 1,
                      .n_seq = n_seq,
                      .n_threads = 2,
                      .type_k = kv,
                      .type_v = kv});
  const int n_vocab = model.info().n_vocab;
  std::mt19937 rng(99);
  std::uniform_int_distribution<int> token(3, std::min(n_vocab, 4096) - 1);
  std::vector<float> out;
  std::vector<BatchToken> batch;
  for (int s = 0; s < n_seq; ++s)
    for (int i = 0; i < n_prompt; ++i) batch.push_back({token(rng), i, s, i + 1 == n_prompt});
  for (int step = 0; step <= n_decode; ++step) {
    ctx.decode(batch);
    for (int b = 0; b < static_cast<int>(batch.size()); ++b) {
      if (!batch[b].want_logits) continue;
      const auto l = ctx.logits(b);
      out.insert(out.end(), l.begin(), l.end());
    }
    batch.clear();
    for (int s = 0; s < n_seq; ++s) batch.push_back({token(rng), n_prompt + step, s, true});
  }
  return out;
}

// LoadOptions::repack (the server's packed weights) changes no output bit: a 12-sequence batch
// (whole tiles and the rows short of one, the tiled path) against the same model loaded plainly.
TEST(RepackedWeights, SameLogitsAsThePlainModel) {
  for (const char* file : {"synth-gemma3-Q4_K_M.gguf", "synth-llama-Q8_0.gguf",
                           "synth-llama-Q4_1.gguf", "synth-qwen2-Q4_K_M.gguf"}) {
    const auto path = tandem::testing::testdata_path(std::string("models/") + file);
    const auto plain = Model::load(path);
    const auto packed = Model::load(path, {.repack = true});
    EXPECT_EQ(plain->info().packed_bytes, 0u);
    EXPECT_GT(packed->info().packed_bytes, 0u) << file;
    const auto want = BatchedLogits(*plain, 12, 9, 3);
    const auto got = BatchedLogits(*packed, 12, 9, 3);
    ASSERT_EQ(want.size(), got.size());
    EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0) << file;
  }
}

// An f16 KV cache (-ctk/-ctv f16) keeps batch invariance: the keys and values are rounded once
// when stored, the same way whatever batch stored them. Gemma 3 on every target (34 positions:
// past the synthetic model's sliding window of 32), and a GQA Qwen2 on the best target (the
// test's cost counts under the sanitizers).
TEST(F16KvCache, BatchInvariantOnEveryTarget) {
  const auto gemma = Model::load(tandem::testing::testdata_path("models/synth-gemma3-Q4_K_M.gguf"));
  for (const std::string& target : kernels::simd_targets()) {
    kernels::set_simd_target(target);
    CheckModel(*gemma, 30, 4, 96, 7, "gemma3 f16 KV on " + target, KvCacheType::F16);
  }
  kernels::set_simd_target("");
  const auto qwen = Model::load(tandem::testing::testdata_path("models/synth-qwen2-Q4_K_M.gguf"));
  CheckModel(*qwen, 13, 9, 96, 7, "qwen2 f16 KV", KvCacheType::F16);
}

// An f16 cache changes the logits only by the rounding of the cached keys and values: close to
// the f32 cache's (not equal: the test fails if the type is ignored), with the same argmax on
// most rows, and the cache takes half the bytes.
TEST(F16KvCache, CloseToF32Cache) {
  const auto model = Model::load(tandem::testing::testdata_path("models/synth-gemma3-Q4_K_M.gguf"));
  const auto f32 = BatchedLogits(*model, 4, 24, 8, KvCacheType::F32);
  const auto f16 = BatchedLogits(*model, 4, 24, 8, KvCacheType::F16);
  ASSERT_EQ(f32.size(), f16.size());
  const size_t n_vocab = static_cast<size_t>(model->info().n_vocab);
  double max_diff = 0, max_abs = 0;
  int same_argmax = 0, rows = 0;
  for (size_t r = 0; r * n_vocab < f32.size(); ++r, ++rows) {
    const float* a = f32.data() + r * n_vocab;
    const float* b = f16.data() + r * n_vocab;
    for (size_t i = 0; i < n_vocab; ++i) {
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(a[i]) - b[i]));
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(a[i])));
    }
    same_argmax += std::max_element(a, a + n_vocab) - a == std::max_element(b, b + n_vocab) - b;
  }
  EXPECT_GT(max_diff, 0.0) << "the f16 cache gave the f32 cache's logits bit for bit";
  // The synthetic model's random weights amplify the rounding more than a trained model does
  // (the real model's perplexity moves by 0.1%: docs/benchmarks.md); bounds that still catch a
  // cache read as the wrong type, which gives unrelated logits.
  EXPECT_LT(max_diff, 0.1 * max_abs) << "largest |logit| " << max_abs;
  EXPECT_GE(same_argmax * 10, rows * 8) << "of " << rows << " rows";
  Context c32(*model, {.n_ctx = 64, .n_seq = 2});
  Context c16(*model,
              {.n_ctx = 64, .n_seq = 2, .type_k = KvCacheType::F16, .type_v = KvCacheType::F16});
  EXPECT_EQ(c16.kv_bytes_per_position() * 2, c32.kv_bytes_per_position());
  Context mixed(*model, {.n_ctx = 64, .n_seq = 2, .type_k = KvCacheType::F16});
  EXPECT_EQ(mixed.kv_bytes_per_position() * 4, c32.kv_bytes_per_position() * 3);
}

// Context::copy_positions forks a sequence: slot 1 takes all of slot 0's prefix, slot 2 shares
// its first 11 tokens (decoded there itself) and takes the rest; each fork then continues with
// the same token as slot 0, in one batch, and every row's logits equal slot 0's bit for bit
// (Gemma 3: 40 positions, past the synthetic sliding window of 32; f32 and f16 caches). Bad
// forks are refused with what was asked and what the slots hold, the cache unchanged.
TEST(ForkedSequences, CopiedPositionsContinueBitExact) {
  const auto model = Model::load(tandem::testing::testdata_path("models/synth-gemma3-Q4_K_M.gguf"));
  for (const KvCacheType kv : {KvCacheType::F32, KvCacheType::F16}) {
    Context ctx(*model, {.n_ctx = 64, .n_seq = 3, .n_threads = 1, .type_k = kv, .type_v = kv});
    std::vector<BatchToken> batch;
    for (int i = 0; i < 40; ++i) batch.push_back({7 + i % 50, i, 0, false});
    for (int i = 0; i < 11; ++i) batch.push_back({7 + i % 50, i, 2, false});
    ctx.decode(batch);
    ctx.copy_positions(0, 1, 0, 40);
    ctx.copy_positions(0, 2, 11, 40);
    EXPECT_EQ(ctx.seq_length(1), 40);
    EXPECT_EQ(ctx.seq_length(2), 40);
    batch.clear();
    for (int s = 0; s < 3; ++s) batch.push_back({5, 40, s, true});
    ctx.decode(batch);
    const auto want = ctx.logits(0);
    for (int s = 1; s < 3; ++s) {
      const auto got = ctx.logits(s);
      EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size_bytes()), 0)
          << "slot " << s << ", kv " << kv_cache_type_name(kv);
    }
    const auto expect_refused = [&](int src, int dst, int from, int to, const std::string& what) {
      const int lengths[3] = {ctx.seq_length(0), ctx.seq_length(1), ctx.seq_length(2)};
      try {
        ctx.copy_positions(src, dst, from, to);
        ADD_FAILURE() << "expected an error containing '" << what << "'";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      }
      for (int s = 0; s < 3; ++s) EXPECT_EQ(ctx.seq_length(s), lengths[s]);
    };
    expect_refused(0, 3, 0, 4, "sequence 3 out of range");
    expect_refused(1, 1, 0, 4, "both sequence 1");
    expect_refused(0, 1, 0, 42, "positions [0, 42) of sequence 0 (41 filled)");
    expect_refused(0, 1, 5, 4, "positions [5, 4)");
    ctx.truncate(2, 3);
    expect_refused(0, 2, 4, 10, "onto sequence 2 (3 filled)");
    ctx.copy_positions(0, 2, 3, 41);
    EXPECT_EQ(ctx.seq_length(2), 41);
  }
}

// The real model, on the best target: longer prompt, Gemma 3's sliding window not reached.
TEST(RealModelBatchInvariance, LogitsAndHiddenBitExactAcrossBatches) {
  const std::string path = test_model_path();
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << "real model not found at " << path << " (run scripts/fetch_model.sh)";
  }
  const auto model = Model::load(path);
  CheckModel(*model, 21, 7, 160, 11, "real model on " + std::string(kernels::simd_target_name()));
  // And the server's packed weights, at a server's batch of 32 decode rows.
  const auto packed = Model::load(path, {.repack = true});
  const auto want = BatchedLogits(*model, 32, 5, 2);
  const auto got = BatchedLogits(*packed, 32, 5, 2);
  ASSERT_EQ(want.size(), got.size());
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace tandem
