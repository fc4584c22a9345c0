// Stateless cloud backends: an OpenAI-compatible /v1/completions (vLLM, SGLang, tandem serve),
// SGLang's /generate with input_ids, llama.cpp's /completion with a token array. Each step
// sends the whole history as token ids (the server's prefix cache, where it has one, saves the
// prefill); a sync is a no-op; verify is emulated by a greedy generate of len(draft) + 1 tokens
// and a comparison here (the accepted prefix plus the cloud's next token are exactly what the
// native verify answers).
//
// Answers are read through client/cloud_answer.h: a malformed one is a CloudError, never a crash.
#include <algorithm>
#include <climits>
#include <nlohmann/json.hpp>

#include "client/cloud_answer.h"
#include "net/http_client.h"
#include "tandem/client.h"

namespace tandem {
namespace {

using nlohmann::json;

enum class Dialect { OpenAi, SgLang, LlamaCpp };

class StatelessBackend : public CloudBackend {
 public:
  StatelessBackend(Dialect dialect, const CloudOptions& options, const Model& edge)
      : dialect_(dialect),
        options_(options),
        http_(net::parse_url(options.url),
              net::HttpOptions{.insecure = options.insecure,
                               .ca_file = options.ca_file,
                               .api_key = options.api_key,
                               .max_body_bytes = options.max_answer_bytes}),
        edge_(edge) {}

  std::string name() const override {
    return std::string(dialect_ == Dialect::OpenAi   ? "openai"
                       : dialect_ == Dialect::SgLang ? "sglang"
                                                     : "llamacpp") +
           " " + http_.url().origin() + http_.url().prefix;
  }

  CloudModelInfo connect() override {
    return cloud::only_cloud_errors(name() + ": connecting", [&] { return connect_unguarded(); });
  }

  CloudStepResult step(std::span<const TokenId> history, const CloudOp& op) override {
    return cloud::only_cloud_errors(name() + ": step", [&] { return step_unguarded(history, op); });
  }

  void close() noexcept override {}
  void abort() noexcept override { http_.abort(); }
  CloudCounters counters() const override {
    CloudCounters c = counters_;
    c.bytes_up = http_.bytes_sent();
    c.bytes_down = http_.bytes_received();
    return c;
  }

 private:
  CloudModelInfo connect_unguarded() {
    CloudModelInfo info;
    info.n_vocab = edge_.vocab_size();
    // The model name (OpenAI requests need it) and a vocabulary probe: /tokenize where the
    // server has it (llama.cpp and tandem serve; tandem also reports vocab_hash).
    if (dialect_ == Dialect::OpenAi) model_name_ = first_model_name();
    info.name = cloud::excerpt(model_name_, 128);  // shown on a terminal: printable only
    check_vocabulary(info);
    connected_ = true;
    return info;
  }

  std::string first_model_name() {
    const std::string what = "listing the cloud's models (GET /v1/models)";
    // The list is the server's to size, not the request's: a fixed cap.
    const cloud::AnswerCap cap{std::min(cloud::kModelListBytes, options_.max_answer_bytes)};
    const net::HttpResponse r = send("GET", "/v1/models", "", cap);
    if (r.status != 200) throw cloud::status_error(r, what);
    const json j = cloud::parse_answer(r, what, cap);
    const auto data = j.find("data");
    if (data == j.end() || !data->is_array() || data->empty() || !(*data)[0].is_object()) {
      throw cloud::malformed(what, "expected 'data' to be a non-empty array of models");
    }
    return cloud::string_field((*data)[0], "id", what, 1024);
  }

  // Refuses (Fatal) a cloud whose /tokenize shows another vocabulary; a cloud without one
  // (vLLM, SGLang) is trusted.
  void check_vocabulary(CloudModelInfo& info) {
    const std::string what = "POST /tokenize";
    const std::string probe = "Hello world, 12345!";
    // At most 4 tokens a byte of the probe, each with its piece where the server adds them.
    const cloud::AnswerCap cap = cloud::answer_cap(
        options_.max_answer_bytes, {{4 * probe.size(), cloud::kCompletionTokenBytes}});
    const net::HttpResponse r = send(
        "POST", "/tokenize",
        json{{"content", probe}, {"add_special", false}, {"parse_special", false}}.dump(), cap);
    if (r.status == 401 || r.status == 403) throw cloud::status_error(r, what);
    if (r.status != 200) return;
    const json j = cloud::parse_answer(r, what, cap);
    const std::string edge_hash = edge_.info().vocab_hash;
    if (cloud::has(j, "vocab_hash")) {
      info.vocab_hash = cloud::string_field(j, "vocab_hash", what, 64);
      if (info.vocab_hash != edge_hash) {
        const int64_t n = cloud::int_field_or(j, "n_vocab", what, 0, INT_MAX, 0);
        throw CloudError(CloudError::Kind::Fatal,
                         "the cloud's vocabulary differs from the edge's: edge vocab_hash " +
                             edge_hash + " (" + std::to_string(edge_.vocab_size()) +
                             " tokens), cloud vocab_hash " + cloud::excerpt(info.vocab_hash, 64) +
                             " (" + std::to_string(n) + " tokens)");
      }
      return;
    }
    if (!cloud::has(j, "tokens")) return;
    const auto mine = edge_.tokenize(probe, false, false);
    std::vector<TokenId> theirs;
    try {
      theirs = cloud::token_field(j, "tokens", what, edge_.vocab_size(), 4 * probe.size());
    } catch (const CloudError& e) {
      throw CloudError(CloudError::Kind::Fatal,
                       std::string("the cloud tokenizes a probe text with ids the edge does not "
                                   "have: the vocabularies differ (") +
                           e.what() + ")");
    }
    if (theirs != mine) {
      throw CloudError(CloudError::Kind::Fatal,
                       "the cloud tokenizes a probe text differently from the edge (cloud " +
                           ids_text(theirs) + ", edge " + ids_text(mine) +
                           "): the vocabularies differ");
    }
  }

