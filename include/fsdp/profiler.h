// fsdp/profiler.h — DEPRECATED forwarding header: the header moved to
// fsdp/observability/profiler.h.
// Include that instead. fsdp-cpp 0.1 keeps this file for one release; the
// next one removes it.
#pragma once
#pragma message("fsdp/profiler.h is deprecated: include fsdp/observability/profiler.h")

#include "fsdp/observability/profiler.h"
