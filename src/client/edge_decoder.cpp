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

#include "client/cloud_link.h"
#include "common/error.h"
#include "tandem/client.h"
#include "tandem/vector_ops.h"

namespace tandem {

using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

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
  ctx_ = std::make_unique<Context>(small, options_.context);
  if (cloud && options_.mode != EdgeMode::Local) {
    link_ = std::make_unique<CloudLink>(
        std::move(cloud), CloudLink::Options{options_.cloud_timeout_s, options_.backoff_initial_s,
                                             options_.backoff_max_s});
  }
}

EdgeDecoder::~EdgeDecoder() = default;

std::string EdgeDecoder::start() {
  if (options_.mode == EdgeMode::Local) return "local mode: the cloud is not used";
  if (!link_) return "no cloud given: decoding locally";
  try {
    const CloudModelInfo info = link_->connect();
    // Stay within the server's limits (a request over them would only be refused).
    if (info.max_generate > 0) {
      options_.route_span = std::min(options_.route_span, info.max_generate);
      options_.cloud_chunk = std::min(options_.cloud_chunk, info.max_generate);
    }
    if (info.max_draft > 0) options_.draft = std::min(options_.draft, info.max_draft);
    return "cloud: " + (info.name.empty() ? info.arch : info.name) + " (n_vocab " +
           std::to_string(info.n_vocab) + ", vocab_hash " + info.vocab_hash + ", n_ctx " +
           std::to_string(info.n_ctx) + ")";
  } catch (const CloudError& e) {
    if (e.kind() == CloudError::Kind::Fatal) throw;
    return std::string("cloud unavailable, decoding locally and retrying: ") + e.what();
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
  ctx_->truncate(0, static_cast<int>(keep));
  local_tokens_.resize(keep);
  logits_pos_ = SIZE_MAX;
  if (n > static_cast<size_t>(ctx_->n_ctx())) {
    throw Error("the conversation has " + std::to_string(n) +
                " tokens, more than the context holds (-c " + std::to_string(ctx_->n_ctx()) + ")");
  }
  constexpr size_t kChunk = 512;
  std::vector<BatchToken> batch;
  for (size_t b = keep; b < n; b += kChunk) {
    const size_t e = std::min(n, b + kChunk);
    batch.clear();
    for (size_t i = b; i < e; ++i) {
      batch.push_back({history_[i], static_cast<int32_t>(i), 0, i + 1 == n,
                       options_.signal_hidden && i + 1 == n});
    }
    ctx_->decode(batch);
    local_tokens_.insert(local_tokens_.end(), history_.begin() + b, history_.begin() + e);
  }
  const auto row = ctx_->logits(static_cast<int>(batch.size()) - 1);
  logits_.assign(row.begin(), row.end());
  if (options_.signal_hidden) {
    const auto h = ctx_->hidden(static_cast<int>(batch.size()) - 1);
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
  *threshold = router_.threshold();  // before decide(): a target-rate controller moves it there
  const RouteDecision d = router_.decide(s);
  local_ms_ += ms_since(t0);
  *cloud = d.cloud;
  return d.score;
}

EdgeResult EdgeDecoder::generate(std::span<const TokenId> context, int n_predict,
                                 const EdgeTokenCallback& on_token) {
  EdgeResult res;
  EdgeStats& st = res.stats;
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

  const CloudCounters c0 = link_ ? link_->counters() : CloudCounters{};
  const int sync0 = link_ ? link_->sync_steps() : 0, syncfail0 = link_ ? link_->sync_failures() : 0;
  const int fail0 = link_ ? link_->failures() : 0;
  local_ms_ = 0;
  const bool use_cloud = link_ && options_.mode != EdgeMode::Local;
  // The prompt goes up while the small model prefills it.
  size_t synced = 0;  // history length last pushed
  auto maybe_sync = [&](bool force) {
    if (!use_cloud || !options_.sync_ahead) return;
    if (!force && history_.size() < synced + static_cast<size_t>(options_.sync_every)) return;
    link_->sync(history_);
    synced = history_.size();
  };
  maybe_sync(true);

  const auto t_start = Clock::now();
  TextStream stream(model_);
  bool stopped = false;
  int cloud_warned = 0;
  // The threshold the current route decision was taken against; every token it produces carries
  // it (EdgeToken::threshold). Stays NaN outside route mode.
  double decided_threshold = std::numeric_limits<double>::quiet_NaN();

  // Appends one produced token; false when generation ends here.
  auto emit = [&](TokenId id, TokenSource source, float score, TokenId edge_top1 = -1,
                  bool fallback = false) -> bool {
    if (model_.is_end_of_generation(id)) {
      res.stop = StopReason::EndOfGeneration;
      return false;
    }
    if (res.ids.empty()) st.ttft_ms = ms_since(t_start);
    history_.push_back(id);
    sampler_.accept(id);
    res.ids.push_back(id);
    res.sources.push_back(source);
    res.scores.push_back(score);
    if (source == TokenSource::Cloud) ++st.cloud_tokens;
    const std::string piece = stream.push(id);
    res.text += piece;
    if (on_token &&
        !on_token(EdgeToken{id, source, score, edge_top1, fallback, decided_threshold}, piece)) {
      res.stop = StopReason::Callback;
      return false;
    }
    if (static_cast<int>(res.ids.size()) >= n_predict) {
      res.stop = StopReason::Length;
      return false;
    }
    if (history_.size() >= static_cast<size_t>(ctx_->n_ctx())) {
      res.stop = StopReason::ContextFull;
      return false;
    }
    return true;
  };
  // A consultation; nullopt (with a fallback counted by the caller) when the cloud fails.
  auto consult = [&](const CloudOp& op) -> std::optional<CloudStepResult> {
    const auto t0 = Clock::now();
    std::string why;
    auto r = link_->request(history_, op, &why);
    st.cloud_ms += ms_since(t0);
    if (!r) {
      st.last_cloud_error = why;
      if (cloud_warned++ == 0 && !why.empty()) {
        std::fprintf(stderr, "tandem: cloud: %s; decoding locally\n", why.c_str());
      }
      return std::nullopt;
    }
    ++st.route_events;
    st.prefilled_on_route += r->prefilled;
    return r;
  };
  auto remaining = [&] {
    const int by_n = n_predict - static_cast<int>(res.ids.size());
    const int by_ctx = ctx_->n_ctx() - static_cast<int>(history_.size());
    return std::max(0, std::min(by_n, by_ctx));
  };
  auto cloud_generate_op = [&](int n) {
    CloudOp op;
    op.kind = CloudOpKind::Generate;
    op.n_generate = n;
    op.sampling = options_.sampling;
    op.send_seed = options_.sampling.seed != kRandomSeed;
    return op;
  };
  // Emits a cloud answer's tokens; false when generation ended. `edge_guess` is the small
  // model's greedy token at the first cloud-decided position (-1: unknown).
  auto emit_cloud = [&](const CloudStepResult& r, float score, int n_local_prefix,
                        TokenId edge_guess) -> bool {
    for (size_t i = 0; i < r.tokens.size(); ++i) {
      const bool local = static_cast<int>(i) < n_local_prefix;
      const TokenId guess = static_cast<int>(i) == n_local_prefix ? edge_guess : -1;
      if (!emit(r.tokens[i], local ? TokenSource::Local : TokenSource::Cloud, score, guess)) {
        return false;
      }
    }
    return true;
  };

  if (n_predict <= 0) stopped = true;
  while (!stopped) {
    if (remaining() <= 0) {
      res.stop = static_cast<int>(res.ids.size()) >= n_predict ? StopReason::Length
                                                               : StopReason::ContextFull;
      break;
    }
    switch (options_.mode) {
      case EdgeMode::Local: {
        stopped = !emit(sample_local(), TokenSource::Local, 0.0f);
        break;
      }
      case EdgeMode::Route: {
        bool to_cloud = false;
        const float score = route_score(&to_cloud, &decided_threshold);
        if (to_cloud) {
          std::optional<CloudStepResult> r;
          const TokenId edge_guess = argmax(logits_);  // route_score left the logits current
          if (link_) r = consult(cloud_generate_op(std::min(options_.route_span, remaining())));
          if (r) {
            router_.record(true, static_cast<int>(r->tokens.size()));
            stopped = !emit_cloud(*r, score, 0, edge_guess);
            break;
          }
          ++st.fallbacks;
        }
        router_.record(false, 1);
        stopped = !emit(sample_local(), TokenSource::Local, score, -1, to_cloud);
        if (!stopped) maybe_sync(false);
        break;
      }
      case EdgeMode::Speculative: {
        std::optional<CloudStepResult> r;
        const int room = remaining();
        std::vector<TokenId> drafts;
        if (link_ && link_->ready()) {
          // Greedy drafts from the small model, at most room - 1 so that the cloud's extra token
          // still fits; the drafts run ahead in the local KV (kept when accepted).
          ensure_local_logits();
          const int n_draft = std::min(options_.draft, room - 1);
          const auto t0 = Clock::now();
          for (int i = 0; i < n_draft; ++i) {
            const TokenId d = argmax(logits_);
            drafts.push_back(d);
            if (model_.is_end_of_generation(d) || i + 1 == n_draft) break;
            const BatchToken bt{d, static_cast<int32_t>(local_tokens_.size()), 0, true};
            ctx_->decode(std::span<const BatchToken>(&bt, 1));
            local_tokens_.push_back(d);
            const auto row = ctx_->logits(0);
            logits_.assign(row.begin(), row.end());
            logits_pos_ = local_tokens_.size();
          }
          local_ms_ += ms_since(t0);
          if (drafts.empty()) {
            r = consult(cloud_generate_op(1));
          } else {
            CloudOp op;
            op.kind = CloudOpKind::Verify;
            op.draft = drafts;
            st.drafted += static_cast<int>(drafts.size());
            r = consult(op);
            if (r) st.accepted_drafts += r->accepted;
          }
        }
        if (r) {
          const TokenId edge_guess =
              r->accepted < static_cast<int>(drafts.size()) ? drafts[r->accepted] : -1;
          stopped = !emit_cloud(*r, 0.0f, r->accepted, edge_guess);
          break;
        }
        ++st.fallbacks;
        stopped = !emit(sample_local(), TokenSource::Local, 0.0f, -1, true);
        break;
      }
      case EdgeMode::Cloud: {
        std::optional<CloudStepResult> r;
        if (link_ && link_->ready()) {
          // Small first steps so the first token streams early, then full chunks.
          const int chunk = std::min(options_.cloud_chunk, 1 << std::min(st.route_events, 16));
          r = consult(cloud_generate_op(std::min(chunk, remaining())));
        }
        if (r) {
          stopped = !emit_cloud(*r, 1.0f, 0, -1);
          break;
        }
        ++st.fallbacks;
        stopped = !emit(sample_local(), TokenSource::Local, 0.0f, -1, true);
        break;
      }
    }
  }
  const std::string tail = stream.flush();
  res.text += tail;
  if (on_token && !tail.empty()) on_token(EdgeToken{-1, TokenSource::Local, 0.0f}, tail);

  st.total_ms = ms_since(t_start);
  st.local_ms = local_ms_;
  st.tokens = static_cast<int>(res.ids.size());
  st.cloud_share = st.tokens ? static_cast<double>(st.cloud_tokens) / st.tokens : 0.0;
  st.tok_s = st.total_ms > 0 ? 1000.0 * st.tokens / st.total_ms : 0.0;
  if (link_) {
    const CloudCounters c1 = link_->counters();
    st.bytes_up = c1.bytes_up - c0.bytes_up;
    st.bytes_down = c1.bytes_down - c0.bytes_down;
    st.replays = c1.replays - c0.replays;
    st.sync_steps = link_->sync_steps() - sync0;
    st.sync_failures = link_->sync_failures() - syncfail0;
    st.cloud_failures = link_->failures() - fail0;
    st.cloud_lost = link_->disabled() || (st.fallbacks > 0 && st.route_events == 0);
    if (st.last_cloud_error.empty() && st.cloud_failures > 0)
      st.last_cloud_error = link_->last_error();
  } else {
    st.cloud_lost = options_.mode != EdgeMode::Local;
  }
  return res;
}

}  // namespace tandem
