// src/state_dict/optim_naming.h — the model's names for an optimizer's
// tensors: the keys each stands for (every original parameter of a unit
// for its flat shard) and where their elements lie in it.
// Shared by optim_state_dict.cpp (saving) and load_optim_state_dict.cpp.
// Private to the library; local (no collective).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model_index.h"

namespace fsdp::detail {

// One tensor the optimizer steps, and the state dict keys it stands for.
struct OptParam {
  at::Tensor tensor;
  // The keys (one, or every original parameter of a unit for its flat
  // shard), and where each one's local elements begin in `tensor` (flat;
  // they lie there in the order of the item's boxes). FULL: an item's
  // `full` says how an engine gathers its state (null: whole everywhere).
  std::vector<const Item*> items;
  std::vector<int64_t> at;
};

// The model's names for the optimizer's tensors.
struct Naming {
  ModelIndex idx;
  std::vector<Item> items;                                      // FULL keys, in the model's order
  std::unordered_map<const c10::TensorImpl*, const Item*> first;  // each parameter's first key
  std::unordered_map<const c10::TensorImpl*, const UnitView*> flat;  // flat shards
  std::unordered_map<std::string, size_t> position;             // keys in the model's state-dict order

  explicit Naming(const std::shared_ptr<torch::nn::Module>& model);
  Naming(const Naming&) = delete;  // `first` points into `items`
  Naming& operator=(const Naming&) = delete;
  // What `t` is; ConfigError for a tensor that is not the model's.
  OptParam classify(const at::Tensor& t) const;
  // The parameter names an optimizer tensor stands for.
  std::vector<std::string> names(const OptParam& p) const;
};

// The item's boxes (their offsets and sizes) cut from `elements`, its local
// elements in box order: views of `elements`, from `at` on.
std::vector<Shard> cut(const Item& item, const at::Tensor& elements, int64_t at = 0);
// The number of elements of the item on this rank.
int64_t local_numel(const Item& item);

// Refuses a tensor listed twice (it would step twice, and its state would
// fill one key twice), then classifies each, group by group.
std::vector<std::vector<OptParam>> classify_all(const std::shared_ptr<torch::nn::Module>& model, const Naming& naming,
                                                const torch::optim::Optimizer& opt, const char* caller);

// PyTorch's form of a step count: a 0-dim float32 tensor (exact up to 2^24).
at::Tensor step_tensor(int64_t step);

// "a, b, c".
std::string join(const std::vector<std::string>& v);

}  // namespace fsdp::detail
