// tandem eval's pieces: answer extraction on tricky outputs, the statistics against values
// computed by hand, and the tasks read from ../shared/data.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "common/error.h"
#include "common/testdata.h"
#include "eval/stats.h"
#include "tandem/eval_loglik.h"
#include "tandem/eval_report.h"
#include "tandem/eval_tasks.h"

namespace tandem::eval {
namespace {

const std::vector<std::string> kABCDE = {"A", "B", "C", "D", "E"};

TEST(EvalExtract, ChoiceIsStrict) {
  struct Case {
    const char* out;
    std::optional<std::string> want;
  };
  const std::vector<Case> cases = {
      {" B", "B"},           {"B", "B"},
      {" (C) because", "C"}, {" D.", "D"},
      {" E)", "E"},          {" A: bank", "A"},
      {"  A\tx", "A"},       {" Bob", std::nullopt},
      {"", std::nullopt},    {" ", std::nullopt},
      {" F", std::nullopt},  {" (C", std::nullopt},
      {" b", std::nullopt},  {" The answer is B", std::nullopt},
      {" A1", std::nullopt}, {" Aé", std::nullopt},
  };
  for (const auto& c : cases)
    EXPECT_EQ(extract_choice(c.out, kABCDE), c.want) << "'" << c.out << "'";
  EXPECT_EQ(extract_choice(" C", {"A", "B"}), std::nullopt) << "a label the item does not have";
}

TEST(EvalExtract, NumberIsStrict) {
  EXPECT_EQ(extract_number("She makes 9 * 2 = $18.\n#### 18"), "18");
  EXPECT_EQ(extract_number("#### 1,234"), "1234");
  EXPECT_EQ(extract_number("#### $5.50"), "5.5");
  EXPECT_EQ(extract_number("#### -3"), "-3");
  EXPECT_EQ(extract_number("#### 12.0"), "12");
  EXPECT_EQ(extract_number("#### 007"), "7");
  EXPECT_EQ(extract_number("So the answer is 42."), "42");
  EXPECT_EQ(extract_number("#### 3\n#### 4"), "4") << "the last marker wins";
  EXPECT_EQ(extract_number("The total is 18."), std::nullopt) << "no marker, no answer";
  EXPECT_EQ(extract_number("#### many"), std::nullopt);
  EXPECT_EQ(extract_number("#### 1.2.3"), std::nullopt);
  EXPECT_EQ(extract_number("####"), std::nullopt);
}

TEST(EvalExtract, CutsTheAnswerWhereTheModelMovesOn) {
  EXPECT_EQ(cut_answer(TaskKind::MultipleChoice, " B\n\nQuestion: next"), " B");
  EXPECT_TRUE(answer_complete(TaskKind::MultipleChoice, " B\n"));
  EXPECT_FALSE(answer_complete(TaskKind::MultipleChoice, " B"));
  EXPECT_EQ(cut_answer(TaskKind::Numeric, " 3 + 4 = 7\n#### 7\n\nQuestion: x"),
            " 3 + 4 = 7\n#### 7");
  EXPECT_FALSE(answer_complete(TaskKind::Numeric, " 3 + 4 = 7\n#### 7"));
}

// The word rule (docs/eval.md): where an answer word starts and ends, when generation may stop,
// and what counts as no answer.
TEST(EvalWord, TheFirstWordByTheRule) {
  struct Case {
    const char* out;
    std::optional<std::string> want;
    bool complete;
  };
  const std::vector<Case> cases = {
      {" signs", "signs", false},              // may go on: " signs" + "pot"
      {" signs.", "signs", true},              // punctuation ends it
      {" signs and", "signs", true},           // whitespace ends it
      {"\n\nPower", "Power", false},           // leading whitespace of any kind
      {" \u201cSal\u201d", "Sal", true},       // an opening curly quote before the word
      {" \"Ridley", "Ridley", false},          // a straight one
      {" don't", "don't", false},              // an apostrophe between letters is inside
      {" don\u2019t go", "don\u2019t", true},  // so is U+2019
      {" dogs' bowls", "dogs", true},          // but not one that ends it
      {" dogs'", "dogs", false},               // undecided until the next character
      {" caf\u00e9 au", "caf\u00e9", true},    // non-ASCII letters are letters
      {" know\u2014", "know", true},           // an em dash ends the word
      {" 1984,", "1984", true},                // digits are word characters
      {". He", std::nullopt, true},            // the sentence ended: no answer, and stop
      {", and", std::nullopt, true},
      {"", std::nullopt, false},
      {"  ", std::nullopt, false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.out);
    EXPECT_EQ(extract_word(c.out), c.want);
    EXPECT_EQ(answer_complete(TaskKind::Word, c.out), c.complete);
  }
  EXPECT_EQ(cut_answer(TaskKind::Word, " signs. The end"), " signs");
  // A UTF-8 character still being written (its first byte only) neither ends nor extends it.
  const std::string partial = std::string(" caf") + "\xc3";
  EXPECT_FALSE(answer_complete(TaskKind::Word, partial));
  EXPECT_EQ(extract_word(partial), "caf");
}

TEST(EvalWord, ExactMatchAgainstThePassagesOwnWord) {
  Task t;
  t.kind = TaskKind::Word;
  Item it;
  it.gold = *extract_word("\u201cSal");
  EXPECT_EQ(it.gold, "Sal");
  EXPECT_EQ(extract_answer(t, it, cut_answer(t.kind, " Sal, who")), "Sal");
  EXPECT_NE(extract_answer(t, it, cut_answer(t.kind, " sal")), it.gold) << "case counts";
  EXPECT_NE(extract_answer(t, it, cut_answer(t.kind, " Sally")), it.gold) << "a whole word";
}

TEST(EvalStats, OracleFixesOneAnswerPerWholeCloudToken) {
  EXPECT_EQ(oracle_fixes(4, 0), 0);
  EXPECT_EQ(oracle_fixes(4, 1.5), 1);
  EXPECT_EQ(oracle_fixes(4, 3), 3);
  EXPECT_EQ(oracle_fixes(4, 100), 4);
  EXPECT_EQ(oracle_fixes(0, 100), 0);
}

// Random runs over 60 items: whatever a route fixes, breaks and spends (at least one cloud token
// in every answer it turns right), its row never stands above the oracle at its own tokens.
TEST(EvalReport, NoRouteRowExceedsItsOracle) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    ReportTask task{"csqa", {}, 5, false};
    RunRecords by_run;
    std::vector<ReportRun> runs = {{"local", "local", {}}, {"cloud", "cloud", {}}};
    for (const char* name : {"route-a", "route-b", "route-c"})
      runs.push_back({name, "route", 0.07});
    for (int i = 0; i < 60; ++i) {
      const std::string id = std::to_string(i);
      task.item_ids.push_back(id);
      const bool local_right = rng() % 4 == 0;
      for (const ReportRun& run : runs) {
        ItemRecord rec;
        rec.id = id;
        rec.tokens = rec.generated = 1 + static_cast<int>(rng() % 48);
        rec.correct = run.name == "local" ? local_right : rng() % 2 == 0;
        // A route that leaves an answer alone spends nothing in it; one that fixes it spends
        // at least one token there.
        const bool fixed = run.mode == "route" && rec.correct && !local_right;
        if (run.mode == "route") rec.cloud_tokens = rec.generated_cloud = fixed + rng() % 2;
        if (run.mode == "route" && !fixed && !rec.cloud_tokens) rec.correct = local_right;
        by_run[run.name][id] = rec;
      }
    }
    const auto results = nlohmann::json::parse(summarize_runs(runs, task, by_run));
    for (const auto& row : results["runs"]) {
      if (row["mode"] != "route") continue;
      ASSERT_LE(row["accuracy"].get<double>(), row["oracle_accuracy"].get<double>() + 1e-12)
          << "trial " << trial << ": " << row.dump();
    }
  }
}

