// fsdp/core/utils.h — what one does with a wrapped model besides training
// it: its units, full parameters, no_sync, summon_full_params, gradient
// clipping, the optimizer check, memory and runtime statistics, and two
// questions to the machine (float16 kernels, resident memory). Each call says
// whether it is a [collective] (every rank, same order) or [local].
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/options.h"  // SummonOptions
#include "fsdp/core/stats.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}
namespace fsdp::detail {
class UnitState;  // one FSDP unit (src/core/unit.h)
}

namespace fsdp {

// [local] The FSDP units in `module`'s tree, pre-order, as (path, module) pairs.
std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> fsdp_modules(
    const std::shared_ptr<torch::nn::Module>& module);

// [collective] The full (unsharded) value of every parameter of the model,
// keyed by its name in the unwrapped model (tied parameters under each name),
// as copies on every rank. For tests, evaluation and export.
std::vector<std::pair<std::string, at::Tensor>> full_parameters(const std::shared_ptr<torch::nn::Module>& module);

// [local] Gradient accumulation without communication, like PyTorch's
// model.no_sync(): backward passes inside the scope keep each unit's full
// (unreduced) gradient; the first backward after it reduces the sum. Do not
// step the optimizer inside the scope. Costs one full gradient buffer per unit.
class NoSync {
 public:
  explicit NoSync(const std::shared_ptr<torch::nn::Module>& model);
  ~NoSync();
  NoSync(const NoSync&) = delete;
  NoSync& operator=(const NoSync&) = delete;

 private:
  std::vector<std::shared_ptr<detail::UnitState>> units_;
};

// Scoped full parameters, like PyTorch's summon_full_params: inside the scope
// every original parameter holds its full value (tensors of the original
// shapes). Construction is a [collective] (an all-gather per unit);
// destruction is local. Running forward or backward, or summoning again,
// inside the scope is a ConfigError. Parameters that already live whole
// (NO_SHARD, world 1) are used in place and never freed.
class SummonFullParams {
 public:
  SummonFullParams(const std::shared_ptr<torch::nn::Module>& model, SummonOptions options = {});
  ~SummonFullParams();
  SummonFullParams(const SummonFullParams&) = delete;
  SummonFullParams& operator=(const SummonFullParams&) = delete;

