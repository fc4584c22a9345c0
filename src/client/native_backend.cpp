// The tandem native protocol (docs/protocol.md) as a CloudBackend.
//
// The backend keeps `mirror_`: the tokens it believes the session's history holds. A step sends
// expected_pos = mirror_.size() and append = history[mirror_.size():]. After a step whose answer
// never came (timeout, cut connection, garbage), mirror_ becomes the history it tried to append:
// the server applied the step entirely or not at all, so a later 409 with pos <= mirror_.size()
// means "resend from pos", and one with pos > mirror_.size() means the server holds tokens the
// edge never saw (a generate that ran) -- then only a replay into a new session is safe.
//
// Every answer is read through client/cloud_answer.h: whatever the server sends, a step or a
// connect ends in a result or a CloudError.
#include <algorithm>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "client/chained_backend.h"
#include "client/cloud_answer.h"
#include "common/error.h"
#include "common/history_hash.h"
#include "net/http_client.h"
#include "net/native_protocol.h"
#include "tandem/client.h"

namespace tandem {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

// A session's answer lists at most this many end-of-generation ids.
constexpr size_t kMaxEogTokens = 4096;
// Connections for chained steps: a sync and two consultations in flight at once, which is what
// a server's session queue holds (one running, max_queued_steps = 2 waiting).
constexpr int kLanes = 3;
// A cancel answers at once (the server never waits for the steps it stops); one that does not
// must not hold up the plain steps behind it on its connection for a whole step timeout.
constexpr double kCancelTimeoutS = 2;

// "general.name (file.gguf)": both, as either may be what the user recognises.
std::string edge_model_name(const Model& m) {
  const std::string file = m.info().path.substr(m.info().path.find_last_of('/') + 1);
  if (m.info().name.empty()) return file;
  return m.info().name + " (" + file + ")";
}

net::HttpOptions http_options(const CloudOptions& o) {
  return net::HttpOptions{.insecure = o.insecure,
                          .ca_file = o.ca_file,
                          .api_key = o.api_key,
                          .max_body_bytes = o.max_answer_bytes};
}

class NativeBackend : public CloudBackend, public ChainedBackend {
 public:
  NativeBackend(const CloudOptions& options, const Model& edge)
      : options_(options),
        http_(net::parse_url(options.url), http_options(options)),
        edge_name_(edge_model_name(edge)),
        edge_n_vocab_(edge.vocab_size()),
        edge_hash_(edge.info().vocab_hash) {
    for (int i = 0; i < kLanes; ++i) {
      lanes_.push_back(
          std::make_unique<net::HttpClient>(net::parse_url(options.url), http_options(options)));
    }
  }

  std::string name() const override {
    return "tandem " + http_.url().origin() + http_.url().prefix;
  }

  CloudModelInfo connect() override {
    return cloud::only_cloud_errors("creating a cloud session", [&] {
      open_session();
      return info_;
    });
  }

  CloudStepResult step(std::span<const TokenId> history, const CloudOp& op) override {
    return cloud::only_cloud_errors("cloud step", [&] { return step_unguarded(history, op); });
  }

  void close() noexcept override {
    if (session_.empty()) return;
    try {
      http_.request("DELETE", session_path(), "", milliseconds(1000), cloud::kAnswerFixedBytes);
    } catch (...) {
    }
    drop_session();
  }

  void close_at_exit() noexcept override {
    if (session_.empty()) return;
    // On the open keep-alive connection only; with none (the last step failed or was cut) the
    // session is left to expire on the server rather than paying a connect now.
    http_.send_last("DELETE", session_path(), milliseconds(200));
    drop_session();
  }

  void abort() noexcept override {
    http_.abort();
    for (auto& lane : lanes_) lane->abort();
  }

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
    for (const auto& lane : lanes_) {
      c.bytes_up += lane->bytes_sent();
      c.bytes_down += lane->bytes_received();
    }
    return c;
  }

  // ---- chained steps (client/chained_backend.h) ----

