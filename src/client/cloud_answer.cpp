#include "client/cloud_answer.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <limits>

#include "common/json_guard.h"

namespace tandem::cloud {

namespace {

// The length of the valid UTF-8 sequence at text[i], 0 when there is none.
size_t utf8_length(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;  // no overlong forms
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;  // nothing over U+10FFFF
  } else {
    return 0;
  }
  if (i + n > text.size() || byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return n;
}

// "a string", "an array", ...: the kind of a value, never the value itself.
std::string a_kind(const json& v) {
  const std::string name = v.type_name();
  if (v.is_null()) return "null";
  return (name[0] == 'a' || name[0] == 'o' ? "an " : "a ") + name;
}

}  // namespace

std::string excerpt(std::string_view text, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes) + 3);
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    size_t n = 1;
    std::string_view piece;
    if (c < 0x80) {
      piece = c >= 0x20 && c != 0x7F ? text.substr(i, 1) : std::string_view(c == '\n' ? " " : "?");
    } else if ((n = utf8_length(text, i)) > 0) {
      // U+0080..U+009F are control characters too (U+009B starts a terminal escape).
      const bool c1 = c == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0;
      piece = c1 ? std::string_view("?") : text.substr(i, n);
    } else {
      n = 1;
      piece = "?";
    }
    if (out.size() + piece.size() > max_bytes) return out + "...";
    out += piece;
    i += n;
  }
  return out;
}

AnswerCap answer_cap(size_t ceiling, std::initializer_list<CapTerm> terms) {
  constexpr size_t kMax = std::numeric_limits<size_t>::max();
  size_t bytes = kAnswerFixedBytes;
  for (const CapTerm& t : terms) {
    const size_t term =
        t.bytes_each != 0 && t.tokens > kMax / t.bytes_each ? kMax : t.tokens * t.bytes_each;
    bytes = term > kMax - bytes ? kMax : bytes + term;
  }
  return AnswerCap{std::min(bytes, ceiling)};
}

net::HttpResponse fetch(net::HttpClient& http, std::string_view method, const std::string& target,
                        std::string_view body, double timeout_s, const AnswerCap& cap) {
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  try {
    return http.request(method, target, body, timeout, std::max<size_t>(cap.bytes, 1));
  } catch (const net::NetError& e) {
    // An untrusted certificate does not heal by retrying: stop and say what to do.
    if (e.kind() == net::NetError::Kind::Tls &&
        std::string_view(e.what()).find("verify") != std::string_view::npos) {
      throw CloudError(CloudError::Kind::Fatal,
                       std::string(e.what()) +
                           " (pass --ca-file with the server's CA, or --insecure for a "
                           "self-signed test certificate)");
    }
    throw CloudError(CloudError::Kind::Unavailable, e.what());
  }
}

json parse_json(std::string_view body, const AnswerCap& cap) {
  if (!json_shape_error(body, kMaxJsonDepth, cap.max_values()).empty()) {
    return json(json::value_t::discarded);
  }
  return json::parse(body, nullptr, false);
}

json parse_answer(const net::HttpResponse& response, const std::string& what,
                  const AnswerCap& cap) {
  const std::string shape = json_shape_error(response.body, kMaxJsonDepth, cap.max_values());
  if (!shape.empty()) {
    throw malformed(what, "the answer (HTTP " + std::to_string(response.status) + ", " +
                              std::to_string(response.body.size()) + " bytes): " + shape);
  }
  json j = json::parse(response.body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    throw malformed(what, "the answer (HTTP " + std::to_string(response.status) +
                              ") is not a JSON object: '" + excerpt(response.body) + "'");
  }
  return j;
}

