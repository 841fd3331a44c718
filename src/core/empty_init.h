// Deferred initialisation (fsdp::EmptyInitGuard): private helpers for wrapping
// (module_to, for the modules above core: fsdp/core/detail/empty_init.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "fsdp/core/detail/empty_init.h"  // module_to

namespace torch::nn {
class Module;
}

namespace fsdp::detail {

// A tensor whose storage was freed by deferral (shape kept, no bytes).
bool is_unallocated(const at::Tensor& t);

// Materialises the deferred modules under `root` (itself included), skipping
// the subtrees for which `skip` returns true; values go to `device`. Returns
// the tensors that received values.
std::vector<at::Tensor> materialize_deferred(torch::nn::Module& root, const std::optional<at::Device>& device,
                          const std::function<bool(const torch::nn::Module&)>& skip);

}  // namespace fsdp::detail
