// One message of a conversation, for a model's chat template (Model::chat_prompt in
// tandem/engine.h). Its own header because the tokenizer, which renders the templates, sits
// below the engine's public header (src/layers.txt).
#pragma once

#include <string>

namespace tandem {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" (anything else is passed through)
  std::string content;
};

}  // namespace tandem
