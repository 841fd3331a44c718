// fsdp/optim_state_dict.h — DEPRECATED forwarding header: the header moved to
// fsdp/state_dict/optim_state_dict.h.
// Include that instead. fsdp-cpp 0.1 keeps this file for one release; the
// next one removes it.
#pragma once
#pragma message("fsdp/optim_state_dict.h is deprecated: include fsdp/state_dict/optim_state_dict.h")

#include "fsdp/state_dict/optim_state_dict.h"
