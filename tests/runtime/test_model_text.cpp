// The public text API of a Model (tandem/engine.h) gives what the internal tokenizer and chat
// templates give, on a synthetic Gemma 3 (a Gemma vocabulary and template).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/testdata.h"
#include "gguf/gguf.h"
#include "runtime/model_internals.h"
#include "tandem/engine.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

TEST(ModelText, IsTheTokenizers) {
  const auto model = Model::load(testing::testdata_path("models/synth-gemma3-Q4_K_M.gguf"));
  const Tokenizer& tok = ModelInternals::tokenizer(*model);
  EXPECT_EQ(model->vocab_size(), tok.n_vocab());
  EXPECT_LE(model->vocab_size(), model->info().n_vocab);
  EXPECT_EQ(model->info().vocab_hash, tok.fingerprint_hex());
  EXPECT_EQ(model->bos(), tok.bos());
  EXPECT_EQ(model->eos(), tok.eos());
  EXPECT_EQ(model->adds_bos(), tok.add_bos());

  const std::string text =
      "Hello <start_of_turn>world\n\xe2\x82\xac \xff";  // a control text, €, bad UTF-8
  for (bool add : {false, true}) {
    for (bool special : {false, true}) {
      const std::vector<TokenId> ids = model->tokenize(text, add, special);
      EXPECT_EQ(ids, tok.encode(text, add, special));
      for (bool remove : {false, true})
        for (bool unparse : {false, true})
          EXPECT_EQ(model->detokenize(ids, remove, unparse), tok.decode(ids, remove, unparse));
    }
  }
  for (TokenId id : {TokenId{-1}, TokenId{0}, model->bos(), model->eos(), model->vocab_size()}) {
    EXPECT_EQ(model->token_piece(id), tok.token_to_piece(id));
    EXPECT_EQ(model->token_piece(id, false), tok.token_to_piece(id, false));
    EXPECT_EQ(model->is_end_of_generation(id), tok.is_eog(id)) << id;
  }

  const std::vector<ChatMessage> msgs = {{"system", "Be brief."}, {"user", "Hi"}};
  for (bool prompt : {false, true})
    EXPECT_EQ(model->chat_prompt(msgs, prompt),
              apply_chat_template(ModelInternals::file(*model), msgs, prompt));
}

// A chat continued by one user turn: appending chat_continuation to a rendered conversation whose
// last answer stops before its end of turn gives the rendering of the whole conversation.
TEST(ModelText, ChatContinuationClosesTheAnswerAndOpensTheNextTurn) {
  for (const char* file : {"models/synth-qwen2-Q4_K_M.gguf", "models/synth-gemma3-Q4_K_M.gguf"}) {
    const auto model = Model::load(testing::testdata_path(file));
    const std::vector<ChatMessage> first = {{"system", "Be brief."},
                                            {"user", "Capital of France?"}};
    std::vector<ChatMessage> whole = first;
    whole.push_back({"assistant", "Paris"});
    whole.push_back({"user", "And of Italy?"});
    const std::string continued =
        model->chat_prompt(first, true) + "Paris" + model->chat_continuation("And of Italy?");
    EXPECT_EQ(continued, model->chat_prompt(whole, true)) << file;
    // The system message is said once, in the first turn only.
    const std::string more = model->chat_continuation("And of Italy?");
    EXPECT_EQ(more.find("Be brief."), std::string::npos) << file;
  }
}

// TextStream is StreamDecoder: the same pieces, a split UTF-8 character held back.
TEST(ModelText, TextStreamIsTheStreamDecoder) {
  const auto model = Model::load(testing::testdata_path("models/synth-gemma3-Q4_K_M.gguf"));
  const std::vector<TokenId> ids =
      model->tokenize("a \xe2\x82\xac and \xf0\x9f\x98\x80 b", false, false);
  for (bool special : {false, true}) {
    TextStream mine(*model, special);
    StreamDecoder theirs(ModelInternals::tokenizer(*model), special);
    for (TokenId id : ids) EXPECT_EQ(mine.push(id), theirs.push(id));
    EXPECT_EQ(mine.flush(), theirs.flush());
  }
}

}  // namespace
}  // namespace tandem
