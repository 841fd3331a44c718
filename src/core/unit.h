// src/core/unit.h — one FSDP unit: the flat parameter of the parameters it
// owns, its shard, its hooks. Private to the library.
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/nn/module.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "autograd_node.h"
#include "flat_param.h"
#include "trace_span.h"
#include "fsdp/core/detail/forward_call.h"
#include "fsdp/dist/process_group.h"
#include "fsdp/core/fully_sharded_data_parallel.h"
#include "fsdp/core/stats.h"

namespace fsdp::detail {

// Per-unit configuration resolved by wrap(). It has no defaults of its own:
// the one constructor copies every setting from the FSDPOptions the unit was
// wrapped with (whose defaults are the only ones, fsdp/core/options.h); the
// groups are resolved by wrap() (resolve_groups).
struct UnitConfig {
  explicit UnitConfig(const FSDPOptions& options);

  ShardingStrategy strategy;
  bool use_orig_params;
  dist::ProcessGroupPtr shard_group;      // null: shards of one (no sharding)
  dist::ProcessGroupPtr replicate_group;  // null: no replication
  std::optional<at::ScalarType> param_dtype;   // compute dtype (unset: the parameters')
  std::optional<at::ScalarType> reduce_dtype;  // gradient reduction dtype (unset: compute dtype)
  std::optional<at::ScalarType> buffer_dtype;
  bool forward_prefetch;
  BackwardPrefetch backward_prefetch;
  bool limit_all_gathers;
  int max_reductions_in_flight;
};

class BufferPool;
class UnitState;

// A unit's training state. Transitions (anything else is an internal error):
//   kIdle -> kForward (pre-forward) -> kIdle (post-forward; or kPreBackward
//     when the outputs carry no tensor to hook the backward on);
//   kIdle -> kPreBackward (the backward reached the unit's outputs; a forward
//     re-run by activation checkpointing stays there) -> kPostBackward (all
//     its gradients are ready: the reduction is issued) -> kIdle (end of
//     backward: the reduction is complete);
//   kIdle -> kSummoned -> kIdle (summon_full_params).
enum class TrainingState { kIdle, kForward, kPreBackward, kPostBackward, kSummoned };
const char* to_string(TrainingState s);

// One unit's gradient reduction, issued and not yet complete.
struct PendingReduction {
  std::shared_ptr<UnitState> unit;
  dist::Work work;         // the collective in flight
  at::Tensor input;        // what it reads: kept alive until it finished
  at::Tensor output;       // this rank's reduced gradient (reduce dtype)
  bool replicate_next = false;  // HYBRID_SHARD: the replicate all-reduce is still to issue
};

// What the units of one root share, made at the root's first forward (as
// FSDP2's FSDPStateContext): the buffer pool, the counters, the reductions in
// flight (in issue order, the same on every rank), and the root's state of
// the iteration.
struct RootShared {
  std::shared_ptr<BufferPool> pool;
  RuntimeStats stats;
  std::deque<PendingReduction> pending;
  // True from a forward that will be differentiated until its backward ends.
  bool awaiting_backward = false;
  // The end-of-backward callback is queued on the autograd engine.
  bool callback_queued = false;
  // Buffers cast by mixed precision, with their original dtypes.
  std::vector<std::pair<at::Tensor, at::ScalarType>> cast_buffers;
  std::vector<std::weak_ptr<UnitState>> tree;        // every unit of the root's tree, pre-order
  std::vector<std::weak_ptr<UnitState>> order;       // forward order of this iteration
  std::vector<std::weak_ptr<UnitState>> last_order;  // ... and of the previous one (for prefetching)
};

class UnitState : public std::enable_shared_from_this<UnitState> {
 public:
  // Flattens `params` (already the unit's, in order) and keeps this rank's
  // shard. Collective-free (sync_module_states is done by wrap()).
  UnitState(torch::nn::Module* module, std::vector<ParamInfo> params, UnitConfig config);
  ~UnitState();

  // [collective over the shard group when sharded] Materialises the full
  // parameters and points the original parameters at them.
  void unshard();
  // Frees the full parameters; the original parameters show their shards.
  void reshard();

  void pre_forward();
  void post_forward(const std::vector<at::Tensor>& outputs);
  void forward_failed();
  void pre_backward();
  void on_grad_ready();
  // [collective] Issues the reduction of the full gradient (waited at the
  // latest by finish_backward), reshards.
  void post_backward();
  // End of backward for the root: issues what is left, completes every
  // pending reduction of its tree, reshards.
  void finish_backward();

  // no_sync: keep full gradients, reduce at the next synced backward.
  void set_no_sync(bool on) { no_sync_ = on; }
  // summon_full_params.
  void summon(const SummonOptions& options);
  void unsummon(const SummonOptions& options);
  // [collective over the shard group when sharded] The full flat parameter
  // in the master dtype (not the compute dtype), as a new tensor.
  at::Tensor gather_master() const;
  // This rank's gradient tensors (sharded; the flat gradient or one per parameter).
  std::vector<at::Tensor> sharded_grads() const;

  // Root bookkeeping (set at the root's first forward).
  void lazy_init_root();
  // The unit of the outermost FSDP-wrapped module that holds this unit's
  // module (set by wrap(); none for a model's root).
  void set_outer(const std::shared_ptr<UnitState>& outer) { outer_ = outer; }