  static std::string ids_text(const std::vector<TokenId>& ids) {
    std::string s = "[";
    for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
    return s + "]";
  }

  CloudStepResult step_unguarded(std::span<const TokenId> history, const CloudOp& op) {
    if (!connected_) connect();
    CloudStepResult out;
    if (op.kind == CloudOpKind::Sync) {
      out.pos = static_cast<int>(history.size());
      return out;
    }
    const bool verify = op.kind == CloudOpKind::Verify;
    const int n = verify ? static_cast<int>(op.draft.size()) + 1 : op.n_generate;
    SamplingParams sp = op.sampling;
    if (verify) sp.temp = 0;
    // The prompt is the history plus, for a verify, the drafts are NOT sent: the cloud's own
    // greedy continuation is compared with them here.
    const std::vector<TokenId> prompt(history.begin(), history.end());
    bool eog = false;
    const std::vector<TokenId> gen = generate(prompt, n, sp, op.send_seed, &eog);
    std::vector<TokenId> tokens = gen;
    if (eog && static_cast<int>(tokens.size()) < n && edge_.eos() >= 0) {
      tokens.push_back(edge_.eos());
    }
    if (tokens.empty()) {
      throw CloudError(CloudError::Kind::Unavailable, name() + ": the answer has no tokens");
    }
    ++counters_.steps;
    counters_.replayed_tokens += history.size();
    if (verify) {
      int a = 0;
      while (a < static_cast<int>(op.draft.size()) && a < static_cast<int>(tokens.size()) &&
             tokens[a] == op.draft[a]) {
        ++a;
      }
      out.accepted = a;
      out.tokens.assign(op.draft.begin(), op.draft.begin() + a);
      if (a < static_cast<int>(tokens.size())) out.tokens.push_back(tokens[a]);
      if (static_cast<int>(out.tokens.size()) != a + 1) {
        throw CloudError(CloudError::Kind::Unavailable,
                         name() + ": the answer ended before the verified position");
      }
    } else {
      out.tokens = tokens;
    }
    out.prefilled = static_cast<int>(history.size());
    out.pos = static_cast<int>(history.size() + out.tokens.size());
    out.stop = eog ? "eog" : "length";
    return out;
  }

  std::vector<TokenId> generate(const std::vector<TokenId>& prompt, int n, const SamplingParams& sp,
                                bool send_seed, bool* eog) {
    json body;
    std::string path;
    const float temp = std::max(0.0f, sp.temp);
    switch (dialect_) {
      case Dialect::OpenAi:
        path = "/v1/completions";
        body = cloud::completions_by_ids(prompt, n, 1);
        body["model"] = model_name_;
        body["temperature"] = temp;
        body["top_p"] = sp.top_p;
        if (sp.top_k > 0) body["top_k"] = sp.top_k;
        if (sp.min_p > 0) body["min_p"] = sp.min_p;
        if (send_seed) body["seed"] = sp.seed;
        break;
      case Dialect::SgLang: {
        path = "/generate";
        json s = {{"max_new_tokens", n}, {"temperature", temp}, {"top_p", sp.top_p}};
        if (sp.top_k > 0) s["top_k"] = sp.top_k;
        if (sp.min_p > 0) s["min_p"] = sp.min_p;
        if (send_seed) s["sampling_seed"] = sp.seed;
        body = {{"input_ids", prompt}, {"sampling_params", s}};
        break;
      }
      case Dialect::LlamaCpp:
        path = "/completion";
        body = {{"prompt", prompt},     {"n_predict", n},       {"temperature", temp},
                {"top_k", sp.top_k},    {"top_p", sp.top_p},    {"min_p", sp.min_p},
                {"cache_prompt", true}, {"return_tokens", true}};
        if (send_seed) body["seed"] = sp.seed;
        break;
    }
    const std::string what = "POST " + path;
    const cloud::AnswerCap cap = generate_cap(prompt.size(), n);
    const net::HttpResponse r = send("POST", path, body.dump(), cap);
    if (r.status != 200) throw cloud::status_error(r, what);
    const json j = cloud::parse_answer(r, what, cap);
    switch (dialect_) {
      case Dialect::OpenAi:
        return read_openai(j, what, n, eog);
      case Dialect::SgLang: {
        const json& meta = cloud::object_field(j, "meta_info", what);
        const auto fr = meta.find("finish_reason");
        *eog = fr != meta.end() && fr->is_object() &&
               cloud::string_field_or(*fr, "type", what, 64, "") == "stop";
        return cloud::token_field(j, "output_ids", what, edge_.vocab_size(), n);
      }
      case Dialect::LlamaCpp:
        *eog = cloud::string_field_or(j, "stop_type", what, 64, "") == "eos";
        return cloud::token_field(j, "tokens", what, edge_.vocab_size(), n);
    }
    return {};
  }

