// tandem router collect|train|bench: traces of the edge and cloud models over text, a trained
// router MLP written as GGUF, and the router's decision cost (docs/router.md).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "cli/edge_flags.h"
#include "tandem/cloud_rows.h"
#include "tandem/engine.h"
#include "tandem/error.h"
#include "tandem/eval_tasks.h"
#include "tandem/router.h"
#include "tandem/router_tools.h"
#include "tandem/router_train.h"

namespace tandem::cli {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

class RouterCollect {
 public:
  explicit RouterCollect(CLI::App* parent) {
    sub_ = parent->add_subcommand(
        "collect",
        "Run the edge model teacher-forced over WikiText-2 test chunks and the cloud over the "
        "same tokens; write a trace (features, tokens, log-probs per position) for `router "
        "train`. Resumes a trace that exists (whole chunks; a half-written tail is cut)");
    edge_.add_to(*sub_, EdgeFlags::kModel);
    add_cloud_model_flag(*sub_, cloud_model_);
    // The cloud over HTTP (/v1/completions) gets the key only: no TLS flags here.
    cloud_.options.timeout_s = 120;  // a request asks for a whole chunk's rows
    cloud_.add_to(*sub_,
                  CloudFlags::kUrl | CloudFlags::kApi | CloudFlags::kApiKey | CloudFlags::kTls);
    sub_->add_option("--out", out_, "Trace file to write or resume")->required();
    sub_->add_option("--task", task_,
                     "What to trace: wikitext or wikitext-valid (WikiText-2 test or validation "
                     "chunks, teacher-forced), or a task's items teacher-forced on their "
                     "reference answers (csqa-train, csqa, arc-easy, arc-challenge, piqa, gsm8k; "
                     "the eval's few-shot prompt, positions recorded from the answer on; lambada: "
                     "the passage and its last word, passages 0-2575 only)")
        ->capture_default_str();
    sub_->add_option("--shots", shots_, "With --task: few-shot examples in the prompt")
        ->check(CLI::Range(0, 32))
        ->capture_default_str();
    chat_.add_to(*sub_);
    sub_->add_option("--chunks", chunks_, "WikiText-2 chunks (or task items) to trace")
        ->check(CLI::Range(1, 100000))
        ->capture_default_str();
    sub_->add_option("--chunk-offset", chunk_offset_,
                     "First chunk or item (sequence ids are chunk or item indices)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    sub_->add_option("--chunk-tokens", chunk_tokens_, "Tokens per chunk")
        ->check(CLI::Range(16, 1 << 16))
        ->capture_default_str();
    sub_->add_option("--first-position", first_position_,
                     "Record positions from this one on (earlier ones only give context)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    sub_->add_option("--top-k", top_k_, "Edge log-probabilities per position in the features")
        ->check(CLI::Range(2, 64))
        ->capture_default_str();
    sub_->add_option("--cloud-top-n", cloud_top_n_,
                     "Over HTTP: the cloud's top-n per position (the edge token's log-prob is "
                     "exact when among them, else bounded by the n-th)")
        ->check(CLI::Range(1, 100))
        ->capture_default_str();
    add_data_flag(*sub_, data_);
    edge_.add_to(*sub_, EdgeFlags::kThreads);
    cloud_.add_to(*sub_, CloudFlags::kTimeout);
    sub_->add_flag("--overwrite", overwrite_, "Start the trace afresh instead of resuming");
    sub_->add_option("--outcome-share", outcome_share_,
                     "Measure the outcome label on this fraction of the sequences (chosen by "
                     "id): at every position where the two top-1s differ, greedy continuations "
                     "both ways (the cloud's through --cloud-model, or --cloud's /v1/completions; "
                     "docs/router.md)")
        ->check(CLI::Range(0.0, 1.0))
        ->capture_default_str();
    sub_->add_option("--outcome-tokens", outcome_tokens_,
                     "Tokens per outcome continuation (text: 16; GSM8K: the answer's tokens at "
                     "most, the eval's 256, each continuation stopping where the eval's would)")
        ->check(CLI::Range(2, 1024));
  }
  bool parsed() const { return sub_->parsed(); }

  int run() {
    model_ = edge_.model_flag.resolve(ModelRole::Edge);
    chat_.check(*sub_, task_);
    if (cloud_model_.empty() == cloud_url_.empty())
      throw Error("router collect: give the cloud as --cloud-model FILE or --cloud URL (one)");
    auto edge = Model::load(model_);
    std::unique_ptr<Model> cloud;
    std::unique_ptr<HttpCloudRows> http;
    if (!cloud_model_.empty()) {
      cloud = Model::load(cloud_model_);
      if (cloud->info().vocab_hash != edge->info().vocab_hash) {
        throw Error("--cloud-model " + cloud_model_ + " has another vocabulary (hash " +
                    cloud->info().vocab_hash + ") than " + model_ + " (hash " +
                    edge->info().vocab_hash + ")");
      }
    } else {
      // Every collection asks for the cloud's top-n per position (and the outcome label for its
      // continuations) through /v1/completions: say so before any work.
      if (api_ == "sglang")
        refuse_sglang("router collect: the cloud's top tokens and continuations",
                      "/v1/completions");
      http = std::make_unique<HttpCloudRows>(cloud_.options, edge->vocab_size());
    }
    // GSM8K (a numeric task): the outcome label judges each continuation's final answer.
    std::optional<eval::Task> numeric;
    const std::vector<TraceSource> sources = task_ == "wikitext" || task_ == "wikitext-valid"
                                                 ? text_sources(*edge)
                                                 : task_sources(*edge, numeric);
    TraceCollection c;
    c.out = out_;
    c.resume = !overwrite_;
    c.top_k = top_k_;
    c.n_threads = threads_;
    c.cloud_model = cloud.get();
    c.outcome_share = outcome_share_;
    c.outcome_tokens = outcome_tokens_ > 0 ? outcome_tokens_
                       : numeric           ? numeric->max_answer_tokens
                                           : 16;
    if (http) {
      c.cloud_rows = [&](const std::vector<TokenId>& chunk, int first) {
        return http->rows(chunk, first, cloud_top_n_);
      };
      c.cloud_continuation = [&](const std::vector<TokenId>& prefix, int n) {
        return http->continuation(prefix, n);
      };
    }
    if (numeric) {
      c.judge_answer = [&](const TraceSource& src) {
        return answer_judge(*numeric, numeric->items[src.id], src.answer_from, c.outcome_tokens);
      };
    }
    collect_traces(*edge, sources, c);
    return 0;
  }

 private:
  // WikiText-2 chunks, recorded from --first-position on.
  std::vector<TraceSource> text_sources(const Model& edge) const {
    const int L = chunk_tokens_;
    if (first_position_ >= L - 1) throw Error("--first-position must be below --chunk-tokens - 1");
    const std::vector<TokenId> all =
        wikitext_tokens(data_, edge, task_ == "wikitext" ? "test" : "valid");
    const int total = static_cast<int>(all.size() / L);
    const int n_chunks = std::min(chunks_, total - chunk_offset_);
    if (n_chunks < 1) {
      throw Error("WikiText-2 " + std::string(task_ == "wikitext" ? "test" : "valid") + " has " +
                  std::to_string(total) + " chunks of " + std::to_string(L) +
                  " tokens; --chunk-offset " + std::to_string(chunk_offset_) + " leaves none");
    }
    std::vector<TraceSource> sources;
    for (int c = 0; c < n_chunks; ++c) {
      const int id = chunk_offset_ + c;
      sources.push_back({static_cast<uint64_t>(id), text_chunk(all, id, L, edge), first_position_});
    }
    return sources;
  }

  // A task's items teacher-forced on their reference answers (few-shot prompt + " " + gold label
  // + newline; with --chat the item's chat prompt + its answer in the chat form, "The answer is
  // (B)."; positions recorded from the row that predicts the answer on). `numeric` receives the
  // task when it is GSM8K.
  std::vector<TraceSource> task_sources(const Model& edge, std::optional<eval::Task>& numeric) {
    if (task_ == "humaneval") {
      throw Error(
          "router collect --task humaneval: a completion has no single reference to "
          "teacher-force (it is judged by running it); choose another task");
    }
    eval::Task task = eval::load_task(task_, data_, task_ == "lambada" ? 0 : shots_);
    chat_.apply(task);
    if (task.kind == eval::TaskKind::Numeric) numeric = task;
    const int n_items = std::min<int>(chunks_, static_cast<int>(task.items.size()) - chunk_offset_);
    if (task.kind == eval::TaskKind::Word &&
        chunk_offset_ + n_items > eval::kLambadaFirstReported) {
      throw Error("router collect --task lambada: passages " +
                  std::to_string(eval::kLambadaFirstReported) +
                  " on are kept for reporting (docs/eval.md); --chunk-offset " +
                  std::to_string(chunk_offset_) + " --chunks " + std::to_string(chunks_) +
                  " reaches passage " + std::to_string(chunk_offset_ + n_items - 1));
    }
    if (n_items < 1) {
      throw Error(task_ + " has " + std::to_string(task.items.size()) + " items; --chunk-offset " +
                  std::to_string(chunk_offset_) + " leaves none");
    }
    std::vector<TraceSource> sources;
    for (int k = 0; k < n_items; ++k) {
      const eval::Item& item = task.items[chunk_offset_ + k];
      const auto [prompt, answer] = prompt_and_answer(task, item, edge);
      const bool special = task.chat.has_value();  // a chat prompt's markers are special tokens
      const int n_prompt = static_cast<int>(edge.tokenize(prompt, true, special).size());
      std::vector<TokenId> ids = edge.tokenize(prompt + answer, true, special);
      if (static_cast<int>(ids.size()) <= n_prompt)
        throw Error(item.id + ": the answer added no tokens to the prompt");
      sources.push_back(
          {static_cast<uint64_t>(chunk_offset_ + k), std::move(ids), n_prompt - 1, n_prompt});
    }
    return sources;
  }

  // An item's prompt as `tandem eval` asks it and the reference answer after it. Plain multiple
  // choice: " B\n"; GSM8K: the worked solution as the shots show theirs; LAMBADA: " word", the
  // word's own tokens only. Chat: the answer turn's text (eval::chat_reference_answer).
  static std::pair<std::string, std::string> prompt_and_answer(const eval::Task& task,
                                                               const eval::Item& item,
                                                               const Model& edge) {
    if (task.chat) {
      return {edge.chat_prompt(eval::chat_messages(task, item), true),
              eval::chat_reference_answer(task, item)};
    }
    const std::string prompt = eval::item_prompt(task, item);
    if (task.kind == eval::TaskKind::Numeric) return {prompt, " " + item.reference + "\n\n"};
    if (task.kind == eval::TaskKind::Word) return {prompt, " " + item.gold};
    return {prompt, " " + item.gold + "\n"};
  }

  // GSM8K's outcome: whether a continuation's final answer is the item's, read as the eval
  // reads the task's form.
  static OutcomeProbe::AnswerJudge answer_judge(const eval::Task& task, const eval::Item& item,
                                                int answer_from, int max_tokens) {
    OutcomeProbe::AnswerJudge judge;
    judge.answer_from = answer_from;
    judge.max_tokens = max_tokens;
    judge.complete = [&task](const std::string& a) { return eval::answer_complete(task, a); };
    judge.correct = [&task, &item](const std::string& a) {
      const auto got = eval::extract_answer(task, item, eval::cut_answer(task, a));
      return got && *got == item.gold;
    };
    return judge;
  }

  CLI::App* sub_;
  CloudFlags cloud_;
  EdgeFlags edge_;
  // run() reads the shared flags under these names.
  std::string& model_ = edge_.model;
  std::string& cloud_url_ = cloud_.options.url;
  std::string& api_ = cloud_.options.api;
  int& threads_ = edge_.options.context.n_threads;
  std::string cloud_model_, out_, data_, task_ = "wikitext";
  ChatFormFlags chat_;
  int shots_ = 5, chunks_ = 24, chunk_offset_ = 0, chunk_tokens_ = 512, first_position_ = 0,
      top_k_ = 8, cloud_top_n_ = 20;
  double outcome_share_ = 0;
  int outcome_tokens_ = 0;  // 0: 16 for text, the task's answer length for GSM8K
  bool overwrite_ = false;
};

class RouterTrain {
 public:
  explicit RouterTrain(CLI::App* parent) {
    sub_ = parent->add_subcommand(
        "train",
        "Train a router MLP on traces (validation split by sequence, early stopping); print "
        "ROC-AUC, PR-AUC and the cloud-share curves; write the router as GGUF");
    sub_->add_option("--traces", t_.traces, "Trace file(s) from `router collect`")->required();
    sub_->add_option("--out", t_.out, "Router GGUF file to write")->required();
    sub_->add_option("--cloud-name", t_.cloud_name,
                     "The cloud model the traces were collected against (e.g. its general.name), "
                     "recorded in the router file beside the edge model's fingerprint");
    sub_->add_option("--label", t_.label, "disagree | critical[:TAU] | gain | gain:Q | kl | kl:log")
        ->capture_default_str();
    sub_->add_option("--hidden", t_.train.hidden, "Hidden layer widths, e.g. 64 or 64,32")
        ->delimiter(',')
        ->capture_default_str();
    sub_->add_option("--epochs", t_.train.epochs, "Epochs at most")->capture_default_str();
    sub_->add_option("--patience", t_.train.patience, "Epochs without a better validation loss")
        ->capture_default_str();
    sub_->add_option("--batch", t_.train.batch, "Rows per step")->check(CLI::Range(1, 1 << 16));
    sub_->add_option("--lr", t_.train.lr, "Adam learning rate")->capture_default_str();
    sub_->add_option("--weight-decay", t_.train.weight_decay, "Decoupled weight decay")
        ->capture_default_str();
    sub_->add_option("--val-fraction", t_.train.val_fraction, "Sequences held out for validation")
        ->check(CLI::Range(0.01, 0.9))
        ->capture_default_str();
    sub_->add_option("--seed", t_.train.seed, "Seed for initialisation, split and shuffling")
        ->capture_default_str();
    sub_->add_option("--min-position", t_.min_position,
                     "Train and validate on positions from this one on (the wikitext eval scores "
                     "the second half of each chunk: 256 for chunks of 512)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    sub_->add_flag("--no-class-weight", no_class_weight_,
                   "Do not weight the rarer class up (classification labels)");
    sub_->add_flag("--cloud-aware-reference", t_.cloud_aware_reference,
                   "Also train, on the same split, a reference MLP for the `gain` label that "
                   "sees three cloud-side values besides the router's features (KL(cloud || "
                   "edge), the cloud's log-probability of the edge's top-1, whether the top-1s "
                   "agree) and print its gap recovered: what routing could reach knowing both "
                   "distributions but not the true token. Not a router; not written");
    sub_->add_flag("--json", json_, "Print the training summary as JSON on stdout");
  }
  bool parsed() const { return sub_->parsed(); }

  int run() {
    t_.train.class_weighting = !no_class_weight_;
    const std::string summary = router::train_router_file(t_);
    if (json_) std::printf("%s\n", json::parse(summary).dump(1).c_str());
    return 0;
  }

 private:
  CLI::App* sub_;
  router::RouterTraining t_;
  bool no_class_weight_ = false, json_ = false;
};

class RouterBench {
 public:
  explicit RouterBench(CLI::App* parent) {
    sub_ = parent->add_subcommand(
        "bench", "Time the trained router's decision (features + MLP) per token, median of runs");
    sub_->add_option("--router", router_, "Router GGUF file")->required();
    sub_->add_option("-n", n_, "Decisions per run")->check(CLI::Range(1, 10000000));
    sub_->add_option("-r", runs_, "Runs")->check(CLI::Range(1, 1000));
    sub_->add_flag("--json", json_, "Print {\"us_per_decision\",\"sd\"} on stdout");
  }
  bool parsed() const { return sub_->parsed(); }

  int run() {
    const std::shared_ptr<const MlpRouterModel> model = router::load_router_model(router_);
    const MlpRouterModel& m = *model;
    // A realistic signal: a hidden state of the right width, k descending probabilities.
    std::vector<float> hidden(m.spec.n_embd);
    for (int i = 0; i < m.spec.n_embd; ++i) hidden[i] = std::sin(0.37f * i) * 3;
    RouterSignal s;
    s.hidden = hidden;
    for (int i = 0; i < m.spec.top_k; ++i) s.top_probs.push_back(0.5f / (1 << i));
    s.entropy = 2.1f;
    s.margin = s.top_probs[0] - s.top_probs[1];
    RouterConfig cfg;
    cfg.policy = RouterPolicy::Mlp;
    cfg.mlp = model;
    cfg.target_rate = 0.07;
    cfg.prior_scores = m.prior_scores(cfg.window);
    // A run is the offline replay of n decisions (each recorded as one token), as eval and
    // bench/bench_router.cpp replay them.
    std::vector<RouterSignal> signals(n_, s);
    for (int i = 0; i < n_; ++i) signals[i].position = i;
    std::vector<double> us;
    float sink = 0;
    for (int r = 0; r < runs_; ++r) {
      const auto t0 = Clock::now();
      const std::vector<RouteDecision> decisions = replay_decisions(cfg, signals);
      us.push_back(seconds_since(t0) * 1e6 / n_);
      for (const RouteDecision& d : decisions) sink += d.score;
    }
    std::sort(us.begin(), us.end());
    double mean = 0, sd = 0;
    for (double u : us) mean += u / us.size();
    for (double u : us) sd += (u - mean) * (u - mean) / us.size();
    sd = std::sqrt(sd);
    std::fprintf(stderr,
                 "router decision (features, %d-feature MLP, target-rate controller): median "
                 "%.2f us, sd %.2f, over %d runs of %d (checksum %g)\n",
                 m.spec.n_features(), us[us.size() / 2], sd, runs_, n_, sink);
    if (json_)
      std::printf("%s\n", json{{"us_per_decision", us[us.size() / 2]}, {"sd", sd}}.dump().c_str());
    return 0;
  }

 private:
  CLI::App* sub_;
  std::string router_;
  int n_ = 20000, runs_ = 5;
  bool json_ = false;
};

class RouterCommand : public Command {
 public:
  explicit RouterCommand(CLI::App& app)
      : Command(app.add_subcommand("router", "Learned routers: collect traces, train, bench")),
        collect_(sub_),
        train_(sub_),
        bench_(sub_) {
    sub_->require_subcommand(1);
  }
  int run() override {
    if (collect_.parsed()) return collect_.run();
    if (train_.parsed()) return train_.run();
    if (bench_.parsed()) return bench_.run();
    return 2;
  }

 private:
  RouterCollect collect_;
  RouterTrain train_;
  RouterBench bench_;
};

}  // namespace

std::unique_ptr<Command> make_router_command(CLI::App& app) {
  return std::make_unique<RouterCommand>(app);
}

}  // namespace tandem::cli