// The case that the cheapest-whole-answer oracle got wrong: the route spends one token on each
// of 10 long answers it fixes; charging the cloud's whole answer (40 tokens) put the oracle at a
// quarter of an answer and the row at 40 times its oracle's gain.
TEST(EvalReport, OracleChargesOneTokenPerFixedAnswer) {
  ReportTask task{"csqa", {}, 5, false};
  RunRecords by_run;
  const std::vector<ReportRun> runs = {
      {"local", "local", {}}, {"cloud", "cloud", {}}, {"route", "route", 0.07}};
  for (int i = 0; i < 40; ++i) {
    const std::string id = std::to_string(i);
    task.item_ids.push_back(id);
    for (const ReportRun& run : runs) {
      ItemRecord rec;
      rec.id = id;
      rec.tokens = rec.generated = 40;
      rec.correct = run.name == "cloud" || (run.name == "route" && i < 10);
      if (run.name == "route" && i < 10) rec.cloud_tokens = rec.generated_cloud = 1;
      by_run[run.name][id] = rec;
    }
  }
  const auto results = nlohmann::json::parse(summarize_runs(runs, task, by_run));
  const auto& route = results["runs"][2];
  EXPECT_DOUBLE_EQ(route["accuracy"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(route["oracle_accuracy"].get<double>(), 0.25) << "10 tokens fix 10 answers";
  EXPECT_DOUBLE_EQ(route["share_of_oracle"].get<double>(), 1.0);
  EXPECT_EQ(results["oracle"]["fixable_answers"], 40);
}

TEST(EvalStats, GapRecoveredWithABootstrapInterval) {
  // 100 items: local right on 10, cloud on 50 (and on those 10), the run on 30 of them.
  std::vector<bool> local(100, false), cloud(100, false), run(100, false);
  for (int i = 0; i < 50; ++i) cloud[i] = true;
  for (int i = 0; i < 10; ++i) local[i] = true;
  for (int i = 0; i < 30; ++i) run[i] = true;
  const GapRecovered g = gap_recovered(run, local, cloud);
  EXPECT_DOUBLE_EQ(g.value, 0.5);
  EXPECT_LT(g.ci95.low, 0.5);
  EXPECT_GT(g.ci95.high, 0.5);
  EXPECT_GT(g.ci95.low, 0.3) << "40 discordant items: the interval is not wide open";
  EXPECT_LT(g.ci95.high, 0.7);
  EXPECT_EQ(gap_recovered(run, local, cloud, 500, 7).value, 0.5);
  const GapRecovered none = gap_recovered(run, local, local);
  EXPECT_TRUE(std::isnan(none.value)) << "no gap, nothing to recover";
}

TEST(EvalStats, WilsonInterval) {
  // 81/100 at 95%: (0.7222, 0.8749) by the textbook formula.
  const Interval a = wilson_interval(81, 100);
  EXPECT_NEAR(a.low, 0.72221, 1e-4);
  EXPECT_NEAR(a.high, 0.87487, 1e-4);
  const Interval zero = wilson_interval(0, 10);
  EXPECT_EQ(zero.low, 0);
  EXPECT_NEAR(zero.high, 0.27753, 1e-4);
  const Interval none = wilson_interval(0, 0);
  EXPECT_EQ(none.low, 0);
  EXPECT_EQ(none.high, 1);
}

TEST(EvalStats, McNemarExact) {
  EXPECT_DOUBLE_EQ(mcnemar_exact_p(0, 0), 1);
  // b = 1, c = 9: 2 * (1 + 10) / 1024.
  EXPECT_NEAR(mcnemar_exact_p(1, 9), 22.0 / 1024, 1e-12);
  EXPECT_NEAR(mcnemar_exact_p(9, 1), 22.0 / 1024, 1e-12);
  EXPECT_DOUBLE_EQ(mcnemar_exact_p(5, 5), 1);
  // Large counts stay finite and tiny.
  EXPECT_LT(mcnemar_exact_p(100, 300), 1e-20);
  const Paired p =
      compare_paired({true, true, false, false, true}, {true, false, true, false, false});
  EXPECT_EQ(p.both, 1);
  EXPECT_EQ(p.only_a, 2);
  EXPECT_EQ(p.only_b, 1);
  EXPECT_EQ(p.neither, 1);
  EXPECT_NEAR(p.p, 1.0, 1e-12);
}

TEST(EvalTasks, LoadFromSharedData) {
  const std::string data = (testing::shared_dir() / "data").string();
  const Task csqa = load_task("csqa", data, 5);
  EXPECT_EQ(csqa.items.size(), 1221u);
  EXPECT_EQ(csqa.items[0].labels.size(), 5u);
  EXPECT_NE(csqa.header.find("Answer: "), std::string::npos);
  EXPECT_EQ(csqa.items[0].gold, "A");
  // The train split for router training: every item but the 5 shots, under the same header.
  const Task train = load_task("csqa-train", data, 5);
  EXPECT_EQ(train.items.size(), 9741u - 5);
  EXPECT_EQ(train.header, csqa.header);
  for (const auto& it : train.items) {
    EXPECT_EQ(csqa.header.find(it.question), std::string::npos) << "a shot is not an item";
  }
  const Task easy = load_task("arc-easy", data, 5);
  EXPECT_EQ(easy.items.size(), 570u - 5);
  const Task chal = load_task("arc-challenge", data, 0);
  EXPECT_EQ(chal.items.size(), 299u);
  int numeric_labels = 0;
  for (const auto& it : chal.items) {
    EXPECT_EQ(it.labels[0], "A");
    EXPECT_NE(std::find(it.labels.begin(), it.labels.end(), it.gold), it.labels.end());
    numeric_labels += it.question.find("\n1. ") != std::string::npos;
  }
  EXPECT_EQ(numeric_labels, 0) << "ARC's 1-4 labels become letters";
  const Task piqa = load_task("piqa", data, 3);
  EXPECT_EQ(piqa.items.size(), 1838u - 3);
  EXPECT_EQ(piqa.items[0].labels, (std::vector<std::string>{"A", "B"}));
  const Task gsm = load_task("gsm8k", data, 2);
  EXPECT_EQ(gsm.items.size(), 1319u - 2);
  EXPECT_EQ(gsm.kind, TaskKind::Numeric);
  EXPECT_NE(gsm.header.find("#### 18"), std::string::npos) << "a shot is a worked solution";
  const Task lambada = load_task("lambada", data, 0);
  EXPECT_EQ(lambada.kind, TaskKind::Word);
  ASSERT_EQ(lambada.items.size(), 5153u);
  EXPECT_EQ(lambada.header, "") << "zero-shot";
  EXPECT_EQ(lambada.items[0].id, "lambada-0");
  EXPECT_EQ(lambada.items[0].gold, "signs");
  const std::string& q = lambada.items[0].question;
  EXPECT_EQ(q.substr(q.size() - 16), "don't care about") << "cut before the last word";
  EXPECT_EQ(lambada.items[5152].id, "lambada-5152");
  for (const auto& it : lambada.items) {
    EXPECT_EQ(extract_word(it.gold), it.gold) << it.id;
    EXPECT_FALSE(std::isspace(static_cast<unsigned char>(it.question.back()))) << it.id;
  }
  EXPECT_THROW(load_task("lambada", data, 5), Error) << "zero-shot only";
  EXPECT_EQ(default_shots("lambada"), 0);
  EXPECT_EQ(default_shots("csqa"), 5);
  EXPECT_THROW(load_task("mmlu", data, 5), Error);
  EXPECT_THROW(load_task("csqa", "/nonexistent", 5), Error);
}

}  // namespace
}  // namespace tandem::eval

