// tandem edge client: the device's half of collaborative decoding.
//
//   #include "tandem/routing.h"  // resolve_routing: the router, as run/eval/ui build it
//   auto small = tandem::Model::load("edge.gguf");
//   tandem::CloudOptions cloud;  cloud.url = "http://127.0.0.1:8080";
//   tandem::EdgeOptions opts;  opts.mode = tandem::EdgeMode::Route;
//   tandem::resolve_routing({.policy = "confidence"}, *small, "edge.gguf", opts);
//   tandem::EdgeDecoder edge(*small, opts, tandem::make_cloud_backend(cloud, *small));
//   edge.start();                                   // opens the cloud session, checks vocabularies
//   auto prompt_ids = small->tokenize("The capital of France is", true, false);
//   auto print = [](const tandem::EdgeToken&, std::string_view piece) {
//     std::fwrite(piece.data(), 1, piece.size(), stdout);
//     return true;  // false stops the answer
//   };
//   tandem::EdgeResult r = edge.generate(prompt_ids, 128, print);
//
// The small model decodes every position; the router picks the positions the cloud decides; the
// cloud keeps a session with the whole history, so only new token ids cross the network. Tokens
// the device decides itself are pushed to the cloud in the background ("sync ahead") so a route
// event prefills (almost) nothing. When the cloud is slow, down, restarted or wrong, the device
// decodes the token itself, counts a fallback and retries later with exponential backoff.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "tandem/engine.h"
#include "tandem/router.h"

namespace tandem {

// ---- the cloud, as the edge sees it ----

struct CloudModelInfo {
  std::string name, arch;
  int n_vocab = 0;
  std::string vocab_hash;  // 16 lowercase hex digits (Tokenizer::fingerprint)
  TokenId bos = -1, eos = -1;
  std::vector<TokenId> eog;
  int n_ctx = 0, max_step_tokens = 0, max_generate = 0, max_draft = 0;
};

enum class CloudOpKind { Sync, Generate, Verify };

struct CloudOp {
  CloudOpKind kind = CloudOpKind::Sync;
  int n_generate = 1;          // Generate
  SamplingParams sampling;     // Generate (temp <= 0: greedy)
  bool send_seed = false;      // Generate: pass sampling.seed
  std::vector<TokenId> draft;  // Verify
};

struct CloudStepResult {
  int pos = 0;                  // the session's history length after the step
  std::vector<TokenId> tokens;  // generated, or accepted drafts + the cloud's token
  std::vector<float> logprobs;
  int accepted = 0;   // Verify
  int prefilled = 0;  // tokens the server ran before sampling
  std::string stop;   // "length", "eog", "context" ("" for a sync)
};

class CloudError : public std::runtime_error {
 public:
  enum class Kind {
    // Transport failure, timeout, 429/503, and any malformed answer (not JSON, too deep, over
    // the size limit, a missing or mistyped field, a token outside the vocabulary, a position
    // that does not add up): fall back, retry later.
    Unavailable,
    Rejected,  // 400/404/413: the request was wrong for this server; fall back
    Fatal,     // 401, a different vocabulary: stop using this cloud
  };
  // The longest pause a cloud may ask for (Retry-After): beyond it the cloud is probed again.
  static constexpr double kMaxRetryAfterS = 60;

  // retry_after_s is clamped into [0, kMaxRetryAfterS] (NaN: 0), whatever the cloud sent.
  CloudError(Kind kind, const std::string& message, double retry_after_s = 0)
      : std::runtime_error(message),
        kind_(kind),
        retry_after_s_(retry_after_s > 0 ? std::min(retry_after_s, kMaxRetryAfterS) : 0.0) {}
  Kind kind() const { return kind_; }
  double retry_after_s() const { return retry_after_s_; }

