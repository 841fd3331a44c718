// The hooks of one fully_shard call and the root's logic (fsdp_state.h),
// as torch's _fsdp_state.py makes them.
#include "fsdp_state.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>

#include <algorithm>
#include <utility>

#include "fsdp/error.h"

namespace fsdp::detail {

namespace {

bool is_float(at::ScalarType t) { return at::isFloatingType(t); }

}  // namespace

std::shared_ptr<FSDPState> state_of(const torch::nn::Module& module) {
  auto slot = find_slot(&module);
  auto hooks = slot ? std::dynamic_pointer_cast<ModuleHooks>(slot->engine) : nullptr;
  return hooks ? hooks->state : nullptr;
}

std::shared_ptr<FSDPParamGroup> group_of(const torch::nn::Module& module) {
  auto state = state_of(module);
  return state ? state->group() : nullptr;
}

void FSDPState::lazy_init() {
  if (group_->modules().size() > 1) {
    // torch: "FSDP requires a single root module".
    throw ConfigError("fully_shard: the group of modules " + group_->name() +
                      " ran forward first, as the root of its model, but a root is one module: apply fully_shard "
                      "to the model that calls them too, and run the model");
  }
  ctx_ = std::make_shared<FSDPStateContext>();
  for (const auto& item : group_->module()->named_modules("", /*include_self=*/true)) {
    auto s = state_of(*item.value());
    if (!s) continue;
    if (std::none_of(ctx_->all_states.begin(), ctx_->all_states.end(),
                     [&](const std::weak_ptr<FSDPState>& w) { return w.lock() == s; })) {
      ctx_->all_states.push_back(s);
    }
    s->ctx_ = ctx_;
    s->is_root_ = s.get() == this;
    s->group_->set_context(ctx_->comm, s->is_root_);
  }
}

void FSDPState::pre_forward(std::vector<at::Tensor>& inputs) {
  if (!ctx_) lazy_init();
  if (modules_to_run_.empty()) modules_to_run_ = group_->modules();
  // A forward re-run in this group's backward (activation checkpointing)
  // finds its parameters gathered and keeps the backward's state. Of a
  // list's modules, the first to run in a pass starts the group's forward;
  // the others only cast their inputs.
  const TrainingState state = group_->training_state();
  const bool rerun = state == TrainingState::kPreBackward;
  const bool first_in_pass = !rerun && state != TrainingState::kForward;
  if (is_root_ && ctx_->forward_depth == 0 && !rerun) ctx_->comm->forward_order.clear();  // a new iteration
  ++ctx_->forward_depth;
  group_->pre_forward(first_in_pass);
  const auto& mp = group_->options().mp_policy();
  for (auto& t : inputs) {
    if (mp.cast_forward_inputs && mp.param_dtype && t.defined() && is_float(t.scalar_type())) t = t.to(*mp.param_dtype);
  }
  if (first_in_pass || rerun) group_->register_post_backward_hook(inputs, rerun);
}

void FSDPState::post_forward(torch::nn::Module* module, std::vector<at::Tensor>& outputs) {
  --ctx_->forward_depth;
  if (group_->training_state() != TrainingState::kPreBackward) {  // not a re-run inside backward
    auto it = std::find(modules_to_run_.begin(), modules_to_run_.end(), module);
    if (it != modules_to_run_.end()) {
      modules_to_run_.erase(it);
      if (modules_to_run_.empty()) {
        end_forward(outputs);
        if (ctx_->forward_depth == 0) end_unfinished_forwards(outputs);
      }
    }
  }
  cast_outputs(outputs);
}

void FSDPState::end_forward(std::vector<at::Tensor>& outputs) {
  group_->post_forward();
  if (at::GradMode::is_enabled()) {
    std::weak_ptr<FSDPState> weak = weak_from_this();
    for (const auto& t : outputs) {
      if (!t.defined() || !t.requires_grad()) continue;
      t.register_hook([weak](const at::Tensor&) {
        if (auto s = weak.lock()) s->pre_backward();
      });
    }
  }
}

void FSDPState::cast_outputs(std::vector<at::Tensor>& outputs) const {
  if (const auto& od = group_->options().mp_policy().output_dtype) {
    for (auto& t : outputs) {
      if (t.defined() && is_float(t.scalar_type())) t = t.to(*od);
    }
  }
}

void FSDPState::end_unfinished_forwards(std::vector<at::Tensor>& outputs) {
  // In reverse pre-order, so that within a nesting chain the deepest
  // state's output cast comes first (torch's order).
  for (auto w = ctx_->all_states.rbegin(); w != ctx_->all_states.rend(); ++w) {
    auto s = w->lock();
    if (!s || s.get() == this || s->modules_to_run_.empty()) continue;
    s->end_forward(outputs);
    s->cast_outputs(outputs);
    s->modules_to_run_.clear();
  }
}

void FSDPState::forward_failed() noexcept {
  --ctx_->forward_depth;
  modules_to_run_.clear();
  group_->forward_failed();
}

void FSDPState::pre_backward() {
  const TrainingState state = group_->training_state();
  if (state == TrainingState::kPreBackward || state == TrainingState::kPostBackward) return;
  if (!ctx_->post_backward_final_callback_queued) {
    ctx_->post_backward_final_callback_queued = true;
    std::shared_ptr<FSDPState> root;
    for (const auto& w : ctx_->all_states) {
      auto s = w.lock();
      if (s && s->is_root_) root = s;
    }
    std::weak_ptr<FSDPState> weak = root ? root : shared_from_this();
    torch::autograd::Engine::get_default_engine().queue_callback([weak] {
      if (auto r = weak.lock()) r->finish_backward();
    });
  }
  group_->pre_backward();
}

void FSDPState::finish_backward() {
  auto ctx = ctx_;
  std::vector<std::shared_ptr<FSDPParamGroup>> groups;
  for (const auto& w : ctx->all_states) {
    if (auto s = w.lock()) groups.push_back(s->group_);
  }
  // Groups whose inputs' gradients never came (inputs without gradients,
  // such as token ids) reduce now, in the tree's order on every rank.
  for (auto& g : groups) g->post_backward();
  FSDPParamGroup::complete_reductions(*ctx->comm);
  for (auto& g : groups) g->finalize_backward(ctx->is_last_backward);
  ctx->post_backward_final_callback_queued = false;
}

}  // namespace fsdp::detail
