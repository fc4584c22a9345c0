// A model's vocabulary on its own, for `tandem tokenize`: it reads only the tokenizer.ggml.* keys
// of a GGUF file, so a vocab-only file works, where Model::load (tandem/engine.h) needs the
// weights too. Tokenizes and gives pieces exactly as Model's text API does (llama.cpp's
// llama-vocab). Also the vocabulary fingerprint's printed form, for files that store the
// fingerprint as a number (router traces).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

using TokenId = int32_t;

class Tokenizer;

class Vocabulary {
 public:
  // Opens the GGUF file and reads its tokenizer; the file is closed again before this returns.
  // Throws tandem::Error naming the file or the missing or malformed key.
  static std::unique_ptr<Vocabulary> load(const std::string& path);
  ~Vocabulary();

  // As Model::tokenize and Model::token_piece.
  std::vector<TokenId> tokenize(std::string_view text, bool add_special, bool parse_special) const;
  std::string token_piece(TokenId id, bool special = true) const;

 private:
  explicit Vocabulary(std::unique_ptr<Tokenizer> tokenizer);
  std::unique_ptr<Tokenizer> tokenizer_;
};

// A vocabulary fingerprint as 16 lowercase hex digits (what `vocab_hash` fields hold).
std::string fingerprint_hex(uint64_t fingerprint);

}  // namespace tandem
