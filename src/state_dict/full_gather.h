// src/state_dict/full_gather.h — the one seam a FULL state dict gathers
// through: each engine's way to make whole tensors of a group of keys (an
// FSDP1 unit's original parameters, an FSDP2 parameter) from this rank's
// part, for the model's tensors and for optimizer state shaped like them,
// and the exchange of "which optimizer state exists" that groups share.
// Private to the library. The collectives are marked on each call; every
// rank calls them for the same groups in the same order.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <string>

namespace fsdp {
struct Mesh;
struct ShardedParam;
}

namespace fsdp::detail {

class UnitView;

// A key whose flags an exchange carries (for its checks and errors).
struct FlagMember {
  const std::string* key;  // the state dict key
  const Mesh* mesh;        // the mesh its value lives on
};

// The exchange of per-key flags that several groups share: one collective
// for all of them (FSDP1: per unit; FSDP2: one for every parameter).
class FlagExchange {
 public:
  virtual ~FlagExchange() = default;
  // [collective over the members' shard group: FSDP1 one all-gather of
  // `flags` per unit, FSDP2 one MAX all-reduce; none on a group of one rank]
  // Each element of `flags` (float64, the same count on every rank) at its
  // largest over the ranks. `members` are the keys the flags describe, in
  // order (FSDP2: ConfigError naming two of them sharded over different
  // meshes). May reuse `flags`' memory.
  virtual at::Tensor max_over_ranks(const at::Tensor& flags, const std::vector<FlagMember>& members) const = 0;
};

// This rank's part of one member's optimizer state, for gather_state.
struct StatePart {
  size_t member = 0;  // the member's index in its group (model_index.h's Item::member)
  // Flat: the member's local elements from `at` on, in the order of its
  // item's boxes (the optimizer's state of the tensor it steps, reshaped);
  // undefined: this rank holds none (zeros travel in its place).
  at::Tensor source;
  int64_t at = 0;
};

// An engine's way to make the whole tensors of a group of items with one
// collective: FSDP1 gathers a unit's flat parameter once for all the
// parameters it owns; FSDP2 gathers one parameter. Items share the object
// of their group.
class FullGather {
 public:
  virtual ~FullGather() = default;
  // [collective over the engine's shard group; allocates the whole tensors]
  // Every member's whole tensor, by member index.
  virtual std::vector<at::Tensor> gather() const = 0;
  // [collective over the engine's shard group: one all-gather (FSDP1 of the
  // unit's flat shard layout, FSDP2 of the parameter's rows); allocates the
  // whole tensors] Per part, in order, the whole tensor of which it is this
  // rank's part (an optimizer's state of the member). Every rank passes the
  // same members, each part shaped like the member's local elements.
  virtual std::vector<at::Tensor> gather_state(const std::vector<StatePart>& parts) const = 0;
  // Whether the gathers' tensors are views of one buffer (cloned where the
  // caller keeps them apart) rather than tensors of their own.
  virtual bool views() const = 0;
  // The exchange this group's optimizer-state flags travel in (groups with
  // one exchange object exchange them in one collective).
  virtual const FlagExchange& flags() const = 0;
};

// [local] FSDP1: the gather of unit `u`'s original parameters (members:
// u->params(), in order); it is its own flag exchange, over the unit's
// shard group. `u` outlives it.
std::shared_ptr<const FullGather> unit_gather(const UnitView* u);
// [local] FSDP2: the gather of one parameter (member 0). Every FSDP2
// parameter shares one flag exchange: a FULL optimizer state dict needs
// them on one mesh. `p` outlives it.
std::shared_ptr<const FullGather> rows_gather(const ShardedParam* p);

}  // namespace fsdp::detail
