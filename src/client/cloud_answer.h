// Reading a cloud's answers without trusting them.
//
// The cloud is a server on the internet: broken, misconfigured or hostile. Everything here turns
// an answer that is not what it should be -- too deep, not JSON, a field missing or of the wrong
// type, a number out of range, a token outside the vocabulary -- into a CloudError that names
// what was wrong, so the edge falls back to local decoding (never a crash, never another
// exception type). Nothing recurses over an answer: the depth check (common/json_guard.h) runs
// before the parser, error texts are cut, and no hostile value is ever dump()ed.
//
//   const json j = cloud::parse_answer(response, "cloud step");          // an object, or throws
//   const int pos = cloud::int_field(j, "pos", what, 0, INT_MAX);        // throws CloudError
//   const auto ids = cloud::token_array(j, "tokens", what, n_vocab, 16);
#pragma once

#include <cstdint>
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

// `text` fit for a message (a terminal, a log, JSON): at most `max_bytes` bytes, cut at a
// character boundary ("..." marks the cut), control characters (C0, DEL, C1) and invalid UTF-8
// replaced by '?', a newline by a space.
std::string excerpt(std::string_view text, size_t max_bytes = kMaxQuotedBytes);

// The body as JSON after the depth check; a discarded value when it is not JSON or nests too deep.
json parse_json(std::string_view body);

// A 2xx answer the edge relies on: a JSON object, or CloudError (Unavailable) quoting the body.
json parse_answer(const net::HttpResponse& response, const std::string& what);

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
// An array of exactly `count` numbers, each finite (clamped into float's range).
std::vector<float> number_array(const json& value, const std::string& field,
                                const std::string& what, size_t count);

// "token_id:N" (vLLM's return_tokens_as_token_ids, which tandem serve honours too) as N, any
// int64; nullopt for any other text. Callers check N against their vocabulary.
std::optional<int64_t> token_id_number(std::string_view text);

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
