// The JSON depth check lives in the public API (include/tandem/json_guard.h), so that the
// browser view (which includes only include/tandem/) checks request bodies as the server does.
// Internal code may keep including this header.
#pragma once

#include "tandem/json_guard.h"
