// tandem eval: quality against cloud share on real benchmarks, through the real system. Each run
// (local, cloud, route at several target cloud shares, speculative) asks every item of a task
// through an EdgeDecoder talking to a cloud (a `tandem serve` or any supported backend), logs each
// item's prompt, output and extracted answer, and ends with a results JSON, a markdown table and
// plots drawn by gnuplot. An interrupted run resumes from its item logs. --chat asks the items
// as chat turns in the model's own template (instruct models; tandem/eval_tasks.h). HumanEval's
// completions run in a sandbox (tandem/sandbox.h), and only with --allow-exec.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "cli/commands.h"
#include "cli/edge_flags.h"
#include "cli/eval_loglik.h"
#include "tandem/client.h"
#include "tandem/default_model.h"
#include "tandem/delay_proxy.h"
#include "tandem/engine.h"
#include "tandem/error.h"
#include "tandem/eval_report.h"
#include "tandem/eval_tasks.h"
#include "tandem/routing.h"
#include "tandem/sandbox.h"

namespace tandem::cli {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;
using namespace tandem::eval;

// One configuration to evaluate: a mode, and for route mode a policy and a target share.
struct RunSpec {
  std::string name;  // "local", "cloud", "route-confidence-5%", "route-ROUTER-5%", "speculative"
  EdgeMode mode = EdgeMode::Local;
  std::optional<double> target_rate;
  std::string policy;       // route mode: confidence | entropy | margin, or "" for a router file
  std::string router_path;  // route mode with a trained router
};

// A route-mode policy: a heuristic by name, or a trained router file (named by its file stem).
struct PolicySpec {
  std::string name, policy, router_path;
  std::vector<double> rates;  // its own targets; empty: --rates
};

// "--router R.gguf[@T1,T2,...]": the file, and the targets given after the last '@' (a list of
// shares in [0, 1]; a path with an '@' not followed by such a list is a path).
std::pair<std::string, std::vector<double>> router_arg(const std::string& arg) {
  const size_t at = arg.rfind('@');
  if (at == std::string::npos) return {arg, {}};
  std::vector<double> rates;
  std::stringstream ss(arg.substr(at + 1));
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const double r = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !(r >= 0 && r <= 1)) return {arg, {}};
    rates.push_back(r);
  }
  if (rates.empty()) return {arg, {}};
  return {arg.substr(0, at), rates};
}

std::string percent_name(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g%%", 100 * r);
  return buf;
}

std::vector<RunSpec> parse_runs(const std::string& modes, const std::vector<double>& rates,
                                const std::vector<PolicySpec>& policies) {
  std::vector<RunSpec> runs;
  std::stringstream ss(modes);
  std::string m;
  while (std::getline(ss, m, ',')) {
    if (m.empty()) continue;
    EdgeMode mode;
    try {
      mode = parse_edge_mode(m);
    } catch (const std::invalid_argument& e) {
      throw Error(std::string("--modes: ") + e.what());
    }
    if (mode == EdgeMode::Route) {
      if (rates.empty()) throw Error("--modes has route but --rates is empty");
      for (const PolicySpec& p : policies) {
        for (double r : p.rates.empty() ? rates : p.rates) {
          runs.push_back(
              {"route-" + p.name + "-" + percent_name(r), mode, r, p.policy, p.router_path});
        }
      }
    } else {
      runs.push_back({m, mode, std::nullopt, "", ""});
    }
  }
  if (runs.empty()) throw Error("--modes names no mode");
  return runs;
}

// The prompt form of a task for its item logs and results.json: null for the plain prompts,
// {"answer": "reason", "system": S} for chat prompts.
json prompt_form(const Task& task) {
  if (!task.chat) return nullptr;
  return {{"answer", chat_answer_name(task.chat->answer)}, {"system", task.chat->system}};
}

std::string describe_form(const json& form) {
  if (form.is_null()) return "the plain prompts";
  return "--chat --chat-answer " + form.value("answer", std::string()) + " --system '" +
         form.value("system", std::string()) + "'";
}