 private:
  Kind kind_;
  double retry_after_s_;
};

struct CloudCounters {
  uint64_t bytes_up = 0, bytes_down = 0;  // HTTP headers + bodies
  int sessions_opened = 0;
  int replays = 0;  // sessions re-created with the whole history replayed in one append
  int resends = 0;  // 409 answers resent from the server's position
  int steps = 0;    // successful steps
  int rewinds = 0;  // sessions cut back to a shared prefix (native "rewind") instead of replayed
  uint64_t replayed_tokens = 0;
  int chained_steps = 0;  // steps sent on a lane of their own, earlier ones possibly still out
};

// One cloud conversation. step() takes the edge's whole history (which normally extends what it
// sent before: only the new tail crosses the network) and makes the cloud's history equal to it
// before doing `op`; the backend resends after a position mismatch, cuts the session back to the
// shared prefix when the histories diverged (where the server can), and replays into a new
// session when the old one is lost. Not thread-safe, except abort().
class CloudBackend {
 public:
  virtual ~CloudBackend() = default;
  virtual std::string name() const = 0;
  // Opens a session and checks the vocabulary. Throws CloudError.
  virtual CloudModelInfo connect() = 0;
  virtual CloudStepResult step(std::span<const TokenId> history, const CloudOp& op) = 0;
  // Closes the session (best effort, short timeout); never throws.
  virtual void close() noexcept = 0;
  // Closes the session without waiting for the cloud's answer, for a process on its way out
  // (the goodbye must not add a round trip to its exit). Default: close().
  virtual void close_at_exit() noexcept { close(); }
  // The next step starts another conversation: a fresh session that is not counted as a replay
  // (the protocol cannot cut a session's history back). Default: nothing (stateless backends).
  virtual void new_conversation() noexcept {}
  // Makes the request in flight (and all later ones) fail at once; any thread.
  virtual void abort() noexcept = 0;
  virtual CloudCounters counters() const = 0;
};

struct CloudOptions {
  std::string url;             // http://host:port[/prefix] or https://...
  std::string api = "tandem";  // tandem | openai | sglang | llamacpp
  std::string api_key;
  bool insecure = false;  // https: do not verify the certificate
  std::string ca_file;
  double timeout_s = 10;  // connect + whole request
  // A cloud answer with a larger body is refused (a CloudError: the edge falls back) before it
  // is buffered further.
  size_t max_answer_bytes = 64u << 20;
};

// The backend for options.api, checking the cloud's vocabulary against `edge_model`'s.
// Throws std::invalid_argument for a bad URL or an API that is not supported yet.
std::unique_ptr<CloudBackend> make_cloud_backend(const CloudOptions& options,
                                                 const Model& edge_model);

// ---- the edge decoder ----

enum class EdgeMode { Local, Route, Speculative, Cloud };
EdgeMode parse_edge_mode(const std::string& name);  // throws std::invalid_argument
std::string edge_mode_name(EdgeMode mode);

enum class TokenSource : uint8_t { Local, Cloud };

struct EdgeOptions {
  EdgeMode mode = EdgeMode::Local;
  RouterConfig router;
  int route_span = 1;      // cloud tokens per route event
  int draft = 4;           // speculative: drafts per verify
  int cloud_chunk = 16;    // cloud mode: tokens per step (the first steps ramp up 1, 2, 4, ...)
  bool sync_ahead = true;  // push locally decided tokens to the cloud in the background
  // Push once this many local tokens have gathered: 1 keeps the cloud's KV fully warm; more
  // spends fewer requests (each ~250 bytes of HTTP) and leaves < sync_every tokens to prefill
  // on a route event.
  int sync_every = 4;
  double cloud_timeout_s = 10;
  double backoff_initial_s = 0.25;
  double backoff_max_s = 8;
  SamplingParams sampling;
  ContextParams context;
  // Also hand the router the small model's final hidden state (for learned routers).
  bool signal_hidden = false;
  int top_k_signal = 8;  // probabilities the router signal carries
  // Route mode: do not stand still for a routed position's answer; decode on from the small
  // model's own choice and go back only when the cloud answers otherwise (docs/client.md,
  // "Pipelined routing"). The output is the same either way.
  bool pipeline = true;
  // Pipelined route mode, greedy, one-token route spans: while a consultation is out, also
  // decode the small model's next `branches` choices at that position, side by side with its
  // guess (one batch, a KV slot each), and take over the line the cloud's answer picks instead
  // of decoding it again (docs/client.md, "Branches"). The output is the same; 0: off. Each
  // fork takes as many of them as its running estimates say pay (none on a pair whose cloud
  // rarely disagrees), or all of them with branches_fixed.
  int branches = 2;
  bool branches_fixed = false;
};

struct EdgeStats {
  int tokens = 0, cloud_tokens = 0;
  double cloud_share = 0;
  int route_events = 0;  // successful cloud consultations (route events, verifies, cloud steps)
  uint64_t bytes_up = 0, bytes_down = 0;
  double cloud_ms = 0;  // consultations' round trips as the decoder saw them (sent to answered)
  double wait_ms = 0;   // time the decoder stood still waiting for the cloud
  double local_ms = 0;  // time in the small model (prefill, decode, sampling, router)
  double ttft_ms = 0;
  double total_ms = 0;
  double tok_s = 0;
  int fallbacks = 0;  // tokens decided locally because the cloud failed or was backing off
  int replays = 0;
  int accepted_drafts = 0, drafted = 0;
  int prefilled_on_route =
      0;  // tokens the cloud prefilled in consultations (sync-ahead saves these)
  int sync_steps = 0, sync_failures = 0, cloud_failures = 0;
  // Route events whose answer was the device's own guess (its top-1; pipelined: its greedy
  // continuation over the route span) and those where the cloud changed it. Pipelined
  // speculative mode: blocks whose verdict was every draft and then the device's own next token
  // (the next block, drafted meanwhile, goes out at once), and the others.
  int route_confirmed = 0, route_changed = 0;
  int wasted_tokens = 0;  // tokens decoded ahead of an answer and then thrown away
  // Branches (EdgeOptions::branches): tokens decoded on alternatives beside the guess, and of
  // those the ones a takeover kept (the rest are thrown away too, at a batch row's cost).
  int branch_tokens = 0, branch_kept = 0;
  int chained_steps = 0;  // cloud steps sent while earlier ones could still be out (queue)
  // Cancels of chained steps the decoder abandoned while the server could still run them (sent
  // in the background), and the steps the server said they stopped (counted when the cancel's
  // answer is in: it may fall in the next answer's stats).
  int cancels = 0, cancelled_steps = 0;
  bool cloud_lost = false;  // the cloud was given up on (fatal error) or never answered
  std::string last_cloud_error;
};

// The one list of EdgeStats' fields, in the order `run --json` prints them: calls
// visit(name, s.field...) for each field, with that field of every `stats` given (one for
// printing, two for adding up; gemma.cpp's VisitFields idea). A new field is added here once
// and run, eval and the browser view all carry it.
template <class Visit, class... Stats>
void visit_edge_stats(Visit&& visit, Stats&... s) {
  visit("tokens", s.tokens...);
  visit("cloud_tokens", s.cloud_tokens...);
  visit("cloud_share", s.cloud_share...);
  visit("route_events", s.route_events...);
  visit("bytes_up", s.bytes_up...);
  visit("bytes_down", s.bytes_down...);
  visit("cloud_ms", s.cloud_ms...);
  visit("wait_ms", s.wait_ms...);
  visit("local_ms", s.local_ms...);
  visit("ttft_ms", s.ttft_ms...);
  visit("tok_s", s.tok_s...);
  visit("fallbacks", s.fallbacks...);
  visit("replays", s.replays...);
  visit("accepted_drafts", s.accepted_drafts...);
  visit("drafted", s.drafted...);
  visit("prefilled_on_route", s.prefilled_on_route...);
  visit("sync_steps", s.sync_steps...);
  visit("sync_failures", s.sync_failures...);
  visit("cloud_failures", s.cloud_failures...);
  visit("route_confirmed", s.route_confirmed...);
  visit("route_changed", s.route_changed...);
  visit("wasted_tokens", s.wasted_tokens...);
  visit("branch_tokens", s.branch_tokens...);
  visit("branch_kept", s.branch_kept...);
  visit("chained_steps", s.chained_steps...);
  visit("cancels", s.cancels...);
  visit("cancelled_steps", s.cancelled_steps...);
  visit("cloud_lost", s.cloud_lost...);
  visit("total_ms", s.total_ms...);
  visit("last_cloud_error", s.last_cloud_error...);
}

// Adds one answer's stats to a session's totals (`run -i`): counts and times add up, the
// shares and speed are recomputed, ttft is the first answer's, a lost cloud stays lost and the
// last cloud error is the latest.
void add_edge_stats(EdgeStats& total, const EdgeStats& one);

struct EdgeToken {
  TokenId id = 0;
  TokenSource source = TokenSource::Local;
  float score = 0;
  // For a cloud token: the small model's greedy choice at that position, when it was computed
  // (the first token of a route event, a speculative correction); -1 when unknown.
  TokenId edge_top1 = -1;
  bool fallback = false;  // decided locally because the cloud failed or was backing off
  // Route mode: the router's threshold the token's decision was taken against (the router's
  // before that decision; every token of a route span shares it). NaN in the other modes.
  double threshold = std::numeric_limits<double>::quiet_NaN();
};

struct EdgeResult {
  std::vector<TokenId> ids;  // generated (an end-of-generation token excluded)
  std::vector<TokenSource> sources;
  std::vector<float> scores;
  std::string text;
  StopReason stop = StopReason::Length;
  EdgeStats stats;  // this call's
};

// How an answer ended, as `tandem run --json` and the browser view say it: length, eog,
// context_full, stopped.
std::string stop_reason_name(StopReason stop);

// EdgeStats as the JSON object (text) `tandem run --json` prints under "stats" (docs/client.md,
// the --json contract) and the browser view sends with its "done" event: every field of
// visit_edge_stats, last_cloud_error only when there was one.
std::string edge_stats_json(const EdgeStats& stats);

// Called per produced token with its text piece (may be empty while a UTF-8 character is
// incomplete); return false to stop.
using EdgeTokenCallback = std::function<bool(const EdgeToken& token, std::string_view piece)>;

class CloudLink;
class BranchSet;

class EdgeDecoder {
 public:
  // `cloud` may be null for Local mode (and then every other mode decodes locally).
  EdgeDecoder(const Model& small, const EdgeOptions& options,
              std::unique_ptr<CloudBackend> cloud = nullptr);
  ~EdgeDecoder();
  EdgeDecoder(const EdgeDecoder&) = delete;
  EdgeDecoder& operator=(const EdgeDecoder&) = delete;

