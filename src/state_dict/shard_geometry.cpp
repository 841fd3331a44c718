// Where each part of a unit's parameters lives on this rank (shard_geometry.h).
#include "shard_geometry.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <sstream>

#include "fsdp/core/detail/unit_view.h"

namespace fsdp::detail {

// This rank's range [lo, hi) of parameter p, relative to p.
std::pair<int64_t, int64_t> local_range(const UnitView& u, const ParamInfo& p) {
  if (u.shard_size() == 1) return {0, p.numel};
  const int64_t lo = std::max(p.offset, u.shard_begin());
  const int64_t hi = std::min(p.offset + p.numel, u.shard_begin() + u.shard_numel());
  return {lo - p.offset, std::max(hi, lo) - p.offset};
}


// Where p's element `rel` lives in the unit's flat shard.
int64_t shard_index(const UnitView& u, const ParamInfo& p, int64_t rel) {
  return p.offset + rel - (u.shard_size() == 1 ? 0 : u.shard_begin());
}


namespace {

// The boxes of elements [lo, hi) of a tensor of `shape`, cut from `flat`
// (which holds exactly those elements, in order): views of `flat`.
std::vector<Shard> range_pieces(const std::vector<int64_t>& shape, int64_t lo, int64_t hi, const at::Tensor& flat) {
  std::vector<Shard> out;
  int64_t cursor = 0;
  for (auto& [offsets, sizes] : flat_range_boxes(shape, lo, hi)) {
    const int64_t n = product(sizes);
    out.push_back(Shard{offsets, flat.narrow(0, cursor, n).view(sizes)});
    cursor += n;
  }
  return out;
}

}  // namespace

// This rank's pieces of p: views of the shard.
std::vector<Shard> local_shards(const UnitView& u, const ParamInfo& p) {
  auto [lo, hi] = local_range(u, p);
  if (hi <= lo) return {};  // no element of p on this rank
  const at::Tensor flat = u.flat_shard().detach();
  const int64_t first = shard_index(u, p, lo);
  return range_pieces(p.shape, lo, hi, flat.narrow(0, first, hi - lo));
}

Mesh unit_mesh(const UnitView& u) {
  if (u.replicate_group() && u.replicate_group()->size() > 1) {
    Mesh m;
    m.groups = {u.replicate_group(), u.shard_group()};
    return m;
  }
  return Mesh::of(u.shard_group());
}

DTensor param_dtensor(const UnitView& u, const ParamInfo& p) {
  return DTensor::from_boxes(unit_mesh(u), p.shape, u.flat_shard().scalar_type(), local_shards(u, p));
}

// The unpadded part of the unit's flat shard, as a sharded flat parameter.
ShardedTensor local_flat(const UnitView& u) {
  ShardedTensor st;
  st.global_shape = {u.numel()};
  st.dtype = u.flat_shard().scalar_type();
  const int64_t begin = u.shard_size() == 1 ? 0 : u.shard_begin();
  const int64_t n = std::max<int64_t>(0, std::min(u.shard_numel(), u.numel() - begin));
  if (u.shard_size() == 1) {
    st.local_shards.push_back(Shard{{0}, u.flat_shard().detach().narrow(0, 0, u.numel())});
  } else if (n > 0) {
    st.local_shards.push_back(Shard{{begin}, u.flat_shard().detach().narrow(0, 0, n)});
  }
  return st;
}

std::vector<Shard> value_boxes(const StateValue& v) {
  if (std::holds_alternative<ShardedTensor>(v)) return std::get<ShardedTensor>(v).local_shards;
  const at::Tensor& t = std::get<at::Tensor>(v);
  return {Shard{std::vector<int64_t>(static_cast<size_t>(t.dim()), 0), t}};
}

int64_t held(const Shard& dst, const std::vector<Shard>& src) {
  int64_t n = 0;
  std::vector<std::pair<int64_t, int64_t>> common;
  for (const auto& s : src) {
    if (!intersect(dst.offsets, dst.tensor.sizes(), s.offsets, s.tensor.sizes(), common)) continue;
    int64_t k = 1;
    for (const auto& [a, b] : common) k *= b - a;
    n += k;
  }
  return n;
}

std::vector<int64_t> value_shape(const StateValue& v) {
  if (std::holds_alternative<at::Tensor>(v)) return std::get<at::Tensor>(v).sizes().vec();
  return std::get<ShardedTensor>(v).global_shape;
}

}  // namespace fsdp::detail
