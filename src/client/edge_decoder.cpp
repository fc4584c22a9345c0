// The edge decoder: local, route, speculative and cloud modes over one small-model context and
// an optional CloudLink.
//
// State: history_ is the conversation (prompts and produced tokens). local_tokens_ is what the
// small model's KV cache holds; it follows history_ lazily (ensure_local_logits truncates it to
// the common prefix and decodes the rest), so cloud tokens, accepted drafts and new chat turns all
// reach the small model the same way, and a rejected draft is just a truncation.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <utility>

#include "client/branch_set.h"
#include "client/cloud_link.h"
#include "client/pipeline_ledger.h"
#include "common/error.h"
#include "tandem/client.h"
#include "tandem/vector_ops.h"

namespace tandem {

using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// EdgeOptions::branches at most: each is a KV slot and a batch row per step.
constexpr int kMaxBranches = 8;

}  // namespace

EdgeMode parse_edge_mode(const std::string& name) {
  if (name == "local") return EdgeMode::Local;
  if (name == "route") return EdgeMode::Route;
  if (name == "speculative") return EdgeMode::Speculative;
  if (name == "cloud") return EdgeMode::Cloud;
  throw std::invalid_argument("unknown mode '" + name +
                              "' (choices: local, route, speculative, cloud)");
}

std::string edge_mode_name(EdgeMode mode) {
  switch (mode) {
    case EdgeMode::Local:
      return "local";
    case EdgeMode::Route:
      return "route";
    case EdgeMode::Speculative:
      return "speculative";
    case EdgeMode::Cloud:
      return "cloud";
  }
  return "?";
}

EdgeDecoder::EdgeDecoder(const Model& small, const EdgeOptions& options,
                         std::unique_ptr<CloudBackend> cloud)
    : model_(small), options_(options), router_(options.router), sampler_(options.sampling) {
  if (options_.route_span < 1) throw Error("--route-span must be at least 1");
  if (options_.draft < 1) throw Error("--draft must be at least 1");
  if (options_.cloud_chunk < 1) options_.cloud_chunk = 1;
  if (options_.sync_every < 1) throw Error("--sync-every must be at least 1");
  if (!(options_.cloud_timeout_s > 0)) throw Error("--cloud-timeout must be positive");
  if (options_.branches < 0 || options_.branches > kMaxBranches) {
    throw Error("--branches " + std::to_string(options_.branches) + " is out of range 0.." +
                std::to_string(kMaxBranches));
  }
  // Branches are forked only by pipelined route mode against a cloud.
  const bool branching = options_.branches > 0 && options_.mode == EdgeMode::Route &&
                         options_.pipeline && cloud != nullptr;
  ContextParams context = options_.context;
  if (branching) context.n_seq = std::max(context.n_seq, 1 + options_.branches);
  ctx_ = std::make_unique<Context>(small, context);
  if (branching) {
    std::vector<int> seqs;
    for (int i = 1; i <= options_.branches; ++i) seqs.push_back(i);
    branches_ = std::make_unique<BranchSet>(*ctx_, small, router_, std::move(seqs),
                                            options_.signal_hidden, options_.top_k_signal);
  }
  if (cloud && options_.mode != EdgeMode::Local) {
    link_ = std::make_unique<CloudLink>(
        std::move(cloud), CloudLink::Options{options_.cloud_timeout_s, options_.backoff_initial_s,
                                             options_.backoff_max_s});
  }
}

EdgeDecoder::~EdgeDecoder() = default;

std::string EdgeDecoder::start() {
  start_in_background();
  await_cloud();
  return cloud_line_;
}

void EdgeDecoder::start_in_background() {
  if (options_.mode == EdgeMode::Local) {
    cloud_line_ = "local mode: the cloud is not used";
  } else if (!link_) {
    cloud_line_ = "no cloud given: decoding locally";
  } else if (cloud_line_.empty() && !connecting_) {
    link_->connect_in_background();
    connecting_ = true;
  }
}

std::optional<std::string> EdgeDecoder::cloud_line() {
  if (!poll_cloud()) return std::nullopt;
  return cloud_line_;
}

bool EdgeDecoder::poll_cloud() {
  if (connecting_ && !link_->connect_settled()) return false;
  await_cloud();
  return true;
}

