// A unit's backward (unit.h): the hooks on its gradients, the reduction it
// issues, the reduced gradient it takes, and its steps at the end of the
// root's backward (root_state.h).
#include "unit.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <string>

#include "fsdp/error.h"

namespace fsdp::detail {

namespace {

// Runs after autograd accumulated a parameter's gradient.
class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  explicit GradReadyHook(std::weak_ptr<UnitState> unit) : unit_(std::move(unit)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    if (auto u = unit_.lock()) u->on_grad_ready();
    return outputs;
  }

 private:
  std::weak_ptr<UnitState> unit_;
};

}  // namespace

void UnitState::hook_accumulators() {
  auto& params = handle_.params();
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].requires_grad) continue;
    auto acc = torch::autograd::impl::grad_accumulator(params[i].param);
    if (acc && acc != accumulators_[i]) {
      acc->add_post_hook(std::make_unique<GradReadyHook>(weak_from_this()));
      accumulators_[i] = acc;  // held, so that the hook stays on the node the next forwards use
    }
  }
}

void UnitState::pre_backward() {
  // Already in backward, or done with it for this pass (the unit's outputs
  // were used more than once): nothing to do.
  if (state_ == TrainingState::kPreBackward || state_ == TrainingState::kPostBackward) return;
  transition({TrainingState::kIdle}, TrainingState::kPreBackward);
  backward_span_.begin("backward", path_);
  // The root finishes the backward of its tree (a unit whose root is gone:
  // its own, under the context it kept).
  auto root = root_.lock();
  if (!root) root = shared_from_this();
  if (!shared_->callback_queued) {
    shared_->callback_queued = true;
    std::weak_ptr<UnitState> weak_root = root;
    torch::autograd::Engine::get_default_engine().queue_callback([weak_root] {
      if (auto r = weak_root.lock()) r->finish_backward();
    });
  }
  unshard();
  if (config_.backward_prefetch == BackwardPrefetch::kBackwardPre) prefetch(-1);
  grads_ready_ = 0;
  if (grads_expected_ == 0) return;
  // A forward re-run in backward (activation checkpointing) builds its graph
  // on the parameters' current accumulators: make sure they are hooked.
  hook_accumulators();
  if (full_grad_.defined()) return;  // accumulated under no_sync: keep adding to it
  full_grad_ = handle_.new_full_buffer_zeroed();
  auto& params = handle_.params();
  for (size_t i = 0; i < params.size(); ++i) {
    auto& p = params[i];
    if (!p.requires_grad) continue;
    saved_grads_[i] = p.param.grad();
    p.param.mutable_grad() = param_view(full_grad_, p);
  }
}

void UnitState::on_grad_ready() {
  if (state_ != TrainingState::kPreBackward) return;
  if (++grads_ready_ == grads_expected_) post_backward();
}

void UnitState::post_backward() {
  if (state_ != TrainingState::kPreBackward) return;
  transition({TrainingState::kPreBackward}, TrainingState::kPostBackward);
  if (config_.backward_prefetch == BackwardPrefetch::kBackwardPost) prefetch(-1);
  if (grads_expected_ == 0) {
    reshard();
    backward_span_.end();
    return;
  }
  at::NoGradGuard no_grad;
  for (auto& p : handle_.params()) {
    if (!p.requires_grad) continue;
    const at::Tensor& g = p.param.grad();
    at::Tensor slot = full_grad_.narrow(0, p.offset, p.numel);
    // Autograd accumulates into our view; if something replaced it, copy.
    if (g.defined() && g.data_ptr() != slot.data_ptr()) slot.copy_(g.reshape({-1}));
  }
  if (!no_sync_) issue_reduction();  // else keep the full gradient: the next synced backward reduces it
  reshard();
  backward_span_.end();
}