// Reads an item log, keeping whole lines only (a killed run may leave half a line, which is cut
// off so that appending continues cleanly). Throws when a line was asked in another prompt
// form than `form` (its "chat" field; none: plain), so a resumed run never mixes forms.
std::map<std::string, ItemRecord> read_log(const fs::path& path, const json& form) {
  std::map<std::string, ItemRecord> done;
  std::ifstream in(path, std::ios::binary);
  if (!in) return done;
  std::string content((std::istreambuf_iterator<char>(in)), {});
  in.close();
  size_t keep = 0, start = 0;
  while (start < content.size()) {
    const size_t nl = content.find('\n', start);
    if (nl == std::string::npos) break;
    json j = json::parse(content.substr(start, nl - start), nullptr, false);
    if (j.is_discarded()) break;
    ItemRecord r;
    if (!j.contains("id") || !j["id"].is_string()) break;  // not one of ours: stop reading here
    r.id = j["id"].get<std::string>();
    const json line_form = j.value("chat", json(nullptr));
    if (line_form != form) {
      throw Error(path.string() + ": item " + r.id + " was asked with " + describe_form(line_form) +
                  ", this run asks with " + describe_form(form) +
                  "; give another --out to keep both");
    }
    r.correct = j.value("correct", false);
    if (j.contains("answer") && j["answer"].is_string()) r.answer = j["answer"].get<std::string>();
    visit_item_counts([&j](const char* name, auto& field) { field = j.value(name, field); }, r);
    // Logs from before the answer-token rule counted every generated token as an answer token.
    if (!j.contains("generated")) r.generated = r.tokens;
    if (!j.contains("generated_cloud")) r.generated_cloud = r.cloud_tokens;
    done[r.id] = r;
    keep = nl + 1;
    start = nl + 1;
  }
  if (keep < content.size()) fs::resize_file(path, keep);
  return done;
}

std::string machine_description() {
  std::ifstream cpu("/proc/cpuinfo");
  std::string line, model;
  while (std::getline(cpu, line)) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  return model + ", " + std::to_string(sysconf(_SC_NPROCESSORS_ONLN)) + " cores";
}

