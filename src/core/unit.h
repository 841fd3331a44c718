// src/core/unit.h — one FSDP unit: the flat parameter of the parameters it
// owns, its shard, its hooks; the per-unit half of the engine. What the units
// of one root share, and the root's duties, are the root's (root_state.h).
// The modules above core see a unit through fsdp/core/detail/unit_view.h.
// Private to the library.
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/nn/module.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "autograd_node.h"
#include "flat_param.h"
#include "root_state.h"
#include "fsdp/core/detail/unit_view.h"
#include "fsdp/core/trace_span.h"
#include "fsdp/core/detail/forward_call.h"
#include "fsdp/distributed/process_group.h"
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

// The configuration of a unit wrapped with `o`, its shard and replicate
// groups resolved (HYBRID_SHARD: from the device mesh, or a mesh made from
// process_group and hybrid_shard_size — a collective then). ConfigError for
// options that do not fit together.
UnitConfig resolve_groups(const FSDPOptions& o);

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

// One unit. As a UnitView it is what the modules above core see; as a
// RootMember it is what its root's duties act on; as ForwardHooks it is the
// engine in its module's slot, which the holders run around the forward.
class UnitState final : public UnitView,
                        public RootMember,
                        public ForwardHooks,
                        public std::enable_shared_from_this<UnitState> {
 public:
  // Flattens `params` (already the unit's, in order) and keeps this rank's
  // shard. Collective-free (sync_module_states is done by wrap()).
  UnitState(torch::nn::Module* module, std::vector<ParamInfo> params, UnitConfig config);
  ~UnitState() override;

  // [collective over the shard group when sharded] Materialises the full
  // parameters and points the original parameters at them.
  void unshard();
  // Frees the full parameters; the original parameters show their shards.
  void reshard() override;

  // ForwardHooks (fsdp/core/detail/forward_call.h; unit.cpp): pre_forward
  // unshards and casts the floating-point inputs to the compute dtype;
  // post_forward reshards and hooks the pre-backward on the outputs;
  // forward_failed puts a unit whose forward threw back to idle.
  void pre_forward(std::vector<at::Tensor>& inputs) override;
  void post_forward(std::vector<at::Tensor>& outputs) override;
  void forward_failed() noexcept override;
  // A LibTorch error in this unit's forward: a ConfigError (carrying `what`)
  // when units below it still held only their shards without having run
  // their forward in this iteration - the trap of calling a unit's module
  // directly (unit->forward(x)), which skips the gather; returns otherwise.
  void explain_forward_error(const std::string& what) override;
  // The backward hooks (autograd; unit_backward.cpp).
  // How many forwards of this unit's tree run now (0 before its root's first forward).
  int forward_depth() const { return shared_ ? shared_->forward_depth : 0; }
  void pre_backward();
  void on_grad_ready();
  // [collective] Issues the reduction of the full gradient (waited at the
  // latest by finish_backward), reshards. Nothing unless in pre-backward.
  void post_backward() override;
  // End of backward, queued on the autograd engine by the first unit of a
  // backward: the root's (RootState::finish_backward), with this unit as the
  // tree when the root is gone.
  void finish_backward();

  // RootMember: the per-unit steps of the root's duties (root_state.h).
  bool holds_full_params() const override;
  void end_backward() override;
  void abandon_backward() override;
  // The reduced shard of this unit's gradient, for the optimizer.
  void accept_gradient(at::Tensor shard_grad) override;

  // no_sync: keep full gradients, reduce at the next synced backward.
  void set_no_sync(bool on) { no_sync_ = on; }
  // summon_full_params.
  void summon(const SummonOptions& options);
  void unsummon(const SummonOptions& options);
  // This rank's gradient tensors (sharded; the flat gradient or one per parameter).
  std::vector<at::Tensor> sharded_grads() const;

  // Makes this unit the root of the units under its module, at its first
  // forward: a RootState, which every unit of the tree joins.
  void lazy_init_root();
  // The unit of the outermost FSDP-wrapped module that holds this unit's
  // module (set by wrap(); none for a model's root).
  void set_outer(const std::shared_ptr<UnitState>& outer) { outer_ = outer; }

  // UnitView (fsdp/core/detail/unit_view.h).
  torch::nn::Module* module() const override { return module_; }
  const std::vector<ParamInfo>& params() const override { return handle_.params(); }
  const at::Tensor& flat_shard() const override { return handle_.flat_shard(); }
  int64_t numel() const override { return handle_.numel(); }
  int64_t padded_numel() const override { return handle_.padded_numel(); }
  int64_t shard_numel() const override { return handle_.shard_numel(); }
  int shard_size() const override { return handle_.shard_size(); }
  // The range of the unpadded flat parameter this rank holds begins here.
  int64_t shard_begin() const override { return handle_.shard_begin(); }
  const dist::ProcessGroupPtr& shard_group() const override { return config_.shard_group; }
  const dist::ProcessGroupPtr& replicate_group() const override { return config_.replicate_group; }
  int world_rank() const override;
  bool summoned() const override { return state_ == TrainingState::kSummoned; }
  bool awaiting_backward() const override;
  const std::vector<std::pair<at::Tensor, at::ScalarType>>& cast_buffers() const override;
  at::Tensor gather_master() const override;
  void follow_module_to() override;

  std::shared_ptr<UnitState> root() const { return root_.lock(); }
  // The units whose forward ran in this iteration, in order (empty before
  // the root's first forward).
  const std::vector<std::weak_ptr<RootMember>>& forward_order() const;
  const UnitConfig& config() const { return config_; }
  TrainingState training_state() const { return state_; }
  bool is_unsharded() const { return handle_.unsharded(); }
  at::ScalarType compute_dtype() const { return handle_.compute_dtype(); }
  // Bytes of full parameters / full gradients alive right now.
  int64_t live_full_param_bytes() const { return handle_.live_full_bytes(); }
  int64_t live_grad_bytes() const;
  // The root's state, shared by its tree (null before the root's first forward).
  const std::shared_ptr<RootState>& root_state() const { return shared_; }

  // This rank's part of parameter p, as its data outside forward: a 1-D
  // slice of the shard (shard size 1: the whole parameter, in shape).
  at::Tensor sharded_view(const at::Tensor& flat, const ParamInfo& p) const { return handle_.sharded_view(flat, p); }

 private:
  void transition(std::initializer_list<TrainingState> from, TrainingState to);
  // The steps of the forward hooks: begin (root, order, unshard), end
  // (reshard, backward hooks), undo (after a throw).
  void begin_forward();
  void end_forward(const std::vector<at::Tensor>& outputs);
  void undo_forward();
  // Count this unit's forward in its tree's forward depth (RootState::
  // forward_depth) from pre_forward, and stop counting it at post_forward
  // or forward_failed.
  void enter_forward();
  void leave_forward();
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
  int units_unsharded() const;

  torch::nn::Module* module_;
  UnitConfig config_;
  FlatParamHandle handle_;
  TrainingState state_ = TrainingState::kIdle;
  at::Tensor full_grad_;  // [padded_numel] from pre-backward until the reduction is issued
  // Per parameter: its sharded gradient from before this backward.
  std::vector<at::Tensor> saved_grads_;
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
  std::shared_ptr<RootState> shared_;
  // The tree whose forward depth counts this unit's running forward.
  std::shared_ptr<RootState> depth_counter_;

  // Profiler spans (trace_span.h): the unit's path in its root ("(root)"
  // for the root; set at the root's lazy init), and its forward and
  // backward, which begin and end in different hooks.
  std::string path_;
  Span forward_span_, backward_span_;
};

// The units of `model`'s tree, pre-order (wrap.cpp).
std::vector<std::shared_ptr<UnitState>> units_of(const std::shared_ptr<torch::nn::Module>& model);

// Gives every Sequential element under `root` that is a unit or checkpointed
// (wrapped before it was placed there) the stand-in that runs it.
void interpose_sequential_elements(torch::nn::Module& root);

// True when `t` is the flat parameter (shard) of some FSDP unit (wrap.cpp).
bool is_flat_param(const at::Tensor& t);


// Parameters of `model` that no unit owns (ignored modules), each once.
std::vector<at::Tensor> unowned_params(const std::shared_ptr<torch::nn::Module>& model);

}  // namespace fsdp::detail
