// Activation checkpointing: a hand-made autograd node that re-runs the
// forward in backward, and the functions that mark modules for it.
#include "fsdp/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/nn/modules/container/sequential.h>

#include "fsdp/error.h"
#include "unit.h"

namespace fsdp {
namespace detail {

namespace {

at::Tensor cpu_rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

// Sets the CPU generator to `state` for its lifetime, then puts back the one
// it found, so that the re-run draws what the first run drew and the caller's
// random stream goes on undisturbed.
class RngReplay {
 public:
  explicit RngReplay(const at::Tensor& state) : saved_(cpu_rng_state()) { set(state); }
  ~RngReplay() { set(saved_); }

 private:
  static void set(const at::Tensor& state) {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
  at::Tensor saved_;
};

class CheckpointNode : public torch::autograd::Node {
 public:
  CheckpointNode(std::function<at::Tensor(const std::vector<at::Tensor>&)> fn, const std::vector<at::Tensor>& inputs)
      : fn_(std::move(fn)), rng_state_(cpu_rng_state()) {
    for (const auto& x : inputs) {
      saved_.push_back(x.defined() ? x.detach() : x);
      needs_grad_.push_back(x.defined() && x.requires_grad());
    }
  }

  std::string name() const override { return "fsdp::CheckpointBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    std::vector<at::Tensor> xs;
    for (size_t i = 0; i < saved_.size(); ++i) {
      at::Tensor x = saved_[i].defined() ? saved_[i].detach() : saved_[i];
      if (needs_grad_[i]) x.requires_grad_(true);
      xs.push_back(x);
    }
    at::Tensor out;
    {
      RngReplay replay(rng_state_);
      at::AutoGradMode enable(true);
      out = fn_(xs);
    }
    if (out.requires_grad()) {
      at::Tensor g = grads.at(0).defined() ? grads[0] : at::zeros_like(out);
      torch::autograd::backward({out}, {g});
    }
    torch::autograd::variable_list result;
    for (size_t i = 0; i < xs.size(); ++i) result.push_back(needs_grad_[i] ? xs[i].grad() : at::Tensor());
    fn_ = nullptr;  // one backward per forward, like any graph without retain_graph
    saved_.clear();
    return result;
  }

 private:
  std::function<at::Tensor(const std::vector<at::Tensor>&)> fn_;
  std::vector<at::Tensor> saved_;
  std::vector<bool> needs_grad_;
  at::Tensor rng_state_;
};

}  // namespace

at::Tensor run_checkpointed(std::function<at::Tensor(const std::vector<at::Tensor>&)> fn,
                            std::vector<at::Tensor> inputs) {
  if (!at::GradMode::is_enabled()) return fn(inputs);
  auto node = std::make_shared<CheckpointNode>(fn, inputs);  // takes the RNG state before the run
  at::Tensor out;
  {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> detached;
    for (const auto& x : inputs) detached.push_back(x.defined() ? x.detach() : x);
    out = fn(detached);
  }
  if (!out.defined()) throw ConfigError("activation checkpointing: the checkpointed forward returned an undefined tensor");
  if (!at::isFloatingType(out.scalar_type())) return out;  // nothing to differentiate
  for (const auto& x : inputs) {
    if (x.defined() && out.is_alias_of(x)) out = out.clone();  // never re-point an input's history
  }
  out = out.detach();
  node->set_next_edges(torch::autograd::collect_next_edges(inputs));
  torch::autograd::create_gradient_edge(out, node);
  return out;
}

void checkpoint_needs_tensor_output() {
  throw ConfigError("activation checkpointing: the checkpointed module's forward must return one at::Tensor");
}

void mark_checkpointed(const std::shared_ptr<Slot>& slot, const torch::nn::Module& module) {
  if (slot->checkpoint) {
    throw ConfigError("activation checkpointing: module " + module.name() +
                      " is already checkpointed; wrap each module once");
  }
  slot->checkpoint = true;
}

}  // namespace detail

namespace {

int apply_rec(torch::nn::Module& m, const std::string& path, const CheckpointCheck& check_fn) {
  int count = 0;
  for (auto& child : m.named_children()) {
    const std::string child_path = path.empty() ? child.key() : path + "." + child.key();
    torch::nn::Module& c = *child.value();
    if (check_fn(c)) {
      auto slot = detail::interpose(&m, c, child_path, "apply_activation_checkpointing: check_fn");
      detail::mark_checkpointed(slot, c);
      ++count;
    }
    count += apply_rec(c, child_path, check_fn);
  }
  return count;
}

}  // namespace

int apply_activation_checkpointing(const std::shared_ptr<torch::nn::Module>& model, const CheckpointCheck& check_fn) {
  if (!model) throw ConfigError("apply_activation_checkpointing: the model is null");
  if (check_fn(*model)) {
    throw ConfigError("apply_activation_checkpointing: check_fn selects the root module (" + model->name() +
                      "): checkpoint its submodules, or wrap the root in fsdp::CheckpointWrapper yourself");
  }
  const int count = apply_rec(*model, "", check_fn);
  detail::interpose_sequential_elements(*model);
  return count;
}

bool is_checkpointed(const torch::nn::Module& module) {
  auto slot = detail::find_slot(&module);
  return slot && slot->checkpoint;
}

}  // namespace fsdp
