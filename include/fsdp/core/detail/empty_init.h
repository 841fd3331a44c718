// fsdp/core/detail/empty_init.h — core's door to deferred initialisation
// (fsdp::EmptyInitGuard) for the modules above it; not for applications.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <optional>

namespace torch::nn {
class Module;
}

namespace fsdp::detail {

// [local] Module::to(device) / to(dtype) for a model that may hold
// unallocated tensors (built under EmptyInitGuard). Without any: the
// module's own to(). Else every parameter and buffer changes its device /
// dtype, and the unallocated ones still hold no bytes.
void module_to(torch::nn::Module& module, const std::optional<at::Device>& device,
               const std::optional<at::ScalarType>& dtype);

}  // namespace fsdp::detail
