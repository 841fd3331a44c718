// Storage helpers (fsdp/core/detail/storage.h).
#include "fsdp/core/detail/storage.h"

#include <ATen/ATen.h>
#include <c10/util/strides.h>

namespace fsdp::detail {

at::Tensor storage_view(const at::Tensor& base, int64_t offset, at::IntArrayRef sizes) {
  at::Tensor t = at::empty({0}, base.options());
  t.set_(base.storage(), base.storage_offset() + offset, sizes, c10::contiguous_strides(sizes));
  return t;
}

void free_storage(const at::Tensor& t) {
  c10::StorageImpl* st = t.storage().unsafeGetStorageImpl();
  st->set_data_ptr_noswap(c10::DataPtr(nullptr, t.device()));  // a pooled block goes back to its pool
  st->set_nbytes(0);
}

void alloc_storage(const at::Tensor& t, const std::function<c10::DataPtr(size_t)>& allocate) {
  c10::StorageImpl* st = t.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (st->nbytes() >= bytes) return;
  st->set_data_ptr_noswap(allocate ? allocate(bytes) : st->allocator()->allocate(bytes));
  st->set_nbytes(bytes);
}

}  // namespace fsdp::detail
