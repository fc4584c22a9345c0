// One token of a batch, as Context::decode (tandem/engine.h) takes it and the model's forward
// pass (src/model/forward.h) runs it. In a header of its own, owned by the model layer, so that
// the model does not include the runtime's public header (src/layers.txt); engine.h includes it.
#pragma once

#include <cstdint>

namespace tandem {

using TokenId = int32_t;

// One token of a batch: its id, its position in its sequence, the sequence slot, and what the
// caller wants back for it.
struct BatchToken {
  TokenId token = 0;
  int32_t pos = 0;
  int32_t seq = 0;
  bool want_logits = false;
  bool want_hidden = false;
};

}  // namespace tandem
