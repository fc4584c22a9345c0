// Dequantization of every tensor of every stored GGUF must reproduce the sha256 of ggml's own
// to_float output (testdata/models/dequant_checksums.json).
#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "common/testdata.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "kernels/kernels_ref.h"

namespace {

using tandem::TensorType;

std::string Sha256Hex(const void* data, size_t n) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EXPECT_EQ(EVP_Digest(data, n, md, &len, EVP_sha256(), nullptr), 1);
  std::string hex;
  char buf[3];
  for (unsigned i = 0; i < len; ++i) {
    std::snprintf(buf, sizeof(buf), "%02x", md[i]);
    hex += buf;
  }
  return hex;
}

nlohmann::json LoadChecksums() {
  std::ifstream f(tandem::testing::testdata_path("models/dequant_checksums.json"));
  return nlohmann::json::parse(f);
}

TEST(KernelsSha256, KnownVector) {
  EXPECT_EQ(Sha256Hex("abc", 3),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

class KernelsDequantChecksum : public ::testing::TestWithParam<std::string> {};

TEST_P(KernelsDequantChecksum, EveryTensorMatchesGgml) {
  const nlohmann::json all = LoadChecksums();
  const std::string file = GetParam();
  ASSERT_TRUE(all.contains(file)) << file;
  const nlohmann::json& expected = all[file];
  auto gguf = tandem::GgufFile::open(tandem::testing::testdata_path("models/" + file));
  ASSERT_EQ(gguf->tensors().size(), expected.size()) << file;
  std::vector<float> out, out_ref;
  for (const auto& t : gguf->tensors()) {
    SCOPED_TRACE(file + ": " + t.name);
    ASSERT_TRUE(expected.contains(t.name));
    const auto& e = expected[t.name];
    EXPECT_EQ(std::string(tandem::traits(t.type).name), e["type"].get<std::string>());
    for (int d = 0; d < 4; ++d) EXPECT_EQ(t.ne[d], e["ne"][d].get<int64_t>());
    const int64_t n = t.n_elements();
    out.assign(static_cast<size_t>(n), 0.0f);
    out_ref.assign(static_cast<size_t>(n), 0.0f);
    // Row by row, as the engine does it.
    const size_t rb = tandem::row_bytes(t.type, t.ne[0]);
    for (int64_t r = 0; r < t.n_rows(); ++r) {
      tandem::kernels::dequantize_row(t.type, t.data + r * rb, out.data() + r * t.ne[0], t.ne[0]);
    }
    tandem::kernels::ref::dequantize_row(t.type, t.data, out_ref.data(), n);
    EXPECT_EQ(Sha256Hex(out.data(), out.size() * 4), e["sha256_f32le"].get<std::string>());
    EXPECT_EQ(Sha256Hex(out_ref.data(), out_ref.size() * 4), e["sha256_f32le"].get<std::string>());
    for (int j = 0; j < 8 && j < n; ++j) EXPECT_EQ(out[j], e["first8"][j].get<float>()) << j;
  }
}

std::vector<std::string> StoredFiles() {
  // Listed here (not read from the json) so that a missing file is a visible failure.
  return {"synth-llama-F16.gguf",    "synth-llama-Q8_0.gguf",   "synth-llama-Q4_0.gguf",
          "synth-llama-Q4_1.gguf",   "synth-llama-Q5_0.gguf",   "synth-llama-Q5_1.gguf",
          "synth-llama-Q2_K.gguf",   "synth-llama-Q3_K.gguf",   "synth-llama-Q4_K.gguf",
          "synth-llama-Q5_K.gguf",   "synth-llama-Q6_K.gguf",   "synth-llama-Q4_K_M.gguf",
          "synth-qwen2-F16.gguf",    "synth-qwen2-Q4_K_M.gguf", "synth-qwen3-BF16.gguf",
          "synth-qwen3-Q4_K_M.gguf", "synth-gemma3-Q4_K_M.gguf"};
}

TEST(KernelsDequantChecksumList, CoversEveryFileInJson) {
  const nlohmann::json all = LoadChecksums();
  std::set<std::string> listed;
  for (const auto& f : StoredFiles()) listed.insert(f);
  for (auto it = all.begin(); it != all.end(); ++it)
    EXPECT_TRUE(listed.count(it.key())) << it.key();
  EXPECT_EQ(listed.size(), all.size());
}

std::string FileTestName(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param.substr(0, info.param.size() - 5);
  for (char& c : s)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Stored, KernelsDequantChecksum, ::testing::ValuesIn(StoredFiles()),
                         FileTestName);

}  // namespace
