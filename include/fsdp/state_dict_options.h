// fsdp/state_dict_options.h — DEPRECATED forwarding header: the header moved to
// fsdp/state_dict/state_dict_options.h.
// Include that instead. fsdp-cpp 0.1 keeps this file for one release; the
// next one removes it.
#pragma once
#pragma message("fsdp/state_dict_options.h is deprecated: include fsdp/state_dict/state_dict_options.h")

#include "fsdp/state_dict/state_dict_options.h"
