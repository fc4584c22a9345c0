// The cloud's teacher-forced rows over HTTP (tandem/cloud_rows.h).
//
// Read like every other cloud answer (client/cloud_answer.h): a cap sized to the request, a
// shape check before the parser, every field by type and range, every token id inside the
// edge's vocabulary before it indexes anything, and the cloud's text only as an excerpt.
#include "tandem/cloud_rows.h"

#include <algorithm>
#include <climits>
#include <nlohmann/json.hpp>

#include "client/cloud_answer.h"
#include "net/http_client.h"
#include "tandem/error.h"

namespace tandem {
namespace {

using json = nlohmann::json;

// POSTs a JSON request and returns its answer: a JSON object within `cap`. A status other than
// 200 throws the backends' CloudError for it: its class, and the cloud's own message cut to a
// printable excerpt (never the raw body).
json post_to_cloud(net::HttpClient& http, const std::string& path, const json& req,
                   double timeout_s, const cloud::AnswerCap& cap) {
  const std::string what = "the cloud's " + path;
  const net::HttpResponse res = cloud::fetch(http, "POST", path, req.dump(), timeout_s, cap);
  if (res.status != 200) throw cloud::status_error(res, what);
  return cloud::parse_answer(res, what, cap);
}

// j[key], which must be an array of more than `index` elements: j[key][index].
const json& array_at(const json& j, const char* key, size_t index, const std::string& what) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_array() || it->size() <= index) {
    throw cloud::malformed(what, "expected '" + std::string(key) +
                                     "' to be an array of more than " + std::to_string(index) +
                                     " entries");
  }
  return (*it)[index];
}

// choices[0] of an OpenAI answer, an object.
const json& first_choice(const json& j, const std::string& what) {
  const json& c = array_at(j, "choices", 0, what);
  if (!c.is_object()) throw cloud::malformed(what, "'choices[0]' is not an object");
  return c;
}

// Row i's prompt log-probabilities in an OpenAI answer (tandem serve, vLLM): the true token's,
// and the entries with a rank up to top_n, most likely first. Row i + 1 of prompt_logprobs is
// an object {"ID": {"logprob", "rank"?, ...}} of at most top_n + 1 entries (the top-n and the
// true token); every ID is checked against the vocabulary before it is used.
CloudRow openai_row(const json& pl, int i, TokenId want, int top_n, int n_vocab,
                    const std::string& what) {
  const std::string at = what + ": prompt_logprobs[" + std::to_string(i + 1) + "]";
  if (!pl.is_object() || pl.size() > static_cast<size_t>(top_n) + 1) {
    throw cloud::malformed(at, "expected an object of at most " + std::to_string(top_n + 1) +
                                   " entries (top-n and the true token)");
  }
  CloudRow row;
  const std::string key = std::to_string(want);
  row.true_logprob = cloud::number_field(cloud::object_field(pl, key.c_str(), at), "logprob", at);
  // Entries with a rank are the cloud's top-n (the true token's own entry has one only when
  // it is among them, or always with vLLM, whose rank may then exceed n).
  for (const auto& [id_text, e] : pl.items()) {
    const std::optional<TokenId> id = cloud::vocab_id(id_text, n_vocab);
    if (!id) {
      throw cloud::malformed(at, "key '" + cloud::excerpt(id_text, 40) +
                                     "' is not a token id in [0, " + std::to_string(n_vocab) + ")");
    }
    if (!e.is_object()) throw cloud::malformed(at, "entry '" + id_text + "' is not an object");
    if (cloud::int_field_or(e, "rank", at, 0, INT_MAX, INT_MAX) > top_n) continue;
    row.top.emplace_back(*id, cloud::number_field(e, "logprob", at));
  }
  std::sort(row.top.begin(), row.top.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  if (top_n > 0 && row.top.empty()) {
    throw cloud::malformed(at, "the cloud sent no top log-probabilities (prompt_logprobs " +
                                   std::to_string(top_n) + ")");
  }
  return row;
}

// Row i's log-probability of the true token in an SGLang answer: input_token_logprobs[i + 1]
// is [logprob, id, text?].
CloudRow sglang_row(const json& meta, int i, TokenId want, const std::string& what) {
  const json& e = array_at(meta, "input_token_logprobs", static_cast<size_t>(i) + 1, what);
  const std::string at = what + ": input_token_logprobs[" + std::to_string(i + 1) + "]";
  if (!e.is_array() || e.size() < 2 || !e[1].is_number_integer() || e[1].get<int64_t>() != want) {
    throw cloud::malformed(at, "expected [logprob, " + std::to_string(want) + ", ...]");
  }
  CloudRow row;
  row.true_logprob = cloud::number_field(json{{"logprob", e[0]}}, "logprob", at);
  return row;
}

}  // namespace

