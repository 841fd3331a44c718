// fsdp/loggers.h — DEPRECATED forwarding header: the header moved to
// fsdp/observability/loggers.h.
// Include that instead. fsdp-cpp 0.1 keeps this file for one release; the
// next one removes it.
#pragma once
#pragma message("fsdp/loggers.h is deprecated: include fsdp/observability/loggers.h")

#include "fsdp/observability/loggers.h"
