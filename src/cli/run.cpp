// tandem run: the device side of collaborative decoding. The small model (-m) decodes; per the
// mode, a router sends chosen tokens to the cloud (--cloud URL, a `tandem serve`), the cloud
// verifies the small model's drafts, or the cloud decodes everything. The answer streams to
// stdout (cloud tokens coloured on a terminal), a one-line summary goes to stderr, and --json
// prints {"text","ids","source","score","stats"} (DESIGN.md §6).
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "common/error.h"
#include "router/router_file.h"
#include "tandem/client.h"
#include "tandem/engine.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tandem::cli {
namespace {

constexpr const char* kCloudColour = "\x1b[36m";  // cyan
constexpr const char* kResetColour = "\x1b[0m";

std::string human_bytes(uint64_t n) {
  char buf[32];
  if (n < 10 * 1024) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  } else if (n < 10 * 1024 * 1024) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", n / 1024.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f MiB", n / (1024.0 * 1024.0));
  }
  return buf;
}

nlohmann::json stats_json(const EdgeStats& s) {
  nlohmann::json j;
  j["tokens"] = s.tokens;
  j["cloud_tokens"] = s.cloud_tokens;
  j["cloud_share"] = s.cloud_share;
  j["route_events"] = s.route_events;
  j["bytes_up"] = s.bytes_up;
  j["bytes_down"] = s.bytes_down;
  j["cloud_ms"] = s.cloud_ms;
  j["local_ms"] = s.local_ms;
  j["ttft_ms"] = s.ttft_ms;
  j["tok_s"] = s.tok_s;
  j["fallbacks"] = s.fallbacks;
  j["replays"] = s.replays;
  j["accepted_drafts"] = s.accepted_drafts;
  j["drafted"] = s.drafted;
  j["prefilled_on_route"] = s.prefilled_on_route;
  j["sync_steps"] = s.sync_steps;
  j["sync_failures"] = s.sync_failures;
  j["cloud_failures"] = s.cloud_failures;
  j["cloud_lost"] = s.cloud_lost;
  j["total_ms"] = s.total_ms;
  if (!s.last_cloud_error.empty()) j["last_cloud_error"] = s.last_cloud_error;
  return j;
}

void add_stats(EdgeStats& total, const EdgeStats& s) {
  total.tokens += s.tokens;
  total.cloud_tokens += s.cloud_tokens;
  total.route_events += s.route_events;
  total.bytes_up += s.bytes_up;
  total.bytes_down += s.bytes_down;
  total.cloud_ms += s.cloud_ms;
  total.local_ms += s.local_ms;
  if (total.ttft_ms == 0) total.ttft_ms = s.ttft_ms;
  total.total_ms += s.total_ms;
  total.fallbacks += s.fallbacks;
  total.replays += s.replays;
  total.accepted_drafts += s.accepted_drafts;
  total.drafted += s.drafted;
  total.prefilled_on_route += s.prefilled_on_route;
  total.sync_steps += s.sync_steps;
  total.sync_failures += s.sync_failures;
  total.cloud_failures += s.cloud_failures;
  total.cloud_lost = total.cloud_lost || s.cloud_lost;
  if (!s.last_cloud_error.empty()) total.last_cloud_error = s.last_cloud_error;
  total.cloud_share = total.tokens ? static_cast<double>(total.cloud_tokens) / total.tokens : 0;
  total.tok_s = total.total_ms > 0 ? 1000.0 * total.tokens / total.total_ms : 0;
}

