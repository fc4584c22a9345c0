// Reads every GGUF in ../shared/testdata and checks what llama.cpp's files are known to hold.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <ostream>
#include <string>

#include "common/testdata.h"
#include "gguf/gguf.h"
#include "gguf_test_util.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using testing::testdata_path;

struct Expect {
  const char* file;
  uint64_t n_kv;
  uint64_t n_tensors;
  const char* arch;
  std::map<std::string, int> types;  // tensor type name -> count
};

// Counts read off the files with an independent parser (and, for tensor types, the testdata
// README's table).
const std::vector<Expect>& expected_files() {
  static const std::vector<Expect> kFiles = {
      {"models/synth-gemma3-Q4_K_M.gguf",
       31,
       80,
       "gemma3",
       {{"Q4_K", 38}, {"Q6_K", 5}, {"F32", 37}}},
      {"models/synth-llama-F16.gguf", 28, 22, "llama", {{"F16", 16}, {"F32", 6}}},
      {"models/synth-llama-Q2_K.gguf", 28, 22, "llama", {{"Q2_K", 16}, {"F32", 6}}},
      {"models/synth-llama-Q3_K.gguf", 28, 22, "llama", {{"Q3_K", 16}, {"F32", 6}}},
      {"models/synth-llama-Q4_0.gguf", 28, 22, "llama", {{"Q4_0", 16}, {"F32", 6}}},
      {"models/synth-llama-Q4_1.gguf", 28, 22, "llama", {{"Q4_1", 16}, {"F32", 6}}},
      {"models/synth-llama-Q4_K.gguf", 28, 22, "llama", {{"Q4_K", 16}, {"F32", 6}}},
      {"models/synth-llama-Q4_K_M.gguf", 28, 22, "llama", {{"Q4_K", 13}, {"Q6_K", 3}, {"F32", 6}}},
      {"models/synth-llama-Q5_0.gguf", 28, 22, "llama", {{"Q5_0", 16}, {"F32", 6}}},
      {"models/synth-llama-Q5_1.gguf", 28, 22, "llama", {{"Q5_1", 16}, {"F32", 6}}},
      {"models/synth-llama-Q5_K.gguf", 28, 22, "llama", {{"Q5_K", 16}, {"F32", 6}}},
      {"models/synth-llama-Q6_K.gguf", 28, 22, "llama", {{"Q6_K", 16}, {"F32", 6}}},
      {"models/synth-llama-Q8_0.gguf", 28, 22, "llama", {{"Q8_0", 16}, {"F32", 6}}},
      {"models/synth-qwen2-F16.gguf", 26, 27, "qwen2", {{"F16", 16}, {"F32", 11}}},
      {"models/synth-qwen2-Q4_K_M.gguf", 26, 27, "qwen2", {{"Q4_K", 13}, {"Q6_K", 3}, {"F32", 11}}},
      {"models/synth-qwen3-BF16.gguf", 28, 25, "qwen3", {{"BF16", 16}, {"F32", 9}}},
      {"models/synth-qwen3-Q4_K_M.gguf", 28, 25, "qwen3", {{"Q4_K", 13}, {"Q6_K", 3}, {"F32", 9}}},
      {"tokenizers/ggml-vocab-gpt-2.gguf", 16, 0, "gpt2", {}},
      {"tokenizers/ggml-vocab-llama-bpe.gguf", 20, 0, "llama", {}},
      {"tokenizers/ggml-vocab-llama-spm.gguf", 22, 0, "llama", {}},
      {"tokenizers/ggml-vocab-phi-3.gguf", 26, 0, "phi3", {}},
      {"tokenizers/ggml-vocab-qwen3.gguf", 24, 0, "qwen3", {}},
  };
  return kFiles;
}

// Keeps test names (and ctest's listing) short: print the file name, not the struct's bytes.
void PrintTo(const Expect& e, std::ostream* os) {
  *os << e.file;
}

class SharedGguf : public ::testing::TestWithParam<Expect> {};

TEST_P(SharedGguf, CountsAndLayout) {
  const Expect& e = GetParam();
  const auto f = GgufFile::open(testdata_path(e.file));
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->metadata().size(), e.n_kv);
  EXPECT_EQ(f->tensors().size(), e.n_tensors);
  EXPECT_EQ(f->get_string("general.architecture"), e.arch);
  EXPECT_EQ(f->data_offset() % f->alignment(), 0u);

  // Every metadata key is findable and every value is readable.
  for (const auto& [key, v] : f->metadata()) {
    ASSERT_EQ(f->find(key), &v) << key;
    EXPECT_LT(v.file_offset, f->file_size()) << key;
  }
  // The vocabulary arrays agree in length.
  const auto& tokens = f->get_string_array("tokenizer.ggml.tokens");
  EXPECT_GT(tokens.size(), 0u);
  if (f->has("tokenizer.ggml.token_type")) {
    EXPECT_EQ(f->get_int_array("tokenizer.ggml.token_type").size(), tokens.size());
  }
  if (f->has("tokenizer.ggml.scores")) {
    EXPECT_EQ(f->get_f32_array("tokenizer.ggml.scores").size(), tokens.size());
  }

  std::map<std::string, int> types;
  for (const auto& t : f->tensors()) {
    ++types[std::string(traits(t.type).name)];
    EXPECT_EQ(f->find_tensor(t.name), &t);
    EXPECT_EQ(t.nbytes, row_bytes(t.type, t.ne[0]) * static_cast<size_t>(t.n_rows())) << t.name;
    EXPECT_EQ(t.offset % f->alignment(), 0u) << t.name;
    EXPECT_EQ(t.data, f->base() + f->data_offset() + t.offset) << t.name;
    EXPECT_LE(f->data_offset() + t.offset + t.nbytes, f->file_size()) << t.name;
  }
  EXPECT_EQ(types, e.types);
}