void EdgeDecoder::await_cloud() {
  if (!connecting_) return;
  connecting_ = false;
  try {
    const CloudModelInfo info = link_->connect();
    // Stay within the server's limits (a request over them would only be refused).
    if (info.max_generate > 0) {
      options_.route_span = std::min(options_.route_span, info.max_generate);
      options_.cloud_chunk = std::min(options_.cloud_chunk, info.max_generate);
    }
    if (info.max_draft > 0) options_.draft = std::min(options_.draft, info.max_draft);
    cloud_line_ = "cloud: " + (info.name.empty() ? info.arch : info.name) + " (n_vocab " +
                  std::to_string(info.n_vocab) + ", vocab_hash " + info.vocab_hash + ", n_ctx " +
                  std::to_string(info.n_ctx) + ")";
  } catch (const CloudError& e) {
    cloud_line_ = std::string("cloud unavailable, decoding locally and retrying: ") + e.what();
    if (e.kind() == CloudError::Kind::Fatal) throw;
  }
}

void EdgeDecoder::ensure_local_logits() {
  const size_t n = history_.size();
  if (n == 0) throw Error("the conversation is empty: nothing to decode from");
  size_t common = 0;
  const size_t limit = std::min(local_tokens_.size(), n);
  while (common < limit && local_tokens_[common] == history_[common]) ++common;
  if (common == n && local_tokens_.size() == n && logits_pos_ == n) return;
  // Keep the common prefix, but re-run at least the last token so its logits come out.
  const size_t keep = std::min(common, n - 1);
  const auto t0 = Clock::now();
  ctx_->truncate(main_seq_, static_cast<int>(keep));
  local_tokens_.resize(keep);
  logits_pos_ = SIZE_MAX;
  if (n > static_cast<size_t>(ctx_->n_ctx())) {
    throw Error("the conversation has " + std::to_string(n) +
                " tokens, more than the context holds (-c " + std::to_string(ctx_->n_ctx()) + ")");
  }
  constexpr size_t kChunk = 512;
  std::vector<BatchToken> batch;
  size_t last = 0;  // the batch row of history_'s last token
  for (size_t b = keep; b < n; b += kChunk) {
    const size_t e = std::min(n, b + kChunk);
    batch.clear();
    for (size_t i = b; i < e; ++i) {
      batch.push_back({history_[i], static_cast<int32_t>(i), main_seq_, i + 1 == n,
                       options_.signal_hidden && i + 1 == n});
    }
    last = batch.size() - 1;
    // A one-token step carries the open branches' next tokens (the weights are read once).
    const bool step = e - keep == 1 && branches_;
    const size_t rows = step ? branches_->rows() : 0;
    if (rows > 0) branches_->add_rows(batch);
    const auto t_step = Clock::now();
    ctx_->decode(batch);
    if (rows > 0) branches_->take_rows(last + 1);
    if (step) branches_->note_step(rows, ms_since(t_step));
    local_tokens_.insert(local_tokens_.end(), history_.begin() + b, history_.begin() + e);
  }
  const auto row = ctx_->logits(static_cast<int>(last));
  logits_.assign(row.begin(), row.end());
  if (options_.signal_hidden) {
    const auto h = ctx_->hidden(static_cast<int>(last));
    hidden_.assign(h.begin(), h.end());
  }
  logits_pos_ = n;
  local_ms_ += ms_since(t0);
}

TokenId EdgeDecoder::sample_local() {
  ensure_local_logits();
  const auto t0 = Clock::now();
  const TokenId t = sampler_.sample(logits_);
  local_ms_ += ms_since(t0);
  return t;
}

float EdgeDecoder::route_score(bool* cloud, double* threshold) {
  ensure_local_logits();
  const auto t0 = Clock::now();
  RouterSignal s =
      router_signal_from_logits(logits_, static_cast<int>(history_.size()), options_.top_k_signal);
  if (options_.signal_hidden) s.hidden = hidden_;
  const RouteDecision d = router_.decide(s);
  local_ms_ += ms_since(t0);
  *cloud = d.cloud;
  *threshold = d.threshold;
  return d.score;
}

TokenId EdgeDecoder::local_top1() const {
  return argmax(logits_);
}

std::vector<TokenId> EdgeDecoder::greedy_chain(TokenId first, int n) {
  std::vector<TokenId> chain{first};
  const size_t pos = history_.size();
  while (static_cast<int>(chain.size()) < n && !model_.is_end_of_generation(chain.back())) {
    history_.push_back(chain.back());
    ensure_local_logits();
    chain.push_back(argmax(logits_));
  }
  history_.resize(pos);
  return chain;
}

void EdgeDecoder::decode_ahead(TokenId token) {
  const auto t0 = Clock::now();
  const BatchToken bt{token, static_cast<int32_t>(local_tokens_.size()), main_seq_, true};
  ctx_->decode(std::span<const BatchToken>(&bt, 1));
  local_tokens_.push_back(token);
  const auto row = ctx_->logits(0);
  logits_.assign(row.begin(), row.end());
  logits_pos_ = local_tokens_.size();
  local_ms_ += ms_since(t0);
}

