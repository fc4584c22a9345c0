#include "tokenizer/chat_template.h"

#include <sstream>

#include "common/error.h"
#include "gguf/gguf.h"

namespace tandem {

namespace {

constexpr const char* kSupported = "gemma, chatml, llama3, phi3";

std::string trim(std::string_view s) {
  auto is_space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
  };
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

bool contains(std::string_view s, std::string_view what) {
  return s.find(what) != std::string_view::npos;
}

}  // namespace

std::string chatml_default_system(std::string_view tmpl) {
  // In the Jinja text the literal is '<|im_start|>system\n...<|im_end|>\n', with "\n" written
  // as a backslash and an n; a literal that goes on with an expression ('...' + content) is not a
  // default.
  const std::string_view open = "'<|im_start|>system\\n", close = "<|im_end|>";
  for (size_t at = tmpl.find(open); at != std::string_view::npos; at = tmpl.find(open, at + 1)) {
    const size_t begin = at + open.size();
    const size_t end = tmpl.find(close, begin);
    if (end == std::string_view::npos) break;
    const std::string_view body = tmpl.substr(begin, end - begin);
    if (body.empty() || body.find_first_of("'\"{}+") != std::string_view::npos) continue;
    return std::string(body);
  }
  return "";
}

std::string_view chat_template_name(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::Gemma:
      return "gemma";
    case ChatTemplateKind::ChatML:
      return "chatml";
    case ChatTemplateKind::Llama3:
      return "llama3";
    case ChatTemplateKind::Phi3:
      return "phi3";
  }
  return "?";
}

ChatTemplateKind detect_chat_template(std::string_view t) {
  if (t == "gemma") return ChatTemplateKind::Gemma;
  if (t == "chatml") return ChatTemplateKind::ChatML;
  if (t == "llama3") return ChatTemplateKind::Llama3;
  if (t == "phi3") return ChatTemplateKind::Phi3;
  // Same order of checks as llama.cpp's llm_chat_detect_template for these kinds.
  if (contains(t, "<|im_start|>")) return ChatTemplateKind::ChatML;
  if (contains(t, "<start_of_turn>")) return ChatTemplateKind::Gemma;
  if (contains(t, "<|start_header_id|>") && contains(t, "<|end_header_id|>"))
    return ChatTemplateKind::Llama3;
  if (contains(t, "<|assistant|>") && contains(t, "<|end|>")) return ChatTemplateKind::Phi3;
  std::string head(t.substr(0, 80));
  for (char& c : head)
    if (c == '\n') c = ' ';
  throw Error("chat template not supported (starts with \"" + head +
              "\"); supported: " + kSupported);
}

ChatTemplateKind chat_template_from_gguf(const GgufFile& f) {
  if (auto t = f.get_string_opt("tokenizer.chat_template")) return detect_chat_template(*t);
  const std::string arch(f.get_string_opt("general.architecture").value_or(""));
  if (arch == "gemma" || arch == "gemma2" || arch == "gemma3") return ChatTemplateKind::Gemma;
  if (arch == "qwen2" || arch == "qwen3" || arch == "qwen2moe" || arch == "qwen3moe")
    return ChatTemplateKind::ChatML;
  if (arch == "llama" && f.get_string_opt("tokenizer.ggml.pre").value_or("") == "llama-bpe")
    return ChatTemplateKind::Llama3;
  if (arch == "phi3") return ChatTemplateKind::Phi3;
  throw Error(f.path() +
              ": no tokenizer.chat_template and no default chat template for "
              "architecture '" +
              arch + "' (supported: " + kSupported + ")");
}

std::string apply_chat_template(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) {
  std::ostringstream ss;
  switch (kind) {
    case ChatTemplateKind::Gemma: {
      std::string system_prompt;
      for (const auto& m : messages) {
        if (m.role == "system") {
          system_prompt += trim(m.content);
          continue;
        }
        const std::string role = m.role == "assistant" ? "model" : m.role;
        ss << "<start_of_turn>" << role << "\n";
        if (!system_prompt.empty() && role != "model") {
          ss << system_prompt << "\n\n";
          system_prompt.clear();
        }
        ss << trim(m.content) << "<end_of_turn>\n";
      }
      if (add_generation_prompt) ss << "<start_of_turn>model\n";
      break;
    }
    case ChatTemplateKind::ChatML:
      for (const auto& m : messages)
        ss << "<|im_start|>" << m.role << "\n" << m.content << "<|im_end|>\n";
      if (add_generation_prompt) ss << "<|im_start|>assistant\n";
      break;
    case ChatTemplateKind::Llama3:
      for (const auto& m : messages)
        ss << "<|start_header_id|>" << m.role << "<|end_header_id|>\n\n"
           << trim(m.content) << "<|eot_id|>";
      if (add_generation_prompt) ss << "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case ChatTemplateKind::Phi3:
      for (const auto& m : messages) ss << "<|" << m.role << "|>\n" << m.content << "<|end|>\n";
      if (add_generation_prompt) ss << "<|assistant|>\n";
      break;
  }
  return ss.str();
}

std::string apply_chat_template(const GgufFile& f, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) {
  const ChatTemplateKind kind = chat_template_from_gguf(f);
  const bool has_system = !messages.empty() && messages.front().role == "system";
  if (kind == ChatTemplateKind::ChatML && !has_system) {
    const auto tmpl = f.get_string_opt("tokenizer.chat_template");
    if (const std::string system = tmpl ? chatml_default_system(*tmpl) : ""; !system.empty()) {
      std::vector<ChatMessage> with_system = {{"system", system}};
      with_system.insert(with_system.end(), messages.begin(), messages.end());
      return apply_chat_template(kind, with_system, add_generation_prompt);
    }
  }
  return apply_chat_template(kind, messages, add_generation_prompt);
}

}  // namespace tandem