INSTANTIATE_TEST_SUITE_P(Testdata, SharedGguf, ::testing::ValuesIn(expected_files()),
                         [](const auto& info) {
                           std::string n = info.param.file;
                           n = n.substr(n.find('/') + 1);
                           n = n.substr(0, n.rfind('.'));
                           for (char& c : n) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return n;
                         });

TEST(GgufRead, VocabSizes) {
  const std::pair<const char*, size_t> kVocab[] = {
      {"tokenizers/ggml-vocab-llama-spm.gguf", 32000},  {"tokenizers/ggml-vocab-phi-3.gguf", 32064},
      {"tokenizers/ggml-vocab-llama-bpe.gguf", 128256}, {"tokenizers/ggml-vocab-gpt-2.gguf", 50257},
      {"tokenizers/ggml-vocab-qwen3.gguf", 151936},
  };
  for (const auto& [file, n] : kVocab) {
    const auto f = GgufFile::open(testdata_path(file));
    EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), n) << file;
  }
  const auto spm = GgufFile::open(testdata_path("tokenizers/ggml-vocab-llama-spm.gguf"));
  EXPECT_EQ(spm->get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(spm->get_u64("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(spm->get_u64("tokenizer.ggml.eos_token_id"), 2u);
  EXPECT_EQ(spm->get_string_array("tokenizer.ggml.tokens")[1], "<s>");
}

TEST(GgufRead, TypedGetters) {
  const auto f = GgufFile::open(testdata_path("models/synth-llama-Q4_0.gguf"));
  EXPECT_EQ(f->get_u64("llama.embedding_length"), 256u);
  EXPECT_EQ(f->get_i64_or("llama.embedding_length", -1), 256);
  EXPECT_EQ(f->get_i64_or("no.such.key", -1), -1);
  EXPECT_FALSE(f->get_u64_opt("no.such.key").has_value());
  EXPECT_FALSE(f->get_string_opt("no.such.key").has_value());
  EXPECT_GT(f->get_f64("llama.attention.layer_norm_rms_epsilon"), 0.0);
  try {
    f->get_string("llama.embedding_length");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("'llama.embedding_length': expected a string, found uint32"));
  }
  try {
    f->get_u64("no.such.key");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("missing required metadata key 'no.such.key'"));
  }
  EXPECT_THROW(f->get_string_array("llama.embedding_length"), Error);
  EXPECT_THROW(f->get_int_array("tokenizer.ggml.scores"), Error);
}

TEST(GgufRead, OpenErrorsNameTheFile) {
  try {
    GgufFile::open("/nonexistent/dir/model.gguf");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent/dir/model.gguf: cannot open"));
  }
  try {
    GgufFile::open(testing::shared_dir().string());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("not a regular file"));
  }
  try {
    GgufFile::open(testdata_path("tokenizers/ggml-vocab-gpt-2.vocabinfo.json"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("byte offset 0"));
  }
}

// The real default model, when scripts/fetch_model.sh has fetched it (CI does).
TEST(GgufRealModel, Gemma3_270m) {
  const std::string path = testing::real_model_path();
  if (path.empty()) GTEST_SKIP() << "default model not fetched (run scripts/fetch_model.sh)";
  const auto f = GgufFile::open(path);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->metadata().size(), 33u);
  EXPECT_EQ(f->tensors().size(), 236u);
  EXPECT_EQ(f->get_string("general.architecture"), "gemma3");
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), 262144u);
  EXPECT_EQ(f->get_f32_array("tokenizer.ggml.scores").size(), 262144u);
  EXPECT_EQ(f->get_u64("gemma3.embedding_length"), 640u);
  std::map<std::string, int> types;
  for (const auto& t : f->tensors()) ++types[std::string(traits(t.type).name)];
  EXPECT_EQ(types, (std::map<std::string, int>{
                       {"F32", 109}, {"Q5_0", 81}, {"Q4_K", 27}, {"Q8_0", 10}, {"Q6_K", 9}}));
}

}  // namespace
}  // namespace tandem