void EdgeDecoder::restore(size_t pos, const Router::State& router, Sampler::State sampler) {
  history_.resize(pos);
  router_.restore(router);
  sampler_.restore(std::move(sampler));
}

void EdgeDecoder::rewind_small_model(size_t pos, std::vector<float> logits,
                                     std::vector<float> hidden) {
  if (local_tokens_.size() > pos) {
    ctx_->truncate(main_seq_, static_cast<int>(pos));
    local_tokens_.resize(pos);
  }
  if (logits.empty()) {
    logits_pos_ = SIZE_MAX;  // recomputed by ensure_local_logits when needed
    return;
  }
  logits_ = std::move(logits);
  hidden_ = std::move(hidden);
  logits_pos_ = pos;
}

namespace {

// How the earliest answer out settled. Confirmed: as guessed (the held tokens up to the next
// consultation went out). Rewound: otherwise, and the decoder went back and took the answer as
// the blocking mode does. Ended: either way, the answer ended there.
enum class Resolved { Confirmed, Rewound, Ended };

}  // namespace

// One generate() call: its result and text stream, the sync-ahead bookkeeping, and in pipelined
// mode the ledger of consultations out and tokens held back behind them (docs/client.md,
// "Pipelined routing"). Every step_*() decodes one position (or takes one cloud answer) and
// returns false when the answer -- or, with a consultation out, the assumed answer -- ends there.
//
// It reads by mode: producing tokens and asking the cloud (shared), then local, route (blocking,
// pipelined), settling the answers a pipelined mode left out, speculative, cloud, and the end of
// the call.
struct EdgeDecoder::Turn {
  using Flight = PipelineLedger::Flight;
  using Held = PipelineLedger::Held;

  Turn(EdgeDecoder& decoder, int n_predict, const EdgeTokenCallback& on_token)
      : d(decoder), n_predict(n_predict), on_token(on_token), stream(decoder.model_) {
    if (d.link_) {
      c0 = d.link_->counters();
      sync0 = d.link_->sync_steps();
      syncfail0 = d.link_->sync_failures();
      fail0 = d.link_->failures();
      cancels0 = d.link_->cancels();
      cancelled0 = d.link_->cancelled_steps();
    }
    if (d.branches_) branches0 = d.branches_->decoded();
    use_cloud = d.link_ && d.options_.mode != EdgeMode::Local;
    maybe_sync(true);  // the prompt goes up while the small model prefills it
    t_start = Clock::now();
  }

  EdgeResult run() {
    bool going = n_predict > 0;
    for (;;) {
      if (going && remaining() <= 0) {
        end(produced() >= n_predict ? StopReason::Length : StopReason::ContextFull);
        going = false;
      }
      if (!going) {
        // The answer ends here unless a consultation still out says otherwise.
        if (!ledger.in_flight()) break;
        going = resolve_earliest() == Resolved::Rewound;
        continue;
      }
      going = step();
    }
    finish();
    return std::move(res);
  }

 private:
  bool step() {
    // An answer that is in settles its position now, not at the next routed position: confirmed
    // tokens stream out at once, and fewer tokens are decoded past an answer that changes them.
    if (resolve_answered() == Resolved::Ended) return false;
    // The session's opening, once settled, brings the server's limits (or a Fatal refusal,
    // which stops the answer here).
    d.poll_cloud();
    switch (d.options_.mode) {
      case EdgeMode::Local:
        return step_local();
      case EdgeMode::Route:
        return step_route();
      case EdgeMode::Speculative:
        return step_speculative();
      case EdgeMode::Cloud:
        return step_cloud();
    }
    return false;
  }

  // ---- producing tokens (every mode) ----

  int produced() const { return static_cast<int>(res.ids.size() + ledger.held_count()); }
  int remaining() const {
    const int by_n = n_predict - produced();
    const int by_ctx = d.ctx_->n_ctx() - static_cast<int>(d.history_.size());
    return std::max(0, std::min(by_n, by_ctx));
  }
  // How the answer ends; with a consultation out only how the assumed answer would.
  void end(StopReason why) {
    if (ledger.in_flight()) {
      ledger.hold_stop(why);
    } else {
      res.stop = why;
    }
  }

