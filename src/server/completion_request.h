// A stateless completion request as the job runs it (CompletionRequest), read from any of the
// four dialects' bodies (docs/server.md): the fields every dialect shares, then the dialect's
// own, then the prompt fitted to the context. Throws ApiError (400 naming the field, 413 for a
// prompt over the context or --max-text-bytes).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "server/api_internal.h"

namespace tandem::server {

struct CompletionRequest {
  Dialect dialect = Dialect::OpenAiText;
  std::vector<TokenId> prompt;
  int max_tokens = 16;
  SamplingParams sampling;
  std::vector<std::string> stop;
  int top_n = 0;  // logprobs per generated token (0: none)
  bool want_logprobs = false;
  int prompt_logprobs_from = -1;  // -1: none; else positions >= this get logprobs
  int prompt_top_n = 0;
  bool prompt_logprobs_field = false;  // vLLM's prompt_logprobs was asked for by name
  bool echo = false;
  bool stream = false;
  bool return_tokens = false;
  bool tokens_as_ids = false;  // vLLM's return_tokens_as_token_ids: logprob tokens as "token_id:N"
  bool ignore_eos = false;     // vLLM's and llama.cpp's: generate on through end-of-generation
  std::string model_name;
  std::optional<std::string> prompt_text;  // the prompt as the client wrote it, for echo
  Clock::time_point deadline = Clock::time_point::max();  // generation stops here ("length")
};

// What reading a request needs of the server.
struct ReadContext {
  const ApiOptions& options;
  const Model& model;
  const Tokenizer& tok;
  int n_vocab;
  int n_ctx;
};

CompletionRequest read_completion(const json& j, Dialect d, const ReadContext& c);

}  // namespace tandem::server