  int chain_lanes() const override {
    return can_queue_ && can_rewind_ && can_hash_ && !session_.empty() ? kLanes : 0;
  }

  // The step that takes the session from what the chain so far leaves (chain_) to `history`, then
  // does `op`; the chain then assumes the session holds history + guess. A history that does not
  // extend the chain (another prompt), or a chain with a cut pending, cuts the session back: that
  // step starts a generation, and the steps of earlier ones still out no longer count.
  ChainedStep chain(std::span<const TokenId> history, const CloudOp& op,
                    std::vector<TokenId> guess) override {
    if (outstanding_ == 0) chain_ = mirror_;
    size_t from = chain_.size();
    bool cut = rewind_pending_;
    if (!extends(history, chain_)) {
      from = common_prefix(chain_, history);
      cut = true;
      ++counters_.rewinds;
    }
    if (cut) {
      ++generation_;
      in_generation_ = 0;
    }
    json body = step_body(history, op, from, cut);
    body[protocol::kQueue] = true;
    ++counters_.chained_steps;
    rewind_pending_ = false;
    chain_.assign(history.begin(), history.end());
    chain_.insert(chain_.end(), guess.begin(), guess.end());
    ++outstanding_;
    ++in_generation_;
    return ChainedStep{.session = session_,
                       .body = body.dump(),
                       .history = std::vector<TokenId>(history.begin(), history.end()),
                       .guess = std::move(guess),
                       .op = op,
                       .from = from,
                       .generation = generation_};
  }

  void extend_guess(ChainedStep& step, TokenId token) override {
    step.guess.push_back(token);
    chain_.push_back(token);
  }

  std::optional<CloudStepResult> run_chained(int lane, const ChainedStep& step) override {
    return cloud::only_cloud_errors("cloud step", [&]() -> std::optional<CloudStepResult> {
      const std::string what = "cloud step at position " + std::to_string(step.from);
      const net::HttpResponse r =
          cloud::fetch(*lanes_.at(static_cast<size_t>(lane)), "POST",
                       std::string(protocol::kSessionPrefix) + step.session + protocol::kStep,
                       step.body, options_.timeout_s, step_cap(step.op));
      if (r.status == 409 || r.status == 410) return std::nullopt;
      if (r.status != 200) throw cloud::status_error(r, what);
      CloudStepResult out = parse_step(r, what, step.op, step.history.size());
      if (auto wrong = wrong_pos(out, step.history.size(), what)) {
        throw CloudError(CloudError::Kind::Unavailable, *wrong);
      }
      return out;
    });
  }

  // What the server surely holds after the step: its history and answer; after a step with no
  // (usable) answer, only what lies before anything it could have written.
  // A step sent before the latest cut changes nothing here: whatever it did, the cut (queued
  // behind it, or refusing it by hash should it arrive later) takes the session where the chain
  // says.
  void settle(const ChainedStep& step, const CloudStepResult* answer) override {
    --outstanding_;
    if (step.generation != generation_) return;
    --in_generation_;
    if (answer) {
      mirror_ = step.history;
      mirror_.insert(mirror_.end(), answer->tokens.begin(), answer->tokens.end());
      ++counters_.steps;
      if (answer->tokens == step.guess) return;
      // The server holds exactly the mirror unless steps sent later were built on the guess
      // that did not hold: whatever they write lies past the mirror, and the next step cuts it.
      rewind_pending_ = in_generation_ > 0;
    } else {
      mirror_.resize(std::min(mirror_.size(), step.from));
      rewind_pending_ = true;  // the step may or may not have written past the mirror
    }
    chain_ = mirror_;
  }

  // As a cut does (chain()): the steps out belong to an older generation from now on, so what
  // they did or did not do changes nothing here; the next step cuts back to mirror_.
  bool abandon_from(size_t from_pos) override {
    if (!can_cancel_) return false;
    ++generation_;
    in_generation_ = 0;
    mirror_.resize(std::min(mirror_.size(), from_pos));
    chain_ = mirror_;
    rewind_pending_ = true;
    return true;
  }

