// Reading a cloud's answers without trusting them.
//
// The cloud is a server on the internet: broken, misconfigured or hostile. Everything here turns
// an answer that is not what it should be -- too deep, not JSON, a field missing or of the wrong
// type, a number out of range, a token outside the vocabulary -- into a CloudError that names
// what was wrong, so the edge falls back to local decoding (never a crash, never another
// exception type). Nothing recurses over an answer: the depth check (common/json_guard.h) runs
// before the parser, error texts are cut, and no hostile value is ever dump()ed.
//
// Memory is bounded too: every answer is read through fetch() with a cap sized to what the
// request can make an honest server say (answer_cap), and parsed only after a linear scan has
// bounded its depth and its number of values, so that the tree costs at most ~8x the cap.
//
//   const cloud::AnswerCap cap = cloud::answer_cap(ceiling, {{n, cloud::kNativeTokenBytes}});
//   const net::HttpResponse r = cloud::fetch(http, "POST", path, body, timeout_s, cap);
//   const json j = cloud::parse_answer(r, "cloud step", cap);            // an object, or throws
//   const int pos = cloud::int_field(j, "pos", what, 0, INT_MAX);        // throws CloudError
//   const auto ids = cloud::token_array(j, "tokens", what, n_vocab, 16);
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "net/http_client.h"
#include "tandem/client.h"