  // Adopts a dtype or device change made by Module::to() (model->to(kHalf)):
  // the flat parameter's new data (use_orig_params=false) or the original
  // parameters' (true) becomes the shard. Called before every use of the shard.
  void follow_module_to();
  // True from a forward that will be differentiated until its backward ends
  // (or the next forward of the root starts).
  bool awaiting_backward() const;
  bool summoned() const { return state_ == TrainingState::kSummoned; }
  // Rank in the unit's whole world (replicate rank * shard size + shard rank).
  int world_rank() const;
  // Buffers cast by mixed precision, with their original dtypes (empty
  // before the root's first forward).
  const std::vector<std::pair<at::Tensor, at::ScalarType>>& cast_buffers() const;
  std::shared_ptr<UnitState> root() const { return root_.lock(); }
  // The units whose forward ran in this iteration, in order (empty before
  // the root's first forward).
  const std::vector<std::weak_ptr<UnitState>>& forward_order() const;

  torch::nn::Module* module() const { return module_; }
  const FlatParamHandle& handle() const { return handle_; }
  const std::vector<ParamInfo>& params() const { return handle_.params(); }
  const UnitConfig& config() const { return config_; }
  TrainingState training_state() const { return state_; }
  int64_t numel() const { return handle_.numel(); }
  int64_t padded_numel() const { return handle_.padded_numel(); }
  int64_t shard_numel() const { return handle_.shard_numel(); }
  int shard_size() const { return handle_.shard_size(); }
  int shard_rank() const { return handle_.shard_rank(); }
  bool is_unsharded() const { return handle_.unsharded(); }
  at::ScalarType compute_dtype() const { return handle_.compute_dtype(); }
  const at::Tensor& flat_shard() const { return handle_.flat_shard(); }
  // Bytes of full parameters / full gradients alive right now.
  int64_t live_full_param_bytes() const { return handle_.live_full_bytes(); }
  int64_t live_grad_bytes() const;
  // The root's shared runtime (null before the root's first forward).
  const std::shared_ptr<RootShared>& shared() const { return shared_; }

  // This rank's part of parameter p, as its data outside forward: a 1-D
  // slice of the shard (shard size 1: the whole parameter, in shape).
  at::Tensor sharded_view(const at::Tensor& flat, const ParamInfo& p) const { return handle_.sharded_view(flat, p); }
  // The range of the unpadded flat parameter this rank holds.
  int64_t shard_begin() const { return handle_.shard_begin(); }

 private:
  void transition(std::initializer_list<TrainingState> from, TrainingState to);
  // The unit's all-gather: start issues it (counted; returns whether it
  // issued one), finish waits for it.
  bool start_unshard();
  void finish_unshard();
  // The unit that ran `step` places after this one in the last recorded
  // forward order (+1: next forward, -1: next backward).
  std::shared_ptr<UnitState> neighbour(int step) const;
  void prefetch(int step);
  void hook_accumulators();
  // Issues the reduction of full_grad_ (post-backward), bounded by
  // max_reductions_in_flight over the root's tree.
  void issue_reduction();
  // The reduced shard of this unit's gradient, for the optimizer.
  void accept_gradient(at::Tensor shard_grad);
  // Root: waits for the oldest pending reduction and hands its gradient over.
  void complete_oldest_reduction();
  // HYBRID_SHARD: waits for r's reduce-scatter and issues its all-reduce
  // over the replicate group.
  static void start_replicate_stage(PendingReduction& r);
  // Root: completes every pending reduction, in issue order.
  void drain_reductions();
  // Root, at a new iteration: cleans up after a backward that threw.
  void recover_from_unfinished_backward();
  int units_unsharded() const;

  torch::nn::Module* module_;
  UnitConfig config_;
  FlatParamHandle handle_;
  TrainingState state_ = TrainingState::kIdle;
  at::Tensor full_grad_;  // [padded_numel] from pre-backward until the reduction is issued
  bool no_sync_ = false;
  bool summon_was_unsharded_ = false;
  at::Tensor summon_snapshot_;
  at::Tensor summon_full_;

  // Backward bookkeeping.
  std::vector<NodePtr> accumulators_;
  int grads_expected_ = 0;
  int grads_ready_ = 0;

  // The unit's place under its root (set at the root's lazy init): the
  // root's own state lives in shared_, which every unit of its tree holds.
  bool is_root_ = false;
  std::weak_ptr<UnitState> root_;
  std::weak_ptr<UnitState> outer_;
  std::shared_ptr<RootShared> shared_;

  // Profiler spans (trace_span.h): the unit's path in its root ("(root)"
  // for the root; set at the root's lazy init), and its forward and
  // backward, which begin and end in different hooks.
  std::string path_;
  Span forward_span_, backward_span_;
};

// The units of `model`'s tree, pre-order (wrap.cpp).
std::vector<std::shared_ptr<UnitState>> units_of(const std::shared_ptr<torch::nn::Module>& model);

// Makes `m` (at `path`, a child of `parent`) interposable: its fsdp::Unit
// slot, or a stand-in in its parent Sequential; ConfigError naming `why`
// (the feature that wants it) otherwise (wrap.cpp).
std::shared_ptr<Slot> interpose(torch::nn::Module* parent, torch::nn::Module& m, const std::string& path,
                                const std::string& why);

// Gives every Sequential element under `root` that is a unit or checkpointed
// (wrapped before it was placed there) the stand-in that runs it.
void interpose_sequential_elements(torch::nn::Module& root);

// True when `t` is the flat parameter (shard) of some FSDP unit (wrap.cpp).
bool is_flat_param(const at::Tensor& t);


// Parameters of `model` that no unit owns (ignored modules), each once.
std::vector<at::Tensor> unowned_params(const std::shared_ptr<torch::nn::Module>& model);

}  // namespace fsdp::detail
