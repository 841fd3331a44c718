// One training step and one held-out evaluation (src/train/step.h).
#include "step.h"

#include <cmath>
#include <iomanip>
#include <sstream>

#include "fsdp/core/utils.h"  // resident_memory_mib

namespace fsdp::train {

StepResult train_step(const Strategy& strategy, Model& model, torch::optim::Optimizer& opt, const Batch& batch,
                      double lr) {
  for (auto& group : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  opt.zero_grad();
  auto loss = models::gpt_loss(model(batch.inputs), batch.targets);
  strategy.backward(loss);  // scaled under "16-mixed"
  StepResult r;
  r.loss = strategy.all_reduce(loss.detach().to(at::kDouble)).item<double>();
  // The engine's arithmetic: FSDP1's flat norm, or DTensor's for fully_shard.
  r.grad_norm = strategy.clip_gradients_norm(model.ptr(), opt, 1.0).to(at::kDouble).item<double>();
  // Under "16-mixed" the scaler skips steps with inf gradients itself.
  r.finite = std::isfinite(r.loss) && (strategy.grad_scaler() != nullptr || std::isfinite(r.grad_norm));
  if (r.finite) strategy.optimizer_step(opt);
  return r;
}

double evaluate(const Strategy& strategy, Model& model, const BatchSampler& batches) {
  torch::NoGradGuard no_grad;
  double sum = 0;  // over this rank's samples, of each sample's mean loss
  for (int64_t i = 0; i < batches.held_out_rounds(); ++i) {
    const Batch b = batches.held_out(i);
    const at::Tensor logits = model(b.inputs);
    const int64_t rows = batches.held_out_rows(i);
    if (rows == 0) continue;
    sum += models::gpt_loss(logits.narrow(0, 0, rows), b.targets.narrow(0, 0, rows)).to(at::kDouble).item<double>() *
           static_cast<double>(rows);
  }
  return strategy.all_reduce(at::full({1}, sum, at::kDouble), dist::ReduceOp::kSum).item<double>() /
         static_cast<double>(kHeldOutSamples);
}

std::vector<std::string> memory_of_ranks(const Strategy& strategy) {
  std::ostringstream mem;
  mem << std::fixed << std::setprecision(0) << resident_memory_mib();
  return strategy.group().all_gather_bytes(mem.str());
}

}  // namespace fsdp::train
