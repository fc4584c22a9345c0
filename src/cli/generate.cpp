// tandem generate: plain generation with one model.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/model_flag.h"
#include "tandem/engine.h"
#include "tandem/error.h"

namespace tandem::cli {
namespace {

class GenerateCommand : public Command {
 public:
  explicit GenerateCommand(CLI::App& app)
      : Command(app.add_subcommand("generate", "Generate text from a prompt with one model")) {
    model_flag_.add_to(*sub_, ModelRole::Edge, "GGUF model file");
    prompt_opt_ = sub_->add_option("-p,--prompt", prompt_, "Prompt text");
    sub_->add_option("-f,--file", file_, "Read the prompt from a file")->excludes(prompt_opt_);
    sub_->add_option("-n,--n-predict", n_predict_, "Tokens to generate (-1: until end or context)")
        ->capture_default_str();
    sub_->add_option("-c,--ctx-size", n_ctx_, "Context size (0: model default, at most 4096)")
        ->check(CLI::Range(0, 1 << 20));
    sub_->add_option("-t,--threads", threads_, "Threads (default: all cores)");
    add_kv_cache_flags(sub_, type_k_, type_v_);
    sub_->add_option("--temp", sp_.temp, "Temperature (0: greedy)")->capture_default_str();
    sub_->add_option("--top-k", sp_.top_k, "Top-k (0: off)")->capture_default_str();
    sub_->add_option("--top-p", sp_.top_p, "Top-p (1: off)")->capture_default_str();
    sub_->add_option("--min-p", sp_.min_p, "Min-p (0: off)")->capture_default_str();
    sub_->add_option("--repeat-penalty", sp_.repeat_penalty, "Repetition penalty (1: off)")
        ->capture_default_str();
    sub_->add_option("--repeat-last-n", sp_.repeat_last_n, "Tokens the penalty looks back over")
        ->capture_default_str();
    sub_->add_option("-s,--seed", seed_, "RNG seed (-1: random)");
    sub_->add_flag("--chat,--conversation", chat_,
                   "Wrap the prompt in the model's chat template as a user turn");
    sub_->add_option("--system", system_, "System message (with --chat)");
    sub_->add_flag("--no-bos", no_bos_, "Do not add BOS");
    sub_->add_flag("--parse-special", parse_special_,
                   "Let control-token texts in the prompt become single tokens");
    sub_->add_flag("--json", json_, "Print {\"text\",\"ids\",\"tok_s\"} on stdout");
    sub_->add_flag("--verbose-prompt", verbose_prompt_, "Print the prompt tokens to stderr");
  }

  int run() override {
    model_ = model_flag_.resolve(ModelRole::Edge);
    std::string prompt = read_prompt(prompt_, file_, prompt_opt_->count() > 0);
    if (seed_ >= 0) sp_.seed = static_cast<uint64_t>(seed_);
    auto model = Model::load(model_);
    bool parse_special = parse_special_;
    if (chat_) {
      std::vector<ChatMessage> msgs;
      if (!system_.empty()) msgs.push_back({"system", system_});
      msgs.push_back({"user", prompt});
      prompt = model->chat_prompt(msgs, true);
      parse_special = true;
    }
    const auto ids = model->tokenize(prompt, !no_bos_, parse_special);
    if (ids.empty()) throw Error("the prompt is empty after tokenization");
    if (verbose_prompt_) {
      for (TokenId id : ids) std::fprintf(stderr, "%d ", id);
      std::fprintf(stderr, "\n");
    }
    ContextParams cp;
    cp.n_ctx = n_ctx_;
    cp.n_threads = threads_;
    cp.type_k = type_k_;
    cp.type_v = type_v_;
    Context ctx(*model, cp);
    Sampler sampler(sp_);
    const int n_predict = n_predict_ < 0 ? ctx.n_ctx() : n_predict_;
    auto print = [&](std::string_view text) {
      if (!json_) {
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fflush(stdout);
      }
      return true;
    };
    if (!json_) print(prompt_echo(prompt));
    const GenerateResult r = generate(ctx, ids, n_predict, sampler, print);
    const double tok_s = r.gen_ms > 0 ? 1000.0 * r.ids.size() / r.gen_ms : 0.0;
    if (json_) {
      nlohmann::json j;
      j["text"] = r.text;
      j["ids"] = r.ids;
      j["tok_s"] = tok_s;
      j["n_prompt"] = r.n_prompt;
      j["prompt_tok_s"] = r.prompt_ms > 0 ? 1000.0 * r.n_prompt / r.prompt_ms : 0.0;
      j["stop"] = r.stop == StopReason::EndOfGeneration ? "eog"
                  : r.stop == StopReason::ContextFull   ? "context_full"
                                                        : "length";
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::printf("\n");
    }
    std::fprintf(stderr,
                 "\nprompt: %d tokens in %.1f ms (%.1f tok/s); generated %zu tokens in %.1f ms "
                 "(%.1f tok/s)%s\n",
                 r.n_prompt, r.prompt_ms, r.prompt_ms > 0 ? 1000.0 * r.n_prompt / r.prompt_ms : 0.0,
                 r.ids.size(), r.gen_ms, tok_s,
                 r.stop == StopReason::EndOfGeneration ? ", stopped at end of generation"
                 : r.stop == StopReason::ContextFull   ? ", stopped: context full (raise -c)"
                                                       : "");
    return 0;
  }

 private:
  // The prompt is echoed before the continuation (as llama.cpp does), but not in chat mode.
  std::string prompt_echo(const std::string& prompt) const { return chat_ ? "" : prompt; }

  ModelFlag model_flag_;
  std::string model_, prompt_, file_, system_;
  CLI::Option* prompt_opt_ = nullptr;
  int n_predict_ = 128, n_ctx_ = 0, threads_ = 0;
  KvCacheType type_k_ = KvCacheType::F32, type_v_ = KvCacheType::F32;
  long long seed_ = -1;
  SamplingParams sp_;
  bool chat_ = false, no_bos_ = false, parse_special_ = false, json_ = false,
       verbose_prompt_ = false;
};

}  // namespace

std::unique_ptr<Command> make_generate_command(CLI::App& app) {
  return std::make_unique<GenerateCommand>(app);
}

}  // namespace tandem::cli
