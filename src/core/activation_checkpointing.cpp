// Activation checkpointing: a hand-made autograd node that re-runs the
// forward in backward, and the functions that mark modules for it.
#include "fsdp/core/activation_checkpointing.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/nn/modules/container/sequential.h>

#include "fsdp/error.h"
#include "unit.h"

namespace fsdp {
namespace detail {

namespace {

// The generators a checkpointed region draws from: the CPU one, and the
// default generator of each CUDA device its tensor inputs live on (as
// PyTorch's checkpoint does), with their states.
struct RngStates {
  std::vector<at::Generator> generators;
  std::vector<at::Tensor> states;
};

// Reads each generator's current state into r.states.
void read_rng(RngStates& r) {
  for (size_t i = 0; i < r.generators.size(); ++i) {
    std::lock_guard<std::mutex> lock(r.generators[i].mutex());
    r.states[i] = r.generators[i].get_state();
  }
}

RngStates capture_rng(const std::vector<at::Tensor>& inputs) {
  RngStates r;
  r.generators.push_back(at::detail::getDefaultCPUGenerator());
  std::vector<at::Device> seen;
  for (const auto& x : inputs) {
    if (!x.defined() || !x.device().is_cuda()) continue;
    if (std::find(seen.begin(), seen.end(), x.device()) != seen.end()) continue;
    seen.push_back(x.device());
    r.generators.push_back(at::globalContext().defaultGenerator(x.device()));
  }
  r.states.resize(r.generators.size());
  read_rng(r);
  return r;
}

void restore_rng(RngStates& r) {
  for (size_t i = 0; i < r.generators.size(); ++i) {
    std::lock_guard<std::mutex> lock(r.generators[i].mutex());
    r.generators[i].set_state(r.states[i]);
  }
}

// Sets the generators to `states` for its lifetime, then puts back what it
// found, so that the re-run draws what the first run drew and the caller's
// random stream goes on undisturbed.
class RngReplay {
 public:
  explicit RngReplay(RngStates& states) : saved_(states) {
    read_rng(saved_);
    restore_rng(states);
  }
  ~RngReplay() { restore_rng(saved_); }

 private:
  RngStates saved_;
};

using CheckpointFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

class CheckpointNode : public torch::autograd::Node {
 public:
  CheckpointNode(CheckpointFn fn, const std::vector<at::Tensor>& inputs)
      : fn_(std::move(fn)), rng_(capture_rng(inputs)) {
    for (const auto& x : inputs) {
      saved_.push_back(x.defined() ? x.detach() : x);
      needs_grad_.push_back(x.defined() && x.requires_grad());
    }
  }

  std::string name() const override { return "fsdp::CheckpointBackward"; }

  // Which outputs of the forward are this node's inputs (differentiable ones).
  void set_differentiable_outputs(std::vector<bool> d) { differentiable_ = std::move(d); }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    std::vector<at::Tensor> xs;
    for (size_t i = 0; i < saved_.size(); ++i) {
      at::Tensor x = saved_[i].defined() ? saved_[i].detach() : saved_[i];
      if (needs_grad_[i]) x.requires_grad_(true);
      xs.push_back(x);
    }
    std::vector<at::Tensor> outs;
    {
      RngReplay replay(rng_);
      at::AutoGradMode enable(true);
      outs = fn_(xs);
    }
    // Back-propagate each differentiable output that received a gradient.
    std::vector<at::Tensor> roots, root_grads;
    size_t g = 0;
    for (size_t i = 0; i < outs.size() && i < differentiable_.size(); ++i) {
      if (!differentiable_[i]) continue;
      const at::Tensor& grad = grads.at(g++);
      if (grad.defined() && outs[i].requires_grad()) {
        roots.push_back(outs[i]);
        root_grads.push_back(grad);
      }
    }
    if (!roots.empty()) torch::autograd::backward(roots, root_grads);
    torch::autograd::variable_list result;
    for (size_t i = 0; i < xs.size(); ++i) result.push_back(needs_grad_[i] ? xs[i].grad() : at::Tensor());
    fn_ = nullptr;  // one backward per forward, like any graph without retain_graph
    saved_.clear();
    return result;
  }

 private:
  CheckpointFn fn_;
  std::vector<at::Tensor> saved_;
  std::vector<bool> needs_grad_;
  std::vector<bool> differentiable_;
  RngStates rng_;
};

}  // namespace

std::vector<at::Tensor> run_checkpointed(CheckpointFn fn, std::vector<at::Tensor> inputs) {
  if (!at::GradMode::is_enabled()) return fn(inputs);
  auto node = make_node<CheckpointNode>(fn, inputs);  // takes the RNG state before the run
  std::vector<at::Tensor> outs;
  {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> detached;
    for (const auto& x : inputs) detached.push_back(x.defined() ? x.detach() : x);
    outs = fn(detached);
  }
  std::vector<bool> differentiable;
  for (auto& out : outs) {
    const bool d = out.defined() && at::isFloatingType(out.scalar_type());
    differentiable.push_back(d);
    if (!d) continue;
    for (const auto& x : inputs) {
      if (x.defined() && out.is_alias_of(x)) out = out.clone();  // never re-point an input's history
    }
    out = out.detach();
  }
  node->set_differentiable_outputs(differentiable);
  node->set_next_edges(torch::autograd::collect_next_edges(inputs));
  for (size_t i = 0; i < outs.size(); ++i) {
    if (differentiable[i]) torch::autograd::create_gradient_edge(outs[i], node);
  }
  return outs;
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
  int count = 0;
  if (check_fn(*model)) {
    // An FSDP root is PyTorch's FSDP(module): the module is the wrapper's
    // child there, and checkpointing it gives FSDP(CheckpointWrapper(module)).
    auto slot = detail::find_slot(model.get());
    if (!slot || !detail::unit_of(*slot)) {
      throw ConfigError("apply_activation_checkpointing: check_fn selects the root module (" + model->name() +
                        "): checkpoint its submodules, or wrap the root in fsdp::CheckpointWrapper yourself");
    }
    detail::mark_checkpointed(slot, *model);
    ++count;
  }
  count += apply_rec(*model, "", check_fn);
  detail::interpose_sequential_elements(*model);
  return count;
}

bool is_checkpointed(const torch::nn::Module& module) {
  auto slot = detail::find_slot(&module);
  return slot && slot->checkpoint;
}

}  // namespace fsdp
