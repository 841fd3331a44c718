// fsdp/strategy.h — DEPRECATED forwarding header: the header moved to
// fsdp/strategy/strategy.h (and grad_scaler.h, registry.h).
// Include that instead. fsdp-cpp 0.1 keeps this file for one release; the
// next one removes it.
#pragma once
#pragma message("fsdp/strategy.h is deprecated: include fsdp/strategy/strategy.h")

#include "fsdp/fsdp.h"
#include "fsdp/strategy/grad_scaler.h"
#include "fsdp/strategy/registry.h"
#include "fsdp/strategy/strategy.h"
