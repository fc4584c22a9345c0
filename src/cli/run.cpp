// tandem run: the device side of collaborative decoding. The small model (-m) decodes; per the
// mode, a router sends chosen tokens to the cloud (--cloud URL, a `tandem serve`), the cloud
// verifies the small model's drafts, or the cloud decodes everything. The answer streams to
// stdout (cloud tokens coloured on a terminal), a one-line summary goes to stderr, and --json
// prints {"text","ids","source","score","stats"} (docs/client.md, the --json contract).
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/edge_flags.h"
#include "tandem/client.h"
#include "tandem/engine.h"
#include "tandem/error.h"

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

class RunCommand : public Command {
 public:
  explicit RunCommand(CLI::App& app)
      : Command(app.add_subcommand(
            "run", "Decode on the device with a small model, consulting a cloud model per token")) {
    flags_.add_to(*sub_);
    prompt_opt_ = sub_->add_option("-p,--prompt", prompt_, "Prompt text");
    sub_->add_option("-f,--file", file_, "Read the prompt from a file")->excludes(prompt_opt_);
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
    flags_.resolve();
    colour_ = color_ || isatty(STDOUT_FILENO) == 1;

    auto model = Model::load(flags_.edge.model);
    flags_.load_router(*model);
    EdgeDecoder edge(*model, flags_.edge.options, flags_.make_backend(*model));
    if (interactive_) {
      print_cloud_line(edge.start());
      return run_interactive(*model, edge);
    }
    // The session opens while the prompt is tokenized and prefilled; the answer waits for it
    // only at its first consultation.
    edge.start_in_background();

    std::string prompt = read_prompt(prompt_, file_, prompt_opt_->count() > 0);
    bool parse_special = false;
    if (chat_) {
      std::vector<ChatMessage> msgs;
      if (!system_.empty()) msgs.push_back({"system", system_});
      msgs.push_back({"user", prompt});
      prompt = model->chat_prompt(msgs, true);
      parse_special = true;
    }
    const auto ids = model->tokenize(prompt, true, parse_special);
    if (ids.empty()) throw Error("the prompt is empty after tokenization");
    if (!json_ && !chat_) {
      std::fwrite(prompt.data(), 1, prompt.size(), stdout);
      std::fflush(stdout);
    }
    const EdgeResult r = edge.generate(ids, n_predict(), printer());
    const std::optional<std::string> cloud_line = edge.cloud_line();
    if (json_) {
      nlohmann::json j;
      j["text"] = r.text;
      j["ids"] = r.ids;
      std::vector<std::string> sources;
      for (TokenSource s : r.sources)
        sources.push_back(s == TokenSource::Cloud ? "cloud" : "local");
      j["source"] = sources;
      j["score"] = r.scores;
      j["stats"] = nlohmann::json::parse(edge_stats_json(r.stats));
      j["mode"] = flags_.edge.mode;
      j["stop"] = stop_reason_name(r.stop);
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::printf("\n");
    }
    std::fflush(stdout);  // the answer's line ends before the cloud's line on stderr
    print_cloud_line(
        cloud_line.value_or("cloud: the session was still opening when the answer ended"));
    summary(r.stats);
    return 0;
  }

 private:
  int n_predict() const {
    return flags_.edge.n_predict < 0 ? std::numeric_limits<int>::max() : flags_.edge.n_predict;
  }

  void print_cloud_line(const std::string& line) const {
    if (flags_.edge.options.mode != EdgeMode::Local)
      std::fprintf(stderr, "tandem: %s\n", line.c_str());
  }

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
                 flags_.edge.mode.c_str(), s.tokens, s.cloud_tokens, 100.0 * s.cloud_share,
                 s.route_events, s.fallbacks, s.replays,
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
    std::vector<ChatMessage> msgs;
    if (!system_.empty()) msgs.push_back({"system", system_});
    std::vector<TokenId> history;
    EdgeStats total;
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
        msgs.push_back({"user", user});
        ids = model.tokenize(model.chat_prompt(msgs, true), true, true);
      } else {
        ids = history;
        const auto more = model.tokenize(model.chat_continuation(user), false, true);
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
        j["stats"] = nlohmann::json::parse(edge_stats_json(r.stats));
        std::printf("%s\n",
                    j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
      } else {
        std::printf("\n");
      }
      std::fflush(stdout);
      summary(r.stats);
      add_edge_stats(total, r.stats);
      history = edge.history();
    }
    if (total.tokens > 0) {
      std::fprintf(stderr, "\ntotal:");
      summary(total);
    }
    return 0;
  }

  DeviceFlags flags_;
  std::string prompt_, file_, system_;
  CLI::Option* prompt_opt_ = nullptr;
  bool color_ = false, chat_ = false, interactive_ = false, json_ = false, colour_ = false,
       verbose_prompt_ = false;
};

}  // namespace

std::unique_ptr<Command> make_run_command(CLI::App& app) {
  return std::make_unique<RunCommand>(app);
}

}  // namespace tandem::cli
