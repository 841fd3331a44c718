// fsdp::optim::AdamW (fsdp/optim/adamw.h): torch.optim.AdamW's single-tensor
// update, in torch 2.15's order of operations (torch/optim/adam.py,
// _single_tensor_adam), on LibTorch's AdamW state.
#include "fsdp/optim/adamw.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cmath>
#include <memory>
#include <string>

#include "fsdp/error.h"
#include "fsdp/optim/detail/state_key.h"

namespace fsdp::optim {

torch::Tensor AdamW::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    const double lr = o.lr();
    const double beta1 = std::get<0>(o.betas());
    const double beta2 = std::get<1>(o.betas());
    const double weight_decay = o.weight_decay();
    const double eps = o.eps();
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const at::Tensor& grad = p.grad();
      if (grad.is_sparse()) {
        throw ConfigError("fsdp::optim::AdamW: a parameter of " + std::to_string(p.numel()) +
                          " elements has a sparse gradient; AdamW takes dense gradients only, as "
                          "torch.optim.AdamW does");
      }
      auto& states = state();
      auto it = states.find(detail::state_key(p));
      if (it == states.end()) {
        auto s = std::make_unique<torch::optim::AdamWParamState>();
        s->step(0);
        s->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        s->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        if (o.amsgrad()) s->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        it = states.emplace(detail::state_key(p), std::move(s)).first;
      }
      auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
      at::Tensor exp_avg = s.exp_avg();
      at::Tensor exp_avg_sq = s.exp_avg_sq();

      s.step(s.step() + 1);
      if (weight_decay != 0) p.mul_(1 - lr * weight_decay);
      exp_avg.lerp_(grad, 1 - beta1);
      exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);

      // Python's floats: step.item() of torch's float32 step counter, whose
      // values are the integers here; ** is pow, and ** 0.5 too.
      const auto step = static_cast<double>(s.step());
      const double bias_correction1 = 1 - std::pow(beta1, step);
      const double bias_correction2 = 1 - std::pow(beta2, step);
      const double step_size = lr / bias_correction1;
      const double bias_correction2_sqrt = std::pow(bias_correction2, 0.5);

      at::Tensor denom;
      if (o.amsgrad()) {
        at::Tensor max_exp_avg_sq = s.max_exp_avg_sq();
        if (!max_exp_avg_sq.defined()) {  // amsgrad turned on after the state was made
          max_exp_avg_sq = at::zeros_like(p, at::MemoryFormat::Preserve);
          s.max_exp_avg_sq(max_exp_avg_sq);
        }
        at::maximum_out(max_exp_avg_sq, max_exp_avg_sq, exp_avg_sq);
        denom = (max_exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps);
      } else {
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps);
      }
      p.addcdiv_(exp_avg, denom, -step_size);
    }
  }
  return loss;
}

}  // namespace fsdp::optim
