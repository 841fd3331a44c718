// fsdp/core/stats.h — what a rank holds and what the FSDP runtime did: the
// values of fsdp::memory_stats and fsdp::runtime_stats (fsdp/core/utils.h,
// which fill them). Plain values; nothing here communicates.
#pragma once

#include <cstdint>

namespace fsdp {

// Bytes a rank holds right now for the model's FSDP units (padding included).
struct MemoryStats {
  int64_t sharded_param_bytes = 0;    // flat shards
  int64_t unsharded_param_bytes = 0;  // full parameters currently materialised
  int64_t grad_bytes = 0;             // sharded gradients and live full-gradient buffers
  int64_t largest_unit_bytes = 0;     // largest unit's full (padded) size
};
// What the FSDP runtime did on this rank for one wrapped model since
// its first forward (or the last reset_runtime_stats): the collectives it
// issued for its units, and how many were in flight at once. "In flight":
// issued and not yet waited by this rank (the backend may have finished).
// Counters cost nothing measurable; they exist for tests, benchmarks and
// fsdp-train's logs. The bytes are the collectives' payloads; in a ring each
// rank sends (world - 1) / world of them.
struct RuntimeStats {
  int64_t all_gathers = 0;              // parameter all-gathers issued (forward, backward, prefetch)
  int64_t prefetches = 0;               // of them, issued ahead of the unit's own use
  int all_gathers_in_flight = 0;        // now
  int peak_all_gathers_in_flight = 0;
  int peak_units_unsharded = 0;         // units other than the root holding (or gathering) full parameters at once
  int64_t reductions = 0;               // gradient reductions issued (one per unit and synced backward)
  int reductions_in_flight = 0;         // now
  int peak_reductions_in_flight = 0;   // at the end of each post-backward hook (see max_reductions_in_flight)
  double all_gather_wait_s = 0;        // time this rank's host blocked waiting for all-gathers
  double reduction_wait_s = 0;         // ... and for reductions
  int64_t all_gather_bytes = 0;        // the full parameters gathered (the all-gathers' output), in bytes
  int64_t reduction_bytes = 0;         // the gradients reduced (the reductions' input), in bytes
};
}  // namespace fsdp
