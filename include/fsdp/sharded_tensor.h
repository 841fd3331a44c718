// fsdp/sharded_tensor.h — DEPRECATED forwarding header: the header moved to
// fsdp/state_dict/sharded_tensor.h.
// Include that instead. fsdp-cpp 0.1 keeps this file for one release; the
// next one removes it.
#pragma once
#pragma message("fsdp/sharded_tensor.h is deprecated: include fsdp/state_dict/sharded_tensor.h")

#include "fsdp/state_dict/sharded_tensor.h"