class RunCommand : public Command {
 public:
  explicit RunCommand(CLI::App& app)
      : Command(app.add_subcommand(
            "run", "Decode on the device with a small model, consulting a cloud model per token")) {
    sub_->add_option("-m,--model", model_, "Small (edge) GGUF model")
        ->default_str(default_model_path());
    sub_->add_option("--cloud", cloud_.url, "Cloud URL: http(s)://HOST:PORT[/PREFIX]");
    sub_->add_option("--cloud-api", cloud_.api,
                     "Cloud API: tandem (native, stateful sessions) | openai (/v1/completions) | "
                     "sglang (/generate) | llamacpp (/completion): stateless, token-id prompts")
        ->capture_default_str();
    sub_->add_option("--api-key", cloud_.api_key, "Cloud API key (Authorization: Bearer)");
    sub_->add_flag("--insecure", cloud_.insecure, "https: do not verify the certificate");
    sub_->add_option("--ca-file", cloud_.ca_file, "https: CA bundle (PEM) to verify against");
    sub_->add_option("--mode", mode_, "local | route | speculative | cloud")->capture_default_str();
    sub_->add_option("--policy", policy_,
                     "Router: confidence | entropy | margin | random:RATE[:SEED] | always | never")
        ->capture_default_str();
    sub_->add_option("--router", router_file_,
                     "Trained router (GGUF, `tandem router train`) instead of --policy; "
                     "--target-rate starts from its calibration table, --threshold is its score");
    auto* thr = sub_->add_option("--threshold", threshold_,
                                 "Route when the policy's score exceeds this (default per policy: "
                                 "confidence 0.5, entropy 2, margin 0.8)");
    sub_->add_option("--target-rate", target_rate_,
                     "Keep the cloud share of tokens near R (0..1) instead of a threshold")
        ->check(CLI::Range(0.0, 1.0))
        ->excludes(thr);
    sub_->add_option("--route-span", opts_.route_span, "Cloud tokens per route event")
        ->check(CLI::Range(1, 1024))
        ->capture_default_str();
    sub_->add_option("--draft", opts_.draft, "Speculative: drafts per verify")
        ->check(CLI::Range(1, 64))
        ->capture_default_str();
    sub_->add_flag("--no-sync-ahead", no_sync_ahead_,
                   "Do not push locally decided tokens to the cloud in the background");
    sub_->add_option("--sync-every", opts_.sync_every,
                     "Sync ahead once N local tokens have gathered (1: after every token)")
        ->check(CLI::Range(1, 1 << 20))
        ->capture_default_str();
    sub_->add_option("--cloud-timeout", opts_.cloud_timeout_s,
                     "Seconds a cloud request may take (connect included) before the device "
                     "decodes the token itself")
        ->check(CLI::Range(0.001, 3600.0))
        ->capture_default_str();
    prompt_opt_ = sub_->add_option("-p,--prompt", prompt_, "Prompt text");
    sub_->add_option("-f,--file", file_, "Read the prompt from a file")->excludes(prompt_opt_);
    sub_->add_option("-n,--n-predict", n_predict_,
                     "Tokens to generate per answer (-1: until end or context)")
        ->capture_default_str();
    sub_->add_option("-c,--ctx-size", opts_.context.n_ctx,
                     "Context size of the small model (0: model default, at most 4096)")
        ->check(CLI::Range(0, 1 << 20));
    sub_->add_option("-t,--threads", opts_.context.n_threads, "Threads (default: all cores)");
    sub_->add_option("--temp", opts_.sampling.temp, "Temperature (0: greedy)")
        ->capture_default_str();
    sub_->add_option("--top-k", opts_.sampling.top_k, "Top-k (0: off)")->capture_default_str();
    sub_->add_option("--top-p", opts_.sampling.top_p, "Top-p (1: off)")->capture_default_str();
    sub_->add_option("--min-p", opts_.sampling.min_p, "Min-p (0: off)")->capture_default_str();
    sub_->add_option("-s,--seed", seed_, "RNG seed (-1: random)");
    sub_->add_flag("--color", color_, "Colour cloud tokens even when stdout is not a terminal");
    sub_->add_flag("--chat", chat_, "Wrap the prompt in the model's chat template");
    sub_->add_option("--system", system_, "System message (with --chat or -i)");
    sub_->add_flag("-i,--interactive", interactive_,
                   "Multi-turn chat on stdin; the cloud session carries over between turns");
    sub_->add_flag("--verbose-prompt", verbose_prompt_,
                   "Print each turn's context token ids to stderr");
    sub_->add_flag("--json", json_,
                   "Print {\"text\",\"ids\",\"source\",\"score\",\"stats\"} on stdout");
  }

