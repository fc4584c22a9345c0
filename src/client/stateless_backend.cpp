// Stateless cloud backends: an OpenAI-compatible /v1/completions (vLLM, SGLang, tandem serve),
// SGLang's /generate with input_ids, llama.cpp's /completion with a token array. Each step
// sends the whole history as token ids (the server's prefix cache, where it has one, saves the
// prefill); a sync is a no-op; verify is emulated by a greedy generate of len(draft) + 1 tokens
// and a comparison here (the accepted prefix plus the cloud's next token are exactly what the
// native verify answers).
#include <algorithm>
#include <nlohmann/json.hpp>

#include "net/http_client.h"
#include "tandem/client.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

enum class Dialect { OpenAi, SgLang, LlamaCpp };

class StatelessBackend : public CloudBackend {
 public:
  StatelessBackend(Dialect dialect, const CloudOptions& options, const Model& edge)
      : dialect_(dialect),
        options_(options),
        http_(net::parse_url(options.url), net::HttpOptions{.insecure = options.insecure,
                                                            .ca_file = options.ca_file,
                                                            .api_key = options.api_key}),
        tok_(edge.tokenizer()) {}

  std::string name() const override {
    return std::string(dialect_ == Dialect::OpenAi   ? "openai"
                       : dialect_ == Dialect::SgLang ? "sglang"
                                                     : "llamacpp") +
           " " + http_.url().origin() + http_.url().prefix;
  }

  CloudModelInfo connect() override {
    CloudModelInfo info;
    info.n_vocab = tok_.n_vocab();
    // The model name (OpenAI requests need it) and a vocabulary probe: /tokenize where the
    // server has it (llama.cpp and tandem serve; tandem also reports vocab_hash).
    if (dialect_ == Dialect::OpenAi) {
      const net::HttpResponse r = send("GET", "/v1/models", "");
      const json j = parse(r, "listing the cloud's models");
      if (r.status == 200 && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
          j["data"][0].contains("id") && j["data"][0]["id"].is_string()) {
        model_name_ = j["data"][0]["id"].get<std::string>();
      } else {
        throw status_error(r, j, "listing the cloud's models (GET /v1/models)");
      }
    }
    info.name = model_name_;
    const std::string probe = "Hello world, 12345!";
    const net::HttpResponse r =
        send("POST", "/tokenize",
             json{{"content", probe}, {"add_special", false}, {"parse_special", false}}.dump());
    if (r.status == 401 || r.status == 403) throw status_error(r, parse(r, ""), "POST /tokenize");
    if (r.status == 200) {
      const json j = parse(r, "POST /tokenize");
      const std::string edge_hash = tok_.fingerprint_hex();
      if (j.contains("vocab_hash") && j["vocab_hash"].is_string()) {
        info.vocab_hash = j["vocab_hash"].get<std::string>();
        if (info.vocab_hash != edge_hash) {
          throw CloudError(CloudError::Kind::Fatal,
                           "the cloud's vocabulary differs from the edge's: edge vocab_hash " +
                               edge_hash + " (" + std::to_string(tok_.n_vocab()) +
                               " tokens), cloud vocab_hash " + info.vocab_hash + " (" +
                               std::to_string(j.value("n_vocab", 0)) + " tokens)");
        }
      } else if (j.contains("tokens") && j["tokens"].is_array()) {
        std::vector<TokenId> ids;
        for (const auto& t : j["tokens"]) {
          if (t.is_number_integer()) ids.push_back(t.get<TokenId>());
        }
        const auto mine = tok_.encode(probe, false, false);
        if (ids != mine) {
          throw CloudError(CloudError::Kind::Fatal,
                           "the cloud tokenizes a probe text differently from the edge (cloud " +
                               j["tokens"].dump() + ", edge " + json(mine).dump() +
                               "): the vocabularies differ");
        }
      }
    }  // no /tokenize (vLLM, SGLang): nothing to check against; token ids are trusted
    connected_ = true;
    return info;
  }

