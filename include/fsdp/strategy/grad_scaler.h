// fsdp/strategy/grad_scaler.h — PyTorch's ShardedGradScaler: dynamic loss
// scaling for float16 training of a sharded model, the one FSDPStrategy uses
// under "16-mixed" (fsdp/strategy/strategy.h). Calls marked [collective] are
// made by every rank of the group, in the same order.
#pragma once

#include <ATen/core/Tensor.h>

#include "fsdp/distributed/process_group.h"

namespace torch::optim {
class Optimizer;
}

namespace fsdp {

// PyTorch's (Sharded)GradScaler for float16 training: scales the loss so
// that small gradients survive float16, unscales the gradients before the
// optimizer (or clipping) sees them, and skips the step — on every rank
// alike — when any rank's shard holds an inf or NaN, backing the scale off.
class ShardedGradScaler {
 public:
  ShardedGradScaler(dist::ProcessGroupPtr group, double init_scale = 65536.0, double growth_factor = 2.0,
                    double backoff_factor = 0.5, int growth_interval = 2000);
  // loss * scale.
  at::Tensor scale(const at::Tensor& loss) const;
  // [collective] Divides the gradients of the optimizer's parameters by the
  // scale (once per step) and agrees over the group whether any is not finite.
  void unscale_(torch::optim::Optimizer& optimizer);
  // [collective unless unscale_ ran] Unscales if needed, then steps unless a
  // gradient was not finite. Returns whether it stepped.
  bool step(torch::optim::Optimizer& optimizer);
  // Grows the scale after growth_interval clean steps, backs off after a bad one.
  void update();
  double get_scale() const { return scale_; }

 private:
  dist::ProcessGroupPtr group_;
  double scale_, growth_, backoff_;
  int interval_, clean_steps_ = 0;
  bool unscaled_ = false, found_inf_ = false;
};

}  // namespace fsdp
