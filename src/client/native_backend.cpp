// The tandem native protocol (docs/protocol.md) as a CloudBackend.
//
// The backend keeps `mirror_`: the tokens it believes the session's history holds. A step sends
// expected_pos = mirror_.size() and append = history[mirror_.size():]. After a step whose answer
// never came (timeout, cut connection, garbage), mirror_ becomes the history it tried to append:
// the server applied the step entirely or not at all, so a later 409 with pos <= mirror_.size()
// means "resend from pos", and one with pos > mirror_.size() means the server holds tokens the
// edge never saw (a generate that ran) -- then only a replay into a new session is safe.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "net/http_client.h"
#include "tandem/client.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr const char* kSessions = "/tandem/v1/sessions";

std::string short_body(const std::string& body) {
  std::string s = body.substr(0, 300);
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

double retry_after_seconds(const net::HttpResponse& r) {
  const std::string v = r.header("retry-after");
  try {
    return v.empty() ? 0.0 : std::max(0.0, std::stod(v));
  } catch (...) {
    return 0.0;
  }
}

// A JSON answer the edge relies on; anything else is a cloud error (garbage is not a crash).
json parse_answer(const net::HttpResponse& r, const std::string& what) {
  json j = json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    throw CloudError(CloudError::Kind::Unavailable,
                     what + ": the answer (HTTP " + std::to_string(r.status) +
                         ") is not a JSON object: '" + short_body(r.body) + "'");
  }
  return j;
}

// An error answer's body: JSON when the server wrote it, anything when a proxy did.
json parse_error_body(const net::HttpResponse& r) {
  json j = json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return json{{"error", {{"message", short_body(r.body)}}}};
  return j;
}

std::string error_message(const json& j) {
  if (j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
      j["error"]["message"].is_string()) {
    return j["error"]["message"].get<std::string>();
  }
  return j.dump().substr(0, 300);
}

template <typename T>
T field(const json& j, const char* name, const std::string& what) {
  if (!j.contains(name)) {
    throw CloudError(CloudError::Kind::Unavailable,
                     what + ": the answer has no '" + std::string(name) + "'");
  }
  try {
    return j.at(name).get<T>();
  } catch (const json::exception&) {
    throw CloudError(CloudError::Kind::Unavailable,
                     what + ": field '" + std::string(name) + "' has the wrong type");
  }
}

// "general.name (file.gguf)": both, as either may be what the user recognises.
std::string edge_model_name(const Model& m) {
  const std::string file = m.info().path.substr(m.info().path.find_last_of('/') + 1);
  if (m.info().name.empty()) return file;
  return m.info().name + " (" + file + ")";
}

class NativeBackend : public CloudBackend {
 public:
  NativeBackend(const CloudOptions& options, const Model& edge)
      : options_(options),
        http_(net::parse_url(options.url), net::HttpOptions{.insecure = options.insecure,
                                                            .ca_file = options.ca_file,
                                                            .api_key = options.api_key}),
        edge_name_(edge_model_name(edge)),
        edge_n_vocab_(edge.tokenizer().n_vocab()),
        edge_hash_(edge.tokenizer().fingerprint_hex()) {}

  std::string name() const override {
    return "tandem " + http_.url().origin() + http_.url().prefix;
  }

  CloudModelInfo connect() override {
    open_session();
    return info_;
  }

