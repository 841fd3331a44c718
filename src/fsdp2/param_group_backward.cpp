// One fully_shard call's group (param_group.h), its backward half: the
// pre- and post-backward, the dtype autograd accumulates each unsharded
// gradient in, the reduction of the gradients and its completion, as
// torch's _fsdp_param_group.py makes them.
#include "param_group.h"

#include <ATen/ATen.h>

#include <utility>

#include "fsdp/core/detail/storage.h"
#include "fsdp/error.h"

namespace fsdp::detail {

void FSDPParamGroup::set_unsharded_grad_dtypes(bool defer_upcast) {
  if (!has_grad_dtype()) return;
  at::NoGradGuard no_grad;
  for (auto& p : params_) p.set_unsharded_grad_dtype(defer_upcast, requires_gradient_sync);
}

void FSDPParamGroup::pre_backward() {
  if (state_ == TrainingState::kPreBackward || state_ == TrainingState::kPostBackward) return;
  state_ = TrainingState::kPreBackward;
  unshard();
  hide_sharded_grads();
  set_unsharded_grad_dtypes(/*defer_upcast=*/true);
  if (!backward_prefetch.empty()) {
    prefetch(backward_prefetch);
  } else if (auto prev = previous_in_forward()) {
    prev->start_unshard();
  }
}

void FSDPParamGroup::post_backward() {
  if (state_ != TrainingState::kPreBackward) return;
  state_ = TrainingState::kPostBackward;
  reduce();
  if (reshard_after_backward) reshard();
}

void FSDPParamGroup::reduce() {
  at::NoGradGuard no_grad;
  for (auto& p : params_) p.accumulate_unsharded_grad_if_needed();
  if (!requires_gradient_sync) {
    // torch 2.15: unsynced gradients stay on the unsharded parameters, in
    // their accumulation dtype (reshard() keeps them aside), and the next
    // backward adds to them in place.
    if (has_grad_dtype()) {
      set_unsharded_grad_dtypes(/*defer_upcast=*/false);
      return;
    }
    // Without grad_dtype (older LibTorch), torch's former
    // to_accumulated_grad_if_needed.
    for (auto& p : params_) p.to_accumulated_grad_if_needed();
    return;
  }
  std::vector<size_t> with_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].requires_grad() && params_[i].unsharded_grad().defined()) with_grad.push_back(i);
  }
  if (with_grad.empty()) {
    set_unsharded_grad_dtypes(/*defer_upcast=*/false);
    return;
  }
  const auto& want_dtype = options_.mp_policy().reduce_dtype;
  at::ScalarType reduce_dtype;
  if (want_dtype) {
    reduce_dtype = *want_dtype;
  } else if (has_grad_dtype()) {
    // torch 2.15's _get_reduce_dtype: promoted over the accumulation dtypes
    // (unsharded_grad_dtype: the parameters' own without reduce_dtype), not
    // the gradients' — bfloat16 compute without reduce_dtype reduces in float32.
    reduce_dtype = params_[with_grad[0]].unsharded_grad_dtype();
    for (size_t i : with_grad) reduce_dtype = at::promoteTypes(reduce_dtype, params_[i].unsharded_grad_dtype());
  } else {
    // Older torch (no grad_dtype): reduced in the gradients' dtype.
    reduce_dtype = params_[with_grad[0]].unsharded_grad().scalar_type();
    for (size_t i : with_grad) reduce_dtype = at::promoteTypes(reduce_dtype, params_[i].unsharded_grad().scalar_type());
  }
  const int ar_size = replicate_group_ ? replicate_group_->size() : 1;
  const DivideFactors f = gradient_divide_factors(shard_size_, ar_size, reduce_dtype, gradient_divide_factor,
                                                  force_sum_reduction, name());
  std::vector<at::Tensor> grads;
  for (size_t i : with_grad) {
    grads.push_back(params_[i].unsharded_grad());
    params_[i].clear_unsharded_grad();
  }
  FSDPCommContext::Pending pending;
  pending.group = shared_from_this();
  pending.reduction = foreach_reduce_scatter(params_, with_grad, std::move(grads), reduce_dtype, f, shard_group_,
                                             gradient_divide_factor);
  pending.all_reduce = requires_all_reduce;
  set_unsharded_grad_dtypes(/*defer_upcast=*/false);
  comm_->pending.push_back(std::move(pending));
  // At most two reductions in flight (torch keeps one per group in flight
  // and waits the oldest at the next post-backward).
  while (comm_->pending.size() > 2) {
    complete(comm_->pending.front());
    comm_->pending.erase(comm_->pending.begin());
  }
}

void FSDPParamGroup::complete(FSDPCommContext::Pending& p) {
  ReduceScatter& rs = p.reduction;
  rs.work.wait();
  FSDPParamGroup& g = *p.group;
  at::NoGradGuard no_grad;
  at::Tensor out = rs.output;
  if (g.replicate_group_) {
    // torch's partial_reduce_output: without the all-reduce across replicas
    // (set_requires_all_reduce(false)) the reduce-scattered gradients wait,
    // summed, for the next reduction that all-reduces.
    auto& partial = g.partial_reduce_output_;
    if (partial.defined() && g.partial_params_ != rs.params) {
      throw ConfigError("fully_shard: module " + g.name() +
                        ": the gradients reduced without the all-reduce across replicas "
                        "(set_requires_all_reduce(false)) belong to other parameters than this backward's; every "
                        "micro-batch must give gradients to the same parameters");
    }
    if (!p.all_reduce) {
      if (partial.defined()) {
        partial.add_(out);
      } else {
        partial = out;
        g.partial_params_ = rs.params;
      }
      rs.input = at::Tensor();
      return;
    }
    if (partial.defined()) {
      out.add_(partial);
      partial = at::Tensor();
      g.partial_params_.clear();
    }
    all_reduce_replicas(out, g.replicate_group_, rs.all_reduce_op);
  }
  div_if_needed(out, rs.post);
  int64_t off = 0;
  for (size_t i : rs.params) {
    FSDPParam& q = g.params_[i];
    // While the parameter is unsharded its sharded gradient waits aside.
    q.add_sharded_grad(storage_view(out, off, q.local_shape()), g.unsharded_ && !g.sharded_grads_shown_);
    off += q.padded_numel();
  }
  rs.input = at::Tensor();
}

void FSDPParamGroup::complete_reductions(FSDPCommContext& comm) {
  for (auto& p : comm.pending) complete(p);
  comm.pending.clear();
}

void FSDPParamGroup::finalize_backward(bool is_last_backward) {
  if (state_ != TrainingState::kForward) state_ = TrainingState::kIdle;
  // The last backward of a step leaves every group sharded, with its
  // gradients on the parameters, for the optimizer.
  if (reshard_after_backward || is_last_backward) reshard();
}

int64_t FSDPParamGroup::live_grad_bytes() const {
  int64_t bytes = 0;
  for (const auto& p : params_) bytes += p.live_grad_bytes();
  return bytes;
}

}  // namespace fsdp::detail
