// bench/tensor_memory.h — fsdp-bench --tensor-memory: counts the bytes of
// every CPU tensor allocation (a c10::Allocator wrapped around LibTorch's
// default one) and, at the largest total, records the live allocations by
// size, so that a peak can be named tensor by tensor (docs/fsdp2.md's
// memory account). Measurement only: it adds a lock per allocation.
// Needs a LibTorch whose Allocator::allocate is not const (2.4 and later);
// elsewhere kTensorMemory is false and the flag is refused.
#pragma once

#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "fsdp/core/utils.h"

namespace bench {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
constexpr bool kTensorMemory = true;

class TensorMemory final : public c10::Allocator {
 public:
  // Makes this the CPU allocator of every tensor allocated from now on.
  static TensorMemory& install() {
    static TensorMemory* m = new TensorMemory(c10::GetDefaultCPUAllocator());
    c10::SetCPUAllocator(m, /*priority=*/255);
    return *m;
  }

  c10::DataPtr allocate(size_t n) override {
    auto* ctx = new Block{inner_->allocate(n), n, this};
    void* data = ctx->inner.get();
    {
      std::lock_guard<std::mutex> lock(mu_);
      current_ += n;
      ++live_[n];
      if (current_ > peak_) {
        peak_ = current_;
        if (peak_ >= snapshot_peak_ + (1 << 20)) {  // a new peak by 1 MiB or more: record what is live
          snapshot_peak_ = peak_;
          snapshot_ = live_;
          snapshot_rss_mib_ = fsdp::resident_memory_mib();
        }
      }
    }
    return {data, ctx, &release, c10::Device(c10::kCPU)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  // One line: the peak of live tensor bytes, the RSS when it was reached,
  // and the live allocations then, largest first (size MiB × count).
  std::string report(int top = 16) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::pair<uint64_t, std::pair<size_t, int64_t>>> rows;  // bytes, (size, count)
    for (const auto& [size, count] : snapshot_) {
      if (count > 0) rows.push_back({static_cast<uint64_t>(size) * static_cast<uint64_t>(count), {size, count}});
    }
    std::sort(rows.rbegin(), rows.rend());
    std::ostringstream out;
    out.setf(std::ios::fixed);
    out.precision(2);
    out << "tensor memory: peak " << peak_ / 1048576.0 << " MiB live (RSS " << snapshot_rss_mib_ << " MiB then); at it:";
    double rest = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (static_cast<int>(i) < top) {
        out << " " << rows[i].second.first / 1048576.0 << "x" << rows[i].second.second;
      } else {
        rest += rows[i].first / 1048576.0;
      }
    }
    out << " +" << rest << " MiB in smaller ones";
    return out.str();
  }

 private:
  struct Block {
    c10::DataPtr inner;
    size_t n;
    TensorMemory* owner;
  };
  explicit TensorMemory(c10::Allocator* inner) : inner_(inner) {}
  static void release(void* p) {
    auto* b = static_cast<Block*>(p);
    {
      std::lock_guard<std::mutex> lock(b->owner->mu_);
      b->owner->current_ -= b->n;
      --b->owner->live_[b->n];
    }
    delete b;
  }

  c10::Allocator* inner_;
  std::mutex mu_;
  uint64_t current_ = 0, peak_ = 0, snapshot_peak_ = 0;
  double snapshot_rss_mib_ = 0;
  std::map<size_t, int64_t> live_, snapshot_;
};
#else
constexpr bool kTensorMemory = false;
#endif

}  // namespace bench