  int cancel(const std::string& session, size_t from_pos) override {
    return cloud::only_cloud_errors("cancelling stale cloud steps", [&] {
      const std::string what = "cancel from position " + std::to_string(from_pos);
      const cloud::AnswerCap cap = cloud::answer_cap(options_.max_answer_bytes);
      const net::HttpResponse r = cloud::fetch(
          http_, "POST", std::string(protocol::kSessionPrefix) + session + protocol::kCancel,
          json{{protocol::kFromPos, from_pos}}.dump(),
          std::min(options_.timeout_s, kCancelTimeoutS), cap);
      if (r.status != 200) throw cloud::status_error(r, what);
      const json j = cloud::parse_answer(r, what, cap);
      return static_cast<int>(cloud::int_field_or(j, protocol::kCancelled, what, 0, INT_MAX, 0));
    });
  }

 private:
  // One step: the session brought to a prefix of `history`, then up to four tries (a 409 or
  // 410 answer resends from the server's position or replays into a new session).
  CloudStepResult step_unguarded(std::span<const TokenId> history, const CloudOp& op) {
    if (history.empty()) throw Error("cloud step: the history is empty");
    align_session(history);
    for (int attempt = 0; attempt < 4; ++attempt) {
      const size_t from = mirror_.size();
      const std::string what = "cloud step at position " + std::to_string(from);
      net::HttpResponse r;
      try {
        r = send("POST", session_path() + protocol::kStep,
                 step_body(history, op, mirror_.size(), rewind_pending_).dump(), step_cap(op));
      } catch (const CloudError&) {
        // Unknown outcome: the server applied all of the step or none of it.
        mirror_.assign(history.begin(), history.end());
        throw;
      }
      if (r.status == 200) return accept_step(r, what, op, history);
      if (r.status == 409) {
        resend_or_replay(r, history, what, step_cap(op));
        continue;
      }
      if (r.status == 410) {
        session_.clear();
        open_session();
        count_replay(history.size());
        continue;
      }
      throw cloud::status_error(r, what);
    }
    throw CloudError(CloudError::Kind::Unavailable,
                     "cloud step: the server kept answering position mismatches");
  }

  // Before a step: a session whose history `history` extends. None yet: open one (a replay
  // unless this is a new conversation). One that holds something else (another prompt, a chat
  // turn re-tokenized): cut back to the shared prefix where the server can ("rewind", sent with
  // the step), else replay into a new session.
  void align_session(std::span<const TokenId> history) {
    if (session_.empty()) {
      open_session();
      if (opened_before_ && !fresh_conversation_) count_replay(history.size());
      fresh_conversation_ = false;
      return;
    }
    if (extends(history, mirror_)) return;
    if (can_rewind_) {
      mirror_.resize(common_prefix(mirror_, history));
      rewind_pending_ = true;
      ++counters_.rewinds;
    } else {
      replay_into_new_session(history.size());
    }
  }

  // The step request (docs/protocol.md): {"expected_pos", "expected_hash"?, "rewind_to"?,
  // "append": [what the server lacks of history], and "generate": {...} or "verify": {"draft":
  // [...]} by op}. The hash makes a session whose history has the expected length but other
  // tokens (a step that reached it out of turn) refuse the step instead of running it there.
  json step_body(std::span<const TokenId> history, const CloudOp& op, size_t from, bool cut) const {
    json body;
    body[protocol::kExpectedPos] = from;
    if (can_hash_)
      body[protocol::kExpectedHash] = HistoryHash::hex(HistoryHash::of(history.first(from)));
    if (cut) body[protocol::kRewindTo] = from;
    body[protocol::kAppend] = std::vector<TokenId>(history.begin() + from, history.end());
    if (op.kind == CloudOpKind::Generate) {
      json g;
      g[protocol::kN] = op.n_generate;
      g["temperature"] = std::max(0.0f, op.sampling.temp);
      g["top_k"] = std::max(0, op.sampling.top_k);
      g["top_p"] = op.sampling.top_p;
      g["min_p"] = std::max(0.0f, op.sampling.min_p);
      if (op.send_seed) g["seed"] = op.sampling.seed;
      body[protocol::kGenerate] = g;
    } else if (op.kind == CloudOpKind::Verify) {
      body[protocol::kVerify] = {{protocol::kDraft, op.draft}};
    }
    return body;
  }

