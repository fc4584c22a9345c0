// The public text API of a Model and TextStream (tandem/engine.h) over the internal tokenizer
// and chat templates.
#include "common/error.h"
#include "gguf/gguf.h"
#include "runtime/model_internals.h"
#include "tandem/engine.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tandem {

int Model::vocab_size() const {
  return parts_->tokenizer->n_vocab();
}

std::vector<TokenId> Model::tokenize(std::string_view text, bool add_special,
                                     bool parse_special) const {
  return parts_->tokenizer->encode(text, add_special, parse_special);
}

std::string Model::detokenize(std::span<const TokenId> ids, bool remove_special,
                              bool unparse_special) const {
  return parts_->tokenizer->decode(ids, remove_special, unparse_special);
}

std::string Model::token_piece(TokenId id, bool special) const {
  return parts_->tokenizer->token_to_piece(id, special);
}

bool Model::is_end_of_generation(TokenId id) const {
  return parts_->tokenizer->is_eog(id);
}

TokenId Model::bos() const {
  return parts_->tokenizer->bos();
}

TokenId Model::eos() const {
  return parts_->tokenizer->eos();
}

bool Model::adds_bos() const {
  return parts_->tokenizer->add_bos();
}

std::string Model::chat_prompt(const std::vector<ChatMessage>& messages,
                               bool add_generation_prompt) const {
  return apply_chat_template(*parts_->file, messages, add_generation_prompt);
}

std::string Model::chat_continuation(const std::string& user) const {
  // Render a conversation whose assistant turn is a marker, and keep what follows the marker.
  // The turns before it are placeholders: no system message, which some templates fold into
  // the next user turn.
  const std::string marker = "\x01";
  const std::string text = apply_chat_template(
      *parts_->file, {{"user", "x"}, {"assistant", marker}, {"user", user}}, true);
  const size_t at = text.rfind(marker);
  if (at == std::string::npos) throw Error("the chat template dropped the assistant's turn");
  return text.substr(at + marker.size());
}

struct TextStream::Decoder : StreamDecoder {
  using StreamDecoder::StreamDecoder;
};

TextStream::TextStream(const Model& model, bool special)
    : decoder_(std::make_unique<Decoder>(ModelInternals::tokenizer(model), special)) {}

TextStream::~TextStream() = default;

std::string TextStream::push(TokenId id) {
  return decoder_->push(id);
}

std::string TextStream::flush() {
  return decoder_->flush();
}

}  // namespace tandem
