// src/state_dict/model_index.h — a wrapped model seen from its state: where every
// unit, original parameter and cast buffer is, and the walk that lists the
// keys of its state dict in PyTorch's order. Model and optimizer state dicts
// and the checkpoint loaders share it. Private to the library; local (no
// collective).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "fsdp/state_dict/detail/visit.h"  // StateSink
#include "fsdp/state_dict/sharded_tensor.h"
#include "fsdp/state_dict/state_dict_options.h"
#include "fsdp/core/detail/unit_view.h"

namespace fsdp::detail {

// A parameter owned by an FSDP unit.
struct Owned {
  const UnitView* unit;
  const ParamInfo* param;
};

// Where every unit, original parameter and cast buffer of a model is.
struct ModelIndex {
  std::vector<std::shared_ptr<UnitView>> units;
  std::unordered_map<const torch::nn::Module*, std::vector<std::pair<std::string, Owned>>> owned;  // by owner module
  std::unordered_map<const c10::TensorImpl*, Owned> by_impl;  // original parameters
  std::unordered_set<const c10::TensorImpl*> flat_impls;      // flat parameters
  std::unordered_map<const torch::nn::Module*, const UnitView*> unit_at;
  std::unordered_map<const c10::TensorImpl*, at::ScalarType> cast_buffers;  // original dtypes
};
// One pass over the model's units and their parameters.
ModelIndex index_model(const std::shared_ptr<torch::nn::Module>& model);

// One key of a state dict.
struct Item {
  enum Kind { kFlat, kOwned, kParam, kBuffer } kind;
  std::string key;
  const UnitView* unit = nullptr;   // kFlat, kOwned
  const ParamInfo* param = nullptr;  // kOwned
  at::Tensor tensor;                 // kParam, kBuffer
};
// Every key of `m`'s state dict under `type`, in PyTorch's order.
void walk(torch::nn::Module& m, const std::string& prefix, const ModelIndex& idx, StateDictType type,
          std::vector<Item>& out);
// The one state dict type (and config) of the model's units (FULL for a
// plain model); ConfigError naming two units whose types differ.
std::pair<StateDictType, StateDictConfig> model_type(const ModelIndex& idx);
// ConfigError naming `what` if a unit is inside summon_full_params.
void check_idle(const ModelIndex& idx, const char* what);

// `t`, or a CPU copy of it with to_cpu.
at::Tensor offload(const at::Tensor& t, bool to_cpu);
// The config's offload_to_cpu.
bool offload_of(const StateDictConfig& c);


}  // namespace fsdp::detail
