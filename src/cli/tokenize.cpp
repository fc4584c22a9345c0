// tandem tokenize: text -> token ids and pieces. Works on vocab-only GGUF files.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/model_flag.h"
#include "tandem/vocab.h"

namespace tandem::cli {
namespace {

class TokenizeCommand : public Command {
 public:
  explicit TokenizeCommand(CLI::App& app)
      : Command(app.add_subcommand("tokenize", "Tokenize text with a model's vocabulary")) {
    model_flag_.add_to(*sub_, ModelRole::Edge, "GGUF file (a vocab-only file is enough)");
    prompt_opt_ = sub_->add_option("-p,--prompt", prompt_, "Text to tokenize, exactly as given");
    sub_->add_option("-f,--file", file_, "Read the text from a file")->excludes(prompt_opt_);
    sub_->add_flag("--no-bos", no_bos_, "Do not add BOS/EOS even if the vocabulary says to");
    sub_->add_flag("--parse-special", parse_special_,
                   "Let control-token texts in the input become single tokens");
    sub_->add_flag("--json", json_, "Print {\"ids\":[...],\"pieces\":[...]} on stdout");
    sub_->footer("Without -p or -f the text is read from stdin.");
  }

  int run() override {
    model_ = model_flag_.resolve(ModelRole::Edge);
    const std::string text = read_prompt(prompt_, file_, prompt_opt_->count() > 0);
    const auto vocab = Vocabulary::load(model_);
    const auto ids = vocab->tokenize(text, !no_bos_, parse_special_);
    if (json_) {
      nlohmann::json j;
      j["ids"] = ids;
      auto pieces = nlohmann::json::array();
      for (TokenId id : ids) pieces.push_back(vocab->token_piece(id, true));
      j["pieces"] = pieces;
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      for (TokenId id : ids) {
        const nlohmann::json piece = vocab->token_piece(id, true);
        std::printf("%6d -> %s\n", id,
                    piece.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
      }
      std::fprintf(stderr, "%zu tokens\n", ids.size());
    }
    return 0;
  }

 private:
  ModelFlag model_flag_;
  std::string model_, prompt_, file_;
  CLI::Option* prompt_opt_ = nullptr;
  bool no_bos_ = false, parse_special_ = false, json_ = false;
};

}  // namespace

std::unique_ptr<Command> make_tokenize_command(CLI::App& app) {
  return std::make_unique<TokenizeCommand>(app);
}

}  // namespace tandem::cli