  CloudStepResult step(std::span<const TokenId> history, const CloudOp& op) override {
    if (history.empty()) throw Error("cloud step: the history is empty");
    if (session_.empty()) {
      open_session();
      if (opened_before_ && !fresh_conversation_) count_replay(history.size());
      fresh_conversation_ = false;
    } else if (!extends(history, mirror_)) {
      // The edge's history left what the cloud holds (another prompt, a chat turn
      // re-tokenized): cut the session back to the shared prefix where the server can
      // ("rewind"), else replay into a new session.
      if (can_rewind_) {
        const size_t common = static_cast<size_t>(
            std::mismatch(mirror_.begin(), mirror_.end(), history.begin(), history.end()).first -
            mirror_.begin());
        mirror_.resize(common);
        rewind_pending_ = true;
        ++counters_.rewinds;
      } else {
        close();
        open_session();
        count_replay(history.size());
      }
    }
    for (int attempt = 0; attempt < 4; ++attempt) {
      const size_t from = mirror_.size();
      json body;
      body["expected_pos"] = from;
      if (rewind_pending_) body["rewind_to"] = from;
      body["append"] = std::vector<TokenId>(history.begin() + from, history.end());
      if (op.kind == CloudOpKind::Generate) {
        json g;
        g["n"] = op.n_generate;
        g["temperature"] = std::max(0.0f, op.sampling.temp);
        g["top_k"] = std::max(0, op.sampling.top_k);
        g["top_p"] = op.sampling.top_p;
        g["min_p"] = std::max(0.0f, op.sampling.min_p);
        if (op.send_seed) g["seed"] = op.sampling.seed;
        body["generate"] = g;
      } else if (op.kind == CloudOpKind::Verify) {
        body["verify"] = {{"draft", op.draft}};
      }
      const std::string what = "cloud step at position " + std::to_string(from);
      net::HttpResponse r;
      try {
        r = send("POST", kSessions + ("/" + session_ + "/step"), body.dump());
      } catch (const CloudError&) {
        // Unknown outcome: the server applied all of the step or none of it.
        mirror_.assign(history.begin(), history.end());
        throw;
      }
      if (r.status == 200) {
        rewind_pending_ = false;
        CloudStepResult out;
        try {
          out = parse_step(r, what, op);
        } catch (const CloudError&) {
          mirror_.assign(history.begin(), history.end());
          throw;
        }
        mirror_.assign(history.begin(), history.end());
        mirror_.insert(mirror_.end(), out.tokens.begin(), out.tokens.end());
        if (out.pos != static_cast<int>(mirror_.size())) {
          const std::string msg = what + ": the server says pos " + std::to_string(out.pos) +
                                  " after the step, the edge counts " +
                                  std::to_string(mirror_.size());
          drop_session();  // whatever it holds, it is not what we think: replay next time
          throw CloudError(CloudError::Kind::Unavailable, msg);
        }
        ++counters_.steps;
        return out;
      }
      const json j = parse_error_body(r);
      if (r.status == 409) {
        const json& e = j.contains("error") && j["error"].is_object() ? j["error"] : j;
        if (e.value("code", "") == "session_busy") {
          // tandem serve answers this (not in protocol v1) while an earlier step of the session,
          // whose answer the edge gave up on, still runs: its outcome is unknown, try later.
          mirror_.assign(history.begin(), history.end());
          throw CloudError(CloudError::Kind::Unavailable,
                           what + ": the session is still running an earlier step", 0.05);
        }
        const long pos = e.contains("pos") && e["pos"].is_number_integer()   ? e["pos"].get<long>()
                         : j.contains("pos") && j["pos"].is_number_integer() ? j["pos"].get<long>()
                                                                             : -1;
        ++counters_.resends;
        if (pos >= 0 && pos <= static_cast<long>(mirror_.size()) &&
            pos <= static_cast<long>(history.size())) {
          mirror_.resize(pos);
        } else {
          close();
          open_session();
          count_replay(history.size());
        }
        continue;
      }
      if (r.status == 410) {
        session_.clear();
        open_session();
        count_replay(history.size());
        continue;
      }
      throw status_error(r, j, what);
    }
    throw CloudError(CloudError::Kind::Unavailable,
                     "cloud step: the server kept answering position mismatches");
  }

  void close() noexcept override {
    if (session_.empty()) return;
    try {
      http_.request("DELETE", kSessions + ("/" + session_), "", milliseconds(1000));
    } catch (...) {
    }
    drop_session();
  }

  void abort() noexcept override { http_.abort(); }

  // The next history need not extend this one. A server that can rewind keeps the session
  // (the next step cuts it back to the shared prefix: a few-shot prompt is not prefilled again);
  // otherwise the session is closed and the next step opens a fresh one (not a replay).
  void new_conversation() noexcept override {
    if (can_rewind_ && !session_.empty()) return;
    close();
    fresh_conversation_ = true;
  }

  CloudCounters counters() const override {
    CloudCounters c = counters_;
    c.bytes_up = http_.bytes_sent();
    c.bytes_down = http_.bytes_received();
    return c;
  }

 private:
  static bool extends(std::span<const TokenId> history, const std::vector<TokenId>& prefix) {
    return prefix.size() <= history.size() &&
           std::equal(prefix.begin(), prefix.end(), history.begin());
  }

  void count_replay(size_t n) {
    ++counters_.replays;
    counters_.replayed_tokens += n;
  }

  void drop_session() {
    session_.clear();
    mirror_.clear();
    rewind_pending_ = false;
  }