std::string error_message(const net::HttpResponse& response) {
  const json j = parse_json(response.body);
  if (j.is_discarded()) {
    return response.body.empty() ? "(no body)" : "'" + excerpt(response.body) + "'";
  }
  if (!j.is_object()) return "(an error answer that is " + a_kind(j) + " in JSON)";
  const auto string_at = [](const json& o, const char* name) -> const json* {
    const auto it = o.find(name);
    return it != o.end() && it->is_string() ? &*it : nullptr;
  };
  const json* message = nullptr;
  if (const auto e = j.find("error"); e != j.end()) {
    message = e->is_object() ? string_at(*e, "message") : e->is_string() ? &*e : nullptr;
  }
  if (!message) message = string_at(j, "message");
  if (!message) return "(an error answer without a message string)";
  return excerpt(message->get_ref<const std::string&>());
}

CloudError status_error(const net::HttpResponse& response, const std::string& what) {
  const std::string msg =
      what + ": HTTP " + std::to_string(response.status) + ": " + error_message(response);
  switch (response.status) {
    case 401:
    case 403:
      return CloudError(CloudError::Kind::Fatal, msg + " (check --api-key)");
    case 400:
    case 404:
    case 413:
      return CloudError(CloudError::Kind::Rejected, msg);
    default:
      return CloudError(CloudError::Kind::Unavailable, msg,
                        net::parse_retry_after(response.header("retry-after")));
  }
}

CloudError malformed(const std::string& what, const std::string& problem) {
  return CloudError(CloudError::Kind::Unavailable, what + ": " + problem);
}

bool has(const json& object, const char* name) {
  const auto it = object.find(name);
  return it != object.end() && !it->is_null();
}

const json& object_field(const json& object, const char* name, const std::string& what) {
  const auto it = object.find(name);
  if (it == object.end()) throw malformed(what, "the answer has no '" + std::string(name) + "'");
  if (!it->is_object()) {
    throw malformed(what, "'" + std::string(name) + "' is " + a_kind(*it) + ", expected an object");
  }
  return *it;
}

int64_t int_field(const json& object, const char* name, const std::string& what, int64_t lo,
                  int64_t hi) {
  const auto it = object.find(name);
  if (it == object.end()) throw malformed(what, "the answer has no '" + std::string(name) + "'");
  // Integers only: a float such as 1e300 would be an undefined conversion.
  int64_t v = 0;
  bool ok = false;
  if (it->is_number_unsigned()) {
    const uint64_t u = it->get<uint64_t>();
    ok = u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    v = ok ? static_cast<int64_t>(u) : 0;
  } else if (it->is_number_integer()) {
    v = it->get<int64_t>();
    ok = true;
  }
  if (!ok || v < lo || v > hi) {
    throw malformed(
        what, "'" + std::string(name) + "' is " +
                  (it->is_number_integer() ? std::string("out of range") : a_kind(*it)) +
                  ", expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                  "]");
  }
  return v;
}

int64_t int_field_or(const json& object, const char* name, const std::string& what, int64_t lo,
                     int64_t hi, int64_t fallback) {
  return has(object, name) ? int_field(object, name, what, lo, hi) : fallback;
}

std::string string_field(const json& object, const char* name, const std::string& what,
                         size_t max_bytes) {
  const auto it = object.find(name);
  if (it == object.end()) throw malformed(what, "the answer has no '" + std::string(name) + "'");
  if (!it->is_string()) {
    throw malformed(what, "'" + std::string(name) + "' is " + a_kind(*it) + ", expected a string");
  }
  const std::string& s = it->get_ref<const std::string&>();
  if (s.size() > max_bytes) {
    throw malformed(what, "'" + std::string(name) + "' has " + std::to_string(s.size()) +
                              " bytes, more than " + std::to_string(max_bytes));
  }
  return s;
}

std::string string_field_or(const json& object, const char* name, const std::string& what,
                            size_t max_bytes, const std::string& fallback) {
  return has(object, name) ? string_field(object, name, what, max_bytes) : fallback;
}

