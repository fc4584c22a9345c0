// tandem eval end to end on the testdata models through a real `tandem serve` on 127.0.0.1:
// every mode runs, the result files and plots appear, and a run killed half-way resumes without
// asking any item twice.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "../server/server_harness.h"
#include "common/run_tandem.h"
#include "common/testdata.h"
#include "tandem/default_model.h"

namespace tandem::testing {
namespace {

namespace fs = std::filesystem;

std::vector<json> read_lines(const fs::path& p) {
  std::vector<json> out;
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line));
  return out;
}

pid_t spawn(const std::vector<std::string>& args) {
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // the server dies with a test that dies
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(strdup(a.c_str()));
    argv.push_back(nullptr);
    freopen("/dev/null", "w", stderr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

int wait_exit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(EvalEndToEnd, AllModesThroughALoopbackServerAndResume) {
  const std::string cloud = testdata_path("models/synth-llama-Q8_0.gguf");
  const std::string edge = testdata_path("models/synth-llama-Q4_0.gguf");
  ServerProcess server(cloud);
  const fs::path out = fs::temp_directory_path() / ("tandem-eval-" + std::to_string(getpid()));
  fs::remove_all(out);
  const std::string url = "http://127.0.0.1:" + std::to_string(server.port());
  auto args = [&](int limit) {
    return std::vector<std::string>{TANDEM_BINARY, "eval",
                                    "-m",          edge,
                                    "--cloud",     url,
                                    "--task",      "arc-easy",
                                    "--shots",     "1",
                                    "--limit",     std::to_string(limit),
                                    "--modes",     "local,cloud,route,speculative",
                                    "--rates",     "0.3",
                                    "--out",       out.string(),
                                    "-t",          "1",
                                    "-c",          "1024"};
  };
  // A first run, killed once a few local items are logged.
  const pid_t first = spawn(args(40));
  const fs::path local_log = out / "items-local.jsonl";
  for (int i = 0; i < 600; ++i) {
    if (fs::exists(local_log) && read_lines(local_log).size() >= 5) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(first, SIGKILL);
  wait_exit(first);
  const size_t before = fs::exists(local_log) ? read_lines(local_log).size() : 0;
  ASSERT_GE(before, 5u);

  ASSERT_EQ(wait_exit(spawn(args(40))), 0);
  for (const char* run : {"local", "cloud", "route-confidence-30%", "speculative"}) {
    SCOPED_TRACE(run);
    const auto lines = read_lines(out / (std::string("items-") + run + ".jsonl"));
    std::set<std::string> ids;
    for (const auto& l : lines) {
      ids.insert(l["id"].get<std::string>());
      EXPECT_TRUE(l.contains("output") && l.contains("answer") && l.contains("question"));
    }
    EXPECT_EQ(lines.size(), 40u) << "every item once";
    EXPECT_EQ(ids.size(), 40u);
  }
  const json results = json::parse(std::ifstream(out / "results.json"));
  ASSERT_EQ(results["runs"].size(), 4u);
  for (const auto& r : results["runs"]) {
    EXPECT_EQ(r["items"], 40);
    EXPECT_GE(r["accuracy"].get<double>(), r["ci95"][0].get<double>());
    EXPECT_LE(r["accuracy"].get<double>(), r["ci95"][1].get<double>());
  }
  EXPECT_EQ(results["runs"][1]["cloud_share"], 1.0) << "cloud mode: every token from the cloud";
  EXPECT_EQ(results["runs"][0]["cloud_share"], 0.0);
  EXPECT_EQ(results["runs"][3]["agreement_with_cloud"], 1.0)
      << "speculative answers are the cloud's greedy answers";
  EXPECT_TRUE(fs::exists(out / "results.md"));
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
    EXPECT_GT(fs::file_size(out / "pareto.png"), 1000u);
    EXPECT_GT(fs::file_size(out / "latency.png"), 1000u);
  }
  fs::remove_all(out);
}

// LAMBADA through the server: the word rule's answer-token counts, the oracle beside every route
// row, several policies in one run, and the flags' bad values refused.
TEST(EvalEndToEnd, LambadaCountsAnswerTokensAndPutsTheOracleBesideEachRow) {
  const std::string cloud = testdata_path("models/synth-llama-Q8_0.gguf");
  const std::string edge = testdata_path("models/synth-llama-Q4_0.gguf");
  const std::string data = (shared_dir() / "data").string();
  ServerProcess server(cloud);
  const fs::path out = fs::temp_directory_path() / ("tandem-lambada-" + std::to_string(getpid()));
  fs::remove_all(out);
  const std::string url = "http://127.0.0.1:" + std::to_string(server.port());
  auto eval = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {"eval",       "-m",         edge,     "--cloud", url,
                                  "--task",     "lambada",    "--data", data,      "--out",
                                  out.string(), "--no-plots", "-t",     "1"};
    a.insert(a.end(), extra.begin(), extra.end());
    return run_tandem(a, fs::temp_directory_path());
  };
  Ran r = eval({"--items", "2576-2600", "--modes", "local,cloud,route", "--rates", "0.3",
                "--policy", "confidence,entropy"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const json results = json::parse(std::ifstream(out / "results.json"));
  EXPECT_EQ(results["task"]["items"], 25);
  EXPECT_EQ(results["task"]["shots"], 0);
  std::set<std::string> runs;
  for (const auto& row : results["runs"]) runs.insert(row["run"].get<std::string>());
  EXPECT_EQ(runs,
            (std::set<std::string>{"local", "cloud", "route-confidence-30%", "route-entropy-30%"}));
  for (const char* run : {"local", "cloud", "route-confidence-30%"}) {
    SCOPED_TRACE(run);
    const auto lines = read_lines(out / (std::string("items-") + run + ".jsonl"));
    ASSERT_EQ(lines.size(), 25u);
    EXPECT_EQ(lines.front()["id"], "lambada-2576");
    for (const auto& l : lines) {
      EXPECT_GE(l["tokens"].get<int>(), 1);
      EXPECT_LE(l["tokens"].get<int>(), l["generated"].get<int>());
      EXPECT_LE(l["generated"].get<int>(), 8) << "the cap";
      EXPECT_LE(l["cloud_tokens"].get<int>(), l["generated_cloud"].get<int>());
      EXPECT_LE(l["cloud_tokens"].get<int>(), l["tokens"].get<int>());
      if (std::string(run) == "cloud") {
        EXPECT_EQ(l["cloud_tokens"], l["tokens"]);
      }
      EXPECT_EQ(l["correct"].get<bool>(), l["answer"] == l["gold"]) << l.dump();
    }
  }
  int64_t fixable = 0;
  {
    const auto local = read_lines(out / "items-local.jsonl");
    const auto cl = read_lines(out / "items-cloud.jsonl");
    for (size_t i = 0; i < local.size(); ++i) fixable += !local[i]["correct"] && cl[i]["correct"];
  }
  EXPECT_EQ(results["oracle"]["fixable_answers"], fixable);
  for (const auto& row : results["runs"]) {
    if (row["mode"] != "route") continue;
    SCOPED_TRACE(row.dump());
    ASSERT_TRUE(row.contains("oracle_accuracy"));
    EXPECT_GE(row["oracle_accuracy"].get<double>(), results["gap"]["local"].get<double>());
    EXPECT_LE(row["accuracy"].get<double>(), row["oracle_accuracy"].get<double>() + 1e-12)
        << "no route row exceeds its oracle";
    EXPECT_LE(row["cloud_share"].get<double>(), row["cloud_share_of_generated"].get<double>() + 1)
        << "shares are fractions";
  }
  std::ifstream md(out / "results.md");
  const std::string table((std::istreambuf_iterator<char>(md)), {});
  EXPECT_NE(table.find("oracle at that share"), std::string::npos);

  r = eval({"--items", "5150-5160", "--modes", "local"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("items 0-5152"), std::string::npos) << r.err;
  r = eval({"--items", "9-3", "--modes", "local"});
  EXPECT_EQ(r.rc, 1);
  r = eval({"--shots", "2", "--modes", "local"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("zero-shot"), std::string::npos) << r.err;
  r = eval({"--policy", "confidence,oracle", "--modes", "route", "--rates", "0.1"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("'oracle'"), std::string::npos) << r.err;
  fs::remove_all(out);
}

// eval takes the device flags of `tandem run` (one definition, src/cli/edge_flags.h), and they
// act: --route-span 4 gives more cloud tokens than route events (span 1: one each), the others
// appear in results.json's settings.
TEST(EvalEndToEnd, TakesRunsDeviceFlagsAndAppliesThem) {
  const std::string cloud = testdata_path("models/synth-llama-Q8_0.gguf");
  const std::string edge = testdata_path("models/synth-llama-Q4_0.gguf");
  const std::string data = (shared_dir() / "data").string();
  ServerProcess server(cloud);
  const fs::path out = fs::temp_directory_path() / ("tandem-flags-" + std::to_string(getpid()));
  const std::string url = "http://127.0.0.1:" + std::to_string(server.port());
  auto route_run = [&](const std::string& span, const std::string& pipeline = "--pipeline") {
    fs::remove_all(out);
    const Ran r = run_tandem(
        {"eval",    "-m",           edge,      "--cloud",    url,          "--task", "lambada",
         "--data",  data,           "--out",   out.string(), "--no-plots", "-t",     "1",
         "--items", "2576-2600",    "--modes", "route",      "--rates",    "0.5",    "--route-span",
         span,      "--sync-every", "2",       "--seed",     "7",          "-ctv",   "f16",
         pipeline},
        fs::temp_directory_path());
    EXPECT_EQ(r.rc, 0) << r.err;
    return json::parse(std::ifstream(out / "results.json"));
  };
  // The route row's cloud tokens among all generated ones (the answer's are fewer).
  auto generated_cloud = [](const json& row) {
    return std::lround(row["cloud_share_of_generated"].get<double>() *
                       row["generated_tokens"].get<double>());
  };
  const json one = route_run("1");
  const json four = route_run("4");
  const json& row1 = one["runs"][0];
  const json& row4 = four["runs"][0];
  ASSERT_GT(row1["route_events"].get<int>(), 0);
  ASSERT_GT(row4["route_events"].get<int>(), 0);
  EXPECT_EQ(generated_cloud(row1), row1["route_events"].get<long>());
  EXPECT_GT(generated_cloud(row4), row4["route_events"].get<long>());
  const json& settings = four["settings"];
  EXPECT_EQ(settings["route_span"], 4);
  EXPECT_EQ(settings["sync_every"], 2);
  EXPECT_EQ(settings["seed"], 7);
  EXPECT_EQ(settings["sync_ahead"], true);
  EXPECT_EQ(settings["cache_type_k"], "f32");
  EXPECT_EQ(settings["cache_type_v"], "f16");
  EXPECT_EQ(settings["target_gain"], 0.2) << "run's default";
  EXPECT_EQ(settings["pipeline"], true);
  // Blocking route mode: the same decisions and tokens; its rows say how long it waited.
  const json blocking = route_run("1", "--no-pipeline");
  const json& row0 = blocking["runs"][0];
  EXPECT_EQ(blocking["settings"]["pipeline"], false);
  EXPECT_EQ(row0["route_events"], row1["route_events"]);
  EXPECT_EQ(row0["generated_tokens"], row1["generated_tokens"]);
  EXPECT_EQ(generated_cloud(row0), generated_cloud(row1));
  EXPECT_EQ(row0["wasted_tokens"], 0);
  for (const json* row : {&row0, &row1}) {
    EXPECT_EQ((*row)["route_confirmed"].get<int>() + (*row)["route_changed"].get<int>(),
              (*row)["route_events"].get<int>());
    EXPECT_GE((*row)["wait_ms_per_answer"].get<double>(), 0.0);
  }
  fs::remove_all(out);
}

// WikiText-2 log-likelihood under routing: the cloud's log-probabilities through a server's
// /v1/completions prompt_logprobs and SGLang-style /generate equal a local copy's, and every
// policy stays under the oracle at the same share.
TEST(EvalEndToEnd, WikitextLoglikThroughTheServerEqualsLocal) {
  const std::string cloud = testdata_path("models/synth-llama-Q8_0.gguf");
  const std::string edge = testdata_path("models/synth-llama-Q4_0.gguf");
  ServerProcess server(cloud);
  const fs::path out = fs::temp_directory_path() / ("tandem-wt-" + std::to_string(getpid()));
  auto run = [&](std::vector<std::string> extra, const std::string& dir) {
    std::vector<std::string> a = {TANDEM_BINARY,
                                  "eval",
                                  "-m",
                                  edge,
                                  "--task",
                                  "wikitext",
                                  "--chunks",
                                  "2",
                                  "--chunk-tokens",
                                  "64",
                                  "--rates",
                                  "0.1,0.3",
                                  "--out",
                                  (out / dir).string(),
                                  "-t",
                                  "1",
                                  "--no-plots"};
    a.insert(a.end(), extra.begin(), extra.end());
    EXPECT_EQ(wait_exit(spawn(a)), 0);
    return json::parse(std::ifstream(out / dir / "results.json"));
  };
  const std::string url = "http://127.0.0.1:" + std::to_string(server.port());
  const json local = run({"--cloud-model", cloud}, "local");
  const json openai = run({"--cloud", url}, "openai");
  const json sglang = run({"--cloud", url, "--cloud-api", "sglang"}, "sglang");
  EXPECT_EQ(local["scored_positions"], 62);
  EXPECT_NEAR(openai["cloud"]["nll"].get<double>(), local["cloud"]["nll"].get<double>(), 1e-4);
  EXPECT_NEAR(sglang["cloud"]["nll"].get<double>(), local["cloud"]["nll"].get<double>(), 1e-4);
  EXPECT_EQ(openai["edge"]["nll"], local["edge"]["nll"]);
  for (const auto& r : local["routes"]) {
    EXPECT_GE(r["nll"].get<double>(), r["oracle_nll"].get<double>() - 1e-9)
        << "nothing beats the oracle at the same share";
  }
  fs::remove_all(out);
}

// --task wikitext-valid scores the validation file, where settings are chosen, and says so.
TEST(EvalEndToEnd, WikitextValidReadsTheValidationFile) {
  const std::string model = testdata_path("models/synth-llama-Q4_0.gguf");
  const fs::path out = fs::temp_directory_path() / ("tandem-wtv-" + std::to_string(getpid()));
  auto run = [&](const std::string& task) {
    const std::vector<std::string> a = {TANDEM_BINARY,
                                        "eval",
                                        "-m",
                                        model,
                                        "--cloud-model",
                                        model,
                                        "--task",
                                        task,
                                        "--chunks",
                                        "1",
                                        "--chunk-tokens",
                                        "64",
                                        "--rates",
                                        "0.1",
                                        "--out",
                                        (out / task).string(),
                                        "-t",
                                        "1",
                                        "--no-plots"};
    EXPECT_EQ(wait_exit(spawn(a)), 0);
    return json::parse(std::ifstream(out / task / "results.json"));
  };
  const json test = run("wikitext"), valid = run("wikitext-valid");
  EXPECT_EQ(test["task"], "wikitext");
  EXPECT_EQ(valid["task"], "wikitext-valid");
  EXPECT_TRUE(test["source"].get<std::string>().ends_with("wikitext-2/test.txt"));
  EXPECT_TRUE(valid["source"].get<std::string>().ends_with("wikitext-2/valid.txt"));
  EXPECT_NE(test["edge"]["nll"], valid["edge"]["nll"]) << "two files, two texts";
  fs::remove_all(out);
}

// --chat through the binary, on a qwen2 model (ChatML by its architecture): results.json names
// the form and holds the first item's prompt, whose ids are the template text's as `tandem
// tokenize --parse-special` gives them; every item line records the form, and a resumed run in
// another form (plain, or another system message) is refused before it asks anything.
TEST(EvalEndToEnd, ChatPromptsAreRecordedAndResumeRefusesToMixForms) {
  const std::string edge = testdata_path("models/synth-qwen2-Q4_K_M.gguf");
  const std::string data = (shared_dir() / "data").string();
  const fs::path out = fs::temp_directory_path() / ("tandem-chat-" + std::to_string(getpid()));
  fs::remove_all(out);
  auto eval = [&](const std::string& items, std::vector<std::string> form) {
    std::vector<std::string> a = {"eval",   "-m",      edge,        "--task", "csqa-train",
                                  "--data", data,      "--items",   items,    "--modes",
                                  "local",  "--shots", "1",         "--out",  out.string(),
                                  "-t",     "1",       "--no-plots"};
    a.insert(a.end(), form.begin(), form.end());
    return run_tandem(a, fs::temp_directory_path());
  };
  const std::vector<std::string> chat = {"--chat", "--system", "Be brief."};
  const Ran first = eval("0-2", chat);
  ASSERT_EQ(first.rc, 0) << first.err;
  const json results = json::parse(std::ifstream(out / "results.json"));
  EXPECT_EQ(results["task"]["chat"], json({{"answer", "reason"}, {"system", "Be brief."}}));
  const json& example = results["task"]["chat_example"];
  const std::string text = example["text"].get<std::string>();
  EXPECT_EQ(text.rfind("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n", 0), 0u);
  EXPECT_TRUE(text.ends_with("<|im_end|>\n<|im_start|>assistant\n"));
  const Ran tok = run_tandem({"tokenize", "-m", edge, "--parse-special", "--json", "-p", text},
                             fs::temp_directory_path());
  ASSERT_EQ(tok.rc, 0) << tok.err;
  EXPECT_EQ(example["ids"], json::parse(tok.out)["ids"]);
  for (const json& line : read_lines(out / "items-local.jsonl"))
    EXPECT_EQ(line["chat"], results["task"]["chat"]);

  const Ran plain = eval("0-3", {});
  EXPECT_EQ(plain.rc, 1);
  EXPECT_NE(plain.err.find("was asked with --chat"), std::string::npos) << plain.err;
  const Ran other = eval("0-3", {"--chat", "--system", "Be long."});
  EXPECT_EQ(other.rc, 1);
  EXPECT_EQ(read_lines(out / "items-local.jsonl").size(), 3u) << "nothing asked, nothing cut";
  const Ran again = eval("0-3", chat);
  EXPECT_EQ(again.rc, 0) << again.err;
  EXPECT_EQ(read_lines(out / "items-local.jsonl").size(), 4u) << "the same form resumes";
  EXPECT_EQ(eval("0-3", {"--system", "x"}).rc, 1) << "--system without --chat";
  fs::remove_all(out);
}

// HumanEval through the CLI on the real small model: refused without --allow-exec (before any
// model is read), and with it three problems generated, run in the sandbox and logged with
// their verdicts; the completion's tokens are what the share counts.
TEST(EvalEndToEnd, HumanEvalOnTheRealModel) {
  const fs::path out = fs::temp_directory_path() / ("tandem-he-" + std::to_string(getpid()));
  fs::remove_all(out);
  fs::create_directories(out);
  const Ran refused =
      run_tandem({"eval", "--task", "humaneval", "--out", (out / "r").string()}, out);
  EXPECT_EQ(refused.rc, 1);
  EXPECT_NE(refused.err.find("--allow-exec"), std::string::npos) << refused.err;
  EXPECT_FALSE(fs::exists(out / "r"));
  const std::string model = test_model_path();
  if (!fs::exists(model)) GTEST_SKIP() << "real model not found at " << model;
  const Ran ran =
      run_tandem({"eval", "-m", model, "--task", "humaneval", "--allow-exec", "--modes", "local",
                  "--limit", "3", "-t", "2", "--no-plots", "--out", (out / "he").string()},
                 out);
  ASSERT_EQ(ran.rc, 0) << ran.err;
  const auto lines = read_lines(out / "he" / "items-local.jsonl");
  ASSERT_EQ(lines.size(), 3u);
  const std::set<std::string> verdicts = {"passed", "failed", "timeout", "killed"};
  for (const json& l : lines) {
    const std::string verdict = l["sandbox"]["verdict"];
    EXPECT_TRUE(verdicts.count(verdict)) << l.dump();
    EXPECT_EQ(l["answer"], verdict);
    EXPECT_EQ(l["correct"], verdict == "passed");
    EXPECT_EQ(l["gold"], "passed");
    EXPECT_LE(l["tokens"].get<int>(), l["generated"].get<int>());
    EXPECT_NE(l["sandbox"]["isolation"].get<std::string>(), "");
  }
  const json results = json::parse(read_file((out / "he" / "results.json").string()));
  EXPECT_EQ(results["task"]["sandbox"]["wall_s"], 15.0);
  EXPECT_EQ(results["task"]["items"], 3);
  fs::remove_all(out);
}

}  // namespace
}  // namespace tandem::testing