  // A 200 answer: the mirror becomes the history plus the tokens the server added, which must
  // match the position the server reports (else the session is dropped: replay next time).
  CloudStepResult accept_step(const net::HttpResponse& r, const std::string& what,
                              const CloudOp& op, std::span<const TokenId> history) {
    rewind_pending_ = false;
    CloudStepResult out;
    try {
      out = parse_step(r, what, op, history.size());
    } catch (const CloudError&) {
      mirror_.assign(history.begin(), history.end());
      throw;
    }
    mirror_.assign(history.begin(), history.end());
    mirror_.insert(mirror_.end(), out.tokens.begin(), out.tokens.end());
    if (auto wrong = wrong_pos(out, history.size(), what)) {
      drop_session();  // whatever it holds, it is not what we think: replay next time
      throw CloudError(CloudError::Kind::Unavailable, *wrong);
    }
    ++counters_.steps;
    return out;
  }

  // A 409: the session is busy (throws), its history differs from what the edge sent (resend it
  // all), or its position does. The edge resends from the server's position when that is one
  // it can resend from, and otherwise (no position, or one past what the edge knows) replays
  // into a new session.
  void resend_or_replay(const net::HttpResponse& r, std::span<const TokenId> history,
                        const std::string& what, const cloud::AnswerCap& cap) {
    static const json empty = json::object();
    const json j = cloud::parse_json(r.body, cap);
    const json& top = j.is_object() ? j : empty;
    const auto e_it = top.find("error");
    const json& e = e_it != top.end() && e_it->is_object() ? *e_it : top;
    const std::string code = cloud::string_field_or(e, "code", what, 64, "");
    if (code == protocol::kHistoryMismatch) {
      // The session holds other tokens than the edge believed (a step that reached it out of
      // turn): send the whole history from position 0, where the server keeps what matches (KV
      // too), or replay it into a new session.
      ++counters_.resends;
      if (can_rewind_) {
        mirror_.clear();
        rewind_pending_ = true;
      } else {
        replay_into_new_session(history.size());
      }
      return;
    }
    if (code == protocol::kSessionBusy) {
      // tandem serve answers this (not in protocol v1) while an earlier step of the session,
      // whose answer the edge gave up on, still runs: its outcome is unknown, try later.
      mirror_.assign(history.begin(), history.end());
      throw CloudError(CloudError::Kind::Unavailable,
                       what + ": the session is still running an earlier step", 0.05);
    }
    const int64_t pos =
        cloud::int_field_or(e, protocol::kPos, what, 0, INT_MAX,
                            cloud::int_field_or(top, protocol::kPos, what, 0, INT_MAX, -1));
    ++counters_.resends;
    if (pos >= 0 && static_cast<size_t>(pos) <= mirror_.size() &&
        static_cast<size_t>(pos) <= history.size()) {
      mirror_.resize(static_cast<size_t>(pos));
    } else {
      replay_into_new_session(history.size());
    }
  }

  // A step's answer must put the session at the history it was sent plus the tokens it added;
  // otherwise what is wrong, for the error.
  static std::optional<std::string> wrong_pos(const CloudStepResult& out, size_t history_size,
                                              const std::string& what) {
    const size_t counted = history_size + out.tokens.size();
    if (out.pos == static_cast<int>(counted)) return std::nullopt;
    return what + ": the server says pos " + std::to_string(out.pos) +
           " after the step, the edge counts " + std::to_string(counted);
  }
  static size_t common_prefix(const std::vector<TokenId>& a, std::span<const TokenId> b) {
    return static_cast<size_t>(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first -
                               a.begin());
  }
  static bool extends(std::span<const TokenId> history, const std::vector<TokenId>& prefix) {
    return prefix.size() <= history.size() &&
           std::equal(prefix.begin(), prefix.end(), history.begin());
  }

