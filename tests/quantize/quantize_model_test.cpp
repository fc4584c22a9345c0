// Re-quantizes the testdata llama model (F16 source) with tandem's quantizer and compares with
// the files llama-quantize made from the same weights: per type, the fraction of byte-identical
// blocks and the dequantized difference; then runs the re-quantized model with the engine
// against llama.cpp's vectors for that type.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/testdata.h"
#include "gguf/gguf.h"
#include "quantize/quantize.h"
#include "quantize/quantize_file.h"
#include "quantize/synth.h"
#include "tandem/engine.h"

namespace tandem::quant {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

fs::path work_dir() {
  const auto d = fs::temp_directory_path() / ("tandem_quant_model_" + std::to_string(getpid()));
  fs::create_directories(d);
  return d;
}

struct Agreement {
  size_t blocks = 0, same_blocks = 0;
  double max_abs = 0, sum_sq = 0, ref_sq = 0;
  size_t n = 0;
  bool types_match = true;
};

Agreement compare_files(const GgufFile& ours, const GgufFile& ref) {
  Agreement a;
  for (const auto& r : ref.tensors()) {
    const auto* o = ours.find_tensor(r.name);
    EXPECT_NE(o, nullptr) << r.name;
    if (!o) continue;
    if (o->type != r.type) {
      ADD_FAILURE() << r.name << ": ours " << traits(o->type).name << ", llama.cpp "
                    << traits(r.type).name;
      a.types_match = false;
      continue;
    }
    const auto& tr = traits(r.type);
    if (tr.is_quantized) {
      const size_t nb = r.nbytes / tr.type_size;
      for (size_t b = 0; b < nb; ++b) {
        a.same_blocks +=
            std::memcmp(o->data + b * tr.type_size, r.data + b * tr.type_size, tr.type_size) == 0;
      }
      a.blocks += nb;
    }
    std::vector<float> x(r.n_elements()), y(r.n_elements());
    to_f32(o->type, o->data, x.data(), r.n_elements());
    to_f32(r.type, r.data, y.data(), r.n_elements());
    for (size_t i = 0; i < x.size(); ++i) {
      const double d = double(x[i]) - y[i];
      a.max_abs = std::max(a.max_abs, std::fabs(d));
      a.sum_sq += d * d;
      a.ref_sq += double(y[i]) * y[i];
      ++a.n;
    }
  }
  return a;
}

class LlamaCppAgreement : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaCppAgreement, ReproducesLlamaQuantize) {
  const std::string type = GetParam();
  const std::string src = tandem::testing::testdata_path("models/synth-llama-F16.gguf");
  const std::string ref_path =
      tandem::testing::testdata_path("models/synth-llama-" + type + ".gguf");
  const auto out = (work_dir() / ("synth-llama-" + type + ".gguf")).string();
  QuantizeOptions opt;
  opt.file_type = *parse_file_type(type);
  opt.pure = type != "Q4_K_M";  // testdata: llama-quantize --pure, except the Q4_K_M mix
  opt.n_threads = 2;
  quantize_file(src, out, opt);
  auto ours = GgufFile::open(out);
  auto ref = GgufFile::open(ref_path);
  const Agreement a = compare_files(*ours, *ref);
  const double rel = std::sqrt(a.sum_sq / std::max(a.ref_sq, 1e-30));
  std::printf(
      "%-7s identical blocks %zu/%zu (%.2f%%), dequantized max abs diff %.3g, rel RMS %.3g\n",
      type.c_str(), a.same_blocks, a.blocks, a.blocks ? 100.0 * a.same_blocks / a.blocks : 100.0,
      a.max_abs, rel);
  RecordProperty("identical_blocks_pct",
                 std::to_string(a.blocks ? 100.0 * a.same_blocks / a.blocks : 100.0));
  EXPECT_TRUE(a.types_match);
  // Reference quantizers reimplemented operation by operation: (nearly) every block identical.
  // A block can differ where llama.cpp's build fused a multiply-add in the scale search.
  EXPECT_GE(a.same_blocks, a.blocks * 99 / 100) << type;
  EXPECT_LT(rel, 0.01) << type;
  EXPECT_EQ(ours->get_u64("general.file_type"), ref->get_u64("general.file_type"));
}

INSTANTIATE_TEST_SUITE_P(Types, LlamaCppAgreement,
                         ::testing::Values("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K",
                                           "Q4_K", "Q5_K", "Q6_K", "Q4_K_M"));

// The re-quantized model, run by the engine, matches llama.cpp's `ref` vectors of that type
// (tolerance for a quantized file from the testdata README: max abs logit 0.6, RMS 0.06,
// top-1 0.93).
class QuantizedModelVectors : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantizedModelVectors, MatchesLlamaCppVectors) {
  const std::string type = GetParam();
  const std::string src = tandem::testing::testdata_path("models/synth-llama-F16.gguf");
  const auto out = (work_dir() / ("vec-llama-" + type + ".gguf")).string();
  QuantizeOptions opt;
  opt.file_type = *parse_file_type(type);
  opt.pure = type != "Q4_K_M";
  opt.n_threads = 2;
  quantize_file(src, out, opt);

