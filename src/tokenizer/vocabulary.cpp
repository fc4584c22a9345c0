// Vocabulary (include/tandem/vocab.h): the tokenizer of a GGUF file without its model.
#include "tandem/vocab.h"

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace tandem {

Vocabulary::Vocabulary(std::unique_ptr<Tokenizer> tokenizer) : tokenizer_(std::move(tokenizer)) {}

Vocabulary::~Vocabulary() = default;

std::unique_ptr<Vocabulary> Vocabulary::load(const std::string& path) {
  auto file = GgufFile::open(path);
  return std::unique_ptr<Vocabulary>(new Vocabulary(Tokenizer::from_gguf(*file)));
}

std::vector<TokenId> Vocabulary::tokenize(std::string_view text, bool add_special,
                                          bool parse_special) const {
  return tokenizer_->encode(text, add_special, parse_special);
}

std::string Vocabulary::token_piece(TokenId id, bool special) const {
  return tokenizer_->token_to_piece(id, special);
}

}  // namespace tandem
