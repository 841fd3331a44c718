// src/fsdp2/fsdp_state.h — the hooks of one fully_shard call and the
// root's logic (torch's FSDPState and FSDPStateContext, _fsdp_state.py):
// the root found at the first forward, the forward's start and end for a
// group of one or several modules, the casts of mp_policy, the pre-backward
// hooks on the outputs and the root's end of backward. The state of a
// module is found through the one map from module to state (core's slot
// of the module, fsdp/core/detail/forward_call.h: torch's
// _module_state_mapping). Private to the fsdp2 module.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <memory>
#include <vector>

#include "fsdp/core/detail/engine.h"
#include "fsdp/core/detail/forward_call.h"
#include "param_group.h"

namespace fsdp::detail {

class FSDPState;

// What the states of one root's tree share (torch's FSDPStateContext),
// made at the root's first forward.
struct FSDPStateContext {
  std::vector<std::weak_ptr<FSDPState>> all_states;  // the tree, pre-order
  // How many of the tree's sharded modules' forwards run now (0 at the
  // start of an iteration's forward: torch's iter_forward_root unset).
  int forward_depth = 0;
  bool post_backward_final_callback_queued = false;
  bool is_last_backward = true;
  std::shared_ptr<FSDPCommContext> comm = std::make_shared<FSDPCommContext>();
};

// One fully_shard call: its group, and the hooks its modules run. A call on
// a list of modules makes one state of several modules (torch's
// _register_group_forward_hooks): the first of them to run in a pass
// gathers, each casts its inputs (and outputs), and the last to run ends
// the group's forward (reshard, pre-backward hooks); the root's
// post-forward ends the forward of groups whose modules did not all run.
class FSDPState final : public std::enable_shared_from_this<FSDPState> {
 public:
  explicit FSDPState(std::shared_ptr<FSDPParamGroup> group) : group_(std::move(group)) {}

  // The forward of `module` (one of the group's modules).
  void pre_forward(std::vector<at::Tensor>& inputs);
  void post_forward(torch::nn::Module* module, std::vector<at::Tensor>& outputs);
  void forward_failed() noexcept;

  const std::shared_ptr<FSDPParamGroup>& group() const { return group_; }
  // Null until the root's first forward.
  const std::shared_ptr<FSDPStateContext>& context() const { return ctx_; }
  bool is_root() const { return is_root_; }

 private:
  // torch's _lazy_init: this state is the root of its module's tree.
  void lazy_init();
  // torch's _pre_backward: queues the root's end of backward, then the
  // group's pre-backward.
  void pre_backward();
  // torch's _root_post_backward_final_callback.
  void finish_backward();
  // The group's end of forward, and the pre-backward hooks on `outputs`.
  void end_forward(std::vector<at::Tensor>& outputs);
  void cast_outputs(std::vector<at::Tensor>& outputs) const;
  // The iteration's forward root: ends the forward of the states of its
  // tree whose modules did not all run (torch's _force_complete_incomplete_states).
  void end_unfinished_forwards(std::vector<at::Tensor>& outputs);

  std::shared_ptr<FSDPParamGroup> group_;
  // The modules still to run in this forward pass (torch's _modules_to_run_forward).
  std::vector<torch::nn::Module*> modules_to_run_;
  std::shared_ptr<FSDPStateContext> ctx_;
  bool is_root_ = false;
};

// The forward hooks (fsdp/core/detail/forward_call.h) in the slot of one
// module of a state; for a root, the engine that core's one entry points
// dispatch to (fsdp/core/detail/engine.h).
class ModuleHooks final : public ForwardHooks, public RootEngine {
 public:
  ModuleHooks(std::shared_ptr<FSDPState> state, torch::nn::Module* module)
      : state(std::move(state)), module(module) {}
  void pre_forward(std::vector<at::Tensor>& inputs) override { state->pre_forward(inputs); }
  void post_forward(std::vector<at::Tensor>& outputs) override { state->post_forward(module, outputs); }
  void forward_failed() noexcept override { state->forward_failed(); }
  // fsdp::clip_grad_norm_ of a model whose root is this module (fully_shard.cpp).
  at::Tensor clip_grad_norm_(double max_norm, double norm_type, bool error_if_nonfinite) override;

  const std::shared_ptr<FSDPState> state;
  torch::nn::Module* const module;
};

// [local] The state that fully_shard made for `module`, or null.
std::shared_ptr<FSDPState> state_of(const torch::nn::Module& module);
// [local] Its group, or null.
std::shared_ptr<FSDPParamGroup> group_of(const torch::nn::Module& module);

}  // namespace fsdp::detail
