// fsdp/unit_list.h — DEPRECATED forwarding header: the header moved to
// fsdp/core/unit_list.h (or fsdp/fsdp.h, all of FSDP).
// Include that instead. fsdp-cpp 0.1 keeps this file for one release; the
// next one removes it.
#pragma once
#pragma message("fsdp/unit_list.h is deprecated: include fsdp/core/unit_list.h")

#include "fsdp/fsdp.h"
