// ShardedGradScaler (fsdp/strategy/grad_scaler.h): loss scaling whose
// inf/NaN check is agreed over the group.
#include "fsdp/strategy/grad_scaler.h"

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "fsdp/error.h"

namespace fsdp {

ShardedGradScaler::ShardedGradScaler(dist::ProcessGroupPtr group, double init_scale, double growth_factor,
                                     double backoff_factor, int growth_interval)
    : group_(std::move(group)),
      scale_(init_scale),
      growth_(growth_factor),
      backoff_(backoff_factor),
      interval_(growth_interval) {
  if (!(init_scale > 0) || !(growth_factor > 1) || !(backoff_factor > 0 && backoff_factor < 1) || growth_interval < 1) {
    throw ConfigError("ShardedGradScaler: expected init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and "
                      "growth_interval >= 1");
  }
}

at::Tensor ShardedGradScaler::scale(const at::Tensor& loss) const { return loss * scale_; }

void ShardedGradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (unscaled_) return;
  at::NoGradGuard no_grad;
  // One 0-dim "found a non-finite gradient" flag per device, kept on that
  // device: no read back to the host per parameter (on CUDA each would be a
  // synchronisation); one per device at the end.
  std::vector<at::Tensor> found;
  for (auto& g : optimizer.param_groups()) {
    for (auto& p : g.params()) {
      if (!p.grad().defined()) continue;
      p.mutable_grad().mul_(1.0 / scale_);
      if (p.grad().numel() == 0) continue;
      at::Tensor bad = at::isfinite(p.grad()).all().logical_not();
      auto it = std::find_if(found.begin(), found.end(), [&](const at::Tensor& f) { return f.device() == bad.device(); });
      if (it == found.end()) {
        found.push_back(bad);
      } else {
        *it = it->logical_or(bad);
      }
    }
  }
  at::Tensor flag = at::zeros({1}, at::kFloat);
  for (const auto& f : found) flag = at::maximum(flag, f.to(at::kCPU, at::kFloat).reshape({1}));
  if (group_ && group_->size() > 1) group_->all_reduce(flag, dist::ReduceOp::kMax).wait();  // [collective]
  found_inf_ = flag.item<float>() > 0;
  unscaled_ = true;
}

bool ShardedGradScaler::step(torch::optim::Optimizer& optimizer) {
  unscale_(optimizer);
  if (found_inf_) return false;
  optimizer.step();
  return true;
}

void ShardedGradScaler::update() {
  if (found_inf_) {
    scale_ *= backoff_;
    clean_steps_ = 0;
  } else if (++clean_steps_ >= interval_) {
    scale_ *= growth_;
    clean_steps_ = 0;
  }
  unscaled_ = false;
  found_inf_ = false;
}

}  // namespace fsdp