  void count_replay(size_t n) {
    ++counters_.replays;
    counters_.replayed_tokens += n;
  }

  // The session is closed and another opened; the next step sends all `n` tokens of the history.
  void replay_into_new_session(size_t n) {
    close();
    open_session();
    count_replay(n);
  }

  // The open session's resource: /tandem/v1/sessions/{id}.
  std::string session_path() const { return std::string(protocol::kSessionPrefix) + session_; }

  void drop_session() {
    session_.clear();
    mirror_.clear();
    rewind_pending_ = false;
  }

  net::HttpResponse send(const char* method, const std::string& target, const std::string& body,
                         const cloud::AnswerCap& cap) {
    return cloud::fetch(http_, method, target, body, options_.timeout_s, cap);
  }

  // The most tokens a step's answer may carry: none for a sync, n for a generate, the drafts
  // plus the correction for a verify.
  static size_t answer_tokens(const CloudOp& op) {
    if (op.kind == CloudOpKind::Generate) return static_cast<size_t>(std::max(0, op.n_generate));
    if (op.kind == CloudOpKind::Verify) return op.draft.size() + 1;
    return 0;
  }
  // A step's answer: kAnswerFixedBytes + answer_tokens(op) x kNativeTokenBytes.
  cloud::AnswerCap step_cap(const CloudOp& op) const {
    return cloud::answer_cap(options_.max_answer_bytes,
                             {{answer_tokens(op), cloud::kNativeTokenBytes}});
  }
  // A session's answer: kAnswerFixedBytes + kMaxEogTokens x kNativeTokenBytes.
  cloud::AnswerCap session_cap() const {
    return cloud::answer_cap(options_.max_answer_bytes,
                             {{kMaxEogTokens, cloud::kNativeTokenBytes}});
  }

