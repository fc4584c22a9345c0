// Stateless completions: OpenAI /v1/completions and /v1/chat/completions, llama.cpp /completion,
// SGLang /generate (docs/server.md). One job type; the dialects differ in how they read the
// request and write the answer, whole or streamed as server-sent events.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "runtime/model_internals.h"
#include "server/api_internal.h"
#include "server/completion_request.h"
#include "server/random_id.h"
#include "tokenizer/chat_template.h"

namespace tandem::server {

namespace {

// ---------------------------------------------------------------------------------------------
// The job: feeds the prompt (the rows whose prompt log-probabilities were asked for with
// logits), then generates one token per engine iteration until a stop, the token budget, the
// context or the time budget ends it; answers whole at the end or streams as it goes.

class CompletionJob : public Job {
 public:
  CompletionJob(const Model& model, Metrics& metrics, std::shared_ptr<Responder> res,
                CompletionRequest req, int n_ctx)
      : tok_(ModelInternals::tokenizer(model)),
        metrics_(metrics),
        res_(std::move(res)),
        req_(std::move(req)),
        sampler_(req_.sampling),
        stream_(tok_),
        n_ctx_(n_ctx) {
    prefix_key = req_.prompt;
    reserve_tokens = req_.max_tokens;
    if (req_.prompt_logprobs_from >= 0) {
      // Logits of position i-1 give the log-probability of prompt token i: those rows must run.
      max_reuse = static_cast<size_t>(std::max(0, req_.prompt_logprobs_from - 1));
    }
    for (TokenId t : req_.prompt) sampler_.accept(t);
    created_ = unix_now();
    id_ = make_id();
    for (const auto& s : req_.stop) max_stop_ = std::max(max_stop_, s.size());
  }

  void on_admit() override {
    const size_t n = req_.prompt.size();
    for (size_t i = static_cast<size_t>(cached); i < n; ++i) {
      const bool prompt_row = req_.prompt_logprobs_from >= 0 &&
                              static_cast<int>(i) + 1 >= req_.prompt_logprobs_from && i + 1 < n;
      feed.push_back({req_.prompt[i], prompt_row || i + 1 == n});
    }
    prompt_lp_.assign(n, std::nullopt);
    if (req_.stream) start_stream();
  }

  void on_logits(size_t index, std::span<const float> logits) override {
    const size_t n = req_.prompt.size();
    if (generated_.empty() && cached + index + 1 < n) {
      record_prompt_row(cached + index + 1, logits);
      return;
    }
    if (req_.max_tokens == 0) {  // prompt log-probabilities (echo) only
      finish_ = "length";
      return;
    }
    generate(logits);
  }

  // Streaming or not, a request whose client hung up is dropped, queued or running.
  bool abandoned() const override { return !res_->alive(); }

  bool on_feed_done() override {
    if (!finish_.empty()) return false;
    if (static_cast<int>(generated_.size()) >= req_.max_tokens) {
      finish_ = "length";
      return false;
    }
    if (static_cast<int>(req_.prompt.size() + generated_.size()) >= n_ctx_) {
      finish_ = "length";
      return false;
    }
    if (Clock::now() >= req_.deadline) {  // the per-request time budget (--max-request-time)
      finish_ = "length";
      return false;
    }
    feed.assign(1, {generated_.back(), true});
    fed = 0;
    return true;
  }

  void on_finish(JobFailure failure, const std::string& message) override {
    if (failure != JobFailure::None) return answer_failure(failure, message);
    if (finish_.empty()) finish_ = "length";
    if (finish_ != "stop" || stop_word_.empty()) {
      text_ += stream_.flush();
    }
    metrics_.generated_tokens += generated_.size();
    if (req_.stream) {
      flush_text(true);
      finish_stream();
    } else {
      send_json(*res_, 200, whole_answer());
    }
  }

 private:
  struct PromptLp {
    float logprob;
    std::vector<TopEntry> top;
  };

