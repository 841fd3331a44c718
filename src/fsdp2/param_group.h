// src/fsdp2/param_group.h — the FSDP2 engine: one fully_shard call's group of
// parameters (torch's FSDPParamGroup), each parameter sharded on its own
// (torch's FSDPParam), and the root's context that the groups of one model
// share (torch's FSDPStateContext). Private to the fsdp2 module.
//
// The layout is torch's, so that every collective moves and sums what
// torch's moves and sums:
//  - parameter i of a group keeps `padded` = ceil(dim0 / W) rows (W: the
//    shard group's size), the first `local_rows` of them its own;
//  - the all-gather input is the concatenation of every parameter's padded
//    rows; the output is W such blocks, rank after rank; each parameter's
//    full tensor is copied out of its W blocks (copy-out);
//  - the reduce-scatter input is W blocks, block r holding every
//    parameter's padded rows r (torch's chunk_cat), zero padding included;
//    the output is this rank's block, and each sharded gradient a view of it.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/core/detail/forward_call.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/fsdp2/options.h"

namespace fsdp::detail {

// A leaf's AccumulateGrad node (std::shared_ptr in LibTorch 1.13, c10::intrusive_ptr in 2.x).
using GradAccumulator = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

// One parameter of a group.
struct FSDPParam {
  at::Tensor param;  // the module's parameter object; its TensorImpl never changes
  std::string name;  // relative to the group's module
  std::vector<int64_t> shape;
  int64_t rows = 0, row_numel = 1;  // dim 0, and elements per row
  int64_t padded_rows = 0;          // ceil(rows / W): every rank's padded shard
  int64_t local_rows = 0, row_offset = 0;
  bool requires_grad = true;
  at::Tensor padded;           // [padded_rows * row_numel], the parameter's dtype: the sharded data
  at::Tensor local;            // padded's first local_rows rows, in shape: the optimizer's tensor
  at::Tensor full;             // [W * padded_numel] in the compute dtype; its storage holds memory only while unsharded
  at::Tensor sharded_grad;     // the sharded gradient, kept aside while the parameter is unsharded
  at::Tensor unsynced_grad;    // full gradient accumulated without sync, while sharded
  at::Tensor accumulated_grad;  // without grad_dtype (old LibTorch): full gradient accumulated without sync in reduce_dtype
  // The unsharded parameter's AccumulateGrad nodes that a graph may still
  // send gradients to (each unshard after a change of dtype makes a new one):
  // grad_dtype, torch's property of its one unsharded parameter, goes to all.
  std::vector<GradAccumulator> grad_accumulators;

  int64_t numel() const { return rows * row_numel; }
  int64_t padded_numel() const { return padded_rows * row_numel; }
  std::vector<int64_t> local_shape() const;
};

enum class GroupState { kIdle, kForward, kPreBackward, kPostBackward };

class ParamGroup;

// What the groups of one root's tree share, made at the root's first forward.
struct RootContext {
  std::vector<std::weak_ptr<ParamGroup>> groups;         // the tree, pre-order
  std::vector<std::weak_ptr<ParamGroup>> forward_order;  // this iteration's
  bool callback_queued = false;                          // the end-of-backward callback
  bool is_last_backward = true;
  // Reductions issued and not yet completed, oldest first.
  struct Pending {
    std::shared_ptr<ParamGroup> group;
    dist::Work work;
    at::Tensor input, output;
    std::vector<size_t> params;  // the group's parameters in this reduction, in order
    std::optional<double> post;  // the division after the reduction
    dist::ReduceOp all_reduce_op = dist::ReduceOp::kSum;  // across replicas (2-D mesh)
    bool all_reduce = true;  // false: kept in the group's partial_reduce_output_ instead
  };
  std::vector<Pending> pending;
};

// One fully_shard call's group. A call on a list of modules makes one group
// of several modules (torch's _register_group_forward_hooks): the first of
// them to run in a pass gathers, each casts its inputs (and outputs), and the
// last to run ends the group's forward (reshard, pre-backward hooks); the
// root's post-forward ends the forward of groups whose modules did not all run.
class ParamGroup final : public std::enable_shared_from_this<ParamGroup> {
 public:
  ParamGroup(std::vector<torch::nn::Module*> modules, std::vector<FSDPParam> params, FullyShardOptions options);
  ~ParamGroup();

  // The forward of `module` (one of modules()), through its ModuleHooks.
  void pre_forward(std::vector<at::Tensor>& inputs);
  void post_forward(torch::nn::Module* module, std::vector<at::Tensor>& outputs);
  void forward_failed() noexcept;

  // [collective over the shard group] Issues the all-gather (nothing when
  // unsharded or gathering); wait_unshard completes it (copy-out).
  void start_unshard();
  void wait_unshard();
  void unshard() {
    start_unshard();
    wait_unshard();
  }
  // [local] The parameters show their shards again.
  void reshard();
  // [local] reshard(), keeping 1/n of the full parameters (n: the
  // post-forward group's size) for backward to gather within that group.
  void reshard_to_post_forward();

  void pre_backward();
  // [collective when it reduces] This group's gradients are complete.
  void post_backward();
  // The root's end of backward (queued on the autograd engine).
  void finish_backward();

  // The modules fully_shard was applied to (one, or a list's roots).
  const std::vector<torch::nn::Module*>& modules() const { return modules_; }
  torch::nn::Module* module() const { return modules_.front(); }
  // The modules' names, for messages ("A", or "[A, B]" for a list).
  std::string name() const;
  const std::vector<FSDPParam>& params() const { return params_; }
  const FullyShardOptions& options() const { return options_; }
  int shard_size() const { return shard_size_; }
  bool unsharded() const { return unsharded_; }
  int64_t live_grad_bytes() const;

