// The routers that ship in routers/ (docs/router.md, "Routers that ship"): each records the pair
// it was trained for, loads for that pair's device model and is refused, naming why, for any
// other; and `router collect --chat`, which made the Qwen pair's, traces an item's chat answer.
// Real models: the Qwen pair (scripts/fetch_model.sh) and the test model (Gemma 3 270M Q4_K_M,
// the same vocabulary and width as the Gemma pair's Q2_K device model).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/run_tandem.h"
#include "common/testdata.h"
#include "router/router_file.h"
#include "router/trace.h"
#include "tandem/default_model.h"
#include "tandem/engine.h"
#include "tandem/eval_tasks.h"

namespace tandem::testing {
namespace {

namespace fs = std::filesystem;

struct Shipped {
  const char* file;        // under routers/
  const char* pair;        // the pair it was trained for
  const char* edge_name;   // the device model's general.name, as recorded
  const char* cloud_name;  // the cloud's, as recorded
};

const Shipped kShipped[] = {
    {"qwen2.5-coder-0.5b-csqa-choice-fixes.gguf", "qwen", "Qwen2.5 Coder 0.5B Instruct AWQ",
     "Qwen2.5 Coder 1.5B Instruct GGUF (qwen2.5-coder-1.5b-instruct-q4_k_m.gguf)"},
    {"gemma-3-270m-q2_k-lambada-fixes.gguf", "gemma", "Gemma 3 270m",
     "Gemma 3 270m (gemma-3-270m-q4_k_m.gguf)"},
};

std::string shipped_path(const Shipped& s) {
  return (fs::path(TANDEM_SOURCE_DIR) / "routers" / s.file).string();
}

// The device model a shipped router is loaded with here: the Qwen pair's own, and for the Gemma
// pair the test model (its Q4_K_M cloud file has the Q2_K device file's fingerprint and width).
std::string device_model(const Shipped& s) {
  return std::string(s.pair) == "qwen" ? pair_model_path("qwen", ModelRole::Edge)
                                       : test_model_path();
}

fs::path scratch(const char* name) {
  const fs::path dir =
      fs::temp_directory_path() / (std::string("tandem-") + name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void skip_without(const std::string& file) {
  if (!fs::exists(file)) GTEST_SKIP() << file << " is absent (scripts/fetch_model.sh)";
}

TEST(ShippedRouters, EachRecordsItsPairAndLoadsForItsDevice) {
  const fs::path dir = scratch("shipped");
  for (const Shipped& s : kShipped) {
    SCOPED_TRACE(s.file);
    const router::LoadedRouter r = router::load_router(shipped_path(s));
    EXPECT_EQ(r.info.edge_name, s.edge_name);
    EXPECT_EQ(r.info.cloud_name, s.cloud_name);
    EXPECT_EQ(r.info.label, "fixes");
    const std::string edge = device_model(s);
    skip_without(edge);
    const Ran ran = run_tandem({"run", "-m", edge, "--mode", "local", "--router", shipped_path(s),
                                "-p", "Hi", "-n", "1", "-t", "1"},
                               dir);
    EXPECT_EQ(ran.rc, 0) << ran.err;
  }
  fs::remove_all(dir);
}

TEST(ShippedRouters, ARouterForAnotherModelIsRefused) {
  const fs::path dir = scratch("refused");
  const std::string qwen_edge = pair_model_path("qwen", ModelRole::Edge);
  const std::string qwen_cloud = pair_model_path("qwen", ModelRole::Cloud);
  skip_without(qwen_edge);
  skip_without(qwen_cloud);
  skip_without(test_model_path());
  struct Case {
    const Shipped& router;
    std::string model;
    const char* why;  // what the error names
  };
  const Case cases[] = {
      {kShipped[0], test_model_path(), "vocabulary hash"},  // Qwen's router, Gemma's model
      {kShipped[0], qwen_cloud, "hidden width"},            // the pair's cloud as the device
      {kShipped[1], qwen_edge, "vocabulary hash"},          // Gemma's router, Qwen's model
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.router.file) + " with " + c.model);
    const Ran ran = run_tandem({"run", "-m", c.model, "--mode", "local", "--router",
                                shipped_path(c.router), "-p", "Hi", "-n", "1", "-t", "1"},
                               dir);
    EXPECT_EQ(ran.rc, 1);
    EXPECT_NE(ran.err.find("trained for another model"), std::string::npos) << ran.err;
    EXPECT_NE(ran.err.find(c.why), std::string::npos) << ran.err;
  }
  fs::remove_all(dir);
}

// In route mode with no routing chosen, `run` routes with the router that ships for the device
// model of a known pair (the same file, by any name), and says so; --policy or --threshold
// chooses otherwise.
TEST(ShippedRouters, RunRoutesWithThePairsRouterByDefault) {
  const std::string edge = pair_model_path("qwen", ModelRole::Edge);
  skip_without(edge);
  const fs::path dir = scratch("default-router");
  // No cloud answers on port 1: the answer is the device's, the choice of router is on stderr.
  const std::vector<std::string> route = {
      "run", "--mode", "route", "--cloud", "http://127.0.0.1:1", "-p", "Hi", "-n", "1", "-t", "1"};
  auto run_with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = route;
    args.insert(args.end(), extra.begin(), extra.end());
    return run_tandem(args, dir);
  };
  const std::string shipped = shipped_path(kShipped[0]);
  Ran r = run_with({"-m", edge});
  EXPECT_NE(r.err.find("routing with " + shipped), std::string::npos) << r.err;
  r = run_with({"--pair", "qwen"});
  EXPECT_NE(r.err.find("routing with " + shipped), std::string::npos) << r.err;
  r = run_with({"-m", edge, "--policy", "confidence"});
  EXPECT_EQ(r.err.find("routing with"), std::string::npos) << r.err;
  r = run_with({"-m", edge, "--threshold", "0.5"});
  EXPECT_EQ(r.err.find("routing with"), std::string::npos) << r.err;
  const fs::path copy = dir / "copy.gguf";
  fs::create_symlink(edge, copy);  // the same file by another name is still the pair's
  r = run_with({"-m", copy.string()});
  EXPECT_NE(r.err.find("routing with " + shipped), std::string::npos) << r.err;
  fs::remove_all(dir);
}

// `router collect --chat`: records start at the answer turn and their true tokens spell the
// chat form's answer, "The answer is (X)." with X the item's gold letter. The edge is its own
// cloud here (quick), so the two top-1s agree everywhere.
TEST(QwenCollect, ChatAnswersTeacherForced) {
  const std::string edge = pair_model_path("qwen", ModelRole::Edge);
  skip_without(edge);
  const fs::path dir = scratch("collect-chat");
  const std::string trace = (dir / "chat.trace").string();
  const Ran ran = run_tandem({"router", "collect", "-m", edge, "--cloud-model", edge, "--task",
                              "csqa-train", "--chat", "--shots", "2", "--chunks", "2", "--data",
                              (shared_dir() / "data").string(), "--out", trace, "-t", "2"},
                             dir);
  ASSERT_EQ(ran.rc, 0) << ran.err;
  const router::TraceFile tf = router::read_trace(trace);
  ASSERT_EQ(tf.sequences.size(), 2u);
  const auto model = Model::load(edge);
  const eval::Task task = eval::load_task("csqa-train", (shared_dir() / "data").string(), 2);
  for (const auto& seq : tf.sequences) {
    std::vector<TokenId> answer;
    for (const auto& rec : seq.records) {
      answer.push_back(rec.true_token);
      EXPECT_EQ(rec.edge_top1, rec.cloud_top1);
    }
    const std::string text = model->detokenize(answer);
    EXPECT_EQ(text, "The answer is (" + task.items[seq.id].gold + ").");
    EXPECT_GT(seq.records.front().position, 100) << "recorded from the answer turn on";
  }
  // --chat with a text task is refused before any work.
  const Ran plain = run_tandem({"router", "collect", "-m", edge, "--cloud-model", edge, "--task",
                                "wikitext", "--chat", "--out", (dir / "x.trace").string()},
                               dir);
  EXPECT_EQ(plain.rc, 1);
  EXPECT_NE(plain.err.find("scores text"), std::string::npos) << plain.err;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tandem::testing
