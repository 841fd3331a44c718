// src/core/root_state.h — the root's state: what the units of one root's tree
// share (as FSDP2's FSDPState and FSDPStateContext), made at the root's first
// forward, and the root's duties - a new iteration (with the recovery from a
// backward that threw), the reductions in flight, the end of the backward.
// It knows the units only as RootMembers, so it serves any engine whose
// units implement that (UnitState does: unit.h). Private to the library.
#pragma once

#include <ATen/core/Tensor.h>

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/stats.h"
#include "fsdp/distributed/process_group.h"

namespace torch::nn {
class Module;
}

namespace fsdp::detail {

class BufferPool;

// One unit of a root's tree, as the root's duties see it. Every call is
// local unless it says otherwise.
class RootMember {
 public:
  virtual ~RootMember() = default;
  // Its full parameters are alive or being gathered (and are not its shard itself).
  virtual bool holds_full_params() const = 0;
  // Frees its full parameters.
  virtual void reshard() = 0;
  // [collective when it reduces] End of backward, before the reductions
  // complete: a unit in pre-backward (some gradients never arrived: unused
  // parameters) issues the reduction of what it has; any other does nothing.
  virtual void post_backward() = 0;
  // End of backward, after the reductions completed: back to idle, resharded.
  virtual void end_backward() = 0;
  // A new iteration after a backward that threw: a unit still in backward
  // drops its full gradient, goes back to idle and reshards.
  virtual void abandon_backward() = 0;
  // The reduced shard of its gradient, for the optimizer.
  virtual void accept_gradient(at::Tensor shard_grad) = 0;
};

// One unit's gradient reduction, issued and not yet complete.
struct PendingReduction {
  std::shared_ptr<RootMember> unit;
  std::string path;          // the unit's, for the profiler's spans
  const char* wait_span = "all_reduce.wait";  // the span of the wait
  dist::Work work;           // the collective in flight
  at::Tensor input;          // what it reads: kept alive until it finished
  at::Tensor output;         // this rank's reduced gradient (reduce dtype)
  dist::ProcessGroupPtr replicate_group;  // HYBRID_SHARD's (null: none)
  bool replicate_next = false;  // HYBRID_SHARD: the replicate all-reduce is still to issue
};

class RootState {
 public:
  // At the root's first forward: a buffer pool for the tree, and every
  // floating-point buffer under `root_module` cast to `buffer_dtype` (when
  // set; the original dtypes are kept in cast_buffers). `root` is the root
  // unit. The units join by adding themselves to `tree`.
  RootState(std::weak_ptr<RootMember> root, torch::nn::Module& root_module, std::optional<at::ScalarType> buffer_dtype);

  // A forward of the root with no unit's forward around it: a new
  // iteration. Recovers from a backward that threw (completes the
  // reductions it issued - every rank issued the same - and puts every unit
  // still in backward back to idle), keeps the last forward order for
  // prefetching, and starts a new one.
  void begin_iteration();
  // How many units of the tree other than the root hold full parameters
  // (0 once the root is gone).
  int units_unsharded() const;
  // Reshards every unit of the tree (a forward without a backward to follow).
  void reshard_tree();
  // Takes the reduction a unit issued (`communicates`: it sends bytes),
  // counts it, and completes the oldest ones until at most
  // `max_in_flight` are in flight.
  void add_reduction(PendingReduction r, bool communicates, int max_in_flight);
  // [collective for HYBRID_SHARD] Completes every pending reduction, in
  // issue order (the same on every rank), and hands each gradient over.
  void drain_reductions();
  // [collective] End of backward (queued on the autograd engine): units whose
  // gradients never all arrived reduce what they have, every reduction
  // completes, every unit goes back to idle and reshards. `caller` stands
  // for the tree when none of it is alive any more (a lone unit).
  void finish_backward(const std::shared_ptr<RootMember>& caller);

  std::shared_ptr<BufferPool> pool;
  RuntimeStats stats;
  std::deque<PendingReduction> pending;  // in issue order, the same on every rank
  // How many forwards of the tree's units run now (0 at the root's forward:
  // a new iteration). Per tree, as FSDP2 counts per state: a model run
  // inside another model's forward starts its own iterations.
  int forward_depth = 0;
  // True from a forward that will be differentiated until its backward ends.
  bool awaiting_backward = false;
  // The end-of-backward callback is queued on the autograd engine.
  bool callback_queued = false;
  // Buffers cast by mixed precision, with their original dtypes.
  std::vector<std::pair<at::Tensor, at::ScalarType>> cast_buffers;
  std::vector<std::weak_ptr<RootMember>> tree;        // every unit of the root's tree, pre-order
  std::vector<std::weak_ptr<RootMember>> order;       // forward order of this iteration
  std::vector<std::weak_ptr<RootMember>> last_order;  // ... and of the previous one (for prefetching)

 private:
  // Waits for the oldest pending reduction and hands its gradient over.
  void complete_oldest_reduction();
  // HYBRID_SHARD: waits for r's reduce-scatter and issues its all-reduce
  // over the replicate group.
  static void start_replicate_stage(PendingReduction& r);

  std::weak_ptr<RootMember> root_;
};

}  // namespace fsdp::detail
