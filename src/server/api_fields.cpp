// Request bodies and their fields, read strictly: a body is a JSON object of bounded nesting,
// every field is type- and range-checked, and an error names the field (docs/server.md,
// "What one request may cost").
#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "common/json_guard.h"
#include "server/api_internal.h"

namespace tandem::server {

ApiError bad(const std::string& field, const std::string& what) {
  return ApiError(400, "bad_request", "'" + field + "' " + what, {{"field", field}});
}

// Every body is checked for nesting before the parser sees it: nothing after this point (reading
// fields, copying, dumping an error) can recurse deeper than kMaxJsonDepth.
json parse_body(const std::string& body) {
  if (body.empty()) return json::object();
  if (const std::string e = json_depth_error(body, kMaxJsonDepth, "the request body"); !e.empty())
    throw ApiError(400, "bad_request", e, {{"field", "body"}, {"limit", kMaxJsonDepth}});
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ApiError(400, "bad_request", "the body is not valid JSON");
  if (!j.is_object()) throw ApiError(400, "bad_request", "the body must be a JSON object");
  return j;
}

const json* field(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

int64_t get_int(const json& j, const char* name, int64_t def, int64_t lo, int64_t hi) {
  const json* v = field(j, name);
  if (!v) return def;
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (d != std::floor(d)) throw bad(name, "must be an integer");
    // 2^63 rounds to INT64_MAX as a double but does not fit an int64_t: compare against the
    // first double past the range, so the cast below is always defined.
    constexpr double kInt64End = 9223372036854775808.0;  // 2^63
    if (d < static_cast<double>(lo) || d > static_cast<double>(hi) || d >= kInt64End) {
      throw bad(name, "is " + v->dump() + ", outside [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + "]");
    }
    return static_cast<int64_t>(d);
  }
  if (!v->is_number_integer())
    throw bad(name, "must be an integer, found " + std::string(v->type_name()));
  const int64_t x =
      v->is_number_unsigned() && v->get<uint64_t>() > INT64_MAX ? INT64_MAX : v->get<int64_t>();
  if (x < lo || x > hi) {
    throw bad(name, "is " + std::to_string(x) + ", outside [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "]");
  }
  return x;
}

double get_num(const json& j, const char* name, double def, double lo, double hi) {
  const json* v = field(j, name);
  if (!v) return def;
  if (!v->is_number()) throw bad(name, "must be a number, found " + std::string(v->type_name()));
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) {
    throw bad(name, "is " + v->dump() + ", outside [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "]");
  }
  return x;
}

bool get_bool(const json& j, const char* name, bool def) {
  const json* v = field(j, name);
  if (!v) return def;
  if (!v->is_boolean())
    throw bad(name, "must be true or false, found " + std::string(v->type_name()));
  return v->get<bool>();
}

std::vector<TokenId> get_ids(const json& v, const std::string& name, int n_vocab, size_t max_len) {
  if (!v.is_array()) throw bad(name, "must be an array of token ids");
  if (v.size() > max_len) {
    throw ApiError(413, "too_large",
                   "'" + name + "' has " + std::to_string(v.size()) + " tokens; the limit is " +
                       std::to_string(max_len),
                   {{"field", name}});
  }
  std::vector<TokenId> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const json& t = v[i];
    if (!t.is_number_integer()) {
      throw bad(name + "[" + std::to_string(i) + "]", "must be an integer token id");
    }
    const int64_t id =
        t.is_number_unsigned() && t.get<uint64_t>() > INT64_MAX ? INT64_MAX : t.get<int64_t>();
    if (id < 0 || id >= n_vocab) {
      throw bad(name + "[" + std::to_string(i) + "]", "is " + std::to_string(id) +
                                                          ", outside the vocabulary [0, " +
                                                          std::to_string(n_vocab) + ")");
    }
    ids.push_back(static_cast<TokenId>(id));
  }
  return ids;
}

