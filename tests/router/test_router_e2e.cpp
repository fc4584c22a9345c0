// Learned routers end to end on the testdata models: `tandem router collect` (a local cloud model
// and a real `tandem serve` give the same trace), resume, `router train`, then the router in
// `tandem run --router` against the server and in `tandem eval --task wikitext --router`, and a
// router refused for another edge model.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <map>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "../server/server_harness.h"
#include "common/run_tandem.h"
#include "common/testdata.h"
#include "router/router_file.h"
#include "router/trace.h"

namespace tandem::testing {
namespace {

namespace fs = std::filesystem;

TEST(RouterEndToEnd, CollectTrainRunAndEval) {
  const std::string cloud = testdata_path("models/synth-llama-Q8_0.gguf");
  const std::string edge = testdata_path("models/synth-llama-Q4_0.gguf");
  const std::string data = (shared_dir() / "data").string();
  const fs::path dir =
      fs::temp_directory_path() / ("tandem-router-e2e-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  ServerProcess server(cloud);
  const std::string url = "http://127.0.0.1:" + std::to_string(server.port());
  // `router collect` of `chunks` sequences into `file`; extra_args name the cloud (and more).
  auto collect = [&](const std::vector<std::string>& extra_args, int chunks,
                     const std::string& file) {
    std::vector<std::string> a = {"router",
                                  "collect",
                                  "-m",
                                  edge,
                                  "--data",
                                  data,
                                  "--out",
                                  file,
                                  "--chunks",
                                  std::to_string(chunks),
                                  "--chunk-tokens",
                                  "64",
                                  "-t",
                                  "1"};
    a.insert(a.end(), extra_args.begin(), extra_args.end());
    return run_tandem(a, dir);
  };

  // Traces with a local copy of the cloud, then resumed to more chunks.
  const std::string trace = (dir / "local.trace").string();
  Ran r = collect({"--cloud-model", cloud}, 6, trace);
  ASSERT_EQ(r.rc, 0) << r.err;
  r = collect({"--cloud-model", cloud}, 8, trace);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("resuming"), std::string::npos) << r.err;
  const router::TraceFile local = router::read_trace(trace);
  ASSERT_EQ(local.sequences.size(), 8u);
  for (size_t s = 0; s < 8; ++s) {
    EXPECT_EQ(local.sequences[s].id, s);
    EXPECT_EQ(local.sequences[s].records.size(), 63u);
  }

  // A task's items teacher-forced on their answers: records from the row before the answer.
  const std::string task_trace = (dir / "task.trace").string();
  r = collect(
      {"--cloud-model", cloud, "--task", "csqa-train", "--shots", "2", "--chunk-offset", "10"}, 3,
      task_trace);
  ASSERT_EQ(r.rc, 0) << r.err;
  const router::TraceFile task_tf = router::read_trace(task_trace);
  ASSERT_EQ(task_tf.sequences.size(), 3u);
  for (size_t s = 0; s < 3; ++s) {
    const auto& recs = task_tf.sequences[s].records;
    EXPECT_EQ(task_tf.sequences[s].id, 10 + s);
    ASSERT_GE(recs.size(), 2u) << "the answer letter and the newline after it";
    EXPECT_GT(recs.front().position, 100) << "recorded from the answer, not the prompt";
    for (size_t i = 1; i < recs.size(); ++i) EXPECT_EQ(recs[i].position, recs[0].position + i);
  }
  // LAMBADA: the passage and its last word; records are the word's tokens only. Passages from
  // 2576 on are kept for reporting: a collection reaching them is refused.
  const std::string lambada_trace = (dir / "lambada.trace").string();
  r = collect({"--cloud-model", cloud, "--task", "lambada", "--chunk-offset", "2573"}, 3,
              lambada_trace);
  ASSERT_EQ(r.rc, 0) << r.err;
  const router::TraceFile lambada_tf = router::read_trace(lambada_trace);
  ASSERT_EQ(lambada_tf.sequences.size(), 3u);
  EXPECT_EQ(lambada_tf.sequences.back().id, 2575u);
  for (const auto& seq : lambada_tf.sequences) {
    ASSERT_GE(seq.records.size(), 1u);
    EXPECT_LE(seq.records.size(), 8u) << "one word's tokens, not the passage";
    EXPECT_GT(seq.records.front().position, 20) << "recorded from the answer, not the passage";
  }
  r = collect({"--cloud-model", cloud, "--task", "lambada", "--chunk-offset", "2574"}, 3,
              (dir / "reported.trace").string());
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("kept for reporting"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("reaches passage 2576"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "reported.trace")) << "refused before any work";

  // GSM8K teacher-forced on the worked solutions, with the outcome judged by the final answer's
  // correctness (the synthetic models never reach a '####' line: every outcome is 0, measured).
  const std::string gsm_trace = (dir / "gsm.trace").string();
  r = collect({"--cloud-model", cloud, "--task", "gsm8k", "--shots", "1", "--outcome-share", "1",
               "--outcome-tokens", "24"},
              2, gsm_trace);
  ASSERT_EQ(r.rc, 0) << r.err;
  const router::TraceFile gsm_tf = router::read_trace(gsm_trace);
  ASSERT_EQ(gsm_tf.sequences.size(), 2u);
  for (const auto& seq : gsm_tf.sequences) {
    const auto& recs = seq.records;
    ASSERT_GE(recs.size(), 20u) << "the worked solution, not one answer token";
    for (size_t i = 1; i < recs.size(); ++i) EXPECT_EQ(recs[i].position, recs[0].position + i);
    for (const auto& rec : recs) EXPECT_EQ(rec.outcome, 0.0f);
  }

  // The outcome label: every position of the chosen sequences continued both ways (all of them
  // at share 1), over the same features as the plain collection.
  const std::string outcome_trace = (dir / "outcome.trace").string();
  r = collect({"--cloud-model", cloud, "--outcome-share", "1", "--outcome-tokens", "8"}, 4,
              outcome_trace);
  ASSERT_EQ(r.rc, 0) << r.err;
  const router::TraceFile outcome_tf = router::read_trace(outcome_trace);
  ASSERT_EQ(outcome_tf.sequences.size(), 4u);
  int divergent = 0, moved = 0;
  for (size_t s = 0; s < 4; ++s) {
    const auto& recs = outcome_tf.sequences[s].records;
    ASSERT_EQ(recs.size(), 63u);
    for (size_t i = 0; i < recs.size(); ++i) {
      const float o = recs[i].outcome;
      ASSERT_FALSE(std::isnan(o)) << s << " " << i;
      EXPECT_GE(o, -1.0f);
      EXPECT_LE(o, 1.0f);
      EXPECT_EQ(o * 8, std::round(o * 8)) << "a whole number of tokens of 8";
      if (recs[i].edge_top1 == recs[i].cloud_top1) {
        EXPECT_EQ(o, 0.0f);
      } else {
        ++divergent;
        moved += o != 0.0f;
      }
      EXPECT_EQ(recs[i].hidden, local.sequences[s].records[i].hidden);
      EXPECT_EQ(recs[i].cloud_top1, local.sequences[s].records[i].cloud_top1);
    }
  }
  EXPECT_GT(divergent, 0);
  EXPECT_GT(moved, 0) << "of " << divergent << " positions where the top-1s differ";
  r = run_tandem(
      {"router", "train", "--traces", outcome_trace, "--out", (dir / "outcome.gguf").string(),
       "--label", "outcome:0.125", "--hidden", "8", "--epochs", "3"},
      dir);
  EXPECT_EQ(r.rc, 0) << r.err;
  r = run_tandem({"router", "train", "--traces", trace, "--out", (dir / "none.gguf").string(),
                  "--label", "outcome"},
                 dir);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("no position of the traces has a measured outcome"), std::string::npos)
      << r.err;
  // The outcome label with the cloud's continuations from the server's /v1/completions: the
  // same outcomes as with the cloud model in this process (the server is batch-invariant).
  const std::string outcome_http = (dir / "outcome-http.trace").string();
  r = collect({"--cloud", url, "--outcome-share", "1", "--outcome-tokens", "8"}, 2, outcome_http);
  ASSERT_EQ(r.rc, 0) << r.err;
  const router::TraceFile outcome_http_tf = router::read_trace(outcome_http);
  ASSERT_EQ(outcome_http_tf.sequences.size(), 2u);
  int compared = 0;
  for (size_t s = 0; s < 2; ++s) {
    const auto &a = outcome_tf.sequences[s].records, &b = outcome_http_tf.sequences[s].records;
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].cloud_top1 != b[i].cloud_top1) continue;  // a near-tie read from the top-n
      EXPECT_EQ(a[i].outcome, b[i].outcome) << s << " " << i;
      compared += a[i].edge_top1 != a[i].cloud_top1;
    }
  }
  EXPECT_GT(compared, 10) << "positions where the top-1s differ, continued over HTTP";
  r = collect({"--cloud", url, "--cloud-api", "sglang", "--outcome-share", "0.5", "--overwrite"}, 1,
              (dir / "x.trace").string());
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("not sglang"), std::string::npos) << r.err;

  // The same chunks through the server's prompt log-probabilities.
  const std::string http_trace = (dir / "http.trace").string();
  r = collect({"--cloud", url}, 2, http_trace);
  ASSERT_EQ(r.rc, 0) << r.err;
  const router::TraceFile http = router::read_trace(http_trace);
  ASSERT_EQ(http.sequences.size(), 2u);
  EXPECT_EQ(http.header, local.header);
  int exact = 0;
  for (size_t s = 0; s < 2; ++s) {
    for (size_t i = 0; i < 63; ++i) {
      const auto &a = local.sequences[s].records[i], &b = http.sequences[s].records[i];
      EXPECT_NEAR(a.cloud_lp_true, b.cloud_lp_true, 1e-3);
      EXPECT_EQ(a.edge_lp_true, b.edge_lp_true);
      EXPECT_EQ(a.hidden, b.hidden);
      if (!(b.flags & router::kCloudEdgeLogprobIsBound)) {
        EXPECT_NEAR(a.cloud_lp_edge, b.cloud_lp_edge, 1e-3);
        ++exact;
      } else {
        EXPECT_LE(a.cloud_lp_edge, b.cloud_lp_edge + 1e-3) << "the bound holds";
      }
    }
  }
  EXPECT_GT(exact, 0);

  // Train, then use the router.
  const std::string model = (dir / "router.gguf").string();
  r = run_tandem({"router", "train", "--traces", trace, "--out", model, "--label", "disagree",
                  "--hidden", "16", "--epochs", "5", "--json", "--cloud-aware-reference"},
                 dir);
  ASSERT_EQ(r.rc, 0) << r.err;
  const json summary = json::parse(r.out);
  EXPECT_EQ(summary["train_sequences"].get<int>() + summary["val_sequences"].get<int>(), 8);
  EXPECT_NE(r.err.find("ROC-AUC"), std::string::npos);
  EXPECT_NE(r.err.find("cloud-aware reference"), std::string::npos) << r.err;
  for (const json& point : summary["val_curve"]) {
    EXPECT_TRUE(point.contains("cloud_aware_gap_recovered")) << point.dump();
    EXPECT_TRUE(point.contains("kl_gap_recovered")) << point.dump();
  }

  r = run_tandem({"run",    "-m",    edge,          "--cloud", url,
                  "--mode", "route", "--router",    model,     "--target-rate",
                  "0.3",    "-p",    "The capital", "-n",      "24",
                  "--temp", "0",     "--json",      "-t",      "1"},
                 dir);
  ASSERT_EQ(r.rc, 0) << r.err;
  const json ran = json::parse(r.out);
  EXPECT_EQ(ran["stats"]["tokens"], 24);
  EXPECT_GT(ran["stats"]["cloud_tokens"].get<int>(), 0) << r.out;
  EXPECT_LT(ran["stats"]["cloud_tokens"].get<int>(), 24) << r.out;

  // `eval --task wikitext` on two held-out chunks with the given --router arguments.
  auto wikitext_eval = [&](const fs::path& out, const std::vector<std::string>& routers) {
    std::vector<std::string> a = {"eval",       "-m",
                                  edge,         "--cloud-model",
                                  cloud,        "--task",
                                  "wikitext",   "--data",
                                  data,         "--chunks",
                                  "2",          "--chunk-offset",
                                  "8",          "--chunk-tokens",
                                  "64",         "--rates",
                                  "0.1,0.3",    "--out",
                                  out.string(), "--no-plots",
                                  "-t",         "1"};
    for (const std::string& router : routers) a.insert(a.end(), {"--router", router});
    return run_tandem(a, dir);
  };
  const fs::path eval_out = dir / "eval";
  r = wikitext_eval(eval_out, {model});
  ASSERT_EQ(r.rc, 0) << r.err;
  const json results = json::parse(std::ifstream(eval_out / "results.json"));
  EXPECT_EQ(results["chunk_offset"], 8);
  int mlp_rows = 0;
  for (const auto& row : results["routes"]) {
    if (row["policy"] != "mlp") continue;
    ++mlp_rows;
    EXPECT_NEAR(row["share"].get<double>(), row["target"].get<double>(), 0.05);
  }
  EXPECT_EQ(mlp_rows, 2);

  // Several routers over the same forward passes, each its own policy: a copy of the file under
  // another name gives rows equal to the original's, and the single-router rows above.
  const fs::path copy = dir / "twin.gguf";
  fs::copy_file(model, copy, fs::copy_options::overwrite_existing);
  const fs::path two_out = dir / "eval-two";
  r = wikitext_eval(two_out, {model, copy.string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  const json both = json::parse(std::ifstream(two_out / "results.json"));
  const std::string stem = "mlp-" + fs::path(model).stem().string();
  std::map<std::string, std::vector<double>> nll;
  for (const auto& row : both["routes"]) nll[row["policy"]].push_back(row["nll"].get<double>());
  ASSERT_EQ(nll.count(stem), 1u) << both["routes"].dump();
  ASSERT_EQ(nll.count("mlp-twin"), 1u) << both["routes"].dump();
  EXPECT_EQ(nll[stem], nll["mlp-twin"]);
  std::vector<double> single;
  for (const auto& row : results["routes"])
    if (row["policy"] == "mlp") single.push_back(row["nll"].get<double>());
  EXPECT_EQ(nll[stem], single);
  r = wikitext_eval(two_out, {model + "@0.1"});  // wikitext scores every router at --rates
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("drop the @targets"), std::string::npos) << r.err;

  // A task eval routes with it through the server: runs named route-STEM-R, the router recorded;
  // R.gguf@T gives the router targets of its own, beside the heuristic at --rates.
  const fs::path task_out = dir / "eval-csqa";
  r = run_tandem({"eval",
                  "-m",
                  edge,
                  "--cloud",
                  url,
                  "--task",
                  "csqa",
                  "--data",
                  data,
                  "--modes",
                  "local,route",
                  "--router",
                  model + "@0.3,0.4",
                  "--policy",
                  "confidence",
                  "--rates",
                  "0.2",
                  "--limit",
                  "3",
                  "--shots",
                  "1",
                  "--out",
                  task_out.string(),
                  "--no-plots",
                  "-t",
                  "1"},
                 dir);
  ASSERT_EQ(r.rc, 0) << r.err;
  const json task = json::parse(std::ifstream(task_out / "results.json"));
  EXPECT_EQ(task["routers"][0]["path"], model);
  EXPECT_EQ(task["routers"][0]["label"], "disagree");
  std::set<std::string> runs;
  for (const auto& run : task["runs"]) {
    runs.insert(run["run"].get<std::string>());
    if (run["run"] != "route-router-30%") continue;
    EXPECT_EQ(run["items"], 3);
    EXPECT_GT(run["cloud_share"].get<double>(), 0.0) << run.dump();
  }
  EXPECT_EQ(runs, (std::set<std::string>{"local", "route-confidence-20%", "route-router-30%",
                                         "route-router-40%"}));

  // LAMBADA routed by the router on passages it may have been trained on: flagged as not held-out.
  r = run_tandem({"eval",
                  "-m",
                  edge,
                  "--cloud",
                  url,
                  "--task",
                  "lambada",
                  "--data",
                  data,
                  "--modes",
                  "route",
                  "--router",
                  model,
                  "--rates",
                  "0.3",
                  "--items",
                  "2575-2576",
                  "--out",
                  (dir / "eval-lambada").string(),
                  "--no-plots",
                  "-t",
                  "1"},
                 dir);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("not held-out"), std::string::npos) << r.err;

  // A router for another model is refused, naming both fingerprints. (Every synth test model
  // shares one vocabulary and width, so the other model's router is this one relabelled.)
  router::LoadedRouter loaded = router::load_router(model);
  loaded.info.vocab_hash = "0123456789abcdef";
  const std::string foreign = (dir / "foreign.gguf").string();
  router::save_router(foreign, *loaded.model, loaded.info);
  r = run_tandem({"run", "-m", edge, "--mode", "local", "--router", foreign, "-p", "x", "-n", "2"},
                 dir);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("another model"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("0123456789abcdef"), std::string::npos) << r.err;
  r = run_tandem(
      {"eval", "-m", edge, "--cloud", url, "--task", "csqa", "--data", data, "--modes", "route",
       "--router", foreign, "--limit", "1", "--out", (dir / "eval-foreign").string(), "--no-plots"},
      dir);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("another model"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tandem::testing
