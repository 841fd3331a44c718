#include "fsdp/fault_points/fault_points.h"

#include <atomic>

namespace {

// Constant-initialised: valid before any static initialiser runs.
std::atomic<fsdp_fault_hook> g_hook{nullptr};

}  // namespace

extern "C" fsdp_fault_hook fsdp_set_fault_hook(fsdp_fault_hook hook) { return g_hook.exchange(hook); }

namespace fsdp::detail {

void fault_point(const char* point, int rank) {
  if (const fsdp_fault_hook hook = g_hook.load(std::memory_order_acquire)) hook(point, rank);
}

}  // namespace fsdp::detail