namespace tandem::eval {
namespace {

TEST(EvalLoglik, RoutedOracleAndQuantile) {
  // Edge NLL 2 everywhere; the cloud is better by 0, 1, 2, 3 nats at four positions.
  std::vector<Position> p = {{-2, -2, 0.1f}, {-2, -1, 0.9f}, {-2, 0, 0.2f}, {-2, 1, 0.5f}};
  EXPECT_DOUBLE_EQ(mean_nll_edge(p), 2);
  EXPECT_DOUBLE_EQ(mean_nll_cloud(p), 0.5);
  const RoutedLoglik none = routed(p, {false, false, false, false});
  EXPECT_DOUBLE_EQ(none.nll, 2);
  EXPECT_DOUBLE_EQ(none.gap_recovered, 0);
  const RoutedLoglik all = routed(p, {true, true, true, true});
  EXPECT_DOUBLE_EQ(all.gap_recovered, 1);
  // The oracle at 25% takes the position that gains 3 nats: NLL (2+2+2-1)/4 = 1.25.
  const RoutedLoglik o = oracle(p, 0.25);
  EXPECT_DOUBLE_EQ(o.share, 0.25);
  EXPECT_DOUBLE_EQ(o.nll, 1.25);
  EXPECT_DOUBLE_EQ(o.gap_recovered, 0.5);
  // By score at 25%: position 1 (score 0.9), which gains 1 nat.
  const RoutedLoglik q = by_score_quantile(p, 0.25);
  EXPECT_DOUBLE_EQ(q.nll, 1.75);
  EXPECT_NEAR(q.gap_recovered, 0.25 / 1.5, 1e-12);
  EXPECT_LE(q.gap_recovered, o.gap_recovered) << "nothing beats the oracle at equal share";
}

}  // namespace
}  // namespace tandem::eval