class EvalCommand : public Command {
 public:
  explicit EvalCommand(CLI::App& app)
      : Command(app.add_subcommand(
            "eval",
            "Accuracy against cloud share on a benchmark, through the real system: every mode "
            "asks every item via the edge decoder and the cloud; writes results.json, "
            "results.md and plots (gnuplot) to --out; resumes an interrupted run")) {
    // The flags of `tandem run`, but those eval spells its own way (--modes; a list of --policy
    // heuristics and --router files; --rates) or has no use for (answers are greedy and as long
    // as the task's).
    edge_.add_to(*sub_, EdgeFlags::kModel);
    cloud_.add_to(*sub_, CloudFlags::kAll & ~CloudFlags::kTimeout);
    sub_->add_option(
            "--task", task_,
            "csqa | arc-easy | arc-challenge | piqa | gsm8k | lambada | humaneval (needs "
            "--allow-exec) | wikitext | wikitext-valid (WikiText-2 validation text, for choosing "
            "settings on text that is not reported)")
        ->required();
    sub_->add_flag("--allow-exec", allow_exec_,
                   "humaneval: run each model-written completion with the problem's tests, as "
                   "python3 in a sandbox (own process group and namespaces, CPU/memory/file "
                   "limits, no network, writes only in a scratch folder, killed at 15 s; "
                   "docs/eval.md); without it humaneval refuses to run");
    add_cloud_model_flag(*sub_, cloud_model_);
    sub_->add_option("--chunks", chunks_, "wikitext: chunks scored")
        ->check(CLI::Range(1, 10000))
        ->capture_default_str();
    sub_->add_option("--chunk-tokens", chunk_tokens_,
                     "wikitext: tokens per chunk (the second half scored)")
        ->check(CLI::Range(16, 1 << 16))
        ->capture_default_str();
    sub_->add_option("--chunk-offset", chunk_offset_,
                     "wikitext: first chunk scored (score held-out text: a router trained on "
                     "chunks [0, K) is evaluated from chunk K on)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    sub_->add_option("--router", router_files_,
                     "A trained router (GGUF, `tandem router train`), as R.gguf or "
                     "R.gguf@T1,T2,... with targets of its own instead of --rates; repeat for "
                     "several: route mode runs each (runs named route-STEM-T, STEM the file's "
                     "name without .gguf), after the --policy heuristics when --policy is given; "
                     "wikitext scores each next to the heuristics over the same forward passes, "
                     "one as the 'mlp' policy, several as 'mlp-STEM'");
    sub_->add_option("--modes", modes_, "Comma-separated: local,cloud,route,speculative")
        ->capture_default_str();
    sub_->add_option("--rates", rates_, "Route mode: target cloud shares, e.g. 0.02,0.05,0.1")
        ->delimiter(',')
        ->check(CLI::Range(0.0, 1.0));
    sub_->add_option("--policy", policy_,
                     "Route mode's heuristic routers, comma-separated: confidence, entropy, "
                     "margin (default confidence; none by default when --router is given)")
        ->capture_default_str();
    edge_.add_to(*sub_, EdgeFlags::kControl);
    chat_.add_to(*sub_);
    sub_->add_option("--shots", shots_,
                     "Few-shot examples in the prompt (default 5; lambada is zero-shot)")
        ->check(CLI::Range(0, 32));
    sub_->add_option("--items", items_,
                     "Only items A to B of the task's file (0-based, both included), e.g. "
                     "2576-5152 for LAMBADA's reported half");
    sub_->add_option("--limit", limit_, "Items at most (0: all)")->check(CLI::NonNegativeNumber);
    add_data_flag(*sub_, data_);
    sub_->add_option("--out", out_, "Output folder (default eval-out/TASK)");
    cloud_.add_to(*sub_, CloudFlags::kTimeout);
    edge_.add_to(*sub_, EdgeFlags::kContext | EdgeFlags::kThreads | EdgeFlags::kSeed);
    sub_->add_option("--rtt-ms", rtt_ms_,
                     "Add this network round trip between device and cloud (a loopback delay "
                     "proxy in this process)")
        ->check(CLI::Range(0.0, 10000.0));
    sub_->add_flag("--no-plots", no_plots_, "Skip the gnuplot plots");
    sub_->add_flag("--json", json_, "Print results.json on stdout too");
  }

