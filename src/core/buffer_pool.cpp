#include "buffer_pool.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>

#include <utility>

namespace fsdp::detail {

// What a pooled DataPtr's context owns: the allocator's block, and the way home.
struct BufferPool::Loan {
  std::weak_ptr<BufferPool> pool;
  c10::DataPtr block;
  size_t bytes;
};

void BufferPool::give_back(void* ctx) {
  std::unique_ptr<Loan> loan(static_cast<Loan*>(ctx));
  if (auto pool = loan->pool.lock()) {
    std::lock_guard<std::mutex> lock(pool->mu_);
    pool->free_[loan->bytes].push_back(std::move(loan->block));
  }  // else the block goes back to the allocator with the loan
}

c10::DataPtr BufferPool::take(size_t bytes) {
  c10::DataPtr block;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(bytes);
    if (it != free_.end() && !it->second.empty()) {
      block = std::move(it->second.back());
      it->second.pop_back();
    }
  }
  if (!block) block = c10::GetCPUAllocator()->allocate(bytes);
  void* data = block.get();
  auto* loan = new Loan{weak_from_this(), std::move(block), bytes};
  return c10::DataPtr(data, loan, &BufferPool::give_back, c10::Device(c10::kCPU));
}

at::Tensor BufferPool::empty(int64_t numel, const at::TensorOptions& options) {
  const size_t bytes = static_cast<size_t>(numel) * options.dtype().itemsize();
  auto storage = c10::Storage(c10::Storage::use_byte_size_t(), bytes, take(bytes), /*allocator=*/nullptr,
                              /*resizable=*/false);
  return at::empty({0}, options).set_(storage, 0, {numel}, {1});
}

size_t BufferPool::kept_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [bytes, blocks] : free_) n += bytes * blocks.size();
  return n;
}

}  // namespace fsdp::detail
