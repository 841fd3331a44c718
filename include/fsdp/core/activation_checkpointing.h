// fsdp/core/activation_checkpointing.h — activation checkpointing: trade compute for memory.
//
// A checkpointed module's forward keeps no intermediate activations: only its
// tensor arguments are saved, and backward re-runs the forward (with the RNG
// state of the original run — the CPU generator and that of each CUDA device
// a tensor argument lives on — so dropout draws the same numbers) and
// back-propagates through the re-run. Gradients equal the plain module's.
// Like FSDP units, checkpointing needs a forward that fsdp-cpp runs: a
// fsdp::Unit / CheckpointWrapper member, or a Tensor(Tensor) element of a
// torch::nn::Sequential. Names of parameters and buffers never change.
// Composes with FSDP in either order (checkpoint before or after wrapping);
// the re-run happens inside the unit's backward, where its parameters are
// already gathered. Any forward signature: tensor arguments are what backward
// differentiates (others are kept as copies); the tensors of the result (a
// tensor, or std::vector / std::pair / std::tuple of them) come back
// differentiable, other parts of the result as the first run made them.
// Local calls (no collectives); the re-run repeats a unit's collectives in
// backward on every rank alike.
#pragma once

#include <functional>
#include <memory>

#include "fsdp/core/fully_sharded_data_parallel.h"

namespace fsdp {

// A fsdp::Unit whose module runs checkpointed (PyTorch's checkpoint_wrapper).
//   block = register_module("block", fsdp::CheckpointWrapper<BlockImpl>(std::make_shared<BlockImpl>()));
// Wrapping it in FullyShardedDataParallel gives FSDP(CheckpointWrapper(block)).
// Throws ConfigError if the module is already checkpointed.
template <class ModuleImpl>
class CheckpointWrapper : public Unit<ModuleImpl> {
 public:
  /* implicit */ CheckpointWrapper(std::shared_ptr<ModuleImpl> module) : Unit<ModuleImpl>(std::move(module)) {
    detail::mark_checkpointed(this->slot_, *this->impl_);
  }
  /* implicit */ CheckpointWrapper(const torch::nn::ModuleHolder<ModuleImpl>& holder)
      : CheckpointWrapper(holder.ptr()) {}
};

// Selects modules to checkpoint.
using CheckpointCheck = std::function<bool(const torch::nn::Module& module)>;

// Selects modules of (or derived from) the given types.
template <class... ModuleImpls>
CheckpointCheck checkpoint_module_types() {
  return [](const torch::nn::Module& m) { return ((dynamic_cast<const ModuleImpls*>(&m) != nullptr) || ...); };
}

// PyTorch's apply_activation_checkpointing: checkpoints every submodule of
// `model` (not `model` itself) for which `check_fn` is true, on a plain model
// or an FSDP-wrapped one. An FSDP-wrapped root may be selected too (in
// PyTorch the wrapped module is the FSDP wrapper's child): it then runs as
// FSDP(CheckpointWrapper(module)). Throws ConfigError when check_fn selects a plain root,
// a module that is already checkpointed, or a module whose forward fsdp-cpp
// cannot run (see above). Returns how many modules it checkpointed.
int apply_activation_checkpointing(const std::shared_ptr<torch::nn::Module>& model, const CheckpointCheck& check_fn);

// True when `module` runs checkpointed.
bool is_checkpointed(const torch::nn::Module& module);

}  // namespace fsdp