  static std::string make_id() { return "cmpl-" + random_id_hex(); }

  // ---- generation

  // Row `index` - 1 of the prompt: the distribution of prompt token `index`.
  void record_prompt_row(size_t index, std::span<const float> logits) {
    const TokenId next = req_.prompt[index];
    const double log_z = logit_stats(logits).log_z;
    prompt_lp_[index] =
        PromptLp{static_cast<float>(logits[next] - log_z), top_n(logits, req_.prompt_top_n, log_z)};
  }

  void generate(std::span<const float> logits) {
    // Greedy with log-probabilities: argmax and log Z from one read of the row (logit_stats).
    const bool want_log_z = req_.want_logprobs || req_.top_n > 0;
    std::optional<LogitStats> stats;
    if (want_log_z && sampler_.greedy()) stats = logit_stats(logits);
    const TokenId t = stats ? static_cast<TokenId>(stats->argmax) : sampler_.sample(logits);
    if (tok_.is_eog(t) && !req_.ignore_eos) {
      finish_ = "stop";
      eog_ = true;
      return;
    }
    sampler_.accept(t);
    const double log_z = !want_log_z ? 0 : stats ? stats->log_z : logit_stats(logits).log_z;
    generated_.push_back(t);
    gen_lp_.push_back(req_.want_logprobs ? static_cast<float>(logits[t] - log_z) : 0.f);
    gen_top_.push_back(top_n(logits, req_.top_n, log_z));
    const size_t before = text_.size();
    text_ += stream_.push(t);
    piece_ends_.push_back(text_.size());
    cut_at_stop_string(before);
    if (req_.stream) flush_text(false);
  }

  // Stop strings: cuts the text at the earliest match. Only a match that ends in the bytes this
  // token added (text_[before, end)) is new, so each token costs its own bytes plus the longest
  // stop string, not a rescan of the whole text.
  void cut_at_stop_string(size_t before) {
    size_t best = std::string::npos;
    const std::string* word = nullptr;
    for (const auto& s : req_.stop) {
      const size_t from = before >= s.size() - 1 ? before - (s.size() - 1) : 0;
      const size_t at = text_.find(s, from);
      if (at < best) {
        best = at;
        word = &s;
      }
    }
    if (!word) return;
    text_.resize(best);
    finish_ = "stop";
    stop_word_ = *word;
  }

  // A cancelled job's client is gone; any other failure is told to it, in the stream if one is
  // open.
  void answer_failure(JobFailure failure, const std::string& message) {
    if (failure == JobFailure::Cancelled) return;
    const int status =
        failure == JobFailure::NoMemory || failure == JobFailure::Draining ? 503 : 500;
    if (streamed_) {
      res_->write(sse_text(error_body(status == 503 ? "unavailable" : "internal", message)));
      res_->end();
    } else {
      send_error(*res_, ApiError(status, status == 503 ? "unavailable" : "internal", message));
    }
  }

  // ---- pieces of the answers

  std::string piece(TokenId t) const { return tok_.token_to_piece(t); }
  std::string echoed_prompt() const {
    return req_.prompt_text ? *req_.prompt_text : tok_.decode(req_.prompt, /*remove_special=*/true);
  }

