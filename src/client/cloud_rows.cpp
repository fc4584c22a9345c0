// The cloud's teacher-forced rows over HTTP (tandem/cloud_rows.h).
#include "tandem/cloud_rows.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <nlohmann/json.hpp>

#include "client/cloud_answer.h"
#include "net/http_client.h"
#include "tandem/error.h"

namespace tandem {
namespace {

using json = nlohmann::json;

// POSTs a JSON request; the parsed answer (discarded on a parse error) and its body, for
// messages. A status other than 200 throws the backends' CloudError for it: its class, and the
// cloud's own message cut to a printable excerpt (never the raw body).
std::pair<json, std::string> post_to_cloud(net::HttpClient& http, const std::string& path,
                                           const json& req, double timeout_s) {
  auto res = http.request("POST", path, req.dump(),
                          std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  if (res.status != 200) throw cloud::status_error(res, "the cloud's " + path);
  json j = json::parse(res.body, nullptr, false);
  return {std::move(j), std::move(res.body)};
}

// Row i's prompt log-probabilities in an OpenAI answer (tandem serve, vLLM): the true token's,
// and the entries with a rank up to top_n, most likely first.
CloudRow openai_row(const json& j, int i, TokenId want, int top_n) {
  CloudRow row;
  const json& pl = j.at("choices").at(0).at("prompt_logprobs").at(i + 1);
  row.true_logprob = static_cast<float>(pl.at(std::to_string(want)).at("logprob").get<double>());
  // Entries with a rank are the cloud's top-n (the true token's own entry has one only when
  // it is among them, or always with vLLM, whose rank may then exceed n).
  for (const auto& [id, e] : pl.items()) {
    if (!e.contains("rank") || e.at("rank").get<int>() > top_n) continue;
    row.top.emplace_back(static_cast<TokenId>(std::stol(id)),
                         static_cast<float>(e.at("logprob").get<double>()));
  }
  std::sort(row.top.begin(), row.top.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  if (top_n > 0 && row.top.empty())
    throw Error("the cloud sent no top log-probabilities for prompt position " +
                std::to_string(i + 1) + " (prompt_logprobs " + std::to_string(top_n) + ")");
  return row;
}

// Row i's log-probability of the true token in an SGLang answer.
CloudRow sglang_row(const json& j, int i, TokenId want) {
  const json& in = j.at("meta_info").at("input_token_logprobs");
  if (in.at(i + 1).at(1).get<int>() != want) throw Error("SGLang answered for another token");
  CloudRow row;
  row.true_logprob = static_cast<float>(in.at(i + 1).at(0).get<double>());
  return row;
}

// choices[0].logprobs.tokens of an answer, or nullptr where it has none.
const json* logprob_tokens(const json& j) {
  if (j.is_object() && j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
    const json& c = j["choices"][0];
    if (c.is_object() && c.contains("logprobs") && c["logprobs"].is_object() &&
        c["logprobs"].contains("tokens") && c["logprobs"]["tokens"].is_array())
      return &c["logprobs"]["tokens"];
  }
  return nullptr;
}

}  // namespace

void refuse_sglang(const std::string& what, const std::string& endpoint) {
  throw Error(what + " come from --cloud-api tandem|openai (" + endpoint +
              ") or --cloud-model, not sglang");
}

HttpCloudRows::HttpCloudRows(const CloudOptions& options)
    : http_(std::make_unique<net::HttpClient>(
          net::parse_url(options.url),
          net::HttpOptions{.insecure = options.insecure,
                           .ca_file = options.ca_file,
                           .api_key = options.api_key,
                           .max_body_bytes = options.max_answer_bytes})),
      api_(options.api),
      timeout_s_(options.timeout_s) {}

HttpCloudRows::~HttpCloudRows() = default;

std::vector<CloudRow> HttpCloudRows::rows(const std::vector<TokenId>& chunk, int first_row,
                                          int top_n) {
  json req;
  std::string path;
  if (api_ == "sglang") {
    if (top_n > 0)
      refuse_sglang("the cloud's top tokens per prompt position",
                    "/v1/completions prompt_logprobs");
    path = "/generate";
    req = {{"input_ids", chunk},
           {"sampling_params", {{"max_new_tokens", 0}, {"temperature", 0}}},
           {"return_logprob", true},
           {"logprob_start_len", 0}};
  } else {
    path = "/v1/completions";
    req = {{"prompt", chunk}, {"max_tokens", 0}, {"temperature", 0}, {"prompt_logprobs", top_n}};
  }
  const auto [j, body] = post_to_cloud(*http_, path, req, timeout_s_);
  std::vector<CloudRow> out;
  for (int i = first_row; i + 1 < static_cast<int>(chunk.size()); ++i) {
    const TokenId want = chunk[i + 1];
    out.push_back(api_ == "sglang" ? sglang_row(j, i, want) : openai_row(j, i, want, top_n));
  }
  return out;
}

std::vector<TokenId> HttpCloudRows::continuation(const std::vector<TokenId>& prefix, int n) {
  if (api_ == "sglang") refuse_sglang("the outcome label's cloud continuations", "/v1/completions");
  const std::string path = "/v1/completions";
  json req = cloud::completions_by_ids(prefix, n, 0);
  req["temperature"] = 0;
  req["ignore_eos"] = true;
  const auto [j, body] = post_to_cloud(*http_, path, req, timeout_s_);
  const json* tokens = logprob_tokens(j);
  if (!tokens) {
    throw Error("the cloud's " + path +
                " answer has no choices[0].logprobs.tokens: " + body.substr(0, 300));
  }
  if (static_cast<int>(tokens->size()) > n) {
    throw Error("the cloud sent " + std::to_string(tokens->size()) + " tokens for max_tokens " +
                std::to_string(n));
  }
  // "token_id:N" per token; a server that ignores return_tokens_as_token_ids sends the text.
  std::vector<TokenId> out;
  for (const json& t : *tokens) {
    const std::string s = t.is_string() ? t.get<std::string>() : t.dump();
    const std::optional<int64_t> id = cloud::token_id_number(s);
    if (!id || *id < 0 || *id > INT32_MAX) {
      throw Error("the cloud returned the token '" + s.substr(0, 40) +
                  "' as text, not as 'token_id:N': the outcome label needs a server that "
                  "honours return_tokens_as_token_ids (tandem serve, vLLM)");
    }
    out.push_back(static_cast<TokenId>(*id));
  }
  return out;
}

}  // namespace tandem
