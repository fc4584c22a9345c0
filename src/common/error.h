// tandem::Error lives in the public API (include/tandem/error.h), so that code above the engine
// can catch it without reaching into src/common. Internal code may keep including this header.
#pragma once

#include "tandem/error.h"