  // choices[0]: the ids from vLLM's return_tokens_as_token_ids ("token_id:N" in
  // logprobs.tokens); elsewhere the text tokenized again (close, not always identical).
  std::vector<TokenId> read_openai(const json& j, const std::string& what, int n, bool* eog) {
    const auto choices = j.find("choices");
    if (choices == j.end() || !choices->is_array() || choices->empty() ||
        !(*choices)[0].is_object()) {
      throw cloud::malformed(what, "expected 'choices' to be a non-empty array of objects");
    }
    const json& c = (*choices)[0];
    const auto reason = c.find("finish_reason");
    *eog = reason != c.end() && reason->is_string() && *reason == "stop";
    if (const auto lp = c.find("logprobs"); lp != c.end() && lp->is_object()) {
      const auto tokens = lp->find("tokens");
      if (tokens != lp->end() && tokens->is_array() && !tokens->empty() &&
          (*tokens)[0].is_string() &&
          (*tokens)[0].get_ref<const std::string&>().rfind("token_id:", 0) == 0) {
        return token_id_strings(*tokens, what, n);
      }
    }
    // A token's text is rarely over a few dozen bytes: this bounds the work of tokenizing.
    const size_t max_text = 256 * static_cast<size_t>(n) + 1024;
    std::vector<TokenId> ids =
        edge_.tokenize(cloud::string_field(c, "text", what, max_text), false, false);
    if (static_cast<int>(ids.size()) > n) ids.resize(n);  // a re-tokenization may split more
    return ids;
  }

  // ["token_id:12", ...]: every entry so, each id in the vocabulary, at most n of them.
  std::vector<TokenId> token_id_strings(const json& tokens, const std::string& what, int n) {
    const std::string field = "choices[0].logprobs.tokens";
    if (tokens.size() > static_cast<size_t>(n)) {
      throw cloud::malformed(what, "'" + field + "' has " + std::to_string(tokens.size()) +
                                       " tokens, more than the " + std::to_string(n) +
                                       " asked for");
    }
    std::vector<TokenId> ids;
    for (size_t i = 0; i < tokens.size(); ++i) {
      const json& t = tokens[i];
      const std::string_view s =
          t.is_string() ? std::string_view(t.get_ref<const std::string&>()) : std::string_view();
      const std::optional<int64_t> id = cloud::token_id_number(s);
      if (!id || *id < 0 || *id >= edge_.vocab_size()) {
        throw cloud::malformed(what, "'" + field + "'[" + std::to_string(i) + "] is '" +
                                         cloud::excerpt(s, 40) +
                                         "', expected 'token_id:N' with N in [0, " +
                                         std::to_string(edge_.vocab_size()) + ")");
      }
      ids.push_back(static_cast<TokenId>(*id));
    }
    return ids;
  }

  // A completion's answer: kAnswerFixedBytes + n x kCompletionTokenBytes, and for llama.cpp,
  // whose /completion echoes the prompt as text, + prompt x kPromptEchoTokenBytes.
  cloud::AnswerCap generate_cap(size_t prompt, int n) const {
    const size_t echoed = dialect_ == Dialect::LlamaCpp ? prompt : 0;
    return cloud::answer_cap(options_.max_answer_bytes,
                             {{static_cast<size_t>(std::max(n, 0)), cloud::kCompletionTokenBytes},
                              {echoed, cloud::kPromptEchoTokenBytes}});
  }

  net::HttpResponse send(const char* method, const std::string& target, const std::string& body,
                         const cloud::AnswerCap& cap) {
    return cloud::fetch(http_, method, target, body, options_.timeout_s, cap);
  }

  Dialect dialect_;
  CloudOptions options_;
  net::HttpClient http_;
  const Model& edge_;
  std::string model_name_;
  bool connected_ = false;
  CloudCounters counters_;
};

}  // namespace

std::unique_ptr<CloudBackend> make_stateless_backend(const CloudOptions& options,
                                                     const Model& edge_model) {
  const Dialect d = options.api == "openai"   ? Dialect::OpenAi
                    : options.api == "sglang" ? Dialect::SgLang
                                              : Dialect::LlamaCpp;
  return std::make_unique<StatelessBackend>(d, options, edge_model);
}

}  // namespace tandem
