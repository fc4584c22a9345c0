// The per-tensor type rules against what llama-quantize chose for every testdata variant
// (models/tensor_types.json), the row-length fallbacks, and whole-file quantization.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/default_model.h"
#include "common/error.h"
#include "common/testdata.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "quantize/quantize.h"
#include "quantize/quantize_file.h"
#include "quantize/type_mix.h"

namespace tandem::quant {
namespace {

using nlohmann::json;

TEST(FileType, NamesAndLlamaNumbers) {
  EXPECT_EQ(parse_file_type("Q4_K_M")->llama_ftype, 15u);
  EXPECT_EQ(parse_file_type("q4_k")->name, "Q4_K_M");
  EXPECT_EQ(parse_file_type("Q3_K")->llama_ftype, 12u);
  EXPECT_EQ(parse_file_type("Q5_K")->llama_ftype, 17u);
  EXPECT_EQ(parse_file_type("Q2_K")->llama_ftype, 10u);
  EXPECT_EQ(parse_file_type("Q6_K")->llama_ftype, 18u);
  EXPECT_EQ(parse_file_type("Q8_0")->llama_ftype, 7u);
  EXPECT_EQ(parse_file_type("Q5_0")->llama_ftype, 8u);
  EXPECT_EQ(parse_file_type("BF16")->llama_ftype, 32u);
  EXPECT_EQ(parse_file_type("F16")->llama_ftype, 1u);
  EXPECT_FALSE(parse_file_type("IQ4_NL").has_value());
}

// Every generated testdata variant: our plan must give each tensor the type llama-quantize gave
// it (pure variants were made with --pure, Q4_K_M with the mix rules).
TEST(TypeMix, MatchesLlamaQuantizeOnEveryTestdataVariant) {
  const json types = json::parse(
      tandem::testing::read_file(tandem::testing::testdata_path("models/tensor_types.json")));
  const std::map<std::string, std::string> source = {{"llama", "synth-llama-F16.gguf"},
                                                     {"qwen2", "synth-qwen2-F16.gguf"},
                                                     {"qwen3", "synth-qwen3-BF16.gguf"},
                                                     {"gemma3", "synth-gemma3-Q4_K_M.gguf"}};
  int n_files = 0, n_tensors = 0;
  for (const auto& [file, entry] : types.items()) {
    const std::string stem = file.substr(6, file.size() - 6 - 5);  // arch-VARIANT
    const std::string arch = stem.substr(0, stem.find('-'));
    const std::string variant = stem.substr(stem.find('-') + 1);
    auto ft = parse_file_type(variant);
    ASSERT_TRUE(ft) << variant;
    auto f = GgufFile::open(tandem::testing::testdata_path("models/" + source.at(arch)));
    const bool pure = variant != "Q4_K_M";
    for (const auto& p : plan_tensor_types(*f, *ft, pure)) {
      ASSERT_TRUE(entry["tensors"].contains(p.name)) << file << " " << p.name;
      EXPECT_EQ(std::string(traits(p.dst_type).name), entry["tensors"][p.name].get<std::string>())
          << file << " tensor " << p.name;
      ++n_tensors;
    }
    ++n_files;
  }
  EXPECT_EQ(n_files, 56);
  std::printf("type plan agrees with llama-quantize on %d files, %d tensors\n", n_files, n_tensors);
}

TEST(TypeMix, Fallbacks) {
  std::string why;
  EXPECT_EQ(fallback_type(TensorType::Q4_K, 640, &why), TensorType::Q5_0);
  EXPECT_NE(why.find("640"), std::string::npos);
  EXPECT_EQ(fallback_type(TensorType::Q5_K, 640, nullptr), TensorType::Q5_1);
  EXPECT_EQ(fallback_type(TensorType::Q6_K, 640, nullptr), TensorType::Q8_0);
  EXPECT_EQ(fallback_type(TensorType::Q3_K, 640, &why), TensorType::Q4_0);
  EXPECT_NE(why.find("IQ4_NL"), std::string::npos);
  EXPECT_EQ(fallback_type(TensorType::Q2_K, 96, nullptr), TensorType::Q4_0);
  EXPECT_EQ(fallback_type(TensorType::Q2_K, 40, nullptr), TensorType::F16);
  EXPECT_EQ(fallback_type(TensorType::Q8_0, 40, nullptr), TensorType::F16);
  EXPECT_EQ(fallback_type(TensorType::Q4_K, 512, nullptr), TensorType::Q4_K);
}

// gemma3-270m-like widths (640) under Q4_K_M: what llama.cpp's gemma-3-270m Q4_K_M file has.
TEST(TypeMix, Gemma270mWidthQ4KM) {
  std::vector<TensorDesc> d = {{"token_embd.weight", 2, 640, TensorType::F32},
                               {"output_norm.weight", 1, 640, TensorType::F32}};
  for (int il = 0; il < 18; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    d.push_back({p + "attn_q.weight", 2, 640, TensorType::F32});
    d.push_back({p + "attn_v.weight", 2, 640, TensorType::F32});
    d.push_back({p + "attn_output.weight", 2, 1024, TensorType::F32});
    d.push_back({p + "ffn_down.weight", 2, 2048, TensorType::F32});
    d.push_back({p + "attn_norm.weight", 1, 640, TensorType::F32});
  }
  MixModel m{"gemma3", 18, 4, 1};
  std::map<std::string, TensorType> got;
  for (const auto& p : plan_tensor_types(d, m, *parse_file_type("Q4_K_M"), false)) {
    got[p.name] = p.dst_type;
  }
  EXPECT_EQ(got["token_embd.weight"], TensorType::Q8_0);    // Q6_K, 640 % 256 != 0
  EXPECT_EQ(got["blk.3.attn_q.weight"], TensorType::Q5_0);  // Q4_K fallback
  EXPECT_EQ(got["blk.0.attn_v.weight"], TensorType::Q8_0);  // use_more_bits: Q6_K fallback
  EXPECT_EQ(got["blk.3.attn_v.weight"], TensorType::Q5_0);
  EXPECT_EQ(got["blk.0.ffn_down.weight"], TensorType::Q6_K);  // 2048 fits
  EXPECT_EQ(got["blk.3.ffn_down.weight"], TensorType::Q4_K);
  EXPECT_EQ(got["blk.4.ffn_down.weight"], TensorType::Q6_K);  // (4 - 2) % 3 == 2
  EXPECT_EQ(got["blk.17.ffn_down.weight"], TensorType::Q6_K);
  EXPECT_EQ(got["blk.5.attn_output.weight"], TensorType::Q4_K);
  EXPECT_EQ(got["blk.5.attn_norm.weight"], TensorType::F32);
}

// The real Gemma 3 270M Q4_K_M (made by llama.cpp), when present: same plan.
TEST(TypeMix, RealGemmaQ4KMPlanMatchesItsTypes) {
  const std::string path = test_model_path();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no real model at " << path;
  auto f = GgufFile::open(path);
  int n = 0, same = 0;
  std::string diffs;
  for (const auto& p : plan_tensor_types(*f, *parse_file_type("Q4_K_M"), false)) {
    const auto& t = f->tensors()[p.index];
    ++n;
    if (t.type == p.dst_type) {
      ++same;
    } else if (diffs.size() < 600) {
      diffs += " " + t.name + ":" + std::string(traits(t.type).name) + "/ours " +
               std::string(traits(p.dst_type).name);
    }
  }
  std::printf("real gemma-3-270m Q4_K_M: %d/%d tensor types as planned\n", same, n);
  EXPECT_EQ(same, n) << diffs;
}

// A file whose rows do not fit the block sizes: handled as documented in type_mix.h.
TEST(QuantizeFile, UnsupportedRowLengthsFallBack) {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 1);
  w.set_string("custom.key", "kept");
  std::vector<float> a(96 * 4), b(40 * 3), c(256 * 2), n(96);
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.1f * i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.3f * i);
  for (size_t i = 0; i < c.size(); ++i) c[i] = 0.01f * (i % 17) - 0.05f;
  for (auto& v : n) v = 1.0f;
  auto add = [&](const char* name, std::vector<int64_t> ne, const std::vector<float>& d) {
    w.add_tensor(name, TensorType::F32, ne,
                 std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(d.data()),
                                          d.size() * sizeof(float)));
  };
  add("blk.0.attn_q.weight", {96, 4}, a);
  add("blk.0.ffn_up.weight", {40, 3}, b);
  add("blk.0.ffn_gate.weight", {256, 2}, c);
  add("blk.0.attn_norm.weight", {96}, n);
  const auto dir = std::filesystem::temp_directory_path() / "tandem_quant_test";
  std::filesystem::create_directories(dir);
  const std::string in = (dir / "rows.gguf").string(), out = (dir / "rows-q2k.gguf").string();
  w.write(in);

  QuantizeOptions opt;
  opt.file_type = *parse_file_type("Q2_K");
  opt.pure = true;
  opt.n_threads = 2;
  const auto rep = quantize_file(in, out, opt);
  EXPECT_EQ(rep.n_fallback, 2);
  auto f = GgufFile::open(out);
  EXPECT_EQ(f->find_tensor("blk.0.attn_q.weight")->type, TensorType::Q4_0);  // 96: IQ4_NL -> Q4_0
  EXPECT_EQ(f->find_tensor("blk.0.ffn_up.weight")->type, TensorType::F16);   // 40: no block fits
  EXPECT_EQ(f->find_tensor("blk.0.ffn_gate.weight")->type, TensorType::Q2_K);
  EXPECT_EQ(f->find_tensor("blk.0.attn_norm.weight")->type, TensorType::F32);
  EXPECT_EQ(f->get_u64("general.file_type"), 10u);
  EXPECT_EQ(f->get_string("general.quantized_by"), "tandem");
  EXPECT_EQ(f->get_string("tandem.quantize.type"), "Q2_K");
  EXPECT_EQ(f->get_string("custom.key"), "kept");
  // F16 fallback data is the input rounded to f16.
  const auto* t = f->find_tensor("blk.0.ffn_up.weight");
  std::vector<float> back(b.size());
  to_f32(t->type, t->data, back.data(), static_cast<int64_t>(back.size()));
  for (size_t i = 0; i < b.size(); ++i) EXPECT_NEAR(back[i], b[i], 1e-3);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem::quant