  json openai_logprobs(size_t from_token, size_t to_token, size_t text_offset0) const {
    json lp = {{"tokens", json::array()},
               {"token_logprobs", json::array()},
               {"top_logprobs", json::array()},
               {"text_offset", json::array()}};
    size_t off = text_offset0;
    auto label = [&](TokenId t) {
      return req_.tokens_as_ids ? "token_id:" + std::to_string(t) : piece(t);
    };
    auto add = [&](TokenId t, std::optional<float> l, const std::vector<TopEntry>* top) {
      const std::string p = piece(t);
      lp["tokens"].push_back(label(t));
      lp["token_logprobs"].push_back(l ? json(*l) : json(nullptr));
      if (top && !top->empty()) {
        json m = json::object();
        for (const auto& e : *top) m[label(e.id)] = e.logprob;
        lp["top_logprobs"].push_back(m);
      } else {
        lp["top_logprobs"].push_back(nullptr);
      }
      lp["text_offset"].push_back(off);
      off += p.size();
    };
    if (from_token == 0 && req_.echo) {
      for (size_t i = 0; i < req_.prompt.size(); ++i) {
        if (prompt_lp_[i]) {
          add(req_.prompt[i], prompt_lp_[i]->logprob, &prompt_lp_[i]->top);
        } else {
          add(req_.prompt[i], std::nullopt, nullptr);
        }
      }
    }
    for (size_t i = from_token; i < to_token && i < generated_.size(); ++i) {
      add(generated_[i], gen_lp_[i], &gen_top_[i]);
    }
    return lp;
  }

  // vLLM's prompt_logprobs: per prompt token null (the first) or {id: {logprob, rank?,
  // decoded_token}} for the token itself and its top alternatives.
  json vllm_prompt_logprobs() const {
    json pl = json::array();
    for (size_t i = 0; i < req_.prompt.size(); ++i) {
      if (!prompt_lp_[i]) {
        pl.push_back(nullptr);
        continue;
      }
      json m = json::object();
      m[std::to_string(req_.prompt[i])] = {{"logprob", prompt_lp_[i]->logprob},
                                           {"decoded_token", piece(req_.prompt[i])}};
      int rank = 1;
      for (const auto& e : prompt_lp_[i]->top) {
        m[std::to_string(e.id)] = {
            {"logprob", e.logprob}, {"rank", rank++}, {"decoded_token", piece(e.id)}};
      }
      pl.push_back(m);
    }
    return pl;
  }