 private:
  std::vector<std::shared_ptr<detail::UnitState>> units_;
  SummonOptions options_;
};

// [collective] Clips the gradients of the whole model so that their global
// norm (over all shards, of order `norm_type`: any p > 0, or INFINITY) is at
// most max_norm, and returns that norm as computed before clipping. The one
// entry point for both engines: it asks the model which engine sharded it
// and runs that engine's torch arithmetic, to the bit.
// - fully_shard (FSDP2): `model` must be the root fully_shard sharded last;
//   torch.nn.utils.clip_grad_norm_ over its DTensor gradients, as
//   fsdp/fsdp2/fully_shard.h's clip_grad_norm_(FSDPModule) describes
//   (error_if_nonfinite as below). ConfigError for a model with modules of
//   both engines, naming the fully_shard one, and for a model whose
//   fully_shard modules lie under an unsharded root.
// - FullyShardedDataParallel (FSDP1), or no engine: what torch's
//   FullyShardedDataParallel.clip_grad_norm_ computes. The arithmetic is torch's:
// - sharded units: a float32 norm of each gradient on this rank (each unit's
//   flat parameter's shard, padding included; with use_orig_params each
//   original parameter's part of it), stacked in the units' pre-order, the
//   stack's float32 norm raised to p and summed over the shard group (the
//   maximum for INFINITY); NO_SHARD units' and unwrapped parameters'
//   gradients, normed the same way locally, add their p-th power after the
//   sum; then the 1/p-th root;
// - every unit NO_SHARD (or a shard group of one): torch.nn.utils.
//   clip_grad_norm_ over the model's parameters() (norms in the gradients'
//   own dtype);
// - every gradient is multiplied by min(max_norm / (norm + 1e-6), 1) in its
//   own dtype, even when that is 1: a NaN norm makes every gradient NaN, an
//   inf norm zeroes the finite ones (and turns the infinite ones NaN);
// - the norm comes back in the promoted dtype of this rank's gradients
//   (float32 when it has none).
// error_if_nonfinite (not in torch's FSDP1; nn.utils' meaning): a
// non-finite norm makes every rank throw fsdp::Error with PyTorch's message,
// leaving the gradients as they are. Without it (the default) they are
// scaled anyway and the non-finite norm is returned.
at::Tensor clip_grad_norm_(const std::shared_ptr<torch::nn::Module>& model, double max_norm, double norm_type = 2.0,
                           bool error_if_nonfinite = false);

// [local] The model's parameters, each tensor once, in model->parameters()'s
// order: what PyTorch's model.parameters() gives. LibTorch's parameters()
// lists a tied parameter (one tensor registered in two modules, such as an
// embedding shared with the output head) once per name, and an optimizer
// built on that list steps it twice per step; build it on this list instead.
std::vector<at::Tensor> unique_parameters(const std::shared_ptr<torch::nn::Module>& model);

// [local] ConfigError when `optimizer` lists one tensor more than once, in
// one param group or in two (torch.optim refuses the latter, and PyTorch's
// parameters() never gives the former): such a tensor is stepped twice per
// step. The error names the tensor by its first name in `models` (and its
// other names), the groups and positions, and points to unique_parameters;
// `caller` begins the message. check_optimizer, the strategies'
// setup_optimizer and every optimizer state dict function call it.
void check_parameters_listed_once(const std::vector<std::shared_ptr<torch::nn::Module>>& models,
                                  const torch::optim::Optimizer& optimizer, const std::string& caller);

// [local] Checks that `optimizer` steps the wrapped model's parameters. An
// optimizer built before wrapping (with use_orig_params=false) references the
// original parameters, which FSDP no longer trains: throws ConfigError
// "The optimizer does not seem to reference any FSDP parameters. HINT: Make
// sure to create the optimizer after setting up the model." (Lightning's words).
// A model sharded by fully_shard (FSDP2) keeps its parameter objects: an
// optimizer on any of them passes. torch::optim::LBFGS on a sharded model
// (either engine) is a ConfigError naming it: its line search takes dot
// products over all parameters, which shards cannot give. A tensor listed
// twice is a ConfigError naming it (check_parameters_listed_once).
void check_optimizer(const std::shared_ptr<torch::nn::Module>& model, const torch::optim::Optimizer& optimizer);
// [local] The same for several models: `optimizer` must step parameters of
// at least one of them (ConfigError as above otherwise, also for no models).
void check_optimizer(const std::vector<std::shared_ptr<torch::nn::Module>>& models,
                     const torch::optim::Optimizer& optimizer);

// [local] Bytes this rank holds right now for the model's FSDP units (MemoryStats).
MemoryStats memory_stats(const std::shared_ptr<torch::nn::Module>& module);

// [local] What the FSDP runtime did on this rank for one wrapped model since
// its first forward (or the last reset_runtime_stats): RuntimeStats.
// All zero for a model that has not run forward yet (or has no unit).
RuntimeStats runtime_stats(const std::shared_ptr<torch::nn::Module>& model);
// Sets the counters and peaks to zero (what is in flight now stays counted).
void reset_runtime_stats(const std::shared_ptr<torch::nn::Module>& model);

// [local] Whether this LibTorch computes in float16 on `device_type`: the
// kernels a transformer needs (matmul, GELU, tanh, softmax, layer norm,
// cross-entropy) run on a tiny float16 tensor. CPU LibTorch 2.x has them,
// 1.13 has none. The first call per device type costs a few milliseconds;
// later calls return the cached answer.
bool float16_compute_available(at::DeviceType device_type);

// [local] This process's resident memory right now, in MiB (from
// /proc/self/statm; 0 where that does not exist).
double resident_memory_mib();

}  // namespace fsdp
