// Tokenizer behaviour beyond the reference vectors: streaming detokenization, chat templates,
// corrupt vocabularies, API details, and the real Gemma 3 model when it is present.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/default_model.h"
#include "common/error.h"
#include "common/testdata.h"
#include "gguf/gguf.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

using tandem::testing::read_file;
using tandem::testing::testdata_path;

std::unique_ptr<Tokenizer> load_vocab(const std::string& name, std::unique_ptr<GgufFile>* keep) {
  auto f = GgufFile::open(testdata_path("tokenizers/ggml-vocab-" + name + ".gguf"));
  auto t = Tokenizer::from_gguf(*f);
  if (keep) *keep = std::move(f);
  return t;
}

bool valid_utf8(std::string_view s) {
  std::string out;
  return utf8_sanitize_append(s, out, true) == 0 && out == s;
}

// ---------------------------------------------------------------------------------------------
// Minimal in-memory GGUF v3 builder (metadata only).

class GgufBuilder {
 public:
  GgufBuilder& str(const std::string& key, const std::string& v) {
    kv(key, 8);
    put_str(v);
    return *this;
  }
  GgufBuilder& u32(const std::string& key, uint32_t v) {
    kv(key, 4);
    put(v);
    return *this;
  }
  GgufBuilder& boolean(const std::string& key, bool v) {
    kv(key, 7);
    put(static_cast<uint8_t>(v));
    return *this;
  }
  GgufBuilder& strs(const std::string& key, const std::vector<std::string>& v) {
    kv(key, 9);
    put(uint32_t{8});
    put(static_cast<uint64_t>(v.size()));
    for (const auto& s : v) put_str(s);
    return *this;
  }
  GgufBuilder& f32s(const std::string& key, const std::vector<float>& v) {
    kv(key, 9);
    put(uint32_t{6});
    put(static_cast<uint64_t>(v.size()));
    for (float x : v) put(x);
    return *this;
  }
  GgufBuilder& i32s(const std::string& key, const std::vector<int32_t>& v) {
    kv(key, 9);
    put(uint32_t{5});
    put(static_cast<uint64_t>(v.size()));
    for (int32_t x : v) put(x);
    return *this;
  }
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> out;
    auto app = [&](const void* p, size_t n) {
      out.insert(out.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
    };
    app("GGUF", 4);
    const uint32_t version = 3;
    const uint64_t n_tensors = 0;
    app(&version, 4);
    app(&n_tensors, 8);
    app(&n_kv_, 8);
    out.insert(out.end(), body_.begin(), body_.end());
    while (out.size() % 32) out.push_back(0);
    return out;
  }

 private:
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    body_.insert(body_.end(), p, p + sizeof v);
  }
  void put_str(const std::string& s) {
    put(static_cast<uint64_t>(s.size()));
    body_.insert(body_.end(), s.begin(), s.end());
  }
  void kv(const std::string& key, uint32_t type) {
    put_str(key);
    put(type);
    ++n_kv_;
  }
  std::vector<uint8_t> body_;
  uint64_t n_kv_ = 0;
};

// A tiny SPM vocab: <unk> <s> </s>, byte tokens for a few bytes, and some pieces.
GgufBuilder tiny_spm() {
  GgufBuilder b;
  std::vector<std::string> toks = {
      "<unk>",  "<s>",          "</s>", "<0x0A>", "<0xE2>", "<0x96>",
      "<0x81>", "\xE2\x96\x81", "a",    "b",      "ab",     std::string("\xE2\x96\x81") + "ab"};
  std::vector<float> scores(toks.size(), 0.0f);
  scores[10] = -1.0f;
  scores[11] = -0.5f;
  std::vector<int32_t> types = {2, 3, 3, 6, 6, 6, 6, 1, 1, 1, 1, 1};
  b.str("general.architecture", "llama")
      .str("tokenizer.ggml.model", "llama")
      .strs("tokenizer.ggml.tokens", toks)
      .f32s("tokenizer.ggml.scores", scores)
      .i32s("tokenizer.ggml.token_type", types);
  return b;
}

std::unique_ptr<Tokenizer> from_bytes(const std::vector<uint8_t>& bytes) {
  auto f = GgufFile::from_memory(bytes.data(), bytes.size(), "<test>");
  return Tokenizer::from_gguf(*f);
}