  void open_session() {
    drop_session();
    const cloud::AnswerCap cap = session_cap();
    const net::HttpResponse r = send("POST", protocol::kSessionsPath,
                                     json{{protocol::kProtocol, protocol::kVersion}}.dump(), cap);
    const std::string what = "creating a cloud session at " + http_.url().origin();
    if (r.status != 201 && r.status != 200) throw cloud::status_error(r, what);
    const json j = cloud::parse_answer(r, what, cap);
    const json& m = cloud::object_field(j, protocol::kModel, what);
    CloudModelInfo info;
    info.name = cloud::excerpt(cloud::string_field_or(m, "name", what, 1024, ""), 128);
    info.arch = cloud::excerpt(cloud::string_field_or(m, "arch", what, 1024, ""), 64);
    info.n_vocab = static_cast<int>(cloud::int_field(m, "n_vocab", what, 1, INT_MAX));
    info.vocab_hash = cloud::string_field(m, "vocab_hash", what, 64);
    session_ = cloud::string_field(j, protocol::kSession, what, 64);
    if (session_.empty() ||
        session_.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                   "0123456789-_.~") != std::string::npos) {
      const std::string bad = cloud::excerpt(session_, 64);
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
                           std::to_string(info.n_vocab) + " tokens (vocab_hash " +
                           cloud::excerpt(info.vocab_hash, 64) +
                           "); routing needs the same tokenizer on both sides");
    }
    try {
      read_model_details(j, m, what, info);
    } catch (const CloudError&) {
      session_.clear();  // not closed: the answer was broken, the server may be too
      throw;
    }
    info_ = info;
    ++counters_.sessions_opened;
    opened_before_ = true;
  }

  // The optional parts of a session's answer: special tokens, limits, features.
  void read_model_details(const json& j, const json& m, const std::string& what,
                          CloudModelInfo& info) {
    const int n = edge_n_vocab_;
    info.bos = static_cast<TokenId>(cloud::int_field_or(m, "bos", what, -1, n - 1, -1));
    info.eos = static_cast<TokenId>(cloud::int_field_or(m, "eos", what, -1, n - 1, -1));
    if (cloud::has(m, "eog")) info.eog = cloud::token_field(m, "eog", what, n, kMaxEogTokens);
    if (cloud::has(j, protocol::kLimits)) {
      const json& l = cloud::object_field(j, protocol::kLimits, what);
      info.n_ctx = static_cast<int>(cloud::int_field_or(l, "n_ctx", what, 0, INT_MAX, 0));
      info.max_step_tokens =
          static_cast<int>(cloud::int_field_or(l, "max_step_tokens", what, 0, INT_MAX, 0));
      info.max_generate =
          static_cast<int>(cloud::int_field_or(l, "max_generate", what, 0, INT_MAX, 0));
      info.max_draft = static_cast<int>(cloud::int_field_or(l, "max_draft", what, 0, INT_MAX, 0));
    }
    can_rewind_ = can_queue_ = can_hash_ = can_cancel_ = false;
    if (const auto f = j.find(protocol::kFeatures); f != j.end() && f->is_array()) {
      for (const json& name : *f) {
        can_rewind_ |= name.is_string() && name == protocol::kFeatureRewind;
        can_queue_ |= name.is_string() && name == protocol::kFeatureQueue;
        can_hash_ |= name.is_string() && name == protocol::kFeatureHistoryHash;
        can_cancel_ |= name.is_string() && name == protocol::kFeatureCancel;
      }
    }
  }

  // A 200 step answer, checked against what was asked: every field of the right type and
  // range, every token in the vocabulary, as many tokens as the operation can give.
  CloudStepResult parse_step(const net::HttpResponse& r, const std::string& what, const CloudOp& op,
                             size_t history_size) {
    const json j = cloud::parse_answer(r, what, step_cap(op));
    const size_t max_tokens = answer_tokens(op);
    CloudStepResult out;
    out.pos = static_cast<int>(cloud::int_field(j, protocol::kPos, what, 0, INT_MAX));
    if (cloud::has(j, protocol::kTokens)) {
      out.tokens = cloud::token_field(j, protocol::kTokens, what, edge_n_vocab_, max_tokens);
    }
    if (cloud::has(j, protocol::kLogprobs)) {
      out.logprobs =
          cloud::number_array(j[protocol::kLogprobs], protocol::kLogprobs, what, out.tokens.size());
    }
    out.accepted = static_cast<int>(cloud::int_field_or(j, protocol::kAccepted, what, 0,
                                                        static_cast<int64_t>(op.draft.size()), 0));
    // The server runs at most the history it was sent (a replay: all of it).
    out.prefilled = static_cast<int>(cloud::int_field_or(j, protocol::kPrefilled, what, 0,
                                                         static_cast<int64_t>(history_size), 0));
    out.stop = cloud::string_field_or(j, protocol::kStop, what, 32, "");
    const size_t n = out.tokens.size();
    bool ok = true;
    if (op.kind == CloudOpKind::Generate) ok = n >= 1;
    if (op.kind == CloudOpKind::Verify) {
      ok = n == static_cast<size_t>(out.accepted) + 1 &&
           std::equal(op.draft.begin(), op.draft.begin() + out.accepted, out.tokens.begin());
    }
    if (!ok) {
      throw CloudError(
          CloudError::Kind::Unavailable,
          what + ": the answer's tokens do not fit the request: '" + cloud::excerpt(r.body) + "'");
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
  bool can_queue_ = false;           // the server lists "queue" (a session's steps wait in turn)
  bool can_hash_ = false;            // the server lists "history_hash" (a step's expected_hash)
  bool can_cancel_ = false;          // the server lists "cancel" (POST .../cancel)
  bool rewind_pending_ = false;      // the next step cuts the session to mirror_.size() first
  // Chained steps: a connection per lane; the history the server holds once every step sent
  // and not yet settled is answered as guessed; how many those are; the cuts sent so far, and
  // how many of the steps out were sent since the latest.
  std::vector<std::unique_ptr<net::HttpClient>> lanes_;
  std::vector<TokenId> chain_;
  int outstanding_ = 0;
  uint64_t generation_ = 0;
  int in_generation_ = 0;
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