  int run() override {
    if (model_.empty()) model_ = default_model_path();
    if (seed_ >= 0) opts_.sampling.seed = static_cast<uint64_t>(seed_);
    opts_.sync_ahead = !no_sync_ahead_;
    opts_.cloud_chunk = 16;
    try {
      opts_.mode = parse_edge_mode(mode_);
      opts_.router = parse_router_policy(policy_);
    } catch (const std::invalid_argument& e) {
      throw Error(e.what());
    }
    if (threshold_) opts_.router.threshold = *threshold_;
    if (target_rate_) opts_.router.target_rate = *target_rate_;
    if (opts_.mode != EdgeMode::Local && cloud_.url.empty()) {
      throw Error("--mode " + mode_ + " needs --cloud URL (a `tandem serve` address)");
    }
    if (opts_.mode == EdgeMode::Speculative && opts_.sampling.temp > 0) {
      std::fprintf(stderr,
                   "tandem: speculative mode is greedy (the cloud verifies greedily); --temp is "
                   "used only for tokens decoded locally when the cloud is unavailable\n");
    }
    cloud_.timeout_s = opts_.cloud_timeout_s;
    colour_ = color_ || isatty(STDOUT_FILENO) == 1;

    auto model = Model::load(model_);
    const Tokenizer& tok = model->tokenizer();
    if (!router_file_.empty()) use_trained_router(*model);
    std::unique_ptr<CloudBackend> backend;
    if (opts_.mode != EdgeMode::Local) {
      try {
        backend = make_cloud_backend(cloud_, *model);
      } catch (const std::invalid_argument& e) {
        throw Error(e.what());
      }
    }
    EdgeDecoder edge(*model, opts_, std::move(backend));
    const std::string cloud_line = edge.start();
    if (opts_.mode != EdgeMode::Local) std::fprintf(stderr, "tandem: %s\n", cloud_line.c_str());

    if (interactive_) return run_interactive(*model, edge);

    std::string prompt = read_prompt(prompt_, file_, prompt_opt_->count() > 0);
    bool parse_special = false;
    if (chat_) {
      std::vector<ChatMessage> msgs;
      if (!system_.empty()) msgs.push_back({"system", system_});
      msgs.push_back({"user", prompt});
      prompt = apply_chat_template(model->file(), msgs, true);
      parse_special = true;
    }
    const auto ids = tok.encode(prompt, true, parse_special);
    if (ids.empty()) throw Error("the prompt is empty after tokenization");
    if (!json_ && !chat_) {
      std::fwrite(prompt.data(), 1, prompt.size(), stdout);
      std::fflush(stdout);
    }
    const EdgeResult r = edge.generate(ids, n_predict(), printer());
    if (json_) {
      nlohmann::json j;
      j["text"] = r.text;
      j["ids"] = r.ids;
      std::vector<std::string> sources;
      for (TokenSource s : r.sources)
        sources.push_back(s == TokenSource::Cloud ? "cloud" : "local");
      j["source"] = sources;
      j["score"] = r.scores;
      j["stats"] = stats_json(r.stats);
      j["mode"] = mode_;
      j["stop"] = r.stop == StopReason::EndOfGeneration ? "eog"
                  : r.stop == StopReason::ContextFull   ? "context_full"
                                                        : "length";
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::printf("\n");
    }
    summary(r.stats);
    return 0;
  }

 private:
  // --router R.gguf: the mlp policy with the small model's hidden state in every signal. Without
  // --threshold or --target-rate the threshold is the calibration's for a 7% cloud share.
  void use_trained_router(const Model& model) {
    router::RouterExpectations expect;
    expect.vocab_hash = vocab_hash_hex(model.tokenizer().fingerprint());
    expect.n_vocab = static_cast<uint32_t>(model.info().n_vocab);
    expect.n_embd = model.info().n_embd;
    expect.edge_path = model_;
    const auto loaded = router::load_router(router_file_, expect);
    RouterConfig& r = opts_.router;
    r.policy = RouterPolicy::Mlp;
    r.mlp = loaded.model;
    r.threshold = threshold_ ? *threshold_ : loaded.model->threshold_for_share(0.07);
    if (r.target_rate) r.prior_scores = loaded.model->prior_scores(r.window);
    opts_.signal_hidden = true;
    opts_.top_k_signal = std::max(opts_.top_k_signal, loaded.model->spec.top_k);
  }

  int n_predict() const { return n_predict_ < 0 ? std::numeric_limits<int>::max() : n_predict_; }

  void show_prompt(std::span<const TokenId> ids) const {
    if (!verbose_prompt_) return;
    for (TokenId id : ids) std::fprintf(stderr, "%d ", id);
    std::fprintf(stderr, "\n");
  }