  int run() override {
    if (task_ == "humaneval" && !allow_exec_) {
      throw Error(
          "--task humaneval runs model-written code: add --allow-exec to run it in the "
          "sandbox (docs/eval.md)");
    }
    // One set of options for every run; run_one overrides only the mode and the router.
    edge_.resolve(cloud_.options);  // its mode and policy (run's flags) are not used here
    base_ = edge_.options;
    base_.sampling.temp = 0;
    if (out_.empty()) out_ = "eval-out/" + task_;
    if (rates_.empty()) rates_ = {0.05, 0.2};
    chat_.check(*sub_, task_);
    if (task_ == "wikitext" || task_ == "wikitext-valid") return run_wikitext();
    use_shipped_router();
    const auto runs = parse_runs(modes_, rates_, policies());
    // The device reaches the cloud through the delay proxy when a round trip is asked for.
    const std::unique_ptr<net::DelayProxy> proxy = start_delay_proxy();
    for (const auto& r : runs) {
      if (r.mode != EdgeMode::Local && cloud_.options.url.empty()) {
        throw Error("mode " + r.name + " needs --cloud URL");
      }
    }
    if (shots_ < 0) shots_ = default_shots(task_);
    Task task = load_task(task_, data_, shots_);
    chat_.apply(task);
    select_items(task);
    if (limit_ > 0 && static_cast<size_t>(limit_) < task.items.size()) task.items.resize(limit_);
    fs::create_directories(out_);
    auto model = Model::load(edge_.model);

    json results;
    results["command"] = invocation();
    results["task"] = {{"name", task.name},
                       {"source", task.source},
                       {"shots", shots_},
                       {"shots_from", task.shots_from},
                       {"items", task.items.size()},
                       {"header", task.header},
                       {"chat", prompt_form(task)}};
    if (task.kind == TaskKind::Code) results["task"]["sandbox"] = sandbox_json(SandboxLimits{});
    if (task.chat && !task.items.empty())
      results["task"]["chat_example"] = chat_example(task, *model);
    results["edge"] = {{"path", edge_.model},
                       {"name", model->info().name},
                       {"vocab_hash", model->info().vocab_hash},
                       {"file_bytes", model->info().file_bytes}};
    results["cloud"] = {
        {"url", cloud_.options.url}, {"api", cloud_.options.api}, {"rtt_ms_added", rtt_ms_}};
    results["settings"] = settings_json();
    for (const std::string& arg : router_files_) {
      // Checked against the edge model now, so a wrong router stops the run before any item.
      const std::string path = router_arg(arg).first;
      EdgeOptions probe;
      RoutingSpec spec;
      spec.router_file = path;
      const auto info = *resolve_routing(spec, *model, edge_.model, probe);
      results["routers"].push_back({{"path", path},
                                    {"label", info.label},
                                    {"edge_vocab_hash", info.vocab_hash},
                                    {"edge_name", info.edge_name},
                                    {"file_bytes", fs::file_size(path)}});
    }
    results["machine"] = machine_description();

    RunRecords by_run;
    for (const RunSpec& spec : runs) {
      by_run[spec.name] = run_one(spec, task, *model, results);
    }
    report(runs, task, by_run, results);
    std::ofstream(fs::path(out_) / "results.json") << results.dump(1) << "\n";
    if (json_) std::printf("%s\n", results.dump(1).c_str());
    return 0;
  }

 private:
  // The first item's chat prompt for results.json: the template's text and its token ids.
  static json chat_example(const Task& task, const Model& model) {
    const Item& item = task.items.front();
    return {{"id", item.id},
            {"text", model.chat_prompt(chat_messages(task, item), true)},
            {"ids", prompt_ids(task, model, item)}};
  }

  // An item's prompt as the model reads it: the plain completion prompt, or the conversation in
  // the model's own chat template with its control tokens ("<|im_start|>") as single tokens, as
  // `tandem run --chat` tokenizes it (BOS added by the vocabulary where it asks for one).
  static std::vector<TokenId> prompt_ids(const Task& task, const Model& model, const Item& item) {
    if (!task.chat) return model.tokenize(item_prompt(task, item), true, false);
    return model.tokenize(model.chat_prompt(chat_messages(task, item), true), true, true);
  }

  // --task wikitext: the offline log-likelihood replay (eval_loglik.cpp).
  int run_wikitext() const {
    WikitextEvalOptions w;
    w.command = invocation();
    w.edge_model = edge_.model;
    w.cloud_url = cloud_.options.url;
    w.api = cloud_.options.api;
    w.api_key = cloud_.options.api_key;
    w.insecure = cloud_.options.insecure;
    w.ca_file = cloud_.options.ca_file;
    w.cloud_model = cloud_model_;
    w.data_dir = data_;
    w.split = task_ == "wikitext" ? "test" : "valid";
    w.out_dir = out_;
    w.rates = rates_;
    w.rate_gain = edge_.target_gain;
    w.chunks = chunks_;
    w.chunk_tokens = chunk_tokens_;
    w.chunk_offset = chunk_offset_;
    for (const std::string& arg : router_files_) {
      const auto [file, targets] = router_arg(arg);
      if (!targets.empty()) {
        throw Error("--router " + arg + ": --task " + task_ +
                    " scores every router at --rates; drop the @targets");
      }
      w.routers.push_back(file);
    }
    w.threads = base_.context.n_threads;
    w.timeout_s = std::max(cloud_.options.timeout_s, 60.0);
    w.plots = !no_plots_;
    w.json = json_;
    return run_wikitext_eval(w);
  }