  CloudStepResult step(std::span<const TokenId> history, const CloudOp& op) override {
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
    if (eog && static_cast<int>(tokens.size()) < n) tokens.push_back(tok_.eos());
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

  void close() noexcept override {}
  void abort() noexcept override { http_.abort(); }
  CloudCounters counters() const override {
    CloudCounters c = counters_;
    c.bytes_up = http_.bytes_sent();
    c.bytes_down = http_.bytes_received();
    return c;
  }

 private:
  std::vector<TokenId> generate(const std::vector<TokenId>& prompt, int n, const SamplingParams& sp,
                                bool send_seed, bool* eog) {
    json body;
    std::string path;
    const float temp = std::max(0.0f, sp.temp);
    switch (dialect_) {
      case Dialect::OpenAi:
        path = "/v1/completions";
        body = {{"model", model_name_},
                {"prompt", prompt},
                {"max_tokens", n},
                {"temperature", temp},
                {"top_p", sp.top_p},
                {"logprobs", 1},
                {"return_tokens_as_token_ids", true}};
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
    const net::HttpResponse r = send("POST", path, body.dump());
    const json j = parse(r, what);
    if (r.status != 200) throw status_error(r, j, what);
    std::vector<TokenId> ids;
    auto bad = [&](const std::string& why) {
      return CloudError(CloudError::Kind::Unavailable, what + ": " + why);
    };
    try {
      switch (dialect_) {
        case Dialect::OpenAi: {
          const json& c = j.at("choices").at(0);
          *eog = c.value("finish_reason", "") == "stop";
          // vLLM's return_tokens_as_token_ids gives "token_id:N"; elsewhere the text is
          // tokenized again (close, not always identical).
          bool have_ids = false;
          if (c.contains("logprobs") && c["logprobs"].is_object() &&
              c["logprobs"].contains("tokens") && c["logprobs"]["tokens"].is_array()) {
            have_ids = true;
            std::vector<TokenId> parsed;
            for (const auto& t : c["logprobs"]["tokens"]) {
              const std::string s = t.is_string() ? t.get<std::string>() : "";
              if (s.rfind("token_id:", 0) != 0) {
                have_ids = false;
                break;
              }
              parsed.push_back(static_cast<TokenId>(std::stol(s.substr(9))));
            }
            if (have_ids) ids = parsed;
          }
          if (!have_ids) ids = tok_.encode(c.at("text").get<std::string>(), false, false);
          break;
        }
        case Dialect::SgLang: {
          ids = j.at("output_ids").get<std::vector<TokenId>>();
          const json& fr = j.at("meta_info").at("finish_reason");
          *eog = fr.is_object() && fr.value("type", "") == "stop";
          break;
        }
        case Dialect::LlamaCpp: {
          ids = j.at("tokens").get<std::vector<TokenId>>();
          *eog = j.value("stop_type", "") == "eos";
          break;
        }
      }
    } catch (const json::exception& e) {
      throw bad(std::string("unexpected answer shape (") + e.what() + ")");
    } catch (const std::exception& e) {
      throw bad(std::string("unexpected answer (") + e.what() + ")");
    }
    if (static_cast<int>(ids.size()) > n) ids.resize(n);
    for (TokenId t : ids) {
      if (t < 0 || t >= tok_.n_vocab()) {
        throw bad("token id " + std::to_string(t) + " is outside the vocabulary");
      }
    }
    return ids;
  }

  net::HttpResponse send(const char* method, const std::string& target, const std::string& body) {
    try {
      return http_.request(method, target, body,
                           milliseconds(static_cast<long>(options_.timeout_s * 1000)));
    } catch (const net::NetError& e) {
      throw CloudError(CloudError::Kind::Unavailable, e.what());
    }
  }

  static json parse(const net::HttpResponse& r, const std::string&) {
    json j = json::parse(r.body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      return json{{"error", {{"message", r.body.substr(0, 300)}}}};
    }
    return j;
  }

  CloudError status_error(const net::HttpResponse& r, const json& j, const std::string& what) {
    if (r.status == 200) {
      return CloudError(CloudError::Kind::Unavailable,
                        what + ": the answer is not what it should be");
    }
    std::string msg = what + ": HTTP " + std::to_string(r.status);
    if (j.contains("error")) {
      const json& e = j["error"];
      msg += ": " + (e.is_object() && e.contains("message") && e["message"].is_string()
                         ? e["message"].get<std::string>()
                         : e.dump().substr(0, 300));
    }
    switch (r.status) {
      case 401:
      case 403:
        return CloudError(CloudError::Kind::Fatal, msg + " (check --api-key)");
      case 400:
      case 404:
      case 413:
        return CloudError(CloudError::Kind::Rejected, msg);
      default:
        return CloudError(CloudError::Kind::Unavailable, msg);
    }
  }

  Dialect dialect_;
  CloudOptions options_;
  net::HttpClient http_;
  const Tokenizer& tok_;
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
