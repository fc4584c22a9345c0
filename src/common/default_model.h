// default_model_path lives in the public API (include/tandem/default_model.h), so that the CLI
// can name the default model without reaching into src/common. Internal code and tests may keep
// including this header.
#pragma once

#include "tandem/default_model.h"
