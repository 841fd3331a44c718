// src/train/step.h — one training step and one held-out evaluation of the
// run's model (the GPT or a Llama) under its Strategy (either engine): what train() repeats. Both are collectives over
// the strategy's group.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "fsdp/models/gpt.h"
#include "fsdp/strategy/strategy_base.h"
#include "fsdp/train/batches.h"

namespace fsdp::train {

// The model a run trains, either kind (the GPT or a Llama), wrapped by
// either engine: its root module and its forward, tokens [B, T] to logits
// [B, T, vocab] through the holder (so that the engine's hooks run).
class Model {
 public:
  template <class Net>
  /* implicit */ Model(Unit<Net> unit)
      : module_(unit.ptr()), forward_([unit](const at::Tensor& tokens) mutable { return unit(tokens); }) {}
  at::Tensor operator()(const at::Tensor& tokens) const { return forward_(tokens); }
  std::shared_ptr<torch::nn::Module> ptr() const { return module_; }
  torch::nn::Module* operator->() const { return module_.get(); }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::function<at::Tensor(const at::Tensor&)> forward_;
};

// What train_step did: the mean loss over the ranks, the gradient norm
// before clipping, and whether they were finite (not: the optimizer step
// was not taken).
struct StepResult {
  double loss = 0, grad_norm = 0;
  bool finite = true;
};

// [collective] One optimizer step on `batch` at learning rate `lr`, with the
// gradients clipped to norm 1; taken only when the mean loss (and, without the
// strategy's gradient scaler, the gradient norm) is finite: the same decision
// on every rank.
StepResult train_step(const Strategy& strategy, Model& model, torch::optim::Optimizer& opt, const Batch& batch,
                      double lr);

// [collective] The mean loss over the held-out set (kHeldOutSamples samples,
// the same at any world size; the same value on every rank). Every rank
// runs the same forwards; the padding rows of a round are left out.
double evaluate(const Strategy& strategy, Model& model, const BatchSampler& batches);

// [collective] Every rank's resident memory in MiB, as text, in rank order.
std::vector<std::string> memory_of_ranks(const Strategy& strategy);

}  // namespace fsdp::train