void UnitState::issue_reduction() {
  const at::ScalarType reduce_dtype = config_.reduce_dtype.value_or(compute_dtype());
  PendingReduction r;
  r.unit = shared_from_this();
  r.path = path_;
  r.wait_span = shard_size() > 1 ? "reduce_scatter.wait" : "all_reduce.wait";
  r.replicate_group = config_.replicate_group;
  r.input = full_grad_.scalar_type() == reduce_dtype ? full_grad_ : full_grad_.to(reduce_dtype);
  full_grad_ = at::Tensor();
  // Until the reduced shard arrives the parameters have no gradient: nothing
  // may see the unreduced one.
  for (auto& p : handle_.params()) {
    if (p.requires_grad) p.param.mutable_grad() = at::Tensor();
  }
  const bool replicate = config_.replicate_group && config_.replicate_group->size() > 1;
  if (shard_size() > 1) {
    ScopedSpan span("reduce_scatter.issue", path_);
    r.output = at::empty({shard_numel()}, r.input.options());
    r.work = config_.shard_group->reduce_scatter(r.output, r.input, dist::ReduceOp::kAvg);
    r.replicate_next = replicate;
  } else if (replicate) {
    ScopedSpan span("all_reduce.issue", path_);
    r.output = r.input;
    r.work = config_.replicate_group->all_reduce(r.output, dist::ReduceOp::kAvg);
  } else {
    r.output = r.input;  // nothing to reduce: one rank
  }
  // Every unit that reaches backward ran a forward, which gave it its root's runtime.
  if (!shared_) throw Error("FSDP internal error: the unit at module " + module_->name() + " reduces without a root");
  shared_->add_reduction(std::move(r), shard_size() > 1 || replicate, config_.max_reductions_in_flight);
}

void UnitState::accept_gradient(at::Tensor shard_grad) {
  at::NoGradGuard no_grad;
  const at::Tensor& flat_shard = handle_.flat_shard();
  // The optimizer steps the master shard, in its own dtype.
  if (shard_grad.scalar_type() != flat_shard.scalar_type()) shard_grad = shard_grad.to(flat_shard.scalar_type());
  auto& params = handle_.params();
  if (config_.use_orig_params) {
    for (size_t i = 0; i < params.size(); ++i) {
      auto& p = params[i];
      if (!p.requires_grad) continue;
      at::Tensor g = sharded_view(shard_grad, p);
      at::Tensor& saved = saved_grads_[i];
      if (saved.defined() && saved.numel() == g.numel()) g.add_(saved.reshape(g.sizes()));
      p.param.mutable_grad() = g;
      saved = at::Tensor();
    }
  } else {
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].param.mutable_grad() = at::Tensor();
      saved_grads_[i] = at::Tensor();
    }
    at::Tensor& fg = handle_.flat_shard().mutable_grad();
    if (fg.defined()) {
      fg.add_(shard_grad);
    } else {
      fg = shard_grad;
    }
  }
}

void UnitState::finish_backward() { shared_->finish_backward(shared_from_this()); }

void UnitState::end_backward() {
  if (state_ == TrainingState::kPostBackward) state_ = TrainingState::kIdle;
  if (state_ == TrainingState::kIdle) reshard();
}

void UnitState::abandon_backward() {
  if (state_ != TrainingState::kPreBackward && state_ != TrainingState::kPostBackward) return;
  state_ = TrainingState::kIdle;
  full_grad_ = at::Tensor();
  reshard();
  backward_span_.end();
}

std::vector<at::Tensor> UnitState::sharded_grads() const {
  std::vector<at::Tensor> out;
  if (config_.use_orig_params) {
    for (const auto& p : params()) {
      if (p.param.grad().defined()) out.push_back(p.param.grad());
    }
  } else if (flat_shard().grad().defined()) {
    out.push_back(flat_shard().grad());
  }
  return out;
}

int64_t UnitState::live_grad_bytes() const {
  int64_t bytes = full_grad_.defined() ? full_grad_.numel() * full_grad_.element_size() : 0;
  if (config_.use_orig_params) {
    for (const auto& p : params()) {
      const auto& g = p.param.grad();
      if (g.defined() && !full_grad_.defined()) bytes += g.numel() * g.element_size();
    }
  } else if (flat_shard().grad().defined()) {
    bytes += flat_shard().grad().numel() * flat_shard().grad().element_size();
  }
  return bytes;
}


}  // namespace fsdp::detail
