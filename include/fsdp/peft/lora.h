// fsdp/peft/lora.h — LoRA as PEFT applies it: an adapter pass over a built
// model. inject_lora walks any torch::nn::Module, finds the linear modules
// whose names match the targets (PEFT's target_modules rule), gives each
// PEFT's adapters (lora_A, lora_B) and freezes everything else:
//
//   auto model = std::make_shared<MyModel>(...);      // built, not yet sharded
//   fsdp::peft::inject_lora(*model, {/*rank=*/8, /*alpha=*/16, {"q_proj", "v_proj"}});
//   fully_shard(...) / FullyShardedDataParallel(...) // then shard it
//
// LibTorch's torch::nn::Linear cannot take adapters in place (its forward is
// not virtual, and a parent calls it through its own typed member), so a
// module LoRA adapts inherits the seam, LoraLayer: fsdp::peft::Linear is
// torch::nn::Linear with it (same parameters, initial draws and arithmetic),
// and a model's own projection type can inherit LoraLayer too (as
// models::LlamaLinear does). Adapters in PEFT's files: fsdp/hf/peft.h.
// Plain values and LibTorch modules; no collectives.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "fsdp/peft/lora_config.h"

namespace fsdp::peft {

// The seam of a linear module LoRA adapts in place. The module registers
// its weight [out, in] as "weight" and ends its forward with
// `return with_lora(x, y);`: without adapters that is y itself; with them,
// y + lora_B(lora_A(x)) * scaling, in PEFT's order of operations.
class LoraLayer {
 public:
  virtual ~LoraLayer() = default;
  torch::nn::Linear lora_A{nullptr}, lora_B{nullptr};  // PEFT's names; Linear without bias
  double scaling = 0;                                   // alpha / rank

 protected:
  at::Tensor with_lora(const at::Tensor& x, at::Tensor y);
};

// Registers rank-`rank` adapters "lora_A" [rank, in] and "lora_B" [out,
// rank] on `module` (which inherits LoraLayer; its "weight" gives in and out,
// dtype and device) with PEFT's initial values, drawn from LibTorch's
// default generator. Freezes nothing. ConfigError if it has adapters
// already, or, before allocating, if they would exceed this machine's
// physical memory (or 2^62 bytes).
void add_lora(torch::nn::Module& module, int64_t rank, double alpha);

// torch::nn::Linear with the LoRA seam: the same parameters, the same
// initial draws, the same forward (F::linear) until inject_lora adapts it.
// A drop-in member type for a model LoRA should reach:
//   fc_ = register_module("fc", fsdp::peft::Linear(in, out));
class LinearImpl : public torch::nn::LinearImpl, public LoraLayer {
 public:
  LinearImpl(int64_t in, int64_t out) : LinearImpl(torch::nn::LinearOptions(in, out)) {}
  explicit LinearImpl(const torch::nn::LinearOptions& options);
  at::Tensor forward(const at::Tensor& input);
};
TORCH_MODULE(Linear);

// [local] PEFT's inject_adapter_in_model + mark_only_lora_as_trainable: every
// module of `model` whose name matches one of config.targets gets adapters
// (add_lora), and every parameter whose name has no "lora_" stops requiring
// gradients. Run it on a built model before sharding it (an engine's
// wrapping takes the parameters as they are then); a module built deferred
// (fsdp::EmptyInitGuard) may be adapted before it is materialised: its
// adapters are allocated at once and kept. Cost: the adapters' memory and
// one Kaiming draw per lora_A. Returns the names of the adapted modules, in
// the model's order. ConfigError (nothing changed) when check_lora_config refuses
// the config, when rank is 0, when a matching module is not a LoraLayer (a
// plain torch::nn::Linear among them, named so), when one is adapted
// already, when nothing matches, or when all the adapters together would
// exceed this machine's physical memory (a rank from a hostile file: named
// with the bytes, before LibTorch's allocator sees it).
std::vector<std::string> inject_lora(torch::nn::Module& model, const LoraConfig& config);
// PEFT's mark_only_lora_as_trainable alone: requires_grad false for every
// parameter of `model` whose name has no "lora_".
void mark_only_lora_trainable(torch::nn::Module& model);
// Whether a state-dict key is an adapter's ("...lora_A." or "...lora_B.").
bool is_lora_key(const std::string& key);

}  // namespace fsdp::peft
