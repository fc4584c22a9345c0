// Where the tools and tests find the default model (Gemma 3 270M Q4_K_M) that
// scripts/fetch_model.sh assembles: $TANDEM_MODEL if set, else
// ${TANDEM_CACHE:-$HOME/.cache/tandem}/models/gemma-3-270m-q4_k_m.gguf. Public (owned by
// src/common), so that the CLI's -m defaults need no internal header.
#pragma once

#include <string>

namespace tandem {

std::string default_model_path();

}  // namespace tandem
