// fsdp/dist/process_group.h — DEPRECATED forwarding header: the folder dist/ is now
// distributed/ (PyTorch's name; "dist/" is build output to many tools).
// Include fsdp/distributed/process_group.h instead. fsdp-cpp 0.1 keeps this file for
// one release; the next one removes it.
#pragma once
#pragma message("fsdp/dist/process_group.h is deprecated: include fsdp/distributed/process_group.h")

#include "fsdp/distributed/process_group.h"
