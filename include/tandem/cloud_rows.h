// The cloud's teacher-forced rows over HTTP, for router collect and eval --task wikitext: its
// prompt log-probabilities (tandem serve's or vLLM's /v1/completions `prompt_logprobs`, SGLang's
// /generate `input_token_logprobs`) and its greedy continuations by token id. Next to the
// stateless backend (src/client), whose token-id reading it shares.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tandem/client.h"
#include "tandem/router_tools.h"

namespace tandem {
namespace net {
class HttpClient;
}

class HttpCloudRows {
 public:
  // The cloud at options.url, spoken to as options.api (tandem | openai | sglang), with its
  // api_key, insecure, ca_file and max_answer_bytes (the ceiling of every answer's cap); each
  // request may take options.timeout_s. Every token id the cloud names must lie in [0, n_vocab)
  // (the edge's vocabulary, whose logits it indexes). Throws std::invalid_argument for a bad URL.
  // Every failure of the cloud (transport, status, an answer over its cap, too deep, of the
  // wrong shape, out of range) is a CloudError whose message quotes the cloud only as an
  // excerpt (control characters replaced, length cut).
  HttpCloudRows(const CloudOptions& options, int n_vocab);
  ~HttpCloudRows();

  // Rows [first_row, n − 1) of a chunk in one request. top_n > 0 asks for the cloud's top-n per
  // row (tandem/openai API only).
  std::vector<CloudRow> rows(const std::vector<TokenId>& chunk, int first_row, int top_n);

  // The cloud's greedy continuation of `prefix` by n tokens, for the outcome label:
  // /v1/completions with the prompt as token ids, temperature 0, ignore_eos, and the tokens
  // returned as ids (vLLM's return_tokens_as_token_ids, which tandem serve honours too). Throws
  // naming what the server did otherwise; SGLang's /generate is refused.
  std::vector<TokenId> continuation(const std::vector<TokenId>& prefix, int n);

 private:
  std::unique_ptr<net::HttpClient> http_;
  std::string api_;
  double timeout_s_;
  int n_vocab_;
  size_t max_answer_bytes_;
};

// What only /v1/completions (or a local cloud model) gives, refused for an SGLang cloud:
// "WHAT come from --cloud-api tandem|openai (ENDPOINT) or --cloud-model, not sglang".
[[noreturn]] void refuse_sglang(const std::string& what, const std::string& endpoint);

}  // namespace tandem