  EdgeTokenCallback printer() {
    return [this](const EdgeToken& t, std::string_view piece) {
      if (json_ || piece.empty()) return true;
      const bool cloud = colour_ && t.source == TokenSource::Cloud;
      if (cloud) std::fputs(kCloudColour, stdout);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      if (cloud) std::fputs(kResetColour, stdout);
      std::fflush(stdout);
      return true;
    };
  }

  void summary(const EdgeStats& s) const {
    std::fprintf(stderr,
                 "\n%s: %d tokens, cloud %d (%.1f%%) in %d events, fallbacks %d, replays %d%s | "
                 "up %s, down %s | ttft %.0f ms, %.1f tok/s (cloud %.0f ms, local %.0f ms)%s\n",
                 mode_.c_str(), s.tokens, s.cloud_tokens, 100.0 * s.cloud_share, s.route_events,
                 s.fallbacks, s.replays,
                 s.drafted ? (", drafts " + std::to_string(s.accepted_drafts) + "/" +
                              std::to_string(s.drafted) + " accepted")
                                 .c_str()
                           : "",
                 human_bytes(s.bytes_up).c_str(), human_bytes(s.bytes_down).c_str(), s.ttft_ms,
                 s.tok_s, s.cloud_ms, s.local_ms,
                 s.cloud_lost ? " | cloud lost: decoded locally" : "");
  }

  // Multi-turn chat: each turn appends the closing of the previous answer and the new user
  // turn, as the chat template renders them, to the token history (so the cloud session only
  // receives the new tokens).
  int run_interactive(const Model& model, EdgeDecoder& edge) {
    const Tokenizer& tok = model.tokenizer();
    std::vector<ChatMessage> msgs;
    if (!system_.empty()) msgs.push_back({"system", system_});
    std::vector<TokenId> history;
    EdgeStats total;
    const std::string marker = "\x01";
    std::string first = prompt_opt_->count() > 0 ? prompt_ : "";
    for (int turn = 0;; ++turn) {
      std::string user;
      if (turn == 0 && !first.empty()) {
        user = first;
      } else {
        std::fprintf(stderr, "\n> ");
        std::fflush(stderr);
        if (!std::getline(std::cin, user)) break;
        if (user.empty()) continue;
      }
      std::vector<TokenId> ids;
      if (history.empty()) {
        std::vector<ChatMessage> m = msgs;
        m.push_back({"user", user});
        ids = tok.encode(apply_chat_template(model.file(), m, true), true, true);
      } else {
        std::vector<ChatMessage> m = msgs;
        m.push_back({"assistant", marker});
        m.push_back({"user", user});
        const std::string text = apply_chat_template(model.file(), m, true);
        const std::string delta = text.substr(text.rfind(marker) + marker.size());
        ids = history;
        const auto more = tok.encode(delta, false, true);
        ids.insert(ids.end(), more.begin(), more.end());
      }
      show_prompt(ids);
      const EdgeResult r = edge.generate(ids, n_predict(), printer());
      if (json_) {
        nlohmann::json j;
        j["text"] = r.text;
        j["ids"] = r.ids;
        std::vector<std::string> sources;
        for (TokenSource s : r.sources) {
          sources.push_back(s == TokenSource::Cloud ? "cloud" : "local");
        }
        j["source"] = sources;
        j["score"] = r.scores;
        j["stats"] = stats_json(r.stats);
        std::printf("%s\n",
                    j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
      } else {
        std::printf("\n");
      }
      std::fflush(stdout);
      summary(r.stats);
      add_stats(total, r.stats);
      msgs.push_back({"user", user});
      msgs.push_back({"assistant", r.text});
      history = edge.history();
    }
    if (total.tokens > 0) {
      std::fprintf(stderr, "\ntotal:");
      summary(total);
    }
    return 0;
  }

  std::string model_, prompt_, file_, system_, mode_ = "route", policy_ = "confidence",
                                               router_file_;
  CLI::Option* prompt_opt_ = nullptr;
  CloudOptions cloud_;
  EdgeOptions opts_;
  std::optional<double> threshold_, target_rate_;
  int n_predict_ = 128;
  long long seed_ = -1;
  bool no_sync_ahead_ = false, color_ = false, chat_ = false, interactive_ = false, json_ = false,
       colour_ = false, verbose_prompt_ = false;
};

}  // namespace

std::unique_ptr<Command> make_run_command(CLI::App& app) {
  return std::make_unique<RunCommand>(app);
}

}  // namespace tandem::cli
