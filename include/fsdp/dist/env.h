// fsdp/dist/env.h — DEPRECATED forwarding header: the header moved to
// fsdp/launch/env.h.
// Include that instead. fsdp-cpp 0.1 keeps this file for one release; the
// next one removes it.
#pragma once
#pragma message("fsdp/dist/env.h is deprecated: include fsdp/launch/env.h")

#include "fsdp/launch/env.h"
