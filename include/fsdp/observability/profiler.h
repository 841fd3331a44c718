// fsdp/observability/profiler.h — LibTorch's own profiler (Kineto) over chosen steps,
// saved as a Chrome trace (JSON; it opens in Perfetto, chrome://tracing and
// TensorBoard's profiler plugin).
//
//   fsdp::Profiler prof;
//   for (int64_t step = 1; step <= steps; ++step) {
//     if (step == 5) prof.start();
//     ... forward, backward, optimizer step ...
//     if (step == 7) prof.stop(fsdp::unused_trace_path("profile/rank_" + std::to_string(rank) + ".pt.trace.json"));
//   }
//
// The trace holds LibTorch's operators and FSDP's phases as user
// annotations named "fsdp::<phase> <unit path>" ("(root)" for the root
// unit): forward, backward, all_gather.issue, all_gather.wait, prefetch
// (around the all-gather it issues for the named unit), reduce_scatter.issue,
// reduce_scatter.wait (all_reduce.* under NO_SHARD and for HYBRID_SHARD's
// replicas), and optimizer.step (FSDPStrategy::optimizer_step). With no
// profiler on, these annotations cost one thread-local check each.
//
// Where LibTorch has no Kineto writer (Debian's 1.13 records the events but
// cannot save them), stop() writes the events itself as a minimal Chrome
// trace: complete events with name, cat ("user_annotation" for these
// spans), pid, tid, ts and dur.
//
// Local: every rank records its own trace. One profiler per process at a
// time (LibTorch's is per process): ranks that are threads of one process
// cannot each profile.
#pragma once

#include <cstdint>
#include <string>

namespace fsdp {

class Profiler {
 public:
  Profiler() = default;
  // Stops a profile still running, without saving it.
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Starts recording this thread's CPU activity, and the threads LibTorch
  // propagates it to (autograd's; a plain std::thread is not recorded), and
  // CUDA's where the LibTorch has CUDA and `cuda` is set. Error when the
  // profiler is already running in this process, or LibTorch refuses.
  // Costs a few milliseconds.
  void start(bool cuda = false);
  // Stops and writes the Chrome trace to `path` (its directory created).
  // A trace that cannot be written (its directory is a file, the disk is
  // full) is a warning naming the path and the reason, through c10's
  // warning handler (TORCH_WARN, as the loggers' failures), and false: the
  // profile is lost, training goes on; a partly written trace is removed.
  // Error only when the profiler is not running. Costs the trace's
  // processing: about a second per 100 000 events.
  bool stop(const std::string& path);
  bool running() const { return running_; }

 private:
  bool running_ = false;
};

// `path` if nothing is there, else the first of "<stem>.1<ext>",
// "<stem>.2<ext>", ... that is free, where <ext> is ".pt.trace.json" (or the
// last extension): a later job's trace keeps an earlier one's.
std::string unused_trace_path(const std::string& path);

// Steps "A:B" (1-based, A <= B, both included) to profile; parse_step_range
// gives a ConfigError naming `what` ("--profile-steps") and the expected form.
struct StepRange {
  int64_t first = 0, last = 0;  // 0, 0: none
  bool empty() const { return first == 0; }
  bool contains(int64_t step) const { return !empty() && step >= first && step <= last; }
};
StepRange parse_step_range(const std::string& text, const std::string& what);

}  // namespace fsdp
