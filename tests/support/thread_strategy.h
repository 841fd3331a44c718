// Test helper: FSDPStrategy on ranks that are threads of one process.
#pragma once

#include "fsdp/strategy/strategy.h"

namespace fsdp::testing {

// [collective] setup_environment, then a barrier. Ranks that are threads of
// one process share LibTorch's default generator, which setup_environment
// seeds on each rank: no rank may build its model (draw from the generator)
// while another may still reseed it. Processes need no such wait, so the
// library does not make it.
inline void setup_thread_rank(FSDPStrategy& strategy) {
  strategy.setup_environment();
  strategy.barrier();
}

}  // namespace fsdp::testing
