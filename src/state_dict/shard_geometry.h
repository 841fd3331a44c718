// src/state_dict/shard_geometry.h — where each part of a unit's parameters lives
// on this rank: the rank's range of a parameter inside the unit's flat
// shard, its pieces as boxes of the parameter, and copying a range out of a
// state dict value. Private to the library; local (no collective).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/dtensor/detail/boxes.h"
#include "fsdp/dtensor/dtensor.h"
#include "fsdp/state_dict/sharded_tensor.h"

namespace fsdp::detail {

class UnitView;
struct ParamInfo;

// This rank's range [lo, hi) of parameter p (relative to p; empty: lo == hi).
std::pair<int64_t, int64_t> local_range(const UnitView& u, const ParamInfo& p);
// Where p's element `rel` lives in the unit's flat shard.
int64_t shard_index(const UnitView& u, const ParamInfo& p, int64_t rel);
// This rank's pieces of p: views of the unit's flat shard.
std::vector<Shard> local_shards(const UnitView& u, const ParamInfo& p);
// The unpadded part of the unit's flat shard, as a sharded flat parameter.
ShardedTensor local_flat(const UnitView& u);

// The unit's mesh: its shard group, under its replicate group (HYBRID_SHARD).
Mesh unit_mesh(const UnitView& u);
// p as a DTensor of boxes (FSDP1's original parameters: a rank's range of
// the flat shard cuts up to 2·ndim−1 boxes, which placements cannot say):
// views of the shard.
DTensor param_dtensor(const UnitView& u, const ParamInfo& p);

// The pieces a state dict value holds: a ShardedTensor's, or a tensor as
// one box at the origin (views, no copy).
std::vector<Shard> value_boxes(const StateValue& v);
// How many elements of box `dst` the pieces `src` hold (box arithmetic
// only; pieces never overlap).
int64_t held(const Shard& dst, const std::vector<Shard>& src);
// The global shape of a state dict value.
std::vector<int64_t> value_shape(const StateValue& v);
}  // namespace fsdp::detail