  // --rtt-ms: a loopback proxy that delays every byte between the device and --cloud, which is
  // pointed at it. Null without --rtt-ms or --cloud.
  std::unique_ptr<net::DelayProxy> start_delay_proxy() {
    if (rtt_ms_ <= 0 || cloud_.options.url.empty()) return nullptr;
    net::DelayedUrl delayed;
    try {
      delayed = net::delay_url(cloud_.options.url, rtt_ms_);
    } catch (const std::invalid_argument& e) {
      throw Error(std::string("--cloud: ") + e.what());
    }
    cloud_.options.url = delayed.url;
    std::fprintf(stderr, "[eval] %g ms round trip added by a loopback proxy\n", rtt_ms_);
    return std::move(delayed.proxy);
  }

  // What every run shares, for results.json: the device's options and the cloud's timeout.
  json settings_json() const {
    return {{"route_span", base_.route_span},
            {"draft", base_.draft},
            {"sync_ahead", base_.sync_ahead},
            {"pipeline", base_.pipeline},
            {"sync_every", base_.sync_every},
            {"target_gain", edge_.target_gain},
            {"cloud_timeout_s", base_.cloud_timeout_s},
            {"ctx_size", base_.context.n_ctx},
            {"threads", base_.context.n_threads},
            {"cache_type_k", kv_cache_type_name(base_.context.type_k)},
            {"cache_type_v", kv_cache_type_name(base_.context.type_v)},
            {"seed", edge_.seed}};
  }

  // With neither --policy nor --router, route mode runs the router that ships for the device
  // model of a known pair (shipped_router_for), at --rates.
  void use_shipped_router() {
    if (!router_files_.empty() || sub_->count("--policy") > 0) return;
    const std::string shipped = shipped_router_for(edge_.model);
    if (shipped.empty()) return;
    router_files_.push_back(shipped);
    std::fprintf(stderr,
                 "[eval] route mode uses %s, the router that ships for this model "
                 "(--policy confidence for the heuristic instead)\n",
                 shipped.c_str());
  }

  // The route-mode policies: the --policy heuristics, then each --router file.
  std::vector<PolicySpec> policies() const {
    std::vector<PolicySpec> out;
    if (router_files_.empty() || sub_->count("--policy") > 0) {
      std::stringstream ss(policy_);
      std::string name;
      while (std::getline(ss, name, ',')) {
        if (name.empty()) continue;
        if (name != "confidence" && name != "entropy" && name != "margin") {
          throw Error("--policy: '" + name + "' is not confidence, entropy or margin");
        }
        out.push_back({name, name, "", {}});
      }
    }
    for (const std::string& arg : router_files_) {
      const auto [path, rates] = router_arg(arg);
      out.push_back({fs::path(path).stem().string(), "", path, rates});
    }
    std::set<std::string> names;
    for (const PolicySpec& p : out) {
      if (!names.insert(p.name).second) throw Error("two route policies are named " + p.name);
    }
    return out;
  }

