// src/fsdp2/param_group.h — one fully_shard call's group of parameters
// (torch's FSDPParamGroup, _fsdp_param_group.py): when the group's
// parameters are gathered, resharded and their gradients reduced. Each
// parameter makes its own transitions (fsdp_param.h); the collectives are
// free functions (collectives.h); the hooks and the root's logic that call
// into a group are its FSDPState (fsdp_state.h). Private to the fsdp2 module.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/fsdp2/options.h"
#include "fsdp_param.h"

namespace fsdp::detail {

// torch's TrainingState of a group.
enum class TrainingState { kIdle, kForward, kPreBackward, kPostBackward };

// What the groups of one root's tree share for their collectives (torch's
// FSDPCommContext), made at the root's first forward.
struct FSDPCommContext {
  std::vector<std::weak_ptr<FSDPParamGroup>> forward_order;  // this iteration's, for the implicit backward prefetch
  // Reductions issued and not yet completed, oldest first.
  struct Pending {
    std::shared_ptr<FSDPParamGroup> group;
    ReduceScatter reduction;
    bool all_reduce = true;  // false: kept in the group's partial reduce output instead
  };
  std::vector<Pending> pending;
};

class FSDPParamGroup final : public std::enable_shared_from_this<FSDPParamGroup> {
 public:
  // [local] Shards `params` (in order) over options.mesh's shard group.
  static std::shared_ptr<FSDPParamGroup> create(std::vector<torch::nn::Module*> modules,
                                                std::vector<at::Tensor> params, std::vector<std::string> names,
                                                FullyShardOptions options);
  FSDPParamGroup(std::vector<torch::nn::Module*> modules, std::vector<FSDPParam> params, FullyShardOptions options);
  ~FSDPParamGroup();

  // [local] The root's lazy init: the context of its tree; `is_root`.
  void set_context(std::shared_ptr<FSDPCommContext> comm, bool is_root);

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

  // [collective] torch's pre_forward: unshards; the first forward of a pass
  // (`first_in_pass`) enters kForward, records the forward order and
  // prefetches forward_prefetch.
  void pre_forward(bool first_in_pass);
  // torch's RegisterPostBackwardFunction: post_backward runs when the
  // gradients of every input in `inputs` that requires one came (each
  // replaced by a view to hook). Nothing outside grad mode or in a re-run.
  void register_post_backward_hook(std::vector<at::Tensor>& inputs, bool rerun);
  // [local] torch's post_forward: idle; reshards (as set), else the
  // parameters show their sharded gradients until backward.
  void post_forward();
  // [local] The forward threw: idle again, resharded; never throws.
  void forward_failed() noexcept;
  // [collective] Unshards for backward and prefetches (explicitly, or the
  // group before this one in the forward order). No-op once in backward.
  void pre_backward();
  // [collective when it reduces] This group's gradients are complete.
  void post_backward();
  // [local] The root's end of backward, after every reduction completed.
  void finalize_backward(bool is_last_backward);
  // [waits] Completes every pending reduction of `comm`, oldest first.
  static void complete_reductions(FSDPCommContext& comm);

  // The modules fully_shard was applied to (one, or a list's roots).
  const std::vector<torch::nn::Module*>& modules() const { return modules_; }
  torch::nn::Module* module() const { return modules_.front(); }
  // The modules' names, for messages ("A", or "[A, B]" for a list).
  std::string name() const;
  const std::vector<FSDPParam>& params() const { return params_; }
  const FullyShardOptions& options() const { return options_; }
  int shard_size() const { return shard_size_; }
  bool unsharded() const { return unsharded_; }
  TrainingState training_state() const { return state_; }
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
  std::vector<std::weak_ptr<FSDPParamGroup>> forward_prefetch, backward_prefetch;

 private:
  void prefetch(const std::vector<std::weak_ptr<FSDPParamGroup>>& groups);
  std::shared_ptr<FSDPParamGroup> previous_in_forward() const;
  // [local] reshard(), keeping 1/n of the full parameters (n: the
  // post-forward group's size) for backward to gather within that group.
  void reshard_to_post_forward();
  // Issues the reduction of the gradients this backward computed.
  void reduce();
  // Completes one reduction: the all-reduce across replicas (or the
  // partial reduce output), the division after, the sharded gradients.
  static void complete(FSDPCommContext::Pending& p);
  bool resharded_after_forward() const;
  // Between a forward that leaves this group unsharded and its backward,
  // the parameters' .grad is their sharded gradient (fsdp_param.h); hide
  // puts the full one back before backward accumulates into it. Both are
  // no-ops when not needed.
  void show_sharded_grads();
  void hide_sharded_grads();
  // Each parameter's FSDPParam::set_unsharded_grad_dtype.
  void set_unsharded_grad_dtypes(bool defer_upcast);

  std::vector<torch::nn::Module*> modules_;
  std::vector<FSDPParam> params_;
  FullyShardOptions options_;
  dist::ProcessGroupPtr shard_group_;
  dist::ProcessGroupPtr replicate_group_;
  int shard_size_ = 1;
  TrainingState state_ = TrainingState::kIdle;
  bool unsharded_ = false;
  bool sharded_grads_shown_ = false;  // unsharded, with the sharded gradients on the parameters (show_sharded_grads)
  // The all-gather in flight.
  std::optional<AllGatherResult> gather_;
  AllGatherResult layout_;          // the last gather's layout (block, dtype), for reshard_to_post_forward
  at::Tensor post_forward_shard_;   // after forward with post_forward_group: this rank's 1/n
  // Reduce-scattered gradients not yet all-reduced across replicas (torch's
  // partial_reduce_output), and the parameters they are of, in order.
  at::Tensor partial_reduce_output_;
  std::vector<size_t> partial_params_;
  // Post-backward: the hooked inputs whose gradients are still to come.
  int inputs_pending_ = 0;
  std::shared_ptr<FSDPCommContext> comm_;
  bool is_root_ = false;
};

}  // namespace fsdp::detail