std::vector<TokenId> token_array(const json& value, const std::string& field,
                                 const std::string& what, int n_vocab, size_t max_count) {
  if (!value.is_array()) {
    throw malformed(what, "'" + field + "' is " + a_kind(value) + ", expected an array");
  }
  if (value.size() > max_count) {
    throw malformed(what, "'" + field + "' has " + std::to_string(value.size()) +
                              " tokens, more than the " + std::to_string(max_count) + " asked for");
  }
  std::vector<TokenId> ids;
  ids.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    const json& t = value[i];
    const bool integer = t.is_number_integer();
    // Compare as int64: a uint64 over INT64_MAX reads as negative and is refused with the rest.
    const int64_t id = integer ? t.get<int64_t>() : -1;
    if (!integer || id < 0 || id >= n_vocab) {
      throw malformed(
          what, "'" + field + "'[" + std::to_string(i) + "] is " +
                    (integer ? "token id " + std::to_string(id) + ", outside the vocabulary [0, " +
                                   std::to_string(n_vocab) + ")"
                             : a_kind(t) + ", expected a token id"));
    }
    ids.push_back(static_cast<TokenId>(id));
  }
  return ids;
}

std::vector<TokenId> token_field(const json& object, const char* name, const std::string& what,
                                 int n_vocab, size_t max_count) {
  const auto it = object.find(name);
  if (it == object.end()) throw malformed(what, "the answer has no '" + std::string(name) + "'");
  return token_array(*it, name, what, n_vocab, max_count);
}

float number_field(const json& object, const char* name, const std::string& what) {
  const auto it = object.find(name);
  if (it == object.end()) throw malformed(what, "the answer has no '" + std::string(name) + "'");
  const double d = it->is_number() ? it->get<double>() : NAN;
  if (!std::isfinite(d)) {
    throw malformed(what,
                    "'" + std::string(name) + "' is " + a_kind(*it) + ", expected a finite number");
  }
  constexpr double kMax = std::numeric_limits<float>::max();
  return static_cast<float>(std::clamp(d, -kMax, kMax));  // in range: no UB
}

std::vector<float> number_array(const json& value, const std::string& field,
                                const std::string& what, size_t count) {
  if (!value.is_array() || value.size() != count) {
    throw malformed(what, "'" + field + "' is " +
                              (value.is_array() ? "an array of " + std::to_string(value.size())
                                                : a_kind(value)) +
                              ", expected an array of " + std::to_string(count) + " numbers");
  }
  std::vector<float> out;
  out.reserve(count);
  constexpr double kMax = std::numeric_limits<float>::max();
  for (size_t i = 0; i < count; ++i) {
    const json& v = value[i];
    const double d = v.is_number() ? v.get<double>() : NAN;
    if (!std::isfinite(d)) {
      throw malformed(what, "'" + field + "'[" + std::to_string(i) + "] is " + a_kind(v) +
                                ", expected a finite number");
    }
    out.push_back(static_cast<float>(std::clamp(d, -kMax, kMax)));  // in range: no UB
  }
  return out;
}

std::optional<int64_t> token_id_number(std::string_view text) {
  constexpr std::string_view kPrefix = "token_id:";
  if (!text.starts_with(kPrefix)) return std::nullopt;
  int64_t id = 0;
  const char* end = text.data() + text.size();
  const auto [stop, ec] = std::from_chars(text.data() + kPrefix.size(), end, id);
  if (ec != std::errc() || stop != end) return std::nullopt;
  return id;
}

std::optional<TokenId> vocab_id(std::string_view digits, int n_vocab) {
  if (digits.empty() || digits.size() > 10 ||
      digits.find_first_not_of("0123456789") != std::string_view::npos) {
    return std::nullopt;
  }
  int64_t id = 0;
  std::from_chars(digits.data(), digits.data() + digits.size(), id);  // <= 10 digits: fits
  if (id >= n_vocab) return std::nullopt;
  return static_cast<TokenId>(id);
}

json completions_by_ids(const std::vector<TokenId>& prompt, int max_tokens, int logprobs) {
  return {{"prompt", prompt},
          {"max_tokens", max_tokens},
          {"logprobs", logprobs},
          {"return_tokens_as_token_ids", true}};
}

}  // namespace tandem::cloud