  // Opens the cloud session and waits for it. Throws CloudError (Fatal) for a different
  // vocabulary or a refused API key; a cloud that does not answer is not an error (the decoder
  // starts locally and retries). Returns a line describing the cloud (or why it is unavailable).
  std::string start();
  // Begins opening the cloud session and returns at once: the prompt's prefill and the tokens
  // before the first consultation overlap its round trips. generate() waits for the session
  // only where it first needs the cloud, and a Fatal refusal then comes out of generate().
  void start_in_background();
  // start()'s line once the session's opening has an outcome; nullopt while it is still out.
  // Throws a Fatal CloudError as start() does.
  std::optional<std::string> cloud_line();

  // Makes the conversation's history `context` (its common prefix with the current history is
  // kept, locally and in the cloud) and produces up to n_predict tokens after it.
  EdgeResult generate(std::span<const TokenId> context, int n_predict,
                      const EdgeTokenCallback& on_token = {});

  const std::vector<TokenId>& history() const { return history_; }
  const EdgeOptions& options() const { return options_; }

 private:
  void ensure_local_logits();
  TokenId sample_local();
  // The router's decision at the current position: its score; *cloud and *threshold (what the
  // score was compared with) are set.
  float route_score(bool* cloud, double* threshold);
  // The small model's greedy token where its logits are (ensure_local_logits, decode_ahead).
  TokenId local_top1() const;
  // The small model's greedy continuation of up to n tokens from the end of history_, starting
  // with `first` (its top-1 there) and cut after an end-of-generation token, as a route span's
  // answer would be. It runs the KV ahead of history_ (the lazy rule keeps what then follows).
  std::vector<TokenId> greedy_chain(TokenId first, int n);
  // Decodes `token` past what the KV holds (a draft, ahead of history_); its logits come out.
  void decode_ahead(TokenId token);
  // Back to history length `pos` with the router and sampler as they were there (a snapshot
  // taken at a consultation or just after a held token). The KV follows lazily.
  void restore(size_t pos, const Router::State& router, Sampler::State sampler);
  // The small model back at history length `pos`: its KV cut there, and its logits (and hidden
  // state) there put back -- or, when none were kept (empty), recomputed when next needed.
  void rewind_small_model(size_t pos, std::vector<float> logits, std::vector<float> hidden);
  // Waits for the session start_in_background() began and takes in the cloud's limits; returns
  // at once when none is being opened (no cloud, local mode, or already settled).
  void await_cloud();
  // await_cloud() when that would not wait; false while the session is still opening.
  bool poll_cloud();
  struct Turn;  // one generate() call (edge_decoder.cpp)

