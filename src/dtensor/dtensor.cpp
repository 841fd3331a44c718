// A tensor laid out over a mesh (fsdp/dtensor/dtensor.h).
#include "fsdp/dtensor/dtensor.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <sstream>

#include "fsdp/dtensor/detail/boxes.h"
#include "fsdp/error.h"

namespace fsdp {

using placement::Partial;
using placement::Placement;
using placement::Replicate;

namespace {

std::string placements_str(const std::vector<Placement>& ps) {
  std::string s = "(";
  for (size_t i = 0; i < ps.size(); ++i) s += (i ? ", " : "") + placement::to_string(ps[i]);
  return s + ")";
}

// torch's Shard.local_shard_size_and_offset: chunk `rank` of `n` elements
// cut into `k` as torch.chunk cuts them; an empty chunk starts at n.
std::pair<int64_t, int64_t> chunk_of(int64_t n, int64_t k, int64_t rank) {
  if (n % k == 0) return {n / k, n / k * rank};
  const int64_t c = (n + k - 1) / k;
  const int64_t start = c * rank;
  if (n < start) return {0, n};
  return {std::min(n, start + c) - start, start};
}

const placement::Shard* shard_of(const Placement& p) { return std::get_if<placement::Shard>(&p); }

// The size of tensor dimension `d` on this rank before mesh dimension `md`
// cuts it (the cuts of the mesh dimensions before md applied).
int64_t size_before(const std::vector<int64_t>& global, const Mesh& mesh, const std::vector<Placement>& ps, int md,
                    int64_t d) {
  std::vector<Placement> head(ps.begin(), ps.begin() + md);
  head.resize(ps.size(), Replicate{});
  return local_chunk(global, mesh.shape(), mesh.coordinate(), head).shape[d];
}

// [collective over `group`] The pieces along dimension d of the ranks of
// `group` put together: `local` is this rank's chunk of a dimension of
// `whole` elements, cut as torch.chunk cuts.
at::Tensor gather_dim(const at::Tensor& local, int64_t d, int64_t whole, const dist::ProcessGroupPtr& group) {
  const int64_t k = group->size();
  const int64_t c = (whole + k - 1) / k;
  at::Tensor front = local.movedim(d, 0);
  std::vector<int64_t> padded = front.sizes().vec();
  padded[0] = c;
  at::Tensor in = at::zeros(padded, local.options());
  if (front.size(0) > 0) in.narrow(0, 0, front.size(0)).copy_(front);
  std::vector<int64_t> all = padded;
  all[0] = c * k;
  at::Tensor out = at::empty(all, local.options());
  group->all_gather(out, in).wait();
  return out.narrow(0, 0, whole).movedim(0, d).contiguous();
}

}  // namespace

LocalChunk local_chunk(const std::vector<int64_t>& global_shape, const std::vector<int64_t>& mesh_shape,
                       const std::vector<int64_t>& coordinate, const std::vector<Placement>& placements) {
  if (placements.size() != mesh_shape.size() || coordinate.size() != mesh_shape.size()) {
    throw ConfigError("DTensor: " + std::to_string(placements.size()) + " placements " + placements_str(placements) +
                      " for a mesh of " + std::to_string(mesh_shape.size()) + " dimensions: give one per dimension");
  }
  LocalChunk out{global_shape, std::vector<int64_t>(global_shape.size(), 0)};
  for (size_t md = 0; md < placements.size(); ++md) {
    const auto* s = shard_of(placements[md]);
    if (!s) continue;
    const int64_t nd = static_cast<int64_t>(global_shape.size());
    if (s->dim < 0 || s->dim >= nd) {
      throw ConfigError("DTensor: " + placement::to_string(placements[md]) + " on mesh dimension " +
                        std::to_string(md) + " cuts a tensor of " + std::to_string(nd) + " dimensions " +
                        detail::shape_str(global_shape) + ": the dimension must be in [0, " + std::to_string(nd) + ")");
    }
    const auto [size, offset] = chunk_of(out.shape[s->dim], mesh_shape[md], coordinate[md]);
    out.offset[s->dim] = size == 0 ? global_shape[s->dim] : out.offset[s->dim] + offset;
    out.shape[s->dim] = size;
  }
  return out;
}

DTensor DTensor::from_local(at::Tensor local, Mesh mesh, std::vector<Placement> placements,
                            std::vector<int64_t> global_shape) {
  const LocalChunk c = local_chunk(global_shape, mesh.shape(), mesh.coordinate(), placements);
  if (local.sizes().vec() != c.shape) {
    throw ConfigError("DTensor: the local tensor is " + detail::shape_str(local.sizes()) + ", but a " +
                      detail::shape_str(global_shape) + " tensor under " + placements_str(placements) +
                      " gives this rank " + detail::shape_str(c.shape));
  }
  DTensor t;
  t.mesh_ = std::move(mesh);
  t.placements_ = std::move(placements);
  t.global_shape_ = std::move(global_shape);
  t.dtype_ = local.scalar_type();
  t.local_ = std::move(local);
  if (t.local_.numel() > 0) t.boxes_.push_back(Shard{c.offset, t.local_});
  return t;
}

DTensor DTensor::from_full(const at::Tensor& full, Mesh mesh, std::vector<Placement> placements) {
  for (const auto& p : placements) {
    if (std::holds_alternative<Partial>(p)) {
      throw ConfigError("DTensor: from_full under " + placements_str(placements) +
                        ": a whole tensor is not a partial one (use Replicate or Shard)");
    }
  }
  const std::vector<int64_t> global = full.sizes().vec();
  const LocalChunk c = local_chunk(global, mesh.shape(), mesh.coordinate(), placements);
  at::Tensor local = full;
  for (size_t d = 0; d < global.size(); ++d) {
    if (c.shape[d] != global[d]) local = local.narrow(d, c.shape[d] == 0 ? 0 : c.offset[d], c.shape[d]);
  }
  return from_local(local, std::move(mesh), std::move(placements), global);
}

DTensor DTensor::from_boxes(Mesh mesh, std::vector<int64_t> global_shape, at::ScalarType dtype,
                            std::vector<Shard> boxes) {
  const std::vector<int64_t> zeros(global_shape.size(), 0);
  for (const auto& b : boxes) {
    std::vector<std::pair<int64_t, int64_t>> unused;
    if (b.offsets.size() != global_shape.size() || b.tensor.dim() != static_cast<int64_t>(global_shape.size()) ||
        (b.tensor.numel() > 0 && !detail::intersect(b.offsets, b.tensor.sizes(), zeros, global_shape, unused))) {
      throw ConfigError("DTensor: a box of " + detail::shape_str(b.tensor.sizes()) + " at " +
                        detail::shape_str(b.offsets) + " is not inside a " + detail::shape_str(global_shape) +
                        " tensor");
    }
  }
  DTensor t;
  t.mesh_ = std::move(mesh);
  t.global_shape_ = std::move(global_shape);
  t.dtype_ = dtype;
  t.boxes_ = std::move(boxes);
  return t;
}

std::vector<int64_t> DTensor::stride() const {
  std::vector<int64_t> s(global_shape_.size(), 1);
  for (int64_t d = static_cast<int64_t>(s.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * global_shape_[d + 1];
  return s;
}

ShardedTensor DTensor::sharded() const { return ShardedTensor{global_shape_, dtype_, boxes_}; }

DTensor DTensor::redistribute(const std::vector<Placement>& target) const {
  if (!has_placements()) throw ConfigError("DTensor: redistribute needs placements; this one holds boxes only");
  const int nd = mesh_.ndim();
  if (static_cast<int>(target.size()) != nd) {
    throw ConfigError("DTensor: redistribute to " + placements_str(target) + " on a mesh of " + std::to_string(nd) +
                      " dimensions: give one placement per dimension");
  }
  // The mesh dimensions to undo and redo: those that change, and after one
  // that cuts tensor dimension d, every later one that cuts d too (their
  // chunks lie inside its chunk).
  std::vector<bool> redo(nd, false);
  std::set<int64_t> cut;
  for (int md = 0; md < nd; ++md) {
    const auto* a = shard_of(placements_[md]);
    const auto* b = shard_of(target[md]);
    const bool nested = (a && cut.count(a->dim)) || (b && cut.count(b->dim));
    if (placements_[md] != target[md] || nested) {
      redo[md] = true;
      if (a) cut.insert(a->dim);
      if (b) cut.insert(b->dim);
    }
    if (std::holds_alternative<Partial>(target[md]) && placements_[md] != target[md]) {
      throw ConfigError("DTensor: redistribute from " + placements_str(placements_) + " to " + placements_str(target) +
                        ": making a Partial placement is not supported");
    }
  }
  at::Tensor t = local_;
  for (int md = nd - 1; md >= 0; --md) {
    if (!redo[md]) continue;
    const auto& g = mesh_.groups[md];
    if (const auto* s = shard_of(placements_[md])) {
      t = gather_dim(t, s->dim, size_before(global_shape_, mesh_, placements_, md, s->dim), g);
    } else if (const auto* p = std::get_if<Partial>(&placements_[md])) {
      t = t.contiguous().clone();
      g->all_reduce(t, p->op).wait();
    }
  }
  for (int md = 0; md < nd; ++md) {
    const auto* s = shard_of(target[md]);
    if (!redo[md] || !s) continue;
    const auto [size, offset] = chunk_of(t.size(s->dim), mesh_.groups[md]->size(), mesh_.groups[md]->rank());
    t = t.narrow(s->dim, size == 0 ? 0 : offset, size);
  }
  return from_local(t, mesh_, target, global_shape_);
}

at::Tensor DTensor::full_tensor() const {
  if (has_placements()) {
    return redistribute(std::vector<Placement>(placements_.size(), Replicate{})).to_local().contiguous();
  }
  // Boxes: every rank of the last dimension's group sends its boxes' places,
  // then their elements (padded to the longest), and all rebuild the whole.
  const auto& g = mesh_.shard_group();
  std::ostringstream meta;
  meta << boxes_.size() << ' ';
  int64_t mine = 0;
  for (const auto& b : boxes_) {
    for (size_t d = 0; d < global_shape_.size(); ++d) meta << b.offsets[d] << ' ' << b.tensor.size(d) << ' ';
    mine += b.tensor.numel();
  }
  const std::vector<std::string> metas = g->all_gather_bytes(meta.str());
  at::Tensor lengths = at::empty({g->size()}, at::kLong);
  at::Tensor my_length = at::full({1}, mine, at::kLong);
  g->all_gather(lengths, my_length).wait();
  const int64_t longest = lengths.max().item<int64_t>();
  const auto opts = at::TensorOptions().dtype(dtype_).device(g->device());
  at::Tensor in = at::zeros({longest}, opts);
  int64_t at_ = 0;
  for (const auto& b : boxes_) {
    in.narrow(0, at_, b.tensor.numel()).copy_(b.tensor.reshape({-1}));
    at_ += b.tensor.numel();
  }
  at::Tensor all = at::empty({longest * g->size()}, opts);
  g->all_gather(all, in).wait();
  at::Tensor full = at::empty(global_shape_, opts);
  int64_t covered = 0;
  const size_t nd = global_shape_.size();
  for (int r = 0; r < g->size(); ++r) {
    std::istringstream in_meta(metas[r]);
    int64_t pos = r * longest;
    std::vector<int64_t> off(nd), size(nd);
    size_t count = 0;
    in_meta >> count;
    for (size_t i = 0; i < count; ++i) {
      for (size_t d = 0; d < nd; ++d) in_meta >> off[d] >> size[d];
      at::Tensor box = full;
      for (size_t d = 0; d < nd; ++d) box = box.narrow(d, off[d], size[d]);
      const int64_t n = detail::product(size);
      box.copy_(all.narrow(0, pos, n).view(size));
      pos += n;
      covered += n;
    }
  }
  if (covered != detail::product(global_shape_)) {
    throw ConfigError("DTensor: the boxes of the ranks of group '" + g->name() + "' hold " + std::to_string(covered) +
                      " elements of a " + detail::shape_str(global_shape_) + " tensor: they must hold each once");
  }
  return full;
}

}  // namespace fsdp