  const std::string vec = "vectors/synth-llama-" + type + ".ref";
  const json m =
      json::parse(tandem::testing::read_file(tandem::testing::testdata_path(vec + ".json")));
  const auto ref_last =
      tandem::testing::read_f32(tandem::testing::testdata_path(vec + ".last_logits.f32"));
  const int V = m["n_vocab"];
  struct Result {
    double max_abs = 0, rms = 0;
    int top1 = 0, n_seq = 0;
    std::vector<float> logits;
  };
  auto run = [&](const std::string& path) {
    auto model = Model::load(path);
    ContextParams cp;
    cp.n_ctx = 256;
    cp.n_threads = 2;
    Context ctx(*model, cp);
    Result res;
    double sum_sq = 0;
    size_t n = 0;
    for (size_t s = 0; s < m["sequences"].size(); ++s) {
      const std::vector<TokenId> tokens = m["sequences"][s]["tokens"];
      ctx.clear(0);
      std::vector<BatchToken> batch;
      for (size_t i = 0; i < tokens.size(); ++i) {
        batch.push_back({tokens[i], static_cast<int32_t>(i), 0, i + 1 == tokens.size(), false});
      }
      ctx.decode(batch);
      const auto l = ctx.logits(static_cast<int>(tokens.size()) - 1);
      res.logits.insert(res.logits.end(), l.begin(), l.end());
      const float* r = ref_last.data() + s * V;
      for (int v = 0; v < V; ++v) {
        const double d = std::fabs(double(l[v]) - r[v]);
        res.max_abs = std::max(res.max_abs, d);
        sum_sq += d * d;
        ++n;
      }
      const int a = static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin());
      const int b = static_cast<int>(std::max_element(r, r + V) - r);
      res.top1 += a == b || std::fabs(r[a] - r[b]) < 1.2;
      ++res.n_seq;
    }
    res.rms = std::sqrt(sum_sq / n);
    return res;
  };
  const Result ours = run(out);
  const Result theirs = run(tandem::testing::testdata_path("models/synth-llama-" + type + ".gguf"));
  std::printf(
      "%-7s last-position logits vs llama.cpp ref: max abs %.4f, RMS %.5f, top-1 %d/%d "
      "(engine on llama.cpp's own file: max abs %.4f, RMS %.5f)\n",
      type.c_str(), ours.max_abs, ours.rms, ours.top1, ours.n_seq, theirs.max_abs, theirs.rms);
  EXPECT_LE(ours.max_abs, 0.6);
  EXPECT_EQ(ours.top1, ours.n_seq);
  EXPECT_LE(ours.rms, 0.06);
  // Our file gives the engine exactly what llama.cpp's file gives it.
  EXPECT_EQ(ours.logits, theirs.logits);
}

INSTANTIATE_TEST_SUITE_P(Types, QuantizedModelVectors,
                         ::testing::Values("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K",
                                           "Q4_K", "Q5_K", "Q6_K", "Q4_K_M"));

}  // namespace
}  // namespace tandem::quant

namespace tandem::quant {
namespace {

// A shrunk gemma3-270m shape (same widths, so the 640-wide fallbacks apply; 2 layers, small
// vocab): the synthetic model loads in the engine and decodes to finite logits.
TEST(Synth, SmallGemmaShapeLoadsAndRuns) {
  SynthShape s = *find_synth_shape("gemma3-270m");
  s.n_vocab = 1024;
  s.n_layer = 2;
  SynthOptions opt;
  opt.file_type = *parse_file_type("Q4_K_M");
  opt.n_threads = 2;
  const auto out = (work_dir() / "synth-small.gguf").string();
  const auto rep = write_synth_model(s, out, opt);
  std::map<std::string, TensorType> types;
  for (const auto& p : rep.plans) types[p.name] = p.dst_type;
  EXPECT_EQ(types["token_embd.weight"], TensorType::Q8_0);    // tied: Q6_K -> Q8_0 (640)
  EXPECT_EQ(types["blk.0.attn_q.weight"], TensorType::Q5_0);  // Q4_K -> Q5_0 (640)
  EXPECT_EQ(types["blk.1.ffn_down.weight"], TensorType::Q6_K);
  auto model = Model::load(out);
  EXPECT_EQ(model->info().n_vocab, 1024);
  EXPECT_EQ(model->info().n_embd, 640);
  Context ctx(*model, {.n_ctx = 64, .n_seq = 1, .n_threads = 2});
  std::vector<BatchToken> batch;
  for (int i = 0; i < 8; ++i) batch.push_back({3 + 7 * i, i, 0, i == 7, false});
  ctx.decode(batch);
  for (float v : ctx.logits(7)) ASSERT_TRUE(std::isfinite(v));
  // Deterministic for a seed.
  const auto out2 = (work_dir() / "synth-small2.gguf").string();
  write_synth_model(s, out2, opt);
  EXPECT_EQ(tandem::testing::read_file(out), tandem::testing::read_file(out2));
}

}  // namespace
}  // namespace tandem::quant