  // --items A-B: keeps the task's items A to B (0-based, both included).
  void select_items(Task& task) const {
    if (items_.empty()) return;
    const size_t dash = items_.find('-');
    auto number = [&](const std::string& s) {
      if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 9)
        throw Error("--items '" + items_ + "': expected A-B, two item numbers");
      return static_cast<size_t>(std::stoul(s));
    };
    if (dash == std::string::npos) throw Error("--items '" + items_ + "': expected A-B");
    const size_t a = number(items_.substr(0, dash)), b = number(items_.substr(dash + 1));
    if (a > b || b >= task.items.size()) {
      throw Error("--items " + items_ + ": " + task.name + " has items 0-" +
                  std::to_string(task.items.size() - 1) + " (" + task.source + ")");
    }
    task.items = std::vector<Item>(task.items.begin() + static_cast<std::ptrdiff_t>(a),
                                   task.items.begin() + static_cast<std::ptrdiff_t>(b + 1));
    if (task.name == "lambada" && !router_files_.empty() &&
        a < static_cast<size_t>(kLambadaFirstReported)) {
      std::fprintf(stderr,
                   "warning: --items %s includes LAMBADA passages 0-%d, which routers are trained "
                   "and tuned on: these figures are not held-out (report from %d on)\n",
                   items_.c_str(), kLambadaFirstReported - 1, kLambadaFirstReported);
    }
  }

  // The word rule: an answer's tokens are those up to the one holding the word's last byte
  // (at least one: the token that showed there is no word); tokens past the word do not count.
  // HumanEval's the same with the completion's end (its stop sequence's token is not counted
  // unless it also holds the completion's last byte).
  static void count_answer_tokens(const std::vector<std::pair<size_t, bool>>& token_starts,
                                  size_t word_end, ItemRecord& r) {
    size_t k = 0;
    while (k < token_starts.size() && token_starts[k].first < word_end) ++k;
    if (k == 0 && !token_starts.empty()) k = 1;
    r.tokens = static_cast<int>(k);
    r.cloud_tokens = 0;
    for (size_t i = 0; i < k; ++i) r.cloud_tokens += token_starts[i].second;
  }

  // Runs one configuration over the task's items that its log (items-NAME.jsonl) does not hold
  // yet, appending each item's line as it is answered (an interrupted run resumes from the log).
  // Returns every item's record, old and new.
  std::map<std::string, ItemRecord> run_one(const RunSpec& spec, const Task& task,
                                            const Model& model, json& results) {
    const fs::path log = fs::path(out_) / ("items-" + spec.name + ".jsonl");
    const json form = prompt_form(task);  // what every line of the log says of its prompt
    auto done = read_log(log, form);
    size_t todo = 0;
    for (const auto& it : task.items) todo += done.count(it.id) == 0;
    if (todo == 0) {
      std::fprintf(stderr, "[%s] %zu items already done\n", spec.name.c_str(), done.size());
      return done;
    }
    const std::unique_ptr<EdgeDecoder> edge = start_decoder(spec, model, results);
    std::ofstream out(log, std::ios::app);
    const bool tty = stderr_is_tty();
    const auto t0 = std::chrono::steady_clock::now();
    Tally tally;
    for (const auto& [id, r] : done) tally.add(r);
    for (const Item& item : task.items) {
      if (done.count(item.id)) continue;
      const Generation g = generate_item(*edge, spec, task, model, item);
      const std::string output = cut_answer(task, g.res.text);
      std::optional<std::string> answer;
      json line_extra = json::object();  // HumanEval: the sandbox verdict and how it ended
      if (task.kind == TaskKind::Code) {
        const SandboxResult run = run_python(code_program(item, output));
        answer = run.verdict;
        line_extra["sandbox"] = sandbox_json(run);
      } else {
        answer = extract_answer(task, item, output);
      }
      const ItemRecord r = item_record(task, item, g, output, answer);
      json line = log_line(spec, item, r, output, answer, g.error, form);
      line.update(line_extra);
      out << line.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
      out.flush();
      done[r.id] = r;
      ++tally.n_done;
      tally.add(r);
      progress(spec.name, done.size(), task.items.size(), tally.n_done, todo, tally.correct,
               tally.tokens, tally.cloud,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), tty);
    }
    std::fprintf(stderr, "\n");
    return done;
  }

  // The progress line's totals: items answered in this call (n_done), and over every item
  // done, old and new, the correct ones and the answer tokens, all and the cloud's.
  struct Tally {
    size_t n_done = 0, correct = 0, tokens = 0, cloud = 0;
    void add(const ItemRecord& r) {
      correct += r.correct;
      tokens += r.tokens;
      cloud += r.cloud_tokens;
    }
  };

  // One item's generation: its result, per token where its text starts in the output and
  // whether the cloud chose it, and the error that ended it ("" if none).
  struct Generation {
    EdgeResult res;
    std::vector<std::pair<size_t, bool>> token_starts;
    std::string error;
  };

  // The run's decoder: its mode, policy and target over base_, its cloud connected (the cloud's
  // model line printed and kept in results.json) unless the run is local.
  std::unique_ptr<EdgeDecoder> start_decoder(const RunSpec& spec, const Model& model,
                                             json& results) const {
    EdgeOptions opts = base_;
    opts.mode = spec.mode;
    RoutingSpec routing;  // local and cloud runs: the defaults, unused
    if (spec.mode == EdgeMode::Route) {
      routing.policy = spec.policy;
      routing.router_file = spec.router_path;
      routing.target_rate = spec.target_rate;
    }
    routing.target_gain = edge_.target_gain;
    routing.route_span = base_.route_span;
    resolve_routing(routing, model, edge_.model, opts);
    std::unique_ptr<CloudBackend> backend;
    if (spec.mode != EdgeMode::Local) backend = make_cloud_backend(cloud_.options, model);
    auto edge = std::make_unique<EdgeDecoder>(model, opts, std::move(backend));
    const std::string cloud_line = edge->start();
    if (spec.mode != EdgeMode::Local) {
      std::fprintf(stderr, "[%s] %s\n", spec.name.c_str(), cloud_line.c_str());
      results["cloud"]["model"] = cloud_line;
    }
    return edge;
  }

  // Generates one item's answer, stopping where the answer is complete. An error (e.g. a prompt
  // longer than the context) ends the item, which is then logged and scored wrong; the first
  // three are printed.
  Generation generate_item(EdgeDecoder& edge, const RunSpec& spec, const Task& task,
                           const Model& model, const Item& item) {
    const auto ids = prompt_ids(task, model, item);
    Generation g;
    std::string text;
    try {
      g.res = edge.generate(
          ids, task.max_answer_tokens, [&](const EdgeToken& t, std::string_view piece) {
            g.token_starts.emplace_back(text.size(), t.source == TokenSource::Cloud);
            text += piece;
            return !answer_complete(task, text);
          });
    } catch (const Error& e) {
      g.error = e.what();
      if (errors_++ < 3) {
        std::fprintf(stderr, "\n[%s] %s: %s\n", spec.name.c_str(), item.id.c_str(), e.what());
      }
    }
    return g;
  }

  // A sandbox run for an item's log line: the verdict, how the program ended, the isolation
  // that applied and the last KiB of its stderr (the traceback).
  static json sandbox_json(const SandboxResult& run) {
    const size_t tail = std::min<size_t>(run.stderr_tail.size(), 1024);
    return {{"verdict", run.verdict},
            {"exit_status", run.exit_status},
            {"signal", run.signal},
            {"timed_out", run.timed_out},
            {"wall_ms", run.wall_ms},
            {"cpu_ms", run.cpu_ms},
            {"isolation", run.isolation},
            {"stderr_tail", run.stderr_tail.substr(run.stderr_tail.size() - tail)}};
  }
  // The sandbox's limits for results.json.
  static json sandbox_json(const SandboxLimits& lim) {
    return {{"wall_s", lim.wall_s},
            {"cpu_s", lim.cpu_s},
            {"memory_bytes", lim.memory_bytes},
            {"file_bytes", lim.file_bytes},
            {"processes", lim.processes},
            {"python", python_executable()}};
  }

  // The item's record: its answer scored against the gold and the generation's statistics (a
  // word task counts only the answer word's tokens, HumanEval the completion's up to its stop).
  static ItemRecord item_record(const Task& task, const Item& item, const Generation& g,
                                const std::string& output,
                                const std::optional<std::string>& answer) {
    ItemRecord r;
    r.id = item.id;
    r.answer = answer.value_or("");
    r.correct = answer && *answer == item.gold;
    r.generated = g.res.stats.tokens;
    r.generated_cloud = g.res.stats.cloud_tokens;
    r.tokens = r.generated;
    r.cloud_tokens = r.generated_cloud;
    if (task.kind == TaskKind::Word || task.kind == TaskKind::Code)
      count_answer_tokens(g.token_starts, output.size(), r);
    r.route_events = g.res.stats.route_events;
    r.fallbacks = g.res.stats.fallbacks;
    r.bytes_up = g.res.stats.bytes_up;
    r.bytes_down = g.res.stats.bytes_down;
    r.ms = g.res.stats.total_ms;
    r.wait_ms = g.res.stats.wait_ms;
    r.route_confirmed = g.res.stats.route_confirmed;
    r.route_changed = g.res.stats.route_changed;
    r.wasted_tokens = g.res.stats.wasted_tokens;
    return r;
  }

  // The item's line in items-NAME.jsonl (read back by read_log on a resumed run).
  static json log_line(const RunSpec& spec, const Item& item, const ItemRecord& r,
                       const std::string& output, const std::optional<std::string>& answer,
                       const std::string& error, const json& form) {
    json line = {{"id", r.id},
                 {"run", spec.name},
                 {"question", item.question},
                 {"output", output},
                 {"answer", answer ? json(*answer) : json(nullptr)},
                 {"gold", item.gold},
                 {"correct", r.correct}};
    visit_item_counts([&line](const char* name, const auto& field) { line[name] = field; }, r);
    if (!error.empty()) line["error"] = error;
    if (!form.is_null()) line["chat"] = form;
    return line;
  }

  static void progress(const std::string& name, size_t have, size_t total, size_t n_done,
                       size_t todo, size_t correct, size_t tokens, size_t cloud, double elapsed,
                       bool tty) {
    if (!tty && n_done % 25 != 0 && n_done != todo) return;
    const double eta = n_done ? elapsed / n_done * (todo - n_done) : 0;
    const int width = 24;
    const int filled = static_cast<int>(width * have / std::max<size_t>(total, 1));
    std::fprintf(stderr, "%s[%s] [%s%s] %zu/%zu  acc %.1f%%  cloud %.1f%%  ETA %dm%02ds%s",
                 tty ? "\r" : "", name.c_str(), std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), have, total,
                 100.0 * correct / std::max<size_t>(have, 1),
                 100.0 * cloud / std::max<size_t>(tokens, 1), static_cast<int>(eta) / 60,
                 static_cast<int>(eta) % 60, tty ? "" : "\n");
    std::fflush(stderr);
  }

  // results.json's run summaries, results.md and the plots (tandem/eval_report.h).
  void report(const std::vector<RunSpec>& runs, const Task& task, const RunRecords& by_run,
              json& results) const {
    std::vector<ReportRun> rows;
    for (const RunSpec& spec : runs)
      rows.push_back({spec.name, edge_mode_name(spec.mode), spec.target_rate});
    ReportTask t{task.name, {}, shots_, task.kind == TaskKind::Word, task.kind == TaskKind::Code};
    for (const Item& it : task.items) t.item_ids.push_back(it.id);
    results.update(json::parse(summarize_runs(rows, t, by_run)));
    const std::string text = results.dump();
    write_results_markdown(out_, t, text);
    if (!no_plots_) plot_results(out_, text);
  }

  CloudFlags cloud_;
  EdgeFlags edge_;
  EdgeOptions base_;  // every run's options but its mode and router (edge_ resolved, greedy)
  std::string task_, modes_ = "local,cloud,route,speculative", policy_ = "confidence";
  std::string data_, out_, cloud_model_;
  ChatFormFlags chat_;
  bool allow_exec_ = false;
  int chunks_ = 8, chunk_tokens_ = 512, chunk_offset_ = 0;
  std::vector<std::string> router_files_;
  std::string items_;
  std::vector<double> rates_;
  int shots_ = -1, limit_ = 0;
  double rtt_ms_ = 0;
  bool no_plots_ = false, json_ = false;
  int errors_ = 0;
};

}  // namespace

std::unique_ptr<Command> make_eval_command(CLI::App& app) {
  return std::make_unique<EvalCommand>(app);
}

}  // namespace tandem::cli
