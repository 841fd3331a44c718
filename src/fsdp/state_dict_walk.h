// src/fsdp/state_dict_walk.h — the walk over a model's state that model and
// optimizer state dicts share. Private to the library.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "fsdp/optim_state_dict.h"
#include "fsdp/state_dict.h"
#include "unit.h"

namespace fsdp::detail {

int64_t product(const std::vector<int64_t>& v);
std::string shape_str(at::IntArrayRef shape);

// A parameter owned by an FSDP unit.
struct Owned {
  UnitState* unit;
  const ParamInfo* param;
};

// Where every unit, original parameter and cast buffer of a model is.
struct ModelIndex {
  std::vector<std::shared_ptr<UnitState>> units;
  std::unordered_map<const torch::nn::Module*, std::vector<std::pair<std::string, Owned>>> owned;  // by owner module
  std::unordered_map<const c10::TensorImpl*, Owned> by_impl;  // original parameters
  std::unordered_set<const c10::TensorImpl*> flat_impls;      // flat parameters
  std::unordered_map<const torch::nn::Module*, UnitState*> unit_at;
  std::unordered_map<const c10::TensorImpl*, at::ScalarType> cast_buffers;  // original dtypes
};
ModelIndex index_model(const std::shared_ptr<torch::nn::Module>& model);

// One key of a state dict.
struct Item {
  enum Kind { kFlat, kOwned, kParam, kBuffer } kind;
  std::string key;
  UnitState* unit = nullptr;        // kFlat, kOwned
  const ParamInfo* param = nullptr;  // kOwned
  at::Tensor tensor;                 // kParam, kBuffer
};
// Every key of `m`'s state dict under `type`, in PyTorch's order.
void walk(torch::nn::Module& m, const std::string& prefix, const ModelIndex& idx, StateDictType type,
          std::vector<Item>& out);
// The one state dict type of the model's units (FULL for a plain model).
std::pair<StateDictType, StateDictConfig> model_type(const ModelIndex& idx);
// ConfigError naming `what` if a unit is inside summon_full_params.
void check_idle(const ModelIndex& idx, const char* what);

// This rank's range [lo, hi) of parameter p (relative to p; empty: lo == hi).
std::pair<int64_t, int64_t> local_range(const UnitState& u, const ParamInfo& p);
// Where p's element `rel` lives in the unit's flat shard.
int64_t shard_index(const UnitState& u, const ParamInfo& p, int64_t rel);
// This rank's pieces of p: views of the shard (or of `shard_like`, a tensor
// laid out like it, e.g. optimizer state of the flat parameter).
std::vector<Shard> local_shards(const UnitState& u, const ParamInfo& p, const at::Tensor& shard_like = {});
// The unpadded part of the unit's flat shard, as a sharded flat parameter.
ShardedTensor local_flat(const UnitState& u);

// Receives the entries of a state dict one by one.
using StateSink = std::function<void(const std::string& key, StateValue value)>;

// state_dict(), handing each entry to `sink` as soon as it exists (FULL: a
// unit's entries right after its gather, so that one unit is alive at a
// time). Returns the keys handed over, in the state dict's order. copy=false:
// FULL tensors are views of the unit's gathered buffer (valid as long as the
// sink holds them; no copy, for writers that consume them at once).
std::vector<std::string> visit_state_dict(const std::shared_ptr<torch::nn::Module>& model, const std::string& prefix,
                                          const StateSink& sink, bool copy = true);

// optim_state_dict(), handing each state entry to `sink` as it exists (FULL:
// one unit's gathered state at a time); returns the parameter groups.
std::vector<OptimParamGroup> visit_optim_state_dict(const std::shared_ptr<torch::nn::Module>& model,
                                                   const torch::optim::Optimizer& optimizer, const StateSink& sink,
                                                   bool copy = true);

at::Tensor offload(const at::Tensor& t, bool to_cpu);
bool offload_of(const StateDictConfig& c);

std::vector<int64_t> value_shape(const StateValue& v);
// Copies what `value` holds of elements [lo, hi) of the tensor of `shape`
// (flat) into `dst` (those elements, flat); false if it does not hold all.
bool copy_range(const StateValue& value, const std::vector<int64_t>& shape, int64_t lo, int64_t hi, at::Tensor dst);

}  // namespace fsdp::detail
