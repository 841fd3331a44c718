// src/state_dict/model_index.h — a wrapped model seen from its state: where every
// unit, original parameter and cast buffer is, and the walk that lists the
// keys of its state dict in PyTorch's order, each one Item of one kind (a
// DTensor of this rank's boxes, whatever engine sharded it). Model and
// optimizer state dicts and the checkpoint loaders share it. Private to the
// library; local (no collective); FULL gathers go through full_gather.h.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "fsdp/fsdp2/fully_shard.h"
#include "fsdp/state_dict/detail/visit.h"  // StateSink
#include "fsdp/state_dict/sharded_tensor.h"
#include "fsdp/state_dict/state_dict_options.h"
#include "fsdp/core/detail/unit_view.h"
#include "fsdp/dtensor/dtensor.h"
#include "full_gather.h"  // FullGather, the seam a FULL gather goes through

namespace fsdp::detail {

// A parameter owned by an FSDP unit.
struct Owned {
  const UnitView* unit;
  const ParamInfo* param;
};

// Where every unit, original parameter and cast buffer of a model is (FSDP1),
// or every group and sharded parameter (FSDP2; a model is one or the other).
struct ModelIndex {
  std::vector<FSDPModule> groups;                          // FSDP2, pre-order
  // FSDP2 parameters: this rank holds rows [row_offset, row_offset + local
  // rows) of each, in the parameter object itself.
  std::unordered_map<const c10::TensorImpl*, ShardedParam> rows;
  std::vector<std::shared_ptr<UnitView>> units;
  std::unordered_map<const torch::nn::Module*, std::vector<std::pair<std::string, Owned>>> owned;  // by owner module
  std::unordered_map<const c10::TensorImpl*, Owned> by_impl;  // original parameters
  std::unordered_set<const c10::TensorImpl*> flat_impls;      // flat parameters
  std::unordered_map<const torch::nn::Module*, const UnitView*> unit_at;
  std::unordered_map<const c10::TensorImpl*, at::ScalarType> cast_buffers;  // original dtypes
  std::unordered_map<const UnitView*, std::shared_ptr<const FullGather>> unit_gather;  // FSDP1: per unit
};
// One pass over the model's units and their parameters.
ModelIndex index_model(const std::shared_ptr<torch::nn::Module>& model);

// One key of a state dict: a DTensor whose boxes are views of the model's
// live storage (FSDP1's original parameters: of the unit's flat shard;
// FSDP2's: the local rows; LOCAL's flat entry: the unpadded flat shard, one
// box), or, on a mesh of no dimension, a tensor every rank holds whole
// (plain parameters and buffers).
struct Item {
  std::string key;
  DTensor value;
  at::Tensor tensor;  // the parameter or buffer object the key names (undefined: LOCAL's flat entry)
  bool frozen = false;  // a parameter with requires_grad false
  // The dtype the state dict holds (a buffer mixed precision cast keeps its
  // original one); Undefined: value's.
  at::ScalarType saved_dtype = at::ScalarType::Undefined;
  // Loads only from a ShardedTensor of exactly this rank's boxes (a LOCAL
  // state dict is one rank's shard).
  bool exact = false;
  // FULL: the engine's gather of the item's group and its member index
  // (null for a tensor every rank holds whole).
  std::shared_ptr<const FullGather> full;
  size_t member = 0;

  // Every rank holds the whole tensor (the state dict holds it as a tensor).
  bool whole() const { return value.mesh().ndim() == 0; }
};
// Every key of `m`'s state dict under `type`, in PyTorch's order.
void walk(torch::nn::Module& m, const std::string& prefix, const ModelIndex& idx, StateDictType type,
          std::vector<Item>& out);
// The one state dict type (and config) of the model's units (FULL for a
// plain model); ConfigError naming two units whose types differ.
std::pair<StateDictType, StateDictConfig> model_type(const ModelIndex& idx);
// ConfigError naming `what` if a unit is inside summon_full_params.
void check_idle(const ModelIndex& idx, const char* what);
// The flat range [lo, hi) of a tensor of `shape` that `boxes` cover
// (row-major; boxes in flat order, one range); [0, 0) for none.
std::pair<int64_t, int64_t> flat_span(const std::vector<int64_t>& shape, const std::vector<Shard>& boxes);
// The rank of this process in the model's whole world (replicate rank *
// shard size + shard rank; 0 for a model without units or groups).
int world_rank(const ModelIndex& idx);
// The groups a tensor travels over from the model's world rank 0 to every
// rank: the shard group, then the replicate group (null when none). Empty
// for a model without units or groups.
std::vector<dist::ProcessGroupPtr> broadcast_groups(const ModelIndex& idx);

// `t`, or a CPU copy of it with to_cpu.
at::Tensor offload(const at::Tensor& t, bool to_cpu);
// The config's offload_to_cpu.
bool offload_of(const StateDictConfig& c);


}  // namespace fsdp::detail
