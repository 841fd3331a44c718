// fsdp/checkpoint_io.h — DEPRECATED forwarding header: the header moved to
// fsdp/checkpoint/checkpoint_io.h.
// Include that instead. fsdp-cpp 0.1 keeps this file for one release; the
// next one removes it.
#pragma once
#pragma message("fsdp/checkpoint_io.h is deprecated: include fsdp/checkpoint/checkpoint_io.h")

#include "fsdp/checkpoint/checkpoint_io.h"
