// fsdp/optim/adamw.h — AdamW equal to PyTorch's torch.optim.AdamW bit for
// bit: the single-tensor update that torch uses on CPU (foreach and fused
// are CUDA-only defaults), step by step in its order of operations.
//
// LibTorch's torch::optim::AdamW computes the same update in another order
// (exp_avg.mul_(beta1).add_(grad, 1 - beta1) where torch uses
// exp_avg.lerp_(grad, 1 - beta1), and a denominator rounded differently);
// after 20 steps the two differ by about 1e-5. A C++ run that must equal a
// Python run, to the bit, steps with this one.
//
//   fsdp::optim::AdamW opt(model->parameters(),
//                          torch::optim::AdamWOptions(3e-3).betas({0.9, 0.95}).weight_decay(0.1));
//   loss.backward();
//   opt.step();
//
// It is a torch::optim::AdamW (a subclass: the same options, the same
// per-parameter state AdamWParamState: step, exp_avg, exp_avg_sq and, with
// amsgrad, max_exp_avg_sq), so everything that takes a LibTorch AdamW takes
// it: fsdp-cpp's optimizer state dicts and checkpoints (whose layout is
// torch.optim.AdamW's: "step", "exp_avg", "exp_avg_sq" per parameter),
// torch::save of the optimizer, FSDPStrategy::setup_optimizer. Only step()
// differs. Parameters without a gradient are skipped, their step count
// unchanged, as in torch. Sparse gradients are refused (ConfigError), as
// torch refuses them. Per step: about 8 elementwise passes over each
// parameter, one temporary the size of the parameter (the denominator);
// no communication.
#pragma once

#include <torch/optim/adamw.h>

namespace fsdp::optim {

class AdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;

  // [local] One AdamW update of every parameter that has a gradient, in
  // torch.optim.AdamW's single-tensor order (torch/optim/adam.py,
  // _single_tensor_adam with decoupled weight decay): step += 1;
  // param *= 1 - lr * weight_decay; exp_avg.lerp_(grad, 1 - beta1);
  // exp_avg_sq = exp_avg_sq * beta2 + (1 - beta2) * grad * grad;
  // param -= lr / (1 - beta1^step) * exp_avg / (sqrt(exp_avg_sq) / sqrt(1 - beta2^step) + eps),
  // the scalars in double precision as Python computes them. With amsgrad,
  // the running maximum of exp_avg_sq takes its place in the denominator.
  // Runs `closure` first (with gradients enabled) and returns its loss.
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace fsdp::optim
