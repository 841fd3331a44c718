// bench/tensor_memory.h — fsdp-bench --tensor-memory: counts the bytes of
// every CPU tensor allocation (a c10::Allocator wrapped around LibTorch's
// default one) and, at the largest total, records the live allocations by
// size, so that a peak can be named tensor by tensor (docs/fsdp2.md's
// memory account). Measurement only: it adds a lock per allocation.
// Needs a LibTorch whose Allocator::allocate is not const (2.4 and later);
// elsewhere kTensorMemory is false and the flag is refused.
#pragma once

#include <c10/core/CPUAllocator.h>
#include <cxxabi.h>
#include <execinfo.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
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

  // The data pointer is its own context (LibTorch's raw_allocate needs it);
  // the inner allocation waits in blocks_ until release.
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = inner_->allocate(n);
    void* data = inner.get();
    if (data == nullptr) return inner;  // nothing to count
    {
      std::lock_guard<std::mutex> lock(mu_);
      Block b{std::move(inner), n, {}};
      if (n >= kTraced) {  // a large allocation: where it was made
        b.frames.resize(24);
        b.frames.resize(static_cast<size_t>(backtrace(b.frames.data(), 24)));
      }
      blocks_.emplace(data, std::move(b));
      current_ += n;
      ++live_[n];
      if (current_ > peak_) {
        peak_ = current_;
        if (peak_ >= snapshot_peak_ + (1 << 20)) {  // a new peak by 1 MiB or more: record what is live
          snapshot_peak_ = peak_;
          snapshot_ = live_;
          snapshot_stacks_.clear();
          for (const auto& [ptr, block] : blocks_) {
            if (!block.frames.empty()) ++snapshot_stacks_[{block.n, block.frames}];
          }
          snapshot_rss_mib_ = fsdp::resident_memory_mib();
        }
      }
    }
    return {data, data, &release, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
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
    // The allocations of kTraced bytes or more live then, by where they were
    // made (the frames whose names say fsdp).
    for (const auto& [key, count] : snapshot_stacks_) {
      out << "\n  " << key.first / 1048576.0 << " MiB x" << count << " from:";
      char** names = backtrace_symbols(key.second.data(), static_cast<int>(key.second.size()));
      for (size_t i = 0; names && i < key.second.size(); ++i) {
        std::string name = names[i];
        const size_t open = name.find('('), plus = name.find('+', open);
        if (open == std::string::npos || plus == std::string::npos || plus == open + 1) continue;
        const std::string mangled = name.substr(open + 1, plus - open - 1);
        int status = 0;
        char* d = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
        std::string readable = status == 0 && d ? d : mangled;
        std::free(d);
        if (readable.find("fsdp") != std::string::npos) out << "\n    " << readable.substr(0, 160);
      }
      std::free(names);
    }
    return out.str();
  }

 private:
  static constexpr size_t kTraced = 32u << 20;
  struct Block {
    c10::DataPtr inner;
    size_t n = 0;
    std::vector<void*> frames;
  };
  explicit TensorMemory(c10::Allocator* inner) : inner_(inner) { self_ = this; }
  static void release(void* p) {
    Block b;
    {
      std::lock_guard<std::mutex> lock(self_->mu_);
      auto it = self_->blocks_.find(p);
      if (it == self_->blocks_.end()) {  // not counted (empty): the inner allocator's
        if (auto d = self_->inner_->raw_deleter()) d(p);
        return;
      }
      b = std::move(it->second);
      self_->blocks_.erase(it);
      self_->current_ -= b.n;
      --self_->live_[b.n];
    }
  }  // b.inner frees the memory here, outside the lock

  static inline TensorMemory* self_ = nullptr;
  std::unordered_map<void*, Block> blocks_;

  c10::Allocator* inner_;
  std::mutex mu_;
  uint64_t current_ = 0, peak_ = 0, snapshot_peak_ = 0;
  double snapshot_rss_mib_ = 0;
  std::map<size_t, int64_t> live_, snapshot_;
  std::map<std::pair<size_t, std::vector<void*>>, int> snapshot_stacks_;
};
#else
constexpr bool kTensorMemory = false;
#endif

}  // namespace bench