  // FSDPModule's settings.
  bool requires_gradient_sync = true;
  bool requires_all_reduce = true;  // 2-D mesh: all-reduce across replicas after the reduce-scatter
  bool reshard_after_backward = true;
  std::optional<bool> reshard_after_forward;  // unset: false for the root, true otherwise
  // reshard_after_forward as an int n below the shard size: the group of n
  // consecutive shard-group ranks this rank keeps 1/n of the full parameters
  // with after forward (null otherwise).
  dist::ProcessGroupPtr post_forward_group;
  std::optional<double> gradient_divide_factor;
  bool force_sum_reduction = false;
  std::vector<std::weak_ptr<ParamGroup>> forward_prefetch, backward_prefetch;
  const std::shared_ptr<RootContext>& context() const { return ctx_; }
  bool is_root() const { return is_root_; }

 private:
  void lazy_init();
  void prefetch(const std::vector<std::weak_ptr<ParamGroup>>& groups);
  std::shared_ptr<ParamGroup> previous_in_forward() const;
  // Issues the reduction of the gradients this backward computed.
  void reduce();
  // Completes the oldest pending reduction of the root's context.
  static void complete(RootContext::Pending& p);
  bool resharded_after_forward() const;
  // Between a forward that leaves this group unsharded and its backward,
  // the parameters' .grad is their sharded gradient, as torch's sharded
  // parameters show it (an optimizer's zero_grad there clears it); the
  // unsharded parameters' gradient slot waits aside. hide puts it back
  // before backward accumulates into it. Both are no-ops when not needed.
  void show_sharded_grads();
  void hide_sharded_grads();
  // The group's post-forward: reshard (as set), pre-backward hooks on
  // `outputs`, idle; and the output dtype cast.
  void end_forward(std::vector<at::Tensor>& outputs);
  void cast_outputs(std::vector<at::Tensor>& outputs) const;
  // The iteration's forward root: ends the forward of the groups of its
  // tree whose modules did not all run (torch's _force_complete_incomplete_states).
  void end_unfinished_forwards(std::vector<at::Tensor>& outputs);
  at::ScalarType compute_dtype(const FSDPParam& p) const;
  // The dtype torch's unsharded parameter accumulates its gradient in
  // (torch's unsharded_grad_dtype: reduce_dtype, or the parameter's own).
  at::ScalarType unsharded_grad_dtype(const FSDPParam& p) const;
  // Where LibTorch has grad_dtype (param_group_backward.cpp), each trainable
  // parameter's: unsharded_grad_dtype while unsharded (as torch's unsharded
  // parameter), its own dtype again while sharded. No-ops otherwise.
  void adopt_grad_dtypes(bool unsharded);
  // torch's _set_unsharded_grad_dtypes for the parameters whose gradients
  // accumulate in a wider dtype than they are computed in. defer_upcast
  // (pre-backward): grad_dtype none when a gradient exists or this backward
  // reduces, so that the gradient, a tied parameter's uses summed, comes in
  // the compute dtype; otherwise (post-backward) a gradient in another dtype
  // is cast to the wider one and grad_dtype set to it.
  void set_unsharded_grad_dtypes(bool defer_upcast);
  // A parameter's elements in one rank's block of the all-gather (bytes when
  // the gather is in bytes).
  int64_t gather_numel(const FSDPParam& p) const;

  std::vector<torch::nn::Module*> modules_;
  // The modules still to run in this forward pass (torch's _modules_to_run_forward).
  std::vector<torch::nn::Module*> modules_to_run_;
  std::vector<FSDPParam> params_;
  FullyShardOptions options_;
  dist::ProcessGroupPtr shard_group_;
  dist::ProcessGroupPtr replicate_group_;
  int shard_size_ = 1;
  int shard_rank_ = 0;
  GroupState state_ = GroupState::kIdle;
  bool unsharded_ = false;
  bool sharded_grads_shown_ = false;  // unsharded, with the sharded gradients on the parameters (show_sharded_grads)
  // The all-gather in flight.
  bool gathering_ = false;
  dist::Work gather_work_;
  at::Tensor gather_out_;
  int64_t gather_block_ = 0;
  at::ScalarType gather_dtype_ = at::kFloat;
  bool from_post_forward_ = false;  // the gather in flight is the post-forward group's
  at::Tensor post_forward_shard_;   // after forward with post_forward_group: this rank's 1/n
  // Reduce-scattered gradients not yet all-reduced across replicas (torch's
  // partial_reduce_output), and the parameters they are of, in order.
  at::Tensor partial_reduce_output_;
  std::vector<size_t> partial_params_;
  // Post-backward: the hooked inputs whose gradients are still to come.
  int inputs_pending_ = 0;
  std::shared_ptr<RootContext> ctx_;
  bool is_root_ = false;
};

// The forward hooks (fsdp/core/detail/forward_call.h) in the slot of one
// module of a group.
class ModuleHooks final : public ForwardHooks {
 public:
  ModuleHooks(std::shared_ptr<ParamGroup> group, torch::nn::Module* module)
      : group(std::move(group)), module(module) {}
  void pre_forward(std::vector<at::Tensor>& inputs) override { group->pre_forward(inputs); }
  void post_forward(std::vector<at::Tensor>& outputs) override { group->post_forward(module, outputs); }
  void forward_failed() noexcept override { group->forward_failed(); }

  const std::shared_ptr<ParamGroup> group;
  torch::nn::Module* const module;
};

// [local] The group that fully_shard made for `module`, or null.
std::shared_ptr<ParamGroup> group_of(const torch::nn::Module& module);

}  // namespace fsdp::detail
