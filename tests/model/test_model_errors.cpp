// Model loading errors: an unsupported architecture, a missing key or tensor, a wrong shape and a
// bad batch each get a tandem::Error that says what was expected and what was found.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>

#include "common/error.h"
#include "common/testdata.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "tandem/engine.h"

namespace tandem {
namespace {

// Writes a copy of a testdata model with `edit` applied to the writer, returns its path.
std::string edited_copy(const std::string& name,
                        const std::function<void(GgufWriter&, const GgufFile&)>& edit) {
  auto src = GgufFile::open(tandem::testing::testdata_path("models/" + name));
  GgufWriter w;
  w.copy_metadata(*src);
  edit(w, *src);
  const auto path = std::filesystem::temp_directory_path() /
                    ("tandem-model-errors-" + std::to_string(::getpid()) + "-" + name);
  w.write(path.string());
  return path.string();
}

void add_all_tensors_except(GgufWriter& w, const GgufFile& f, const std::string& skip) {
  for (const auto& t : f.tensors()) {
    if (t.name != skip) w.add_tensor_view(t);
  }
}

std::string load_error(const std::string& path) {
  try {
    Model::load(path);
  } catch (const Error& e) {
    std::filesystem::remove(path);
    return e.what();
  }
  std::filesystem::remove(path);
  return "";
}

TEST(ModelErrors, UnsupportedArchitectureListsSupported) {
  const auto path = edited_copy("synth-llama-Q4_K.gguf", [](GgufWriter& w, const GgufFile& f) {
    w.set_string("general.architecture", "mamba");
    add_all_tensors_except(w, f, "");
  });
  const std::string msg = load_error(path);
  EXPECT_NE(msg.find("unsupported architecture 'mamba'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("llama, qwen2, qwen3, gemma3"), std::string::npos) << msg;
}

TEST(ModelErrors, MissingKeyIsNamed) {
  const auto path = edited_copy("synth-llama-Q4_K.gguf", [](GgufWriter& w, const GgufFile& f) {
    w.remove("llama.embedding_length");
    add_all_tensors_except(w, f, "");
  });
  const std::string msg = load_error(path);
  EXPECT_NE(msg.find("llama.embedding_length"), std::string::npos) << msg;
}

TEST(ModelErrors, MissingTensorIsNamedWithItsShape) {
  const auto path = edited_copy("synth-qwen2-Q4_K_M.gguf", [](GgufWriter& w, const GgufFile& f) {
    add_all_tensors_except(w, f, "blk.1.attn_k.bias");
  });
  const std::string msg = load_error(path);
  EXPECT_NE(msg.find("missing tensor 'blk.1.attn_k.bias' (expected shape [128])"),
            std::string::npos)
      << msg;
}

TEST(ModelErrors, WrongShapeSaysExpectedAndFound) {
  const auto path = edited_copy("synth-llama-F16.gguf", [](GgufWriter& w, const GgufFile& f) {
    for (const auto& t : f.tensors()) {
      if (t.name == "blk.0.ffn_up.weight") {
        // Same bytes, transposed shape: [768, 256] instead of [256, 768].
        const int64_t ne[2] = {768, 256};
        w.add_tensor_view(t.name, t.type, ne, std::span<const uint8_t>(t.data, t.nbytes));
      } else {
        w.add_tensor_view(t);
      }
    }
  });
  const std::string msg = load_error(path);
  EXPECT_NE(msg.find("'blk.0.ffn_up.weight': expected shape [256, 768], found [768, 256]"),
            std::string::npos)
      << msg;
}

TEST(ModelErrors, BadBatchesAreRejectedWithoutChangingTheCache) {
  auto model = Model::load(tandem::testing::testdata_path("models/synth-llama-Q4_K.gguf"));
  ContextParams cp;
  cp.n_ctx = 8;
  cp.n_seq = 2;
  cp.n_threads = 1;
  Context ctx(*model, cp);
  std::vector<BatchToken> ok = {{5, 0, 0, true}, {6, 1, 0, true}};
  ctx.decode(ok);
  EXPECT_EQ(ctx.seq_length(0), 2);
  auto expect_error = [&](std::vector<BatchToken> b, const std::string& what) {
    try {
      ctx.decode(b);
      ADD_FAILURE() << "expected an error containing '" << what << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_EQ(ctx.seq_length(0), 2);
    EXPECT_EQ(ctx.seq_length(1), 0);
  };
  expect_error({{5, 2, 0}, {99999, 3, 0}}, "outside the vocabulary");
  expect_error({{5, 0, 2}}, "sequence 2 is outside [0, 2)");
  expect_error({{5, 3, 0}}, "expects position 2, found 3");
  expect_error({{5, 0, 1},
                {5, 1, 1},
                {5, 2, 0},
                {5, 3, 0},
                {5, 4, 0},
                {5, 5, 0},
                {5, 6, 0},
                {5, 7, 0},
                {5, 8, 0}},
               "is full");
  expect_error({}, "empty");
  EXPECT_THROW(ctx.logits(5), Error);
  ctx.truncate(0, 1);
  EXPECT_EQ(ctx.seq_length(0), 1);
}

}  // namespace
}  // namespace tandem