SamplingParams get_sampling(const json& j, double default_temp, uint64_t* seed_out) {
  SamplingParams sp;
  sp.temp = static_cast<float>(get_num(j, "temperature", default_temp, 0, 100));
  sp.top_k = static_cast<int>(get_int(j, "top_k", 0, -1, 1 << 20));
  sp.top_p = static_cast<float>(get_num(j, "top_p", 1.0, 0, 1));
  sp.min_p = static_cast<float>(get_num(j, "min_p", 0.0, 0, 1));
  sp.repeat_penalty = static_cast<float>(get_num(j, "repeat_penalty", 1.0, 0.01, 100));
  const int64_t seed = get_int(j, "seed", -1, -1, INT64_MAX);
  sp.seed = seed < 0 ? kRandomSeed : static_cast<uint64_t>(seed);
  if (seed_out) *seed_out = sp.seed;
  return sp;
}

Clock::time_point deadline_after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// Text the server is asked to tokenize is refused before any work when it is over the cap.
void check_text_size(size_t bytes, const std::string& name, size_t max_bytes) {
  if (bytes <= max_bytes) return;
  throw ApiError(413, "too_large",
                 "'" + name + "' has " + std::to_string(bytes) + " bytes of text; the limit is " +
                     std::to_string(max_bytes) + " (--max-text-bytes)",
                 {{"field", name}, {"limit", max_bytes}});
}

const std::string& checked_text(const json& v, const std::string& name, size_t max_bytes) {
  const std::string& text = v.get_ref<const std::string&>();
  check_text_size(text.size(), name, max_bytes);
  return text;
}

std::vector<std::string> get_stop(const json& j, const char* name) {
  std::vector<std::string> out;
  const json* v = field(j, name);
  if (!v) return out;
  if (v->is_string()) {
    if (!v->get<std::string>().empty()) out.push_back(v->get<std::string>());
    return out;
  }
  if (!v->is_array() || v->size() > 16)
    throw bad(name, "must be a string or an array of at most 16 strings");
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string())
      throw bad(std::string(name) + "[" + std::to_string(i) + "]", "must be a string");
    if (!(*v)[i].get<std::string>().empty()) out.push_back((*v)[i].get<std::string>());
  }
  return out;
}

// A prompt given as a string, an array of ids, or (llama.cpp) a mix of strings and ids. A prompt
// wrapped in one-element arrays ([["text"]], [[1,2,3]]) is unwrapped in a loop, never by
// recursion (the body's nesting is bounded before this runs, but the loop holds regardless).
std::vector<TokenId> get_prompt(const json& outer, const std::string& name, const Tokenizer& tok,
                                int n_vocab, int n_ctx, size_t max_text) {
  const json* v = &outer;
  while (v->is_array() && v->size() == 1 && ((*v)[0].is_string() || (*v)[0].is_array())) {
    v = &(*v)[0];
  }
  if (v->is_string()) return tok.encode(checked_text(*v, name, max_text), true, false);
  if (!v->is_array()) throw bad(name, "must be a string or an array of token ids");
  const bool all_ids =
      std::all_of(v->begin(), v->end(), [](const json& x) { return x.is_number_integer(); });
  if (all_ids) return get_ids(*v, name, n_vocab, static_cast<size_t>(n_ctx));
  std::vector<TokenId> out;
  for (size_t i = 0; i < v->size(); ++i) {
    const json& part = (*v)[i];
    const std::string at = name + "[" + std::to_string(i) + "]";
    if (part.is_string()) {
      auto ids = tok.encode(checked_text(part, at, max_text), i == 0, false);
      out.insert(out.end(), ids.begin(), ids.end());
    } else if (part.is_number_integer()) {
      out.push_back(get_ids(json::array({part}), at, n_vocab, 1)[0]);
    } else {
      throw bad(at, "must be a string or a token id");
    }
    if (out.size() > static_cast<size_t>(n_ctx)) break;  // too long: refused by the caller
  }
  return out;
}

}  // namespace tandem::server