namespace tandem::cloud {

using nlohmann::json;

// The most bytes of a cloud's text (an error message, a body that is not JSON) that the device
// repeats in its own messages.
inline constexpr size_t kMaxQuotedBytes = 300;

// ---- how much one answer may be ----
//
// An answer is buffered and parsed into a tree, so a cloud that answers 60 MiB of `[{},{},...]`
// (under the transport's 64 MiB ceiling) would cost the device ~2 GiB. Each request's answer is
// therefore capped by what that request can make an honest server say:
//
//   cap = min(CloudOptions::max_answer_bytes,
//             kAnswerFixedBytes + sum over the request's terms of tokens x bytes per token)
//
// e.g. a native generate of 16 tokens: 64 KiB + 16 x 64 B; an OpenAI completion of 16 tokens:
// 64 KiB + 16 x 1 KiB; router collect's 512-token chunk with top-20 prompt log-probabilities:
// 64 KiB + 512 x 21 x 256 B = 2.7 MiB. The fixed part holds the envelope (ids, model names,
// usage, an error's message); the terms hold what grows with the request.
inline constexpr size_t kAnswerFixedBytes = 64u << 10;
// Native protocol, per token: `123456,` in "tokens" and `-12.345678901234567,` in "logprobs"
// (a step answers at most the tokens it asked for; a session at most 4096 eog ids).
inline constexpr size_t kNativeTokenBytes = 64;
// OpenAI /v1/completions, SGLang /generate, llama.cpp /completion, per generated token: its
// text (escaped: up to 6 bytes a byte), "token_id:N", its log-probability, one top_logprobs
// entry, its text_offset.
inline constexpr size_t kCompletionTokenBytes = 1024;
// llama.cpp's /completion also echoes the prompt as text: per prompt token.
inline constexpr size_t kPromptEchoTokenBytes = 64;
// One entry of a prompt log-probability row (vLLM/tandem `prompt_logprobs`: `"id": {"logprob",
// "rank", "decoded_token"}`; SGLang `input_token_logprobs`: `[logprob, id, text]`).
inline constexpr size_t kPromptLogprobBytes = 256;
// GET /v1/models: a list the server sizes, not the request (hundreds of model entries).
inline constexpr size_t kModelListBytes = 1u << 20;
// Bytes of cap per JSON value allowed: the tree of an answer then takes at most
// kJsonBytesPerValue / kAnswerBytesPerValue = 8 times the cap (common/json_guard.h). Honest
// answers hold one value per 2 bytes (`7,`) only in token arrays, which the terms above pay
// 64 bytes or more per token for.
inline constexpr size_t kAnswerBytesPerValue = 16;

struct AnswerCap {
  size_t bytes = kAnswerFixedBytes;
  size_t max_values() const { return bytes / kAnswerBytesPerValue; }
};

// A term of the cap: `tokens` tokens of `bytes_each` bytes.
struct CapTerm {
  size_t tokens = 0;
  size_t bytes_each = 0;
};

// kAnswerFixedBytes + sum of terms (saturating), at most `ceiling`.
AnswerCap answer_cap(size_t ceiling, std::initializer_list<CapTerm> terms = {});

// The one way the device asks a cloud: METHOD target with a JSON body, the whole exchange
// within timeout_s, the answer's body refused as soon as it passes cap.bytes (never buffered
// further). Throws CloudError: Unavailable for a transport failure or an answer over the cap,
// Fatal for a certificate the device does not trust (retrying does not heal it). Any HTTP
// status comes back as a response.
net::HttpResponse fetch(net::HttpClient& http, std::string_view method, const std::string& target,
                        std::string_view body, double timeout_s, const AnswerCap& cap);

// `text` fit for a message (a terminal, a log, JSON): at most `max_bytes` bytes, cut at a
// character boundary ("..." marks the cut), control characters (C0, DEL, C1) and invalid UTF-8
// replaced by '?', a newline by a space.
std::string excerpt(std::string_view text, size_t max_bytes = kMaxQuotedBytes);

// The body as JSON after the shape check (depth, and the values the cap allows); a discarded
// value when it is not JSON, nests too deep or holds too many values.
json parse_json(std::string_view body, const AnswerCap& cap = {});

// A 2xx answer the edge relies on: a JSON object within the shape check, or CloudError
// (Unavailable) naming the limit or quoting an excerpt of the body.
json parse_answer(const net::HttpResponse& response, const std::string& what, const AnswerCap& cap);

// The human part of an error answer: error.message (or a string "error" / "message") cut to
// kMaxQuotedBytes, an excerpt of a body that is not JSON, or a fixed text. Never throws.
std::string error_message(const net::HttpResponse& response);

// The CloudError for a non-2xx answer: 401/403 Fatal, 400/404/413 Rejected, anything else
// Unavailable with the answer's Retry-After (clamped to net::kMaxRetryAfterS).
CloudError status_error(const net::HttpResponse& response, const std::string& what);

// Malformed-answer errors: CloudError(Unavailable, "WHAT: PROBLEM").
CloudError malformed(const std::string& what, const std::string& problem);

// Field readers. Each throws malformed() naming the field and what was expected.
bool has(const json& object, const char* name);  // present and not null
const json& object_field(const json& object, const char* name, const std::string& what);
int64_t int_field(const json& object, const char* name, const std::string& what, int64_t lo,
                  int64_t hi);
int64_t int_field_or(const json& object, const char* name, const std::string& what, int64_t lo,
                     int64_t hi, int64_t fallback);
std::string string_field(const json& object, const char* name, const std::string& what,
                         size_t max_bytes);
std::string string_field_or(const json& object, const char* name, const std::string& what,
                            size_t max_bytes, const std::string& fallback);
// An array of at most `max_count` token ids, each an integer in [0, n_vocab).
std::vector<TokenId> token_array(const json& value, const std::string& field,
                                 const std::string& what, int n_vocab, size_t max_count);
std::vector<TokenId> token_field(const json& object, const char* name, const std::string& what,
                                 int n_vocab, size_t max_count);
// A finite number (clamped into float's range).
float number_field(const json& object, const char* name, const std::string& what);
// An array of exactly `count` numbers, each finite (clamped into float's range).
std::vector<float> number_array(const json& value, const std::string& field,
                                const std::string& what, size_t count);

// "token_id:N" (vLLM's return_tokens_as_token_ids, which tandem serve honours too) as N, any
// int64; nullopt for any other text. Callers check N against their vocabulary.
std::optional<int64_t> token_id_number(std::string_view text);

// Decimal digits only (no sign, no space, no exponent) naming an id in [0, n_vocab); nullopt
// otherwise. For token ids that come as JSON object keys (prompt_logprobs).
std::optional<TokenId> vocab_id(std::string_view digits, int n_vocab);

// The body of a /v1/completions request that sends the prompt as token ids and asks for the
// tokens back as ids: {"prompt", "max_tokens", "logprobs", "return_tokens_as_token_ids": true};
// callers add their sampling fields.
json completions_by_ids(const std::vector<TokenId>& prompt, int max_tokens, int logprobs);

// Runs `fn` and lets only CloudError out: any other exception (a json type error that slipped
// through, bad_alloc, a bug) becomes CloudError(Unavailable) prefixed by `what`.
template <typename Fn>
auto only_cloud_errors(const std::string& what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const CloudError&) {
    throw;
  } catch (const std::exception& e) {
    throw CloudError(CloudError::Kind::Unavailable, what + ": " + excerpt(e.what()));
  }
}

}  // namespace tandem::cloud
