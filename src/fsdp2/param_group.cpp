// One fully_shard call's group (param_group.h): its all-gather and
// reshard, and its forward, as torch's _fsdp_param_group.py makes them.
// The backward half (reduce-scatter, gradient dtypes) is
// param_group_backward.cpp.
#include "param_group.h"

#include <ATen/ATen.h>

#include <utility>

namespace fsdp::detail {

std::shared_ptr<FSDPParamGroup> FSDPParamGroup::create(std::vector<torch::nn::Module*> modules,
                                                       std::vector<at::Tensor> params, std::vector<std::string> names,
                                                       FullyShardOptions options) {
  const dist::ProcessGroupPtr& shard = options.mesh().shard_group();
  const auto& mp = options.mp_policy();
  std::vector<FSDPParam> fsdp_params;
  fsdp_params.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    fsdp_params.emplace_back(std::move(params[i]), std::move(names[i]), shard->size(), shard->rank(), mp.param_dtype,
                             mp.reduce_dtype);
  }
  auto group = std::make_shared<FSDPParamGroup>(std::move(modules), std::move(fsdp_params), std::move(options));
  for (auto& p : group->params_) p.set_group(group);
  return group;
}

FSDPParamGroup::FSDPParamGroup(std::vector<torch::nn::Module*> modules, std::vector<FSDPParam> params,
                               FullyShardOptions options)
    : modules_(std::move(modules)), params_(std::move(params)), options_(std::move(options)) {
  shard_group_ = options_.mesh().shard_group();
  replicate_group_ = options_.mesh().replicate_group();
  shard_size_ = shard_group_->size();
}

FSDPParamGroup::~FSDPParamGroup() = default;

void FSDPParamGroup::set_context(std::shared_ptr<FSDPCommContext> comm, bool is_root) {
  comm_ = std::move(comm);
  is_root_ = is_root;
}

std::string FSDPParamGroup::name() const {
  if (modules_.size() == 1) return modules_[0]->name();
  std::string out = "[";
  for (size_t i = 0; i < modules_.size(); ++i) out += (i ? ", " : "") + modules_[i]->name();
  return out + "]";
}

bool FSDPParamGroup::resharded_after_forward() const { return reshard_after_forward.value_or(!is_root_); }

void FSDPParamGroup::start_unshard() {
  if (unsharded_ || gather_) return;
  const bool within_post_forward = post_forward_shard_.defined();
  gather_ = foreach_all_gather(params_, within_post_forward ? post_forward_group : shard_group_,
                               std::move(post_forward_shard_));
  post_forward_shard_ = at::Tensor();
}

void FSDPParamGroup::wait_unshard() {
  if (unsharded_) return;
  if (!gather_) start_unshard();
  foreach_all_gather_copy_out(*gather_, params_, shard_size_,
                              gather_->from_post_forward ? post_forward_group->size() : 0);
  layout_ = *gather_;
  gather_.reset();
  at::NoGradGuard no_grad;
  for (auto& p : params_) p.to_unsharded();
  unsharded_ = true;
}

void FSDPParamGroup::reshard_to_post_forward() {
  if (gather_) wait_unshard();
  if (!unsharded_) return;
  at::Tensor keep = post_forward_shard(params_, layout_, shard_size_, post_forward_group->size(),
                                       post_forward_group->rank());
  reshard();
  post_forward_shard_ = keep;
}

void FSDPParamGroup::show_sharded_grads() {
  if (!unsharded_ || sharded_grads_shown_) return;
  for (auto& p : params_) p.show_sharded_grad();
  sharded_grads_shown_ = true;
}

void FSDPParamGroup::hide_sharded_grads() {
  if (!sharded_grads_shown_) return;
  for (auto& p : params_) p.hide_sharded_grad();
  sharded_grads_shown_ = false;
}

void FSDPParamGroup::reshard() {
  if (gather_) wait_unshard();  // the backend may still write into the buffer
  post_forward_shard_ = at::Tensor();
  if (!unsharded_) return;
  hide_sharded_grads();
  at::NoGradGuard no_grad;
  for (auto& p : params_) p.to_sharded();
  unsharded_ = false;
}

void FSDPParamGroup::prefetch(const std::vector<std::weak_ptr<FSDPParamGroup>>& groups) {
  for (const auto& w : groups) {
    if (auto g = w.lock()) g->start_unshard();
  }
}

std::shared_ptr<FSDPParamGroup> FSDPParamGroup::previous_in_forward() const {
  const auto& order = comm_->forward_order;
  for (size_t i = order.size(); i-- > 1;) {
    if (order[i].lock().get() == this) return order[i - 1].lock();
  }
  return nullptr;
}

void FSDPParamGroup::pre_forward(bool first_in_pass) {
  if (first_in_pass) {
    state_ = TrainingState::kForward;
    comm_->forward_order.push_back(weak_from_this());
  }
  unshard();
  if (first_in_pass) prefetch(forward_prefetch);
}

void FSDPParamGroup::register_post_backward_hook(std::vector<at::Tensor>& inputs, bool rerun) {
  inputs_pending_ = 0;
  if (rerun || !at::GradMode::is_enabled()) return;
  std::weak_ptr<FSDPParamGroup> weak = weak_from_this();
  for (auto& t : inputs) {
    if (!t.defined() || !t.requires_grad()) continue;
    t = t.view_as(t);
    ++inputs_pending_;
    t.register_hook([weak](const at::Tensor&) {
      if (auto g = weak.lock()) {
        if (--g->inputs_pending_ == 0) g->post_backward();
      }
    });
  }
}

void FSDPParamGroup::post_forward() {
  state_ = TrainingState::kIdle;
  if (!resharded_after_forward()) {
    // Unsharded until backward: the optimizer's view of .grad is the
    // sharded gradient meanwhile (a zero_grad between forward and backward
    // clears what this backward would add to, as in torch).
    show_sharded_grads();
  } else if (post_forward_group) {
    reshard_to_post_forward();
  } else {
    reshard();
  }
}

void FSDPParamGroup::forward_failed() noexcept {
  if (state_ == TrainingState::kForward) state_ = TrainingState::kIdle;
  try {
    reshard();
  } catch (...) {
  }
}

}  // namespace fsdp::detail