  // Appends one produced token to the conversation and publishes it, or holds it back while a
  // consultation is out; false when generation ends here.
  bool emit(TokenId id, TokenSource source, float score, TokenId edge_top1 = -1,
            bool fallback = false) {
    if (d.model_.is_end_of_generation(id)) {
      end(StopReason::EndOfGeneration);
      return false;
    }
    d.history_.push_back(id);
    d.sampler_.accept(id);
    const EdgeToken token{id, source, score, edge_top1, fallback, decided_threshold};
    if (ledger.in_flight()) {
      ledger.hold(Held{token, d.router_.state(), d.sampler_.state(), d.history_.size()});
    } else if (!publish(token)) {
      res.stop = StopReason::Callback;
      return false;
    }
    if (produced() >= n_predict) {
      end(StopReason::Length);
      return false;
    }
    if (d.history_.size() >= static_cast<size_t>(d.ctx_->n_ctx())) {
      end(StopReason::ContextFull);
      return false;
    }
    return true;
  }

  // Hands a token to the result and the callback; false when the callback stops the answer.
  bool publish(const EdgeToken& t) {
    if (res.ids.empty()) st.ttft_ms = ms_since(t_start);
    res.ids.push_back(t.id);
    res.sources.push_back(t.source);
    res.scores.push_back(t.score);
    if (t.source == TokenSource::Cloud) ++st.cloud_tokens;
    const std::string piece = stream.push(t.id);
    res.text += piece;
    return !on_token || on_token(t, piece);
  }

  // A locally decided token (a fallback when the cloud was asked and failed).
  bool emit_local(float score, bool fallback) {
    const bool going = emit(d.sample_local(), TokenSource::Local, score, -1, fallback);
    if (going) maybe_sync(false);
    return going;
  }

