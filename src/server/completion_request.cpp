// Reading a stateless completion request (server/completion_request.h).
#include "server/completion_request.h"
#include "runtime/model_internals.h"

#include <algorithm>

#include "tokenizer/chat_template.h"

namespace tandem::server {

namespace {

void read_openai_text(const json& j, const ReadContext& c, CompletionRequest& r) {
  const ApiOptions& o = c.options;
  const json* p = field(j, "prompt");
  if (!p) throw bad("prompt", "is required");
  r.prompt = get_prompt(*p, "prompt", c.tok, c.n_vocab, c.n_ctx, o.max_text_bytes);
  if (p->is_string()) r.prompt_text = p->get<std::string>();
  r.max_tokens = static_cast<int>(get_int(j, "max_tokens", 16, 0, o.max_generate));
  r.sampling = get_sampling(j, 1.0);
  r.stop = get_stop(j, "stop");
  if (field(j, "logprobs")) {
    r.top_n = static_cast<int>(get_int(j, "logprobs", 0, 0, o.max_top_n));
    r.want_logprobs = true;
  }
  r.echo = get_bool(j, "echo", false);
  r.tokens_as_ids = get_bool(j, "return_tokens_as_token_ids", false);
  if (field(j, "prompt_logprobs")) {
    r.prompt_top_n = static_cast<int>(get_int(j, "prompt_logprobs", 0, 0, o.max_top_n));
    r.prompt_logprobs_from = 1;
    r.prompt_logprobs_field = true;
  }
  if (r.echo && r.want_logprobs && r.prompt_logprobs_from < 0) r.prompt_logprobs_from = 1;
}

// A chat message's content: a string, or an array of text parts [{"type":"text","text":...}].
std::string message_text(const json* content, const std::string& at) {
  std::string text;
  if (content && content->is_string()) {
    text = content->get<std::string>();
  } else if (content && content->is_array()) {
    for (const auto& part : *content) {
      if (part.is_object() && part.value("type", "") == "text" && part.contains("text") &&
          part["text"].is_string()) {
        text += part["text"].get<std::string>();
      } else {
        throw bad(at + ".content", "parts must be {\"type\":\"text\",\"text\":...}");
      }
    }
  } else if (content) {
    throw bad(at + ".content", "must be a string or an array of text parts");
  }
  return text;
}

std::vector<ChatMessage> read_messages(const json& j, size_t max_text_bytes) {
  const json* msgs = field(j, "messages");
  if (!msgs || !msgs->is_array() || msgs->empty()) {
    throw bad("messages", "must be a non-empty array of {role, content}");
  }
  std::vector<ChatMessage> chat;
  // All messages' roles and texts together count against --max-text-bytes: the chat template
  // renders (and the tokenizer reads) the role as much as the content.
  size_t chat_bytes = 0;
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw bad(at, "must be an object");
    const json* role = field(m, "role");
    const json* content = field(m, "content");
    if (!role || !role->is_string()) throw bad(at + ".role", "must be a string");
    chat_bytes += role->get_ref<const std::string&>().size();
    check_text_size(chat_bytes, "messages", max_text_bytes);
    std::string text = message_text(content, at);
    chat_bytes += text.size();
    check_text_size(chat_bytes, "messages", max_text_bytes);
    chat.push_back({role->get<std::string>(), text});
  }
  return chat;
}

void read_openai_chat(const json& j, const ReadContext& c, CompletionRequest& r) {
  const ApiOptions& o = c.options;
  const std::vector<ChatMessage> chat = read_messages(j, o.max_text_bytes);
  const std::string prompt = apply_chat_template(ModelInternals::file(c.model), chat, true);
  r.prompt = c.tok.encode(prompt, true, true);
  const int64_t mt = get_int(j, "max_completion_tokens", -1, -1, o.max_generate);
  r.max_tokens = static_cast<int>(mt >= 0 ? mt : get_int(j, "max_tokens", 256, 0, o.max_generate));
  r.sampling = get_sampling(j, 1.0);
  r.stop = get_stop(j, "stop");
  r.want_logprobs = get_bool(j, "logprobs", false);
  if (r.want_logprobs) r.top_n = static_cast<int>(get_int(j, "top_logprobs", 0, 0, o.max_top_n));
}

void read_llama_cpp(const json& j, const ReadContext& c, CompletionRequest& r) {
  const ApiOptions& o = c.options;
  const json* p = field(j, "prompt");
  if (!p) throw bad("prompt", "is required");
  r.prompt = get_prompt(*p, "prompt", c.tok, c.n_vocab, c.n_ctx, o.max_text_bytes);
  const int64_t n = get_int(j, "n_predict", -1, -1, o.max_generate);
  r.max_tokens = n < 0 ? o.max_generate : static_cast<int>(n);
  r.sampling = get_sampling(j, 0.8);
  if (!field(j, "top_k")) r.sampling.top_k = 40;
  r.stop = get_stop(j, "stop");
  r.top_n = static_cast<int>(get_int(j, "n_probs", 0, 0, o.max_top_n));
  r.want_logprobs = r.top_n > 0;
  r.return_tokens = get_bool(j, "return_tokens", false);
}

void read_sglang(const json& j, const ReadContext& c, CompletionRequest& r) {
  const ApiOptions& o = c.options;
  const json* ids = field(j, "input_ids");
  const json* text = field(j, "text");
  if (ids) {
    r.prompt = get_ids(*ids, "input_ids", c.n_vocab, static_cast<size_t>(c.n_ctx));
  } else if (text && text->is_string()) {
    r.prompt = c.tok.encode(checked_text(*text, "text", o.max_text_bytes), true, false);
  } else {
    throw bad("input_ids", "or 'text' is required");
  }
  static const json kNoParams = json::object();
  const json* s = field(j, "sampling_params");
  if (s && !s->is_object()) throw bad("sampling_params", "must be an object");
  const json& sp = s ? *s : kNoParams;  // read in place: client JSON is never copied
  r.max_tokens = static_cast<int>(get_int(sp, "max_new_tokens", 128, 0, o.max_generate));
  r.sampling = get_sampling(sp, 1.0);
  r.stop = get_stop(sp, "stop");
  r.ignore_eos = get_bool(sp, "ignore_eos", false);
  r.want_logprobs = get_bool(j, "return_logprob", false);
  if (r.want_logprobs) {
    const int64_t start = get_int(j, "logprob_start_len", -1, -1, c.n_ctx);
    if (start >= 0) r.prompt_logprobs_from = static_cast<int>(start);
    r.top_n = static_cast<int>(get_int(j, "top_logprobs_num", 0, 0, o.max_top_n));
    r.prompt_top_n = r.top_n;
  }
}

// A prompt must hold a token and leave room for one more; generation stops at the context's end.
void fit_prompt(CompletionRequest& r, int n_ctx) {
  if (r.prompt.empty()) throw bad("prompt", "is empty after tokenization");
  if (static_cast<int>(r.prompt.size()) >= n_ctx) {
    throw ApiError(413, "too_large",
                   "the prompt has " + std::to_string(r.prompt.size()) +
                       " tokens; the context holds " + std::to_string(n_ctx),
                   {{"field", "prompt"}});
  }
  r.max_tokens = std::min(r.max_tokens, n_ctx - static_cast<int>(r.prompt.size()));
}

}  // namespace

CompletionRequest read_completion(const json& j, Dialect d, const ReadContext& c) {
  CompletionRequest r;
  r.dialect = d;
  r.model_name = c.options.model_name;
  if (const json* m = field(j, "model"); m && m->is_string()) r.model_name = m->get<std::string>();
  r.stream = get_bool(j, "stream", false);
  r.deadline = deadline_after(c.options.max_request_seconds);
  switch (d) {
    case Dialect::OpenAiText:
      read_openai_text(j, c, r);
      break;
    case Dialect::OpenAiChat:
      read_openai_chat(j, c, r);
      break;
    case Dialect::LlamaCpp:
      read_llama_cpp(j, c, r);
      break;
    case Dialect::SgLang:
      read_sglang(j, c, r);
      break;
  }
  // vLLM and llama.cpp take ignore_eos beside the other sampling fields; SGLang inside
  // sampling_params (above).
  if (d != Dialect::SgLang) r.ignore_eos = get_bool(j, "ignore_eos", false);
  fit_prompt(r, c.n_ctx);
  return r;
}

}  // namespace tandem::server
