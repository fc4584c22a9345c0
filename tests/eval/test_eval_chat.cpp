// tandem eval --chat: an item as chat turns, rendered by the vocabulary's own chat template and
// tokenized with its control tokens as single tokens; the chat answer form's strict extraction
// and its cut; the plain prompts unchanged. Runs without a model: the Qwen3 vocab-only GGUF of
// ../shared/testdata carries a ChatML template.
#include <gtest/gtest.h>

#include "common/error.h"
#include "common/testdata.h"
#include "gguf/gguf.h"
#include "tandem/eval_tasks.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tandem::eval {
namespace {

const std::vector<std::string> kFive = {"A", "B", "C", "D", "E"};

std::string data_dir() {
  return (testing::shared_dir() / "data").string();
}

// FNV-1a, to pin long prompt texts byte for byte.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

Task chat_task(const std::string& name, int shots, ChatForm form) {
  Task t = load_task(name, data_dir(), shots);
  use_chat_form(t, form);
  return t;
}

TEST(EvalChat, ShotsAreEarlierTurnsAndTheItemTheLastUserTurn) {
  const Task t = chat_task("csqa-train", 2, {"Be brief.", ChatAnswer::Reason});
  const Item& item = t.items[0];
  const auto msgs = chat_messages(t, item);
  ASSERT_EQ(msgs.size(), 6u);
  const std::vector<std::string> roles = {"system", "user",      "assistant",
                                          "user",   "assistant", "user"};
  for (size_t i = 0; i < msgs.size(); ++i) EXPECT_EQ(msgs[i].role, roles[i]) << i;
  EXPECT_EQ(msgs[0].content, "Be brief.");
  EXPECT_EQ(msgs[1].content.rfind("Answer the multiple choice question about common sense.", 0), 0u)
      << "the instruction opens the first user turn";
  EXPECT_EQ(msgs[2].content, "The answer is (" + t.shots[0].gold + ").");
  EXPECT_EQ(msgs[3].content.rfind("Question: ", 0), 0u) << "the instruction only once";
  // The item's question is the plain one without its "Answer:" cue.
  EXPECT_EQ(msgs[5].content + "\nAnswer:", item.question);
  EXPECT_EQ(t.max_answer_tokens, 48);

  const Task letter = chat_task("csqa-train", 0, {"", ChatAnswer::Letter});
  const auto one = chat_messages(letter, letter.items[0]);
  ASSERT_EQ(one.size(), 1u) << "no shots, no system: one user turn";
  EXPECT_NE(one[0].content.find("Reply with the letter only.\n\nQuestion: "), std::string::npos);
  EXPECT_EQ(letter.max_answer_tokens, 4);
  // The choice form: the shot's answer names its choice's text after the letter.
  const Task choice = chat_task("csqa-train", 1, {"", ChatAnswer::Choice});
  const auto named = chat_messages(choice, choice.items[0]);
  ASSERT_EQ(named.size(), 3u);
  const Item& shot = choice.shots[0];
  const std::string answer = named[1].content;
  ASSERT_EQ(answer.rfind("The answer is (" + shot.gold + ") ", 0), 0u) << answer;
  const std::string text = answer.substr(18, answer.size() - 19);
  EXPECT_NE(shot.question.find("\n" + shot.gold + ". " + text + "\n"), std::string::npos) << text;
  EXPECT_EQ(extract_chat_choice(answer, shot.labels), shot.gold);
  EXPECT_EQ(choice.max_answer_tokens, 24);
  EXPECT_THROW(chat_messages(load_task("csqa", data_dir(), 0), letter.items[0]), Error)
      << "a task without a chat form";
}

TEST(EvalChat, GsmShotsEndInTheAnswerStatementAndLambadaAsksForTheWord) {
  const Task gsm = chat_task("gsm8k", 1, {});
  const auto msgs = chat_messages(gsm, gsm.items[0]);
  ASSERT_EQ(msgs.size(), 3u);
  EXPECT_EQ(msgs[1].content.find("<<"), std::string::npos) << "calculator notes removed";
  EXPECT_EQ(msgs[1].content.find("####"), std::string::npos);
  EXPECT_EQ(msgs[1].content.substr(msgs[1].content.size() - 17), "The answer is 18.");
  EXPECT_EQ(extract_number(msgs[1].content), "18");
  const Task lambada = chat_task("lambada", 0, {});
  const auto words = chat_messages(lambada, lambada.items[0]);
  ASSERT_EQ(words.size(), 1u);
  EXPECT_EQ(words[0].content.substr(words[0].content.size() - 16), "don't care about");
  EXPECT_EQ(lambada.max_answer_tokens, 8);
}

// The ids of an item's chat prompt (what eval decodes from: the template's text tokenized with
// parse_special, as `tandem run --chat`) are exactly the template's pieces: each ChatML marker
// one special token, the text between them tokenized as plain text, and no BOS.
TEST(EvalChat, PromptIdsAreTheTemplatesRenderingWithSingleSpecialTokens) {
  const auto file = GgufFile::open(testing::testdata_path("tokenizers/ggml-vocab-qwen3.gguf"));
  const auto tok = Tokenizer::from_gguf(*file);
  const Task t = chat_task("csqa-train", 1, {"Be brief.", ChatAnswer::Reason});
  const auto msgs = chat_messages(t, t.items[3]);
  const std::string text = apply_chat_template(*file, msgs, true);
  std::string expected;
  for (const ChatMessage& m : msgs)
    expected += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  expected += "<|im_start|>assistant\n";
  EXPECT_EQ(text, expected) << "ChatML, the vocabulary's own template";

  const auto start = tok->encode("<|im_start|>", false, true);
  const auto end = tok->encode("<|im_end|>", false, true);
  ASSERT_EQ(start.size(), 1u);
  ASSERT_EQ(end.size(), 1u);
  std::vector<TokenId> want;
  auto plain = [&](const std::string& s) {
    const auto ids = tok->encode(s, false, false);
    want.insert(want.end(), ids.begin(), ids.end());
  };
  for (const ChatMessage& m : msgs) {
    want.push_back(start[0]);
    plain(m.role + "\n" + m.content);
    want.push_back(end[0]);
    plain("\n");
  }
  want.push_back(start[0]);
  plain("assistant\n");
  const auto ids = tok->encode(text, true, true);
  EXPECT_EQ(ids, want);
  EXPECT_EQ(ids.front(), start[0]) << "no BOS before the first turn";
  EXPECT_GT(tok->encode(text, true, false).size(), ids.size())
      << "without parse_special the markers are spelled out in pieces";
  // The assistant's end of turn is an end-of-generation token: the decoder stops there, before
  // the callback or the text sees it.
  EXPECT_TRUE(tok->is_eog(end[0]));
}

TEST(EvalChat, ExtractsTheAnswerStatementOrALetterAlone) {
  EXPECT_EQ(extract_chat_choice("The answer is (B)", kFive), "B");
  EXPECT_EQ(extract_chat_choice("The answer is B", kFive), "B");
  EXPECT_EQ(extract_chat_choice("Banks hold money. The answer is (B) bank", kFive), "B");
  EXPECT_EQ(extract_chat_choice("Money sits in a bank, so the answer is: (D)", kFive), "D");
  EXPECT_EQ(extract_chat_choice("The answer is (A) and (A) alone", kFive), "A");
  EXPECT_EQ(extract_chat_choice("B", kFive), "B");
  EXPECT_EQ(extract_chat_choice(" (C)\n", kFive), "C");
  EXPECT_EQ(extract_chat_choice("E.", kFive), "E");
  EXPECT_EQ(extract_chat_choice("D)", kFive), "D");
  // Refused: no letter, two letters, a letter the item does not have, a letter with more.
  EXPECT_EQ(extract_chat_choice("", kFive), std::nullopt);
  EXPECT_EQ(extract_chat_choice("The answer is television", kFive), std::nullopt);
  EXPECT_EQ(extract_chat_choice("The answer is (F)", kFive), std::nullopt);
  EXPECT_EQ(extract_chat_choice("The answer is (A) or (B)", kFive), std::nullopt);
  EXPECT_EQ(extract_chat_choice("The answer is (A). No, the answer is (C)", kFive), std::nullopt);
  EXPECT_EQ(extract_chat_choice("The answer is (B", kFive), std::nullopt);
  EXPECT_EQ(extract_chat_choice("The answer is Bob", kFive), std::nullopt);
  EXPECT_EQ(extract_chat_choice("B. bank", kFive), std::nullopt);
  EXPECT_EQ(extract_chat_choice("B or C", kFive), std::nullopt);
  EXPECT_EQ(extract_chat_choice("C", {"A", "B"}), std::nullopt);
}

TEST(EvalChat, CutsAtTheEndOfTheAnswerStatement) {
  const Task mc = chat_task("csqa-train", 0, {});
  EXPECT_EQ(cut_answer(mc, "Banks hold money. The answer is (B). Also"),
            "Banks hold money. The answer is (B)");
  EXPECT_EQ(cut_answer(mc, "The answer is (B) bank\nmore"), "The answer is (B) bank");
  EXPECT_FALSE(answer_complete(mc, "The answer is (B)")) << "its rest may still name a letter";
  EXPECT_FALSE(answer_complete(mc, "The answer is not obvious. Maybe"));
  EXPECT_TRUE(answer_complete(mc, "The answer is (B)."));
  EXPECT_EQ(extract_answer(mc, mc.items[0], cut_answer(mc, "The answer is (A). The answer is (B)")),
            "A")
      << "the cut keeps the first statement";
  // Plain multiple choice still cuts at the newline.
  const Task plain = load_task("csqa-train", data_dir(), 0);
  EXPECT_EQ(cut_answer(plain, " B\nQuestion:"), " B");
  // GSM8K: the whole turn (the end of turn ends it); LAMBADA: the word rule.
  const Task gsm = chat_task("gsm8k", 0, {});
  EXPECT_EQ(cut_answer(gsm, "3 + 4 = 7.\n\nThe answer is 7."), "3 + 4 = 7.\n\nThe answer is 7.");
  EXPECT_FALSE(answer_complete(gsm, "3 + 4 = 7.\n\nThe answer is 7."));
  const Task lambada = chat_task("lambada", 0, {});
  EXPECT_EQ(cut_answer(lambada, "signs."), "signs");
  EXPECT_TRUE(answer_complete(lambada, "signs."));
}

TEST(EvalChat, AnswerFormNames) {
  EXPECT_EQ(parse_chat_answer(chat_answer_name(ChatAnswer::Reason)), ChatAnswer::Reason);
  EXPECT_EQ(parse_chat_answer(chat_answer_name(ChatAnswer::Letter)), ChatAnswer::Letter);
  EXPECT_EQ(parse_chat_answer(chat_answer_name(ChatAnswer::Choice)), ChatAnswer::Choice);
  EXPECT_THROW(parse_chat_answer("essay"), Error);
}

// The plain prompts are what they were before chat prompts existed, byte for byte (earlier
// results and the router's traces depend on them).
TEST(EvalChat, PlainPromptsAreUnchanged) {
  const Task csqa = load_task("csqa", data_dir(), 5);
  EXPECT_FALSE(csqa.chat.has_value());
  EXPECT_EQ(fnv1a(item_prompt(csqa, csqa.items[0])), 0x95f27a679e897484ull);
  const Task gsm = load_task("gsm8k", data_dir(), 5);
  EXPECT_EQ(fnv1a(item_prompt(gsm, gsm.items[0])), 0x97c85f8de062bcc8ull);
  const Task piqa = load_task("piqa", data_dir(), 5);
  EXPECT_EQ(fnv1a(item_prompt(piqa, piqa.items[0])), 0x25fcfa0d8d0cdf57ull);
  EXPECT_EQ(gsm.max_answer_tokens, 256);
  EXPECT_EQ(csqa.max_answer_tokens, 4);
}

}  // namespace
}  // namespace tandem::eval
