// fsdp/checkpoint.h — DEPRECATED forwarding header: the header moved to
// fsdp/core/activation_checkpointing.h (or fsdp/fsdp.h, all of FSDP).
// Include that instead. fsdp-cpp 0.1 keeps this file for one release; the
// next one removes it.
#pragma once
#pragma message("fsdp/checkpoint.h is deprecated: include fsdp/core/activation_checkpointing.h")

#include "fsdp/fsdp.h"
