// fsdp/core/detail/storage.h — tensors on another tensor's memory, and a
// storage whose memory is freed and given back in place: what FSDP1's flat
// parameters (src/core/flat_param.cpp) and FSDP2's parameter groups
// (src/fsdp2/) both build their full parameters on. Local: nothing here
// communicates.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>

#include <cstddef>
#include <cstdint>
#include <functional>

namespace fsdp::detail {

// A tensor on `base`'s storage at `offset` (elements, from base's own
// offset) with `sizes`, contiguous, that autograd does not consider a view
// (optimizers detach_() gradients, which views refuse). No copy.
at::Tensor storage_view(const at::Tensor& base, int64_t offset, at::IntArrayRef sizes);

// Frees the memory of `t`'s storage (torch's free_storage): `t`, and every
// tensor on that storage (views autograd saved included), keep the storage
// object, now of 0 bytes.
void free_storage(const at::Tensor& t);

// Gives `t`'s storage memory for t.numel() elements again, unless it has it
// (torch's alloc_storage): from `allocate` when given, else from the
// storage's own allocator. Tensors on the storage see the new memory.
void alloc_storage(const at::Tensor& t, const std::function<c10::DataPtr(size_t)>& allocate = nullptr);

}  // namespace fsdp::detail
