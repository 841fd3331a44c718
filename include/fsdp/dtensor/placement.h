// fsdp/dtensor/placement.h — how a tensor lies on one dimension of a mesh,
// torch's Placement types (torch.distributed.tensor.placement_types):
//  - Shard{d}: the tensor is cut along its dimension d into as many chunks
//    as the mesh dimension has ranks, as torch.chunk cuts (ceil-sized
//    chunks, trailing ones smaller or empty); rank i holds chunk i;
//  - Replicate: every rank holds the same values;
//  - Partial{op}: every rank holds a part of the values; the tensor is their
//    reduction (op) over the mesh dimension.
// Values only: nothing here communicates or allocates.
#pragma once

#include <cstdint>
#include <string>
#include <variant>

#include "fsdp/distributed/process_group.h"  // dist::ReduceOp

namespace fsdp::placement {

struct Shard {
  int64_t dim = 0;
};
struct Replicate {};
struct Partial {
  dist::ReduceOp op = dist::ReduceOp::kSum;
};
using Placement = std::variant<Shard, Replicate, Partial>;

// torch's repr: "Shard(dim=0)", "Replicate()", "Partial(sum)".
std::string to_string(const Placement& p);
bool operator==(const Placement& a, const Placement& b);
inline bool operator!=(const Placement& a, const Placement& b) { return !(a == b); }
inline bool is_shard(const Placement& p) { return std::holds_alternative<Shard>(p); }

}  // namespace fsdp::placement
