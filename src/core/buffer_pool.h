// src/core/buffer_pool.h — unit-sized CPU buffers kept for reuse. Private to
// the library.
//
// A unit's full parameters and full gradient are needed for a few
// milliseconds at a time, several times a step, at the same sizes every step.
// Freed to glibc, a buffer above its mmap threshold (32 MiB at most) goes back
// to the kernel and costs page faults and zeroing at every use; below it, it
// stays in the heap anyway. The pool keeps freed blocks by size instead and
// hands them out again: after the first step no unit-sized buffer is
// allocated. It holds at most the largest number of blocks of each size that
// were in use at once, plus nothing: memory stays at what the step needs.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace fsdp::detail {

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  // A block of `bytes` on CPU: a kept one of the same size, else a new one
  // from LibTorch's CPU allocator. Destroying the returned DataPtr (freeing
  // the storage that holds it) gives the block back to this pool, or to the
  // allocator once the pool is gone. Thread-safe (blocks may be released on
  // the backend's threads).
  c10::DataPtr take(size_t bytes);

  // An uninitialised contiguous CPU tensor of `numel` elements on a pooled
  // block; `options` must be on CPU.
  at::Tensor empty(int64_t numel, const at::TensorOptions& options);

  // Bytes kept for reuse right now (not in use).
  size_t kept_bytes() const;

 private:
  struct Loan;
  static void give_back(void* loan);

  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<c10::DataPtr>> free_;
};

}  // namespace fsdp::detail
