// fsdp/core/detail/engine.h — what core's one entry points ask of the engine
// that sharded a model, beyond the forward hooks of its modules
// (forward_call.h). fully_shard (src/fsdp2/) implements RootEngine on the
// hooks of its modules; core's own engine (FSDP1) is core's. Not a public API.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace torch::nn {
class Module;
}

namespace fsdp::detail {

// The engine of a model's root module, as fsdp::clip_grad_norm_
// (fsdp/core/utils.h) dispatches to it.
class RootEngine {
 public:
  virtual ~RootEngine() = default;
  // [collective over the engine's shard group] The engine's torch arithmetic
  // of clip_grad_norm_ over every gradient of the tree under this root
  // (fully_shard: torch.nn.utils.clip_grad_norm_ over DTensors). Returns the
  // total norm from before clipping. error_if_nonfinite: check_finite_norm
  // before any gradient is scaled.
  virtual at::Tensor clip_grad_norm_(double max_norm, double norm_type, bool error_if_nonfinite) = 0;
};

// [local] fsdp::Error with torch.nn.utils.clip_grad_norm_'s message unless
// `total` (a 0-d norm) is finite (src/core/utils.cpp).
void check_finite_norm(const at::Tensor& total, double norm_type);

// Throws the ConfigError that refuses a model with two engines: `sharded`
// (under `model`, or `model` itself) is sharded by fully_shard (FSDP2) while
// `model` has, or is being given, FullyShardedDataParallel units. `who`
// prefixes the message (src/core/wrap.cpp).
[[noreturn]] void refuse_two_engines(const std::string& who, const torch::nn::Module& sharded,
                                     const torch::nn::Module& model);

}  // namespace fsdp::detail