  const Model& model_;
  EdgeOptions options_;
  Router router_;
  std::unique_ptr<Context> ctx_;
  Sampler sampler_;
  std::unique_ptr<CloudLink> link_;
  std::unique_ptr<BranchSet> branches_;  // options_.branches > 0 only
  int main_seq_ = 0;                     // the KV slot local_tokens_ describes
  std::vector<TokenId> history_;         // the conversation: prompt(s) and every produced token
  std::vector<TokenId> local_tokens_;    // what the small model's KV holds (may run ahead: drafts)
  std::vector<float> logits_;            // the small model's next-token logits after local_tokens_
  std::vector<float> hidden_;            // its final hidden state there (signal_hidden only)
  size_t logits_pos_ = SIZE_MAX;         // local_tokens_.size() when logits_ was computed
  double local_ms_ = 0;
  bool connecting_ = false;  // start_in_background() began a connect not yet awaited
  std::string cloud_line_;   // what start() returns, once known
};

// What a trained router's file says about itself.
struct TrainedRouterInfo {
  std::string label;          // what it learned to predict (`router train --label`)
  std::string vocab_hash;     // the edge vocabulary it was made for, 16 hex digits
  std::string edge_name;      // that edge model's general.name
  std::string training_json;  // a summary of its training data and metrics
};

}  // namespace tandem
