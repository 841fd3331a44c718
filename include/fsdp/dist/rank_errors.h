// fsdp/dist/rank_errors.h — DEPRECATED forwarding header: the folder dist/ is now
// distributed/ (PyTorch's name; "dist/" is build output to many tools).
// Include fsdp/distributed/rank_errors.h instead. fsdp-cpp 0.1 keeps this file for
// one release; the next one removes it.
#pragma once
#pragma message("fsdp/dist/rank_errors.h is deprecated: include fsdp/distributed/rank_errors.h")

#include "fsdp/distributed/rank_errors.h"