  net::HttpResponse send(const char* method, const std::string& target, const std::string& body) {
    try {
      return http_.request(method, target, body,
                           milliseconds(static_cast<long>(options_.timeout_s * 1000)));
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

  CloudError status_error(const net::HttpResponse& r, const json& j, const std::string& what) {
    const std::string msg = what + ": HTTP " + std::to_string(r.status) + ": " + error_message(j);
    switch (r.status) {
      case 401:
      case 403:
        return CloudError(CloudError::Kind::Fatal, msg + " (check --api-key)");
      case 400:
      case 404:
      case 413:
        return CloudError(CloudError::Kind::Rejected, msg);
      default:
        return CloudError(CloudError::Kind::Unavailable, msg, retry_after_seconds(r));
    }
  }

  void open_session() {
    drop_session();
    const net::HttpResponse r = send("POST", kSessions, R"({"protocol":1})");
    const std::string what = "creating a cloud session at " + http_.url().origin();
    if (r.status != 201 && r.status != 200) throw status_error(r, parse_error_body(r), what);
    const json j = parse_answer(r, what);
    CloudModelInfo info;
    try {
      const json& m = j.at("model");
      info.name = m.value("name", "");
      info.arch = m.value("arch", "");
      info.n_vocab = m.at("n_vocab").get<int>();
      info.vocab_hash = m.at("vocab_hash").get<std::string>();
      info.bos = m.value("bos", -1);
      info.eos = m.value("eos", -1);
      if (m.contains("eog")) info.eog = m["eog"].get<std::vector<TokenId>>();
      if (j.contains("limits")) {
        const json& l = j["limits"];
        info.n_ctx = l.value("n_ctx", 0);
        info.max_step_tokens = l.value("max_step_tokens", 0);
        info.max_generate = l.value("max_generate", 0);
        info.max_draft = l.value("max_draft", 0);
      }
      can_rewind_ = false;
      if (j.contains("features") && j["features"].is_array()) {
        for (const json& f : j["features"]) can_rewind_ |= f.is_string() && f == "rewind";
      }
      session_ = j.at("session").get<std::string>();
    } catch (const json::exception& e) {
      throw CloudError(
          CloudError::Kind::Unavailable,
          what + ": the answer lacks the session or model fields (" + std::string(e.what()) + ")");
    }
    if (session_.empty() || session_.size() > 64 ||
        session_.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                   "0123456789-_.~") != std::string::npos) {
      const std::string bad = session_;
      session_.clear();
      throw CloudError(CloudError::Kind::Unavailable,
                       what + ": session id '" + bad + "' is not 1..64 URL-safe characters");
    }
    if (info.n_vocab != edge_n_vocab_ || info.vocab_hash != edge_hash_) {
      const std::string cloud_name = info.name.empty() ? info.arch : info.name;
      close();
      throw CloudError(CloudError::Kind::Fatal,
                       "the cloud's vocabulary differs from the edge's: edge model '" + edge_name_ +
                           "' has " + std::to_string(edge_n_vocab_) + " tokens (vocab_hash " +
                           edge_hash_ + "), cloud model '" + cloud_name + "' has " +
                           std::to_string(info.n_vocab) + " tokens (vocab_hash " + info.vocab_hash +
                           "); routing needs the same tokenizer on both sides");
    }
    info_ = info;
    ++counters_.sessions_opened;
    opened_before_ = true;
  }

  CloudStepResult parse_step(const net::HttpResponse& r, const std::string& what,
                             const CloudOp& op) {
    const json j = parse_answer(r, what);
    CloudStepResult out;
    out.pos = field<int>(j, "pos", what);
    if (j.contains("tokens")) out.tokens = field<std::vector<TokenId>>(j, "tokens", what);
    if (j.contains("logprobs") && j["logprobs"].is_array()) {
      for (const auto& v : j["logprobs"])
        out.logprobs.push_back(v.is_number() ? v.get<float>() : 0.f);
    }
    out.accepted = j.value("accepted", 0);
    out.prefilled = j.value("prefilled", 0);
    out.stop = j.value("stop", "");
    for (TokenId t : out.tokens) {
      if (t < 0 || t >= edge_n_vocab_) {
        throw CloudError(CloudError::Kind::Unavailable,
                         what + ": token id " + std::to_string(t) + " is outside the vocabulary");
      }
    }
    const size_t n = out.tokens.size();
    bool ok = true;
    if (op.kind == CloudOpKind::Sync) ok = n == 0;
    if (op.kind == CloudOpKind::Generate) ok = n >= 1 && n <= static_cast<size_t>(op.n_generate);
    if (op.kind == CloudOpKind::Verify) {
      ok = out.accepted >= 0 && out.accepted <= static_cast<int>(op.draft.size()) &&
           n == static_cast<size_t>(out.accepted) + 1 &&
           std::equal(op.draft.begin(), op.draft.begin() + out.accepted, out.tokens.begin());
    }
    if (!ok) {
      throw CloudError(
          CloudError::Kind::Unavailable,
          what + ": the answer's tokens do not fit the request: '" + short_body(r.body) + "'");
    }
    return out;
  }

  CloudOptions options_;
  net::HttpClient http_;
  std::string edge_name_;
  int edge_n_vocab_;
  std::string edge_hash_;
  std::string session_;
  std::vector<TokenId> mirror_;
  CloudModelInfo info_;
  CloudCounters counters_;
  bool opened_before_ = false;
  bool fresh_conversation_ = false;  // new_conversation() was called: the next open is no replay
  bool can_rewind_ = false;          // the server lists "rewind" (a step's rewind_to)
  bool rewind_pending_ = false;      // the next step cuts the session to mirror_.size() first
};

}  // namespace

// stateless_backend.cpp
std::unique_ptr<CloudBackend> make_stateless_backend(const CloudOptions& options,
                                                     const Model& edge_model);

std::unique_ptr<CloudBackend> make_cloud_backend(const CloudOptions& options,
                                                 const Model& edge_model) {
  if (options.api == "tandem") return std::make_unique<NativeBackend>(options, edge_model);
  if (options.api == "openai" || options.api == "sglang" || options.api == "llamacpp") {
    return make_stateless_backend(options, edge_model);
  }
  throw std::invalid_argument("unknown --cloud-api '" + options.api +
                              "' (choices: tandem, openai, sglang, llamacpp)");
}

}  // namespace tandem
