// Pieces of tensors: ShardedTensor and the box arithmetic (fsdp/dtensor/shards.h).
#include "fsdp/dtensor/shards.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>

#include "fsdp/dtensor/detail/boxes.h"

namespace fsdp {

using detail::product;

int64_t ShardedTensor::global_numel() const { return product(global_shape); }

int64_t ShardedTensor::local_numel() const {
  int64_t n = 0;
  for (const auto& s : local_shards) n += s.tensor.numel();
  return n;
}

namespace {

using Box = std::pair<std::vector<int64_t>, std::vector<int64_t>>;

void boxes_rec(const std::vector<int64_t>& shape, size_t dim, std::vector<int64_t>& base, int64_t lo, int64_t hi,
               std::vector<Box>& out) {
  if (lo >= hi) return;
  const size_t nd = shape.size();
  auto emit = [&](int64_t first, int64_t count) {  // slices [first, first+count) of dim, whole below
    Box b;
    b.first = base;
    b.first.push_back(first);
    b.second.assign(dim, 1);
    b.second.push_back(count);
    for (size_t d = dim + 1; d < nd; ++d) {
      b.first.push_back(0);
      b.second.push_back(shape[d]);
    }
    out.push_back(std::move(b));
  };
  int64_t inner = 1;
  for (size_t d = dim + 1; d < nd; ++d) inner *= shape[d];
  if (inner == 0) return;
  if (lo % inner == 0 && hi % inner == 0) {
    emit(lo / inner, hi / inner - lo / inner);
    return;
  }
  auto sub = [&](int64_t index, int64_t a, int64_t b) {
    base.push_back(index);
    boxes_rec(shape, dim + 1, base, a, b, out);
    base.pop_back();
  };
  if (lo / inner == (hi - 1) / inner) {  // inside one slice
    sub(lo / inner, lo % inner, hi - (lo / inner) * inner);
    return;
  }
  int64_t a = lo / inner;
  if (lo % inner != 0) {
    sub(a, lo % inner, inner);
    ++a;
  }
  const int64_t b = hi / inner;
  if (a < b) emit(a, b - a);
  if (hi % inner != 0) sub(b, 0, hi % inner);
}

}  // namespace

std::vector<Box> flat_range_boxes(const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  std::vector<Box> out;
  if (begin >= end) return out;
  if (shape.empty()) {
    out.emplace_back();
    return out;
  }
  std::vector<int64_t> base;
  boxes_rec(shape, 0, base, begin, end, out);
  return out;
}

int64_t copy_overlap(at::Tensor& target, const std::vector<int64_t>& target_offsets, const std::vector<Shard>& shards) {
  at::NoGradGuard no_grad;
  int64_t copied = 0;
  std::vector<std::pair<int64_t, int64_t>> common;
  for (const auto& s : shards) {
    if (!detail::intersect(target_offsets, target.sizes(), s.offsets, s.tensor.sizes(), common)) continue;
    at::Tensor dst = target;
    at::Tensor src = s.tensor;
    for (size_t d = 0; d < common.size(); ++d) {
      const auto [lo, hi] = common[d];
      const auto dim = static_cast<int64_t>(d);
      dst = dst.narrow(dim, lo - target_offsets[d], hi - lo);
      src = src.narrow(dim, lo - s.offsets[d], hi - lo);
    }
    dst.copy_(src);
    copied += dst.numel();
  }
  return copied;
}

}  // namespace fsdp
