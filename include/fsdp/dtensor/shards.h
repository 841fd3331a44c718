// fsdp/dtensor/shards.h — pieces of tensors: what a rank holds of a tensor
// that is sharded over ranks (PyTorch's ShardedTensor with its local shards),
// and the box arithmetic that state dicts and checkpoints reshard with.
//
// A box of a tensor of shape S is the sub-tensor [offsets, offsets + sizes)
// in every dimension. Row-major flat ranges of elements map to at most
// 2 * ndim - 1 boxes (flat_range_boxes), which is how a rank's slice of a
// flat parameter becomes pieces of the original parameters. Everything here
// is local: no collective, no allocation beyond the results.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace fsdp {

// One piece of a tensor: the box [offsets, offsets + tensor.sizes()).
struct Shard {
  std::vector<int64_t> offsets;
  at::Tensor tensor;
};

// This rank's pieces of a tensor of `global_shape` (PyTorch's ShardedTensor
// with its local shards). Pieces held by one rank never overlap.
struct ShardedTensor {
  std::vector<int64_t> global_shape;
  at::ScalarType dtype = at::kFloat;
  std::vector<Shard> local_shards;

  int64_t global_numel() const;
  int64_t local_numel() const;
};

// [local] Splits elements [begin, end) of a row-major tensor of `shape` into
// the fewest boxes (at most 2 * ndim - 1) in flat order, as (offsets, sizes)
// pairs. A 0-dim shape gives one box with no dimensions.
std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> flat_range_boxes(const std::vector<int64_t>& shape,
                                                                                    int64_t begin, int64_t end);

// [local] Copies into `target` (a tensor of the box target_offsets +
// target.sizes() of a global tensor) whatever part of it `shards` hold;
// returns the number of elements copied (overlapping pieces count twice).
// A piece with another number of dimensions than `target` is skipped.
int64_t copy_overlap(at::Tensor& target, const std::vector<int64_t>& target_offsets, const std::vector<Shard>& shards);

}  // namespace fsdp