  // Emits a cloud answer's tokens; the first `n_local_prefix` are the device's own (accepted
  // drafts). `edge_guess` is the small model's greedy token at the first cloud-decided position
  // (-1: unknown).
  bool emit_cloud(std::span<const TokenId> tokens, float score, int n_local_prefix,
                  TokenId edge_guess) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const bool local = static_cast<int>(i) < n_local_prefix;
      const TokenId guess = static_cast<int>(i) == n_local_prefix ? edge_guess : -1;
      if (!emit(tokens[i], local ? TokenSource::Local : TokenSource::Cloud, score, guess)) {
        return false;
      }
    }
    return true;
  }

  // ---- asking the cloud (every mode but local) ----

  void maybe_sync(bool force) {
    // While a consultation is out, it carries the history, and what lies past it is unsettled.
    if (!use_cloud || !d.options_.sync_ahead || ledger.in_flight()) return;
    if (!force && d.history_.size() < synced + static_cast<size_t>(d.options_.sync_every)) return;
    d.link_->sync(d.history_);
    synced = d.history_.size();
  }

  CloudOp generate_op(int n) const {
    CloudOp op;
    op.kind = CloudOpKind::Generate;
    op.n_generate = n;
    op.sampling = d.options_.sampling;
    op.send_seed = d.options_.sampling.seed != kRandomSeed;
    return op;
  }

  void note_failure(const std::string& why) {
    st.last_cloud_error = why;
    if (cloud_warned++ == 0 && !why.empty()) {
      std::fprintf(stderr, "tandem: cloud: %s; decoding locally\n", why.c_str());
    }
  }
  void note_answer(const CloudStepResult& r) {
    ++st.route_events;
    st.prefilled_on_route += r.prefilled;
  }
  void count_agreement(bool same) { ++(same ? st.route_confirmed : st.route_changed); }

  // A consultation the decoder waits for; nullopt (the caller counts a fallback) on failure.
  std::optional<CloudStepResult> consult(const CloudOp& op) {
    const auto t0 = Clock::now();
    std::string why;
    auto r = d.link_->request(d.history_, op, &why);
    const double ms = ms_since(t0);
    st.cloud_ms += ms;
    st.wait_ms += ms;
    if (!r) {
      note_failure(why);
      return std::nullopt;
    }
    note_answer(*r);
    return r;
  }

  // ---- local mode ----

  bool step_local() { return emit(d.sample_local(), TokenSource::Local, 0.0f); }

  // ---- route mode, blocking ----

  // One position: the router decides; the cloud's answer or the device's own token goes in.
  bool step_route() {
    bool to_cloud = false;
    const float score = d.route_score(&to_cloud, &decided_threshold);
    if (!to_cloud) {
      d.router_.record(false, 1);
      return emit_local(score, false);
    }
    // Another routed position while answers are out goes out too when the link can take it;
    // otherwise it waits for the earliest. That answer either stands (this position then goes
    // out as usual) or rewinds past this position (this decision was then never taken).
    while (ledger.in_flight() && !room_for_another()) {
      const Resolved first = resolve_earliest();
      if (first != Resolved::Confirmed) return first == Resolved::Rewound;
    }
    const TokenId edge_guess = d.local_top1();  // route_score left the logits current
    // A one-token op is within any server's limits, so it need not wait for the session's
    // opening: it queues behind it on the link while a pipelined decoder goes on. A longer
    // span first learns the server's limits.
    if (d.options_.route_span > 1) d.await_cloud();
    const CloudOp op = generate_op(std::min(d.options_.route_span, remaining()));
    if (!d.link_) return take_answer(std::nullopt, score, edge_guess);
    if (d.options_.pipeline) return route_ahead(op, score, edge_guess);
    const std::optional<CloudStepResult> r = consult(op);
    if (r) count_agreement(!r->tokens.empty() && r->tokens[0] == edge_guess);
    return take_answer(r, score, edge_guess);
  }

  // A route event's outcome as blocking route mode takes it: the cloud's tokens, or (nullopt) a
  // fallback to the device's own token.
  bool take_answer(const std::optional<CloudStepResult>& r, float score, TokenId edge_guess) {
    if (r) {
      d.router_.record(true, static_cast<int>(r->tokens.size()));
      return emit_cloud(r->tokens, score, 0, edge_guess);
    }
    ++st.fallbacks;
    d.router_.record(false, 1);
    return emit_local(score, true);
  }

  // ---- route mode, pipelined ----

  // Consultations out at once, at most: a sync and this many fill a server's session queue.
  static constexpr size_t kMaxFlights = 2;
  bool room_for_another() const {
    return ledger.flights_out() < kMaxFlights && d.link_->can_begin_another();
  }

  // The request goes out and the decoder goes on as if the cloud answered the device's own
  // greedy continuation, holding its tokens and every later one back until the answer is in.
  // The snapshot is taken before the continuation is decoded (that moves the logits on).
  bool route_ahead(const CloudOp& op, float score, TokenId edge_guess) {
    Flight f{.pos = d.history_.size(),
             .router = d.router_.state(),
             .sampler = d.sampler_.state(),
             .logits = d.logits_,
             .hidden = d.hidden_,
             .score = score,
             .threshold = decided_threshold,
             .edge_guess = edge_guess};
    f.guess = d.greedy_chain(edge_guess, op.n_generate);
    std::string why;
    f.ticket = d.link_->begin(d.history_, op, f.guess, &why);
    if (f.ticket == 0) {
      note_failure(why);
      return take_answer(std::nullopt, score, edge_guess);
    }
    f.sent = Clock::now();
    const Flight& out = ledger.send(std::move(f));
    d.router_.record(true, static_cast<int>(out.guess.size()));
    fork_branches(out, op.n_generate);
    return emit_cloud(out.guess, score, 0, edge_guess);
  }

  // The small model's other choices at the flight's position go on side by side with its guess
  // (BranchSet), when no earlier consultation's branches are still going. The router's state is
  // the blocking decoder's after a one-token answer; the logits are still those at the position.
  void fork_branches(const Flight& f, int n_generate) {
    if (!d.branches_ || d.branches_->active() || n_generate != 1 || !d.sampler_.greedy()) return;
    const size_t n = d.options_.branches_fixed ? static_cast<size_t>(d.options_.branches)
                                               : d.branches_->worth_forking();
    if (n == 0) return;
    d.branches_->fork(f.ticket, d.history_, d.main_seq_, d.logits_, f.edge_guess, d.router_.state(),
                      d.history_.size() + static_cast<size_t>(remaining()), n);
  }

  // The answer to f is the alternative a branch took: the decoder takes that line over -- its
  // KV slot, its logits, the tokens it produced past the answer, each with the router's state
  // after its decision -- as if it had decoded them itself. False when the answer ends there.
  bool take_over_branch(const Flight& f, const CloudStepResult& r) {
    if (!d.branches_ || r.tokens.size() != 1) return true;
    std::optional<BranchSet::Takeover> t =
        d.branches_->take_over(f.ticket, r.tokens[0], d.main_seq_, d.local_tokens_);
    if (!t) return true;
    d.main_seq_ = t->seq;
    d.logits_pos_ = t->logits.empty() ? SIZE_MAX : d.local_tokens_.size();
    d.logits_ = std::move(t->logits);
    d.hidden_ = std::move(t->hidden);
    st.branch_kept += static_cast<int>(d.local_tokens_.size() - f.pos);
    for (const BranchSet::Produced& p : t->produced) {
      d.router_.restore(p.router);
      decided_threshold = p.token.threshold;
      if (!emit(p.token.id, TokenSource::Local, p.token.score)) return false;
    }
    maybe_sync(false);
    return true;
  }

  // ---- settling the answers out (pipelined route and speculative modes) ----

  // Settles the answers already in, earliest first; the first outcome other than Confirmed, or
  // nullopt when every one was confirmed (or none is in).
  std::optional<Resolved> resolve_answered() {
    while (ledger.in_flight() && d.link_->answered(ledger.earliest().ticket)) {
      const Resolved r = resolve_earliest();
      if (r != Resolved::Confirmed) return r;
    }
    return std::nullopt;
  }

  // Waits for the earliest answer out. The tokens assumed: the held tokens it settles are
  // published (Confirmed, or Ended when the assumed answer ended there or the callback stopped
  // it). Otherwise -- other tokens, or no answer -- see take_instead.
  Resolved resolve_earliest() {
    Flight f = ledger.take_earliest();
    std::string why;
    const auto t0 = Clock::now();
    const std::optional<CloudStepResult> r = d.link_->wait(f.ticket, &why);
    st.wait_ms += ms_since(t0);
    st.cloud_ms += ms_since(f.sent);
    if (!r) {
      note_failure(why);
      if (d.branches_) d.branches_->drop();
      return take_instead(std::move(f), r);
    }
    note_answer(*r);
    count_agreement(r->tokens == f.guess);
    if (!f.drafts.empty()) st.accepted_drafts += r->accepted;
    if (d.branches_ && !f.logits.empty() && !r->tokens.empty()) {
      d.branches_->note_answer(f.logits, r->tokens[0]);
    }
    const uint64_t ticket = f.ticket;
    const Resolved out = r->tokens != f.guess ? take_instead(std::move(f), r)
                         : publish_settled()  ? Resolved::Confirmed
                                              : Resolved::Ended;
    // Branches answer for one consultation; a rewind also voids every later one.
    if (d.branches_ && (out != Resolved::Confirmed || d.branches_->ticket() == ticket)) {
      d.branches_->drop();
    }
    return out;
  }

  // The answer to f is not its guess (or none came): everything goes back to f's position, the
  // later consultations are dropped, and the answer -- or, when the cloud failed, the device's
  // fallback token -- goes in as the blocking mode takes it (Rewound, or Ended when that ends
  // the answer). The tokens decoded past f that this undoes are wasted.
  Resolved take_instead(Flight f, const std::optional<CloudStepResult>& r) {
    const std::vector<TokenId> ahead(d.history_.begin() + static_cast<std::ptrdiff_t>(f.pos),
                                     d.history_.end());
    abandon(ledger.drop_all());
    d.restore(f.pos, f.router, std::move(f.sampler));
    // Route mode kept the logits at f.pos; speculative mode did not (drafting moved them on).
    d.rewind_small_model(f.pos, std::move(f.logits), std::move(f.hidden));
    decided_threshold = f.threshold;
    bool going =
        f.drafts.empty() ? take_answer(r, f.score, f.edge_guess) : take_verdict(r, f.drafts);
    if (going && r && f.drafts.empty()) going = take_over_branch(f, *r);
    count_wasted(ahead, f.pos);
    return going ? Resolved::Rewound : Resolved::Ended;
  }

  // After an answer that agreed: publishes the held tokens it settles, in order; false when the
  // answer ends with them (the assumed answer ended there, or the callback stopped it at one:
  // the decoder is then put back to just after that token, where the blocking mode would have
  // stopped, and every token held after it is wasted).
  bool publish_settled() {
    std::vector<Held> settled = ledger.take_settled();
    for (size_t i = 0; i < settled.size(); ++i) {
      if (publish(settled[i].token)) continue;
      d.restore(settled[i].history_len, settled[i].router, std::move(settled[i].sampler));
      st.wasted_tokens += static_cast<int>(settled.size() - i - 1 + ledger.held_count());
      abandon(ledger.drop_all());
      res.stop = StopReason::Callback;
      return false;
    }
    const std::optional<StopReason> stop = ledger.take_settled_stop();
    if (stop) res.stop = *stop;
    return !stop;
  }

  // Consultations built on a guess that did not hold: nobody waits for them.
  void abandon(const std::vector<uint64_t>& tickets) {
    for (const uint64_t ticket : tickets) d.link_->abandon(ticket);
  }

  // Tokens decoded past `pos` (`ahead`) that the conversation no longer holds after a rewind.
  void count_wasted(const std::vector<TokenId>& ahead, size_t pos) {
    size_t kept = 0;
    while (kept < ahead.size() && pos + kept < d.history_.size() &&
           d.history_[pos + kept] == ahead[kept]) {
      ++kept;
    }
    st.wasted_tokens += static_cast<int>(ahead.size() - kept);
  }

  // ---- speculative mode ----

  // One block: the small model drafts, the cloud verifies (blocking), or -- pipelined -- the
  // block goes out and the device goes on as if every draft and its own next token were taken,
  // drafting the next block while this one is verified (docs/client.md, "Pipelined routing").
  bool step_speculative() {
    d.await_cloud();
    if (!ledger.in_flight() && !(d.link_ && d.link_->ready())) {
      return take_verdict(std::nullopt, {});
    }
    // With blocks out, this one is drafted before anything is waited for; the drafts of a block
    // that an answer rewinds past go with the rewind (the KV is cut back).
    std::optional<Resolved> settled;
    std::vector<TokenId> drafts = draft(remaining(), &settled);
    if (settled) return *settled == Resolved::Rewound;
    const bool chains = !drafts.empty() && !d.model_.is_end_of_generation(drafts.back());
    while (ledger.in_flight() && !(chains && room_for_another())) {
      const Resolved first = resolve_earliest();
      if (first != Resolved::Confirmed) return first == Resolved::Rewound;
      if (!ledger.in_flight() && !d.link_->ready()) return take_verdict(std::nullopt, {});
    }
    return verify(std::move(drafts), chains);
  }

  // Greedy drafts from the small model, at most room - 1 so that the cloud's extra token still
  // fits; the drafts run ahead in the local KV (kept when accepted). With blocks out, an answer
  // that comes in is settled between two drafts, so that a changed block throws away at most
  // one draft decoded after its answer; when it rewinds or ends the answer, that outcome is in
  // *settled and the drafts are void.
  std::vector<TokenId> draft(int room, std::optional<Resolved>* settled) {
    d.ensure_local_logits();
    const int n_draft = std::min(d.options_.draft, room - 1);
    std::vector<TokenId> drafts;
    for (int i = 0; i < n_draft; ++i) {
      const TokenId t = d.local_top1();
      drafts.push_back(t);
      if (d.model_.is_end_of_generation(t) || i + 1 == n_draft) break;
      d.decode_ahead(t);
      *settled = resolve_answered();
      if (*settled) return {};
    }
    return drafts;
  }

  // The block drafted goes to the cloud: verified blocking, or sent ahead when the next block
  // can chain on it (no drafts: the cloud decides the position alone).
  bool verify(std::vector<TokenId> drafts, bool chains) {
    if (drafts.empty()) return take_verdict(consult(generate_op(1)), {});
    st.drafted += static_cast<int>(drafts.size());
    CloudOp op;
    op.kind = CloudOpKind::Verify;
    op.draft = drafts;
    if (d.options_.pipeline && chains) return verify_ahead(op, std::move(drafts));
    const std::optional<CloudStepResult> r = consult(op);
    if (r) st.accepted_drafts += r->accepted;
    return take_verdict(r, drafts);
  }

  // A verification's outcome as blocking speculative mode takes it: the accepted drafts and the
  // cloud's token, or (nullopt) a fallback to the device's own token.
  bool take_verdict(const std::optional<CloudStepResult>& r, const std::vector<TokenId>& drafts) {
    if (r) {
      const TokenId edge_guess =
          r->accepted < static_cast<int>(drafts.size()) ? drafts[r->accepted] : -1;
      return emit_cloud(r->tokens, 0.0f, r->accepted, edge_guess);
    }
    ++st.fallbacks;
    return emit(d.sample_local(), TokenSource::Local, 0.0f, -1, true);
  }

  // Pipelined: sends the block and goes on as if the cloud took every draft and then answered
  // the small model's own next token, holding those tokens back until the verdict is in. The
  // snapshot is the decoder before the drafts (f.pos), for a verdict that differs.
  bool verify_ahead(const CloudOp& op, std::vector<TokenId> drafts) {
    const size_t pos = d.history_.size();
    // The logits at pos are not kept (drafting moved them on): a rewind recomputes them.
    Flight f{.pos = pos,
             .router = d.router_.state(),
             .sampler = d.sampler_.state(),
             .threshold = decided_threshold};
    // The block goes out before the last draft is decoded (that decode would only delay it);
    // the small model's next token then completes the guess, here and on the link.
    std::string why;
    f.ticket = d.link_->begin(d.history_, op, drafts, &why);
    if (f.ticket == 0) {
      note_failure(why);
      return take_verdict(std::nullopt, drafts);
    }
    d.history_.insert(d.history_.end(), drafts.begin(), drafts.end());
    d.ensure_local_logits();  // decodes the last draft: the small model's next token
    f.guess = drafts;
    f.guess.push_back(d.local_top1());
    d.link_->extend_guess(f.ticket, f.guess.back());
    d.history_.resize(pos);
    f.drafts = std::move(drafts);
    f.sent = Clock::now();
    const Flight& out = ledger.send(std::move(f));
    return emit_cloud(out.guess, 0.0f, static_cast<int>(out.drafts.size()), -1);
  }

  // ---- cloud mode ----

  bool step_cloud() {
    std::optional<CloudStepResult> r;
    d.await_cloud();
    if (d.link_ && d.link_->ready()) {
      // Small first steps so the first token streams early, then full chunks.
      const int chunk = std::min(d.options_.cloud_chunk, 1 << std::min(st.route_events, 16));
      r = consult(generate_op(std::min(chunk, remaining())));
    }
    if (r) return emit_cloud(r->tokens, 1.0f, 0, -1);
    ++st.fallbacks;
    return emit(d.sample_local(), TokenSource::Local, 0.0f, -1, true);
  }

  // ---- the end: the text's tail and this call's stats ----

  void finish() {
    // A consultation that failed because the session was refused (a Fatal error) has settled
    // the opening by now: the refusal stops the answer even when no step came after it.
    d.poll_cloud();
    const std::string tail = stream.flush();
    res.text += tail;
    if (on_token && !tail.empty()) on_token(EdgeToken{-1, TokenSource::Local, 0.0f}, tail);
    st.total_ms = ms_since(t_start);
    st.local_ms = d.local_ms_;
    st.tokens = static_cast<int>(res.ids.size());
    st.cloud_share = st.tokens ? static_cast<double>(st.cloud_tokens) / st.tokens : 0.0;
    st.tok_s = st.total_ms > 0 ? 1000.0 * st.tokens / st.total_ms : 0.0;
    if (!d.link_) {
      st.cloud_lost = d.options_.mode != EdgeMode::Local;
      return;
    }
    const CloudCounters c1 = d.link_->counters();
    st.bytes_up = c1.bytes_up - c0.bytes_up;
    st.bytes_down = c1.bytes_down - c0.bytes_down;
    st.replays = c1.replays - c0.replays;
    st.chained_steps = c1.chained_steps - c0.chained_steps;
    st.sync_steps = d.link_->sync_steps() - sync0;
    st.sync_failures = d.link_->sync_failures() - syncfail0;
    st.cloud_failures = d.link_->failures() - fail0;
    st.cancels = d.link_->cancels() - cancels0;
    if (d.branches_) st.branch_tokens = static_cast<int>(d.branches_->decoded() - branches0);
    st.cancelled_steps = d.link_->cancelled_steps() - cancelled0;
    st.cloud_lost = d.link_->disabled() || (st.fallbacks > 0 && st.route_events == 0);
    if (st.last_cloud_error.empty() && st.cloud_failures > 0) {
      st.last_cloud_error = d.link_->last_error();
    }
  }

  EdgeDecoder& d;
  const int n_predict;
  const EdgeTokenCallback& on_token;
  EdgeResult res;
  EdgeStats& st = res.stats;
  TextStream stream;
  Clock::time_point t_start;
  CloudCounters c0;
  int sync0 = 0, syncfail0 = 0, fail0 = 0, cancels0 = 0, cancelled0 = 0;
  uint64_t branches0 = 0;
  bool use_cloud = false;
  size_t synced = 0;  // history length last pushed
  int cloud_warned = 0;
  // The threshold the current route decision was taken against; every token it produces carries
  // it (EdgeToken::threshold). Stays NaN outside route mode.
  double decided_threshold = std::numeric_limits<double>::quiet_NaN();
  PipelineLedger ledger;  // pipelined: the consultations out and the tokens held behind them
};

EdgeResult EdgeDecoder::generate(std::span<const TokenId> context, int n_predict,
                                 const EdgeTokenCallback& on_token) {
  if (context.empty()) throw Error("generate: the prompt is empty (no tokens to start from)");
  if (context.size() >= static_cast<size_t>(ctx_->n_ctx())) {
    throw Error("the prompt has " + std::to_string(context.size()) +
                " tokens but the context holds " + std::to_string(ctx_->n_ctx()) + " (-c)");
  }
  // A context that does not continue the conversation starts another one: a fresh cloud session
  // (not a replay: nothing was lost).
  const bool continues = context.size() >= history_.size() &&
                         std::equal(history_.begin(), history_.end(), context.begin());
  if (!continues && link_) link_->new_conversation();
  history_.assign(context.begin(), context.end());
  for (TokenId t : context) sampler_.accept(t);
  local_ms_ = 0;
  Turn turn(*this, n_predict, on_token);
  return turn.run();
}

}  // namespace tandem