  json chat_logprobs(size_t from, size_t to) const {
    json content = json::array();
    for (size_t i = from; i < to && i < generated_.size(); ++i) {
      json top = json::array();
      for (const auto& e : gen_top_[i])
        top.push_back({{"token", piece(e.id)}, {"logprob", e.logprob}});
      content.push_back(
          {{"token", piece(generated_[i])}, {"logprob", gen_lp_[i]}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }

  json llama_probs(size_t from, size_t to) const {
    json a = json::array();
    for (size_t i = from; i < to && i < generated_.size(); ++i) {
      json top = json::array();
      for (const auto& e : gen_top_[i]) {
        top.push_back({{"id", e.id}, {"token", piece(e.id)}, {"logprob", e.logprob}});
      }
      a.push_back({{"id", generated_[i]},
                   {"token", piece(generated_[i])},
                   {"logprob", gen_lp_[i]},
                   {"top_logprobs", top}});
    }
    return a;
  }

  // SGLang writes a token's log-probability as [logprob, id, null].
  static json sglang_top(const std::vector<TopEntry>& top) {
    json t = json::array();
    for (const auto& e : top) t.push_back({e.logprob, e.id, nullptr});
    return t;
  }

  void add_sglang_logprobs(json& meta) const {
    json in = json::array(), in_top = json::array(), out = json::array(), out_top = json::array();
    const size_t from = static_cast<size_t>(std::max(0, req_.prompt_logprobs_from));
    if (req_.prompt_logprobs_from >= 0) {
      for (size_t i = from; i < req_.prompt.size(); ++i) {
        if (prompt_lp_[i]) {
          in.push_back({prompt_lp_[i]->logprob, req_.prompt[i], nullptr});
          in_top.push_back(req_.prompt_top_n > 0 ? sglang_top(prompt_lp_[i]->top) : json(nullptr));
        } else {
          in.push_back({nullptr, req_.prompt[i], nullptr});
          in_top.push_back(nullptr);
        }
      }
    }
    for (size_t i = 0; i < generated_.size(); ++i) {
      out.push_back({gen_lp_[i], generated_[i], nullptr});
      out_top.push_back(req_.top_n > 0 ? sglang_top(gen_top_[i]) : json(nullptr));
    }
    meta["input_token_logprobs"] = in;
    meta["output_token_logprobs"] = out;
    meta["input_top_logprobs"] = in_top;
    meta["output_top_logprobs"] = out_top;
  }

  json sglang_meta() const {
    json meta = {{"id", id_},
                 {"prompt_tokens", req_.prompt.size()},
                 {"completion_tokens", generated_.size()},
                 {"cached_tokens", cached},
                 {"finish_reason",
                  finish_ == "stop" ? json{{"type", "stop"},
                                           {"matched", eog_ ? json(tok_.eos()) : json(stop_word_)}}
                                    : json{{"type", "length"}, {"length", generated_.size()}}}};
    if (req_.want_logprobs) add_sglang_logprobs(meta);
    return meta;
  }

  json usage() const {
    const int p = static_cast<int>(req_.prompt.size());
    const int c = static_cast<int>(generated_.size());
    return {{"prompt_tokens", p},
            {"completion_tokens", c},
            {"total_tokens", p + c},
            {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  }

  // ---- whole answers

  json openai_text_answer(const std::string& prompt_text) const {
    json choice = {{"index", 0},
                   {"text", prompt_text + text_},
                   {"finish_reason", finish_},
                   {"logprobs", nullptr}};
    if (req_.want_logprobs) choice["logprobs"] = openai_logprobs(0, generated_.size(), 0);
    if (req_.prompt_logprobs_field) choice["prompt_logprobs"] = vllm_prompt_logprobs();
    return {{"id", id_},
            {"object", "text_completion"},
            {"created", created_},
            {"model", req_.model_name},
            {"choices", json::array({choice})},
            {"usage", usage()}};
  }

  json openai_chat_answer() const {
    json choice = {{"index", 0},
                   {"message", {{"role", "assistant"}, {"content", text_}}},
                   {"finish_reason", finish_},
                   {"logprobs", nullptr}};
    if (req_.want_logprobs) choice["logprobs"] = chat_logprobs(0, generated_.size());
    return {{"id", "chat" + id_},       {"object", "chat.completion"},      {"created", created_},
            {"model", req_.model_name}, {"choices", json::array({choice})}, {"usage", usage()}};
  }

  json llama_answer(const std::string& prompt_text) const {
    json out = {{"content", prompt_text + text_},
                {"tokens", req_.return_tokens ? json(generated_) : json::array()},
                {"id_slot", 0},
                {"stop", true},
                {"model", req_.model_name},
                {"tokens_predicted", generated_.size()},
                {"tokens_evaluated", req_.prompt.size()},
                {"tokens_cached", cached},
                {"stop_type", finish_ == "length" ? "limit" : (eog_ ? "eos" : "word")},
                {"stopping_word", stop_word_},
                {"truncated", false}};
    if (req_.top_n > 0 || req_.want_logprobs) {
      out["completion_probabilities"] = llama_probs(0, generated_.size());
    }
    return out;
  }

  json whole_answer() const {
    const std::string prompt_text = req_.echo ? echoed_prompt() : "";
    switch (req_.dialect) {
      case Dialect::OpenAiText:
        return openai_text_answer(prompt_text);
      case Dialect::OpenAiChat:
        return openai_chat_answer();
      case Dialect::LlamaCpp:
        return llama_answer(prompt_text);
      case Dialect::SgLang:
        return {{"text", text_}, {"output_ids", generated_}, {"meta_info", sglang_meta()}};
    }
    return {};
  }

  // ---- streaming

  void start_stream() {
    streamed_ = true;
    res_->start_stream(200, "text/event-stream");
    if (req_.dialect == Dialect::OpenAiChat) {
      json delta = {{"role", "assistant"}, {"content", ""}};
      res_->write(sse(chat_chunk(delta, nullptr)));
    }
    if (req_.echo && req_.dialect == Dialect::OpenAiText) {
      res_->write(sse(text_chunk(echoed_prompt(), nullptr, json(nullptr))));
    }
  }

  json text_chunk(const std::string& text, const json& finish, const json& logprobs) const {
    return {
        {"id", id_},
        {"object", "text_completion"},
        {"created", created_},
        {"model", req_.model_name},
        {"choices",
         json::array(
             {{{"index", 0}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", finish}}})}};
  }
  json chat_chunk(const json& delta, const json& finish) const {
    return {{"id", "chat" + id_},
            {"object", "chat.completion.chunk"},
            {"created", created_},
            {"model", req_.model_name},
            {"choices", json::array({{{"index", 0},
                                      {"delta", delta},
                                      {"logprobs", nullptr},
                                      {"finish_reason", finish}}})}};
  }

  // Streams the text decided so far, holding back what could still become a stop string.
  void flush_text(bool final) {
    const size_t safe = sendable_end(final);
    if (safe <= sent_ && !final) return;
    const std::string piece_text = safe > sent_ ? text_.substr(sent_, safe - sent_) : std::string();
    const size_t tok_to = tokens_sent_by(safe, final);
    if (!piece_text.empty() || tok_to > tokens_sent_) {
      if (!write_chunk(piece_text, safe, tok_to, final)) return;
    }
    sent_ = std::max(sent_, safe);
    tokens_sent_ = tok_to;
  }

  // Where the text may be sent up to: all of it at the end; before, short of the longest stop
  // string less one byte, and never inside a UTF-8 character.
  size_t sendable_end(bool final) const {
    size_t safe = text_.size();
    if (!final && max_stop_ > 0)
      safe = text_.size() > max_stop_ - 1 ? text_.size() - (max_stop_ - 1) : 0;
    while (!final && safe > sent_ && safe < text_.size() &&
           (static_cast<unsigned char>(text_[safe]) & 0xC0) == 0x80) {
      --safe;
    }
    return safe;
  }

  // How many generated tokens have their text wholly within text_[0, safe).
  size_t tokens_sent_by(size_t safe, bool final) const {
    size_t tok_to = tokens_sent_;
    while (tok_to < generated_.size() && (final || piece_ends_[tok_to] <= safe)) ++tok_to;
    return tok_to;
  }

  // One chunk with text_[sent_, safe) and tokens [tokens_sent_, tok_to); false when it is held
  // back (SGLang, below) and the next flush sends it.
  bool write_chunk(const std::string& piece_text, size_t safe, size_t tok_to, bool final) {
    switch (req_.dialect) {
      case Dialect::OpenAiText:
        res_->write(sse(text_chunk(
            piece_text, nullptr,
            req_.want_logprobs ? openai_logprobs(tokens_sent_, tok_to, sent_) : json(nullptr))));
        return true;
      case Dialect::OpenAiChat:
        if (!piece_text.empty()) {
          json c = chat_chunk({{"content", piece_text}}, nullptr);
          if (req_.want_logprobs) c["choices"][0]["logprobs"] = chat_logprobs(tokens_sent_, tok_to);
          res_->write(sse(c));
        }
        return true;
      case Dialect::LlamaCpp:
        res_->write(sse(llama_chunk(piece_text, tok_to)));
        return true;
      case Dialect::SgLang:
        // SGLang's chunks repeat everything so far. Sent after every token that is quadratic
        // (~80 MB of JSON for 4,096 tokens); after the first 16 tokens a chunk goes out only
        // once the answer has grown by a sixteenth, so a stream costs at most ~17 times its
        // final answer (docs/server.md).
        if (!final && tok_to < tokens_sent_ + std::max<size_t>(1, tok_to / 16)) return false;
        res_->write(sse(
            {{"text", text_.substr(0, safe)},
             {"output_ids", std::vector<TokenId>(generated_.begin(), generated_.begin() + tok_to)},
             {"meta_info", {{"id", id_}, {"completion_tokens", tok_to}}}}));
        return true;
    }
    return true;
  }

  json llama_chunk(const std::string& piece_text, size_t tok_to) const {
    json c = {{"content", piece_text},
              {"stop", false},
              {"id_slot", 0},
              {"tokens", std::vector<TokenId>(generated_.begin() + tokens_sent_,
                                              generated_.begin() + tok_to)}};
    if (req_.top_n > 0 || req_.want_logprobs)
      c["completion_probabilities"] = llama_probs(tokens_sent_, tok_to);
    return c;
  }

  void finish_stream() {
    switch (req_.dialect) {
      case Dialect::OpenAiText: {
        json c = text_chunk("", finish_, nullptr);
        c["usage"] = usage();
        res_->write(sse(c));
        res_->write("data: [DONE]\n\n");
        break;
      }
      case Dialect::OpenAiChat: {
        json c = chat_chunk(json::object(), finish_);
        c["usage"] = usage();
        res_->write(sse(c));
        res_->write("data: [DONE]\n\n");
        break;
      }
      case Dialect::LlamaCpp: {
        json out = whole_answer();
        out["content"] = "";
        out["tokens"] = json::array();
        out.erase("completion_probabilities");
        res_->write(sse(out));
        break;
      }
      case Dialect::SgLang: {
        res_->write(sse(whole_answer()));
        res_->write("data: [DONE]\n\n");
        break;
      }
    }
    res_->end();
  }

  const Tokenizer& tok_;
  Metrics& metrics_;
  std::shared_ptr<Responder> res_;
  CompletionRequest req_;
  Sampler sampler_;
  StreamDecoder stream_;
  int n_ctx_;
  int64_t created_ = 0;
  std::string id_;
  std::vector<TokenId> generated_;
  std::vector<float> gen_lp_;
  std::vector<std::vector<TopEntry>> gen_top_;
  std::vector<size_t> piece_ends_;  // text_ length after each generated token
  std::vector<std::optional<PromptLp>> prompt_lp_;
  std::string text_;
  size_t sent_ = 0, tokens_sent_ = 0, max_stop_ = 0;
  std::string finish_, stop_word_;
  bool eog_ = false;
  bool streamed_ = false;
};

// Counts an open stream (metrics.sse_clients, capped by --max-sse) for as long as it is open.
struct StreamGuard : Responder {
  StreamGuard(std::shared_ptr<Responder> in, Metrics& m) : in(std::move(in)), m(m) {
    ++m.sse_clients;
  }
  ~StreamGuard() override { --m.sse_clients; }
  void send(int s, const std::string& ct, std::string b, const HeaderList& h) override {
    in->send(s, ct, std::move(b), h);
  }
  void start_stream(int s, const std::string& ct, const HeaderList& h) override {
    in->start_stream(s, ct, h);
  }
  bool write(std::string c) override { return in->write(std::move(c)); }
  void end() override { in->end(); }
  bool alive() const override { return in->alive(); }
  std::shared_ptr<Responder> in;
  Metrics& m;
};

}  // namespace

void Api::Impl::completion(const HttpRequest& req, std::shared_ptr<Responder> res, Dialect d,
                           const Credential& who) {
  const json j = parse_body(req.body);
  CompletionRequest r = read_completion(j, d, ReadContext{options, model, tok, n_vocab(), n_ctx()});
  if (r.stream && metrics.sse_clients >= options.max_sse_clients) {
    ++metrics.rejected_overload;
    throw ApiError(429, "overloaded", "too many open streams; retry later");
  }
  std::shared_ptr<Responder> out = res;
  if (r.stream) out = std::make_shared<StreamGuard>(res, metrics);
  auto job = std::make_shared<CompletionJob>(model, metrics, out, std::move(r), n_ctx());
  submit_or_refuse(job, who);
}

}  // namespace tandem::server
