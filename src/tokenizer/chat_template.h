// Chat templates: detection from tokenizer.chat_template and the formats llama.cpp's built-in
// llm_chat_apply_template produces for them (no Jinja interpreter).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tandem/chat.h"  // ChatMessage

namespace tandem {

class GgufFile;

enum class ChatTemplateKind { Gemma, ChatML, Llama3, Phi3 };

// "gemma", "chatml", "llama3", "phi3".
std::string_view chat_template_name(ChatTemplateKind kind);

// Detects the kind from a template text (a Jinja template or one of the names above).
// Throws tandem::Error listing the supported templates when nothing matches.
ChatTemplateKind detect_chat_template(std::string_view tmpl);

// Reads tokenizer.chat_template; when absent falls back by general.architecture
// (gemma/gemma2/gemma3 -> Gemma, qwen2/qwen3 -> ChatML, llama with a Llama 3 vocab -> Llama3).
// Throws tandem::Error naming the architecture when neither gives a template.
ChatTemplateKind chat_template_from_gguf(const GgufFile& f);

// Renders the conversation. BOS is not included: the tokenizer adds it (add_special).
//  Gemma:  "<start_of_turn>{user|model}\n{trimmed content}<end_of_turn>\n"; system messages are
//          merged into the next user turn ("{system}\n\n{user}"); prompt "<start_of_turn>model\n".
//  ChatML: "<|im_start|>{role}\n{content}<|im_end|>\n"; prompt "<|im_start|>assistant\n".
//  Llama3: "<|start_header_id|>{role}<|end_header_id|>\n\n{trimmed content}<|eot_id|>";
//          prompt "<|start_header_id|>assistant<|end_header_id|>\n\n".
//  Phi3:   "<|{role}|>\n{content}<|end|>\n"; prompt "<|assistant|>\n".
std::string apply_chat_template(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt);
// The GGUF's own template as its Jinja text renders it: a ChatML template that writes a system
// turn of its own when the conversation has none (Qwen2.5's "You are Qwen, created by Alibaba
// Cloud. You are a helpful assistant.") gets that turn first, as llama.cpp's Jinja path
// (llama-server's default) renders it; llama.cpp's legacy built-in path leaves it out.
std::string apply_chat_template(const GgufFile& f, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt);

// The system message a ChatML template's Jinja text writes when the conversation has none: the
// first literal '<|im_start|>system\n...<|im_end|>' with plain text inside; "" when there is none.
std::string chatml_default_system(std::string_view tmpl);

}  // namespace tandem
