// HumanEval as an eval task: the 164 problems read from ../shared/data, completions cut at the
// stop sequences, and scoring through the sandbox: canonical solutions pass, wrong ones fail.
#include <gtest/gtest.h>

#include "common/error.h"
#include "common/testdata.h"
#include "tandem/eval_tasks.h"
#include "tandem/sandbox.h"

namespace tandem::eval {
namespace {

std::string data_dir() {
  return (tandem::testing::shared_dir() / "data").string();
}

TEST(HumanEvalTask, Loads164ProblemsZeroShot) {
  tandem::testing::data_path("humaneval/HumanEval.jsonl");
  const Task t = load_task("humaneval", data_dir(), 0);
  ASSERT_EQ(t.items.size(), 164u);
  EXPECT_EQ(t.kind, TaskKind::Code);
  EXPECT_EQ(default_shots("humaneval"), 0);
  EXPECT_EQ(t.max_answer_tokens, 384);
  EXPECT_TRUE(t.header.empty());
  for (size_t i = 0; i < t.items.size(); ++i) {
    const Item& it = t.items[i];
    EXPECT_EQ(it.id, "HumanEval/" + std::to_string(i));
    EXPECT_EQ(it.gold, kCodePassed);
    EXPECT_FALSE(it.entry_point.empty());
    EXPECT_NE(it.test.find("def check(candidate)"), std::string::npos) << it.id;
  }
  EXPECT_EQ(t.items[0].entry_point, "has_close_elements");
  // The prompt is the problem's, as it is: the model completes the function's body.
  EXPECT_EQ(item_prompt(t, t.items[0]).rfind("from typing import List\n\n\ndef has_close_", 0), 0u);
  EXPECT_EQ(item_prompt(t, t.items[0]).back(), '\n');
}

TEST(HumanEvalTask, RefusesShotsAndChat) {
  EXPECT_THROW(load_task("humaneval", data_dir(), 1), Error);
  Task t = load_task("humaneval", data_dir(), 0);
  EXPECT_THROW(use_chat_form(t, {}), Error);
}

TEST(HumanEvalTask, CompletionsAreCutAtTheStopSequences) {
  const std::string body = "    return sorted(x)\n";
  for (const std::string stop : {"\ndef main():\n", "\nclass A:\n", "\nif __name__ == '__main__':",
                                 "\nprint(f([1]))", "\n# tests\n"}) {
    const std::string out = body + stop;
    EXPECT_EQ(cut_answer(TaskKind::Code, out), body) << stop;
    EXPECT_TRUE(answer_complete(TaskKind::Code, out)) << stop;
  }
  // Indented, or not at a line start: part of the function.
  const std::string inner =
      "    def helper(y):\n        # sort\n        return y\n    x = 1 # print(\n";
  EXPECT_EQ(cut_answer(TaskKind::Code, inner), inner);
  EXPECT_FALSE(answer_complete(TaskKind::Code, inner));
  // The earliest stop wins; a stop still being written is not one yet.
  EXPECT_EQ(cut_answer(TaskKind::Code, body + "\n#x\ndef g():"), body);
  EXPECT_FALSE(answer_complete(TaskKind::Code, body + "\nde"));
  EXPECT_EQ(cut_answer(TaskKind::Code, ""), "");
}

TEST(HumanEvalTask, ProgramIsPromptCompletionTestsAndCheck) {
  Item it;
  // Move-assigned strings: GCC 12 warns falsely (-Wrestrict) on assigning a literal here.
  it.question = std::string("def f(x):\n");
  it.test = std::string("def check(candidate):\n    assert candidate(1) == 2\n");
  it.entry_point = std::string("f");
  EXPECT_EQ(code_program(it, "    return x + 1\n"),
            "def f(x):\n    return x + 1\n\ndef check(candidate):\n    assert candidate(1) == "
            "2\n\ncheck(f)\n");
}

TEST(HumanEvalScoring, CanonicalSolutionsPassAndWrongOnesFail) {
  const Task t = load_task("humaneval", data_dir(), 0);
  for (const size_t i : {0, 2, 32, 163}) {
    const Item& it = t.items[i];
    const SandboxResult ok = run_python(code_program(it, it.reference));
    EXPECT_EQ(ok.verdict, kCodePassed) << it.id << "\n" << ok.stderr_tail;
  }
  // has_close_elements that always says False; and one that never returns.
  const SandboxResult wrong = run_python(code_program(t.items[0], "    return False\n"));
  EXPECT_EQ(wrong.verdict, "failed");
  EXPECT_NE(wrong.stderr_tail.find("AssertionError"), std::string::npos) << wrong.stderr_tail;
  SandboxLimits quick;
  quick.wall_s = 2;
  quick.cpu_s = 1;
  const SandboxResult loops = run_python(code_program(t.items[0], "    while True: pass\n"), quick);
  EXPECT_EQ(loops.verdict, "timeout");
  // An empty completion (the model stopped at once) is a syntax error: failed.
  EXPECT_EQ(run_python(code_program(t.items[0], "")).verdict, "failed");
}

}  // namespace
}  // namespace tandem::eval