void refuse_sglang(const std::string& what, const std::string& endpoint) {
  throw Error(what + " come from --cloud-api tandem|openai (" + endpoint +
              ") or --cloud-model, not sglang");
}

HttpCloudRows::HttpCloudRows(const CloudOptions& options, int n_vocab)
    : http_(std::make_unique<net::HttpClient>(
          net::parse_url(options.url),
          net::HttpOptions{.insecure = options.insecure,
                           .ca_file = options.ca_file,
                           .api_key = options.api_key,
                           .max_body_bytes = options.max_answer_bytes})),
      api_(options.api),
      timeout_s_(options.timeout_s),
      n_vocab_(n_vocab),
      max_answer_bytes_(options.max_answer_bytes) {}

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
  // Per prompt token a row of top_n + 1 entries (the true token's); SGLang's one entry.
  const size_t entries = chunk.size() * (static_cast<size_t>(std::max(top_n, 0)) + 1);
  const cloud::AnswerCap cap =
      cloud::answer_cap(max_answer_bytes_, {{entries, cloud::kPromptLogprobBytes}});
  const json j = post_to_cloud(*http_, path, req, timeout_s_, cap);
  const std::string what = "the cloud's " + path;
  std::vector<CloudRow> out;
  for (int i = first_row; i + 1 < static_cast<int>(chunk.size()); ++i) {
    const TokenId want = chunk[i + 1];
    if (api_ == "sglang") {
      out.push_back(sglang_row(cloud::object_field(j, "meta_info", what), i, want, what));
    } else {
      const json& pl =
          array_at(first_choice(j, what), "prompt_logprobs", static_cast<size_t>(i) + 1, what);
      out.push_back(openai_row(pl, i, want, top_n, n_vocab_, what));
    }
  }
  return out;
}

std::vector<TokenId> HttpCloudRows::continuation(const std::vector<TokenId>& prefix, int n) {
  if (api_ == "sglang") refuse_sglang("the outcome label's cloud continuations", "/v1/completions");
  const std::string path = "/v1/completions";
  const std::string what = "the cloud's " + path;
  json req = cloud::completions_by_ids(prefix, n, 0);
  req["temperature"] = 0;
  req["ignore_eos"] = true;
  const cloud::AnswerCap cap = cloud::answer_cap(
      max_answer_bytes_, {{static_cast<size_t>(std::max(n, 0)), cloud::kCompletionTokenBytes}});
  const json j = post_to_cloud(*http_, path, req, timeout_s_, cap);
  const json& lp = cloud::object_field(first_choice(j, what), "logprobs", what);
  const auto tokens = lp.find("tokens");
  if (tokens == lp.end() || !tokens->is_array()) {
    throw cloud::malformed(what, "the answer has no choices[0].logprobs.tokens array");
  }
  if (tokens->size() > static_cast<size_t>(std::max(n, 0))) {
    throw cloud::malformed(what, "the cloud sent " + std::to_string(tokens->size()) +
                                     " tokens for max_tokens " + std::to_string(n));
  }
  // "token_id:N" per token; a server that ignores return_tokens_as_token_ids sends the text.
  std::vector<TokenId> out;
  for (size_t k = 0; k < tokens->size(); ++k) {
    const json& t = (*tokens)[k];
    const std::string_view s =
        t.is_string() ? std::string_view(t.get_ref<const std::string&>()) : std::string_view();
    const std::optional<int64_t> id = cloud::token_id_number(s);
    if (!id || *id < 0 || *id >= n_vocab_) {
      throw cloud::malformed(what, "choices[0].logprobs.tokens[" + std::to_string(k) + "] is '" +
                                       cloud::excerpt(s, 40) +
                                       "', expected 'token_id:N' with N in [0, " +
                                       std::to_string(n_vocab_) +
                                       ") (the outcome label needs a server that honours "
                                       "return_tokens_as_token_ids: tandem serve, vLLM)");
    }
    out.push_back(static_cast<TokenId>(*id));
  }
  return out;
}

}  // namespace tandem