void expect_error(const GgufBuilder& b, const std::string& needle) {
  const auto bytes = b.bytes();
  try {
    from_bytes(bytes);
    ADD_FAILURE() << "expected tandem::Error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TokenizerCorrupt, TinySpmWorks) {
  const auto bytes = tiny_spm().bytes();
  auto tok = from_bytes(bytes);
  EXPECT_EQ(tok->n_vocab(), 12);
  EXPECT_EQ(tok->encode("ab", true, false), (std::vector<TokenId>{1, 11}));
  // A character without a token falls back to bytes, and bytes without a token to <unk>.
  EXPECT_EQ(tok->encode("ab\nz", false, false), (std::vector<TokenId>{11, 3, 0}));
  EXPECT_EQ(tok->decode(tok->encode("ab ab", false, false)), "ab ab");
}

TEST(TokenizerCorrupt, MissingOrBadKeysThrow) {
  expect_error(GgufBuilder().str("general.architecture", "llama"), "tokenizer.ggml.model");
  expect_error(
      GgufBuilder().str("tokenizer.ggml.model", "bert").strs("tokenizer.ggml.tokens", {"a"}),
      "bert");
  expect_error(GgufBuilder().str("tokenizer.ggml.model", "llama"), "tokenizer.ggml.tokens");
  expect_error(GgufBuilder().str("tokenizer.ggml.model", "llama").strs("tokenizer.ggml.tokens", {}),
               "empty");
  expect_error(GgufBuilder()
                   .str("tokenizer.ggml.model", "llama")
                   .strs("tokenizer.ggml.tokens", {"a", "b"})
                   .f32s("tokenizer.ggml.scores", {0.0f}),
               "tokenizer.ggml.scores");
  expect_error(GgufBuilder()
                   .str("tokenizer.ggml.model", "llama")
                   .strs("tokenizer.ggml.tokens", {"a", "b"})
                   .i32s("tokenizer.ggml.token_type", {1}),
               "tokenizer.ggml.token_type");
  expect_error(GgufBuilder()
                   .str("tokenizer.ggml.model", "llama")
                   .str("tokenizer.ggml.tokens", "not an array"),
               "tokenizer.ggml.tokens");
  expect_error(GgufBuilder()
                   .str("tokenizer.ggml.model", "gpt2")
                   .str("tokenizer.ggml.pre", "qwen2")
                   .strs("tokenizer.ggml.tokens", {"a", "b"}),
               "tokenizer.ggml.merges");
  expect_error(GgufBuilder()
                   .str("tokenizer.ggml.model", "gpt2")
                   .str("tokenizer.ggml.pre", "no-such-pre")
                   .strs("tokenizer.ggml.tokens", {"a", "b"})
                   .strs("tokenizer.ggml.merges", {"a b"}),
               "no-such-pre");
  expect_error(GgufBuilder()
                   .str("tokenizer.ggml.model", "llama")
                   .strs("tokenizer.ggml.tokens", {"a", "b"})
                   .str("tokenizer.ggml.bos_token_id", "one"),
               "tokenizer.ggml.bos_token_id");
}

TEST(TokenizerCorrupt, OddButLoadableVocabsDoNotCrash) {
  // Out-of-range special ids are ignored; empty and duplicate token texts are tolerated;
  // a BPE vocab without byte tokens drops unknown bytes like llama.cpp.
  GgufBuilder b;
  b.str("tokenizer.ggml.model", "gpt2")
      .str("tokenizer.ggml.pre", "gpt-2")
      .strs("tokenizer.ggml.tokens", {"a", "", "a", "b", "ab", "\xC4\xA0"})
      .strs("tokenizer.ggml.merges", {"a b", "nospace", " x"})
      .u32("tokenizer.ggml.bos_token_id", 1000)
      .u32("tokenizer.ggml.eos_token_id", 4)
      .boolean("tokenizer.ggml.add_bos_token", true);
  const auto bytes = b.bytes();
  auto tok = from_bytes(bytes);
  EXPECT_EQ(tok->n_vocab(), 6);
  EXPECT_EQ(tok->token_text(1), "[EMPTY_1]");
  EXPECT_EQ(tok->bos(), -1);  // default 11 is out of range too
  EXPECT_EQ(tok->encode("ab", true, false), (std::vector<TokenId>{4}));
  EXPECT_EQ(tok->encode("a\xFF\xFE b", false, false), (std::vector<TokenId>{2, 5, 3}));
  EXPECT_EQ(tok->token_to_piece(-5), "");
  EXPECT_EQ(tok->token_to_piece(1 << 30), "");
  EXPECT_EQ(tok->decode(std::vector<TokenId>{-1, 99, 4}), "ab");
}

// ---------------------------------------------------------------------------------------------
// API details visible in llama.cpp's behaviour

TEST(TokenizerApi, SpecialTokensAndPieces) {
  auto qwen = load_vocab("qwen3", nullptr);
  EXPECT_EQ(qwen->model_name(), "gpt2");
  const TokenId im_start = qwen->find_token("<|im_start|>");
  ASSERT_GE(im_start, 0);
  EXPECT_EQ(qwen->attr(im_start), TokenAttr::CONTROL);
  EXPECT_EQ(qwen->token_to_piece(im_start, true), "<|im_start|>");
  EXPECT_EQ(qwen->token_to_piece(im_start, false), "");
  EXPECT_EQ(qwen->encode("<|im_start|>", false, true), (std::vector<TokenId>{im_start}));
  EXPECT_GT(qwen->encode("<|im_start|>", false, false).size(), 1u);
  // USER_DEFINED tokens are matched in both modes; "</s>" is forced to CONTROL.
  EXPECT_EQ(qwen->encode("<think>", false, false), (std::vector<TokenId>{151667}));
  EXPECT_EQ(qwen->encode("</s>", false, true), (std::vector<TokenId>{128247}));
  EXPECT_EQ(qwen->attr(128247), TokenAttr::CONTROL);
  EXPECT_TRUE(qwen->is_eog(151645));
  EXPECT_TRUE(qwen->is_eog(151643));
  EXPECT_FALSE(qwen->is_eog(im_start));
  EXPECT_EQ(qwen->attr(151935), TokenAttr::UNUSED);
  EXPECT_EQ(qwen->token_to_piece(151935), "");

  auto spm = load_vocab("llama-spm", nullptr);
  EXPECT_EQ(spm->model_name(), "llama");
  EXPECT_EQ(spm->encode(" Hello", true, false), (std::vector<TokenId>{1, 29871, 15043}));
  const auto ids = spm->encode("Hello world", true, false);
  EXPECT_EQ(spm->decode(ids), "<s> Hello world");
  // llama_detokenize keeps the prefix space when it removes BOS (remove_space = false).
  EXPECT_EQ(spm->decode(ids, /*remove_special=*/true), " Hello world");
  EXPECT_EQ(spm->decode(ids, false, /*unparse_special=*/false), " Hello world");
  EXPECT_EQ(spm->token_to_piece(spm->find_token("<0x0A>")), "\n");
  EXPECT_EQ(spm->encode("", true, false), (std::vector<TokenId>{1}));
  EXPECT_TRUE(spm->encode("", false, false).empty());

  auto gpt2 = load_vocab("gpt-2", nullptr);
  EXPECT_TRUE(gpt2->clean_spaces());
  EXPECT_EQ(gpt2->decode(gpt2->encode("Hi , there . It 's", false, false)), "Hi, there. It's");
}

// ---------------------------------------------------------------------------------------------
// Streaming

TEST(StreamDecoder, Utf8Sanitize) {
  std::string out;
  EXPECT_EQ(utf8_sanitize_append("a\xF0\x9F", out, false), 2u);
  EXPECT_EQ(out, "a");
  out.clear();
  EXPECT_EQ(utf8_sanitize_append("a\xF0\x9F", out, true), 0u);
  EXPECT_EQ(out, "a\xEF\xBF\xBD");
  out.clear();
  EXPECT_EQ(utf8_sanitize_append("\xFF"
                                 "b\xC3\xA9\x80\xED\xA0\x80",
                                 out, false),
            0u);
  EXPECT_EQ(out,
            "\xEF\xBF\xBD"
            "b\xC3\xA9\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(StreamDecoder, EmojiSplitAcrossByteTokens) {
  auto spm = load_vocab("llama-spm", nullptr);
  StreamDecoder sd(*spm);
  std::vector<TokenId> bytes;
  for (const char* b : {"<0xF0>", "<0x9F>", "<0x99>", "<0x82>"})
    bytes.push_back(spm->find_token(b));
  EXPECT_EQ(sd.push(bytes[0]), "");
  EXPECT_EQ(sd.push(bytes[1]), "");
  EXPECT_EQ(sd.push(bytes[2]), "");
  EXPECT_EQ(sd.push(bytes[3]), "\xF0\x9F\x99\x82");
  EXPECT_EQ(sd.flush(), "");
  // Incomplete at the end -> U+FFFD at flush; impossible bytes -> U+FFFD right away.
  EXPECT_EQ(sd.push(bytes[0]), "");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(sd.push(spm->find_token("<0xFF>")), "\xEF\xBF\xBD");
  EXPECT_EQ(sd.push(bytes[1]), "\xEF\xBF\xBD");  // lone continuation byte
}

TEST(StreamDecoder, CorpusNeverEmitsInvalidUtf8) {
  const std::string corpus = read_file(testdata_path("tokenizers/corpus.jsonl"));
  for (const char* name : {"llama-spm", "phi-3", "llama-bpe", "gpt-2", "qwen3"}) {
    auto tok = load_vocab(name, nullptr);
    std::istringstream lines(corpus);
    int n = 0;
    for (std::string line; std::getline(lines, line);) {
      if (line.empty()) continue;
      const std::string text = nlohmann::json::parse(line)["text"].get<std::string>();
      const auto ids = tok->encode(text, true, true);
      StreamDecoder sd(*tok);
      std::string streamed, concat;
      for (TokenId id : ids) {
        const std::string chunk = sd.push(id);
        ASSERT_TRUE(valid_utf8(chunk)) << name << " chunk of " << text;
        streamed += chunk;
        concat += tok->token_to_piece(id, true);
      }
      const std::string rest = sd.flush();
      ASSERT_TRUE(valid_utf8(rest));
      streamed += rest;
      EXPECT_EQ(streamed, concat) << name << ": " << text;
      ++n;
    }
    EXPECT_GT(n, 200);
  }
}

// ---------------------------------------------------------------------------------------------
// Chat templates

TEST(ChatTemplate, Formats) {
  const std::vector<ChatMessage> msgs = {
      {"system", "Be brief."}, {"user", " Hi! "}, {"assistant", "Hello."}, {"user", "2+2?"}};
  EXPECT_EQ(apply_chat_template(ChatTemplateKind::Gemma, msgs, true),
            "<start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n"
            "<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\n2+2?<end_of_turn>\n"
            "<start_of_turn>model\n");
  EXPECT_EQ(apply_chat_template(ChatTemplateKind::ChatML, msgs, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi! <|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(apply_chat_template(ChatTemplateKind::ChatML, {{"user", "x"}}, false),
            "<|im_start|>user\nx<|im_end|>\n");
  EXPECT_EQ(apply_chat_template(ChatTemplateKind::Llama3, {{"user", "x"}}, true),
            "<|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

// A ChatML template's own default system turn, as its Jinja text writes it (Qwen2.5's two
// literals: one alone, one that goes on with the conversation's system message).
TEST(ChatTemplate, DefaultSystemFromTheJinjaText) {
  const std::string qwen =
      "{%- if messages[0]['role'] == 'system' %}\n"
      "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
      "{%- else %}\n"
      "    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
      "assistant.<|im_end|>\\n' }}\n"
      "{%- endif %}";
  EXPECT_EQ(chatml_default_system(qwen),
            "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  EXPECT_EQ(chatml_default_system("{{'<|im_start|>' + message['role']}}"), "");
  EXPECT_EQ(chatml_default_system("'<|im_start|>system\\n' + x + '<|im_end|>'"), "");
  EXPECT_EQ(chatml_default_system("'<|im_start|>system\\nno end"), "");
  // The qwen3 test vocab's template writes no system turn of its own: nothing is added.
  std::unique_ptr<GgufFile> f;
  load_vocab("qwen3", &f);
  EXPECT_EQ(chatml_default_system(*f->get_string_opt("tokenizer.chat_template")), "");
  EXPECT_EQ(apply_chat_template(*f, {{"user", "x"}}, false), "<|im_start|>user\nx<|im_end|>\n");
}

TEST(ChatTemplate, Detection) {
  EXPECT_EQ(detect_chat_template("{{ '<start_of_turn>' + role }}"), ChatTemplateKind::Gemma);
  EXPECT_EQ(detect_chat_template("{{'<|im_start|>' + message['role']}}"), ChatTemplateKind::ChatML);
  EXPECT_EQ(detect_chat_template("chatml"), ChatTemplateKind::ChatML);
  EXPECT_EQ(detect_chat_template("<|start_header_id|>x<|end_header_id|>"),
            ChatTemplateKind::Llama3);
  try {
    detect_chat_template("{% for m in messages %}[INST]{% endfor %}");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gemma, chatml"), std::string::npos) << e.what();
  }
  // The qwen3 vocab carries its template.
  std::unique_ptr<GgufFile> f;
  load_vocab("qwen3", &f);
  EXPECT_EQ(chat_template_from_gguf(*f), ChatTemplateKind::ChatML);
  // Without a template: by architecture.
  auto bytes = GgufBuilder().str("general.architecture", "gemma3").bytes();
  auto g = GgufFile::from_memory(bytes.data(), bytes.size());
  EXPECT_EQ(chat_template_from_gguf(*g), ChatTemplateKind::Gemma);
  bytes = GgufBuilder().str("general.architecture", "qwen3").bytes();
  g = GgufFile::from_memory(bytes.data(), bytes.size());
  EXPECT_EQ(chat_template_from_gguf(*g), ChatTemplateKind::ChatML);
  bytes = GgufBuilder().str("general.architecture", "mamba").bytes();
  g = GgufFile::from_memory(bytes.data(), bytes.size());
  EXPECT_THROW(chat_template_from_gguf(*g), Error);
}

TEST(ChatTemplate, ChatMLTokenizesToControlTokens) {
  auto qwen = load_vocab("qwen3", nullptr);
  const std::string p = apply_chat_template(ChatTemplateKind::ChatML, {{"user", "Hi"}}, true);
  const auto ids = qwen->encode(p, true, true);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), qwen->find_token("<|im_start|>"));
  EXPECT_EQ(qwen->decode(ids), p);
}

// ---------------------------------------------------------------------------------------------
// Real Gemma 3 model (skipped when absent)

class GemmaTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = test_model_path();
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "Gemma 3 model not found at " << path;
    file_ = GgufFile::open(path);
    if (file_->get_string_opt("general.architecture").value_or("") != "gemma3")
      GTEST_SKIP() << path << " is not a gemma3 model";
    tok_ = Tokenizer::from_gguf(*file_);
  }
  std::unique_ptr<GgufFile> file_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(GemmaTokenizer, Basics) {
  const Tokenizer& t = *tok_;
  EXPECT_EQ(t.n_vocab(), 262144);
  EXPECT_EQ(t.model_name(), "llama");
  EXPECT_FALSE(t.add_space_prefix());
  EXPECT_EQ(t.bos(), 2);
  EXPECT_EQ(t.eos(), 1);
  EXPECT_EQ(t.find_token("<start_of_turn>"), 105);
  EXPECT_EQ(t.find_token("<end_of_turn>"), 106);
  EXPECT_EQ(t.eot(), 106);
  EXPECT_TRUE(t.is_eog(1));
  EXPECT_TRUE(t.is_eog(106));
  EXPECT_EQ(t.encode("Hello world", true, false), (std::vector<TokenId>{2, 9259, 1902}));
  const std::string prompt =
      apply_chat_template(*file_, {{"system", "Be brief."}, {"user", "Hi"}}, true);
  EXPECT_EQ(prompt, "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n");
  const auto ids = t.encode(prompt, true, true);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(ids[1], 105);
  EXPECT_EQ(t.decode(ids, /*remove_special=*/true), prompt);
  EXPECT_EQ(t.encode("<start_of_turn>", false, false).size() > 1, true);
}

TEST_F(GemmaTokenizer, RoundTripSharedData) {
  const auto root = tandem::testing::shared_dir() / "data";
  ASSERT_TRUE(std::filesystem::exists(root));
  size_t n = 0, bytes = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    const std::string content = read_file(e.path().string());
    for (size_t pos = 0; pos < content.size(); pos += 65536) {
      const std::string text = content.substr(pos, 65536);
      const auto ids = tok_->encode(text, false, false);
      // Chunks may cut a UTF-8 sequence: byte fallback still gives the bytes back.
      EXPECT_EQ(tok_->decode(ids, false, false), text) << e.path();
      ++n;
      bytes += text.size();
    }
  }
  std::printf("[gemma3] round trip over ../shared/data: %zu texts, %zu bytes\n", n, bytes);
}

}  // namespace
}  // namespace tandem
