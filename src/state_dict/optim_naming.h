// src/state_dict/optim_naming.h — the model's names for an optimizer's
// tensors: which unit, original parameter, FSDP2 parameter or plain
// parameter each is, and the names an optimizer state dict files it under.
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

// One tensor the optimizer steps, and what it is in the model.
struct OptParam {
  at::Tensor tensor;
  const UnitView* unit = nullptr;    // a unit's flat shard (param null) or an original parameter's shard
  const ParamInfo* param = nullptr;  // the original parameter (use_orig_params)
  const ShardedParam* rows = nullptr;  // a parameter that fully_shard sharded (FSDP2)
  std::string name;                  // plain, original and FSDP2 parameters
};

// The model's names for the optimizer's tensors.
struct Naming {
  ModelIndex idx;
  std::unordered_map<const ParamInfo*, std::string> owned;      // first name of each original parameter
  std::unordered_map<const c10::TensorImpl*, std::string> plain;  // parameters outside units
  std::unordered_map<const c10::TensorImpl*, std::pair<std::string, const ShardedParam*>> rows;  // FSDP2 parameters
  std::unordered_map<const c10::TensorImpl*, const UnitView*> flat;  // flat shards
  std::unordered_map<std::string, size_t> position;             // keys in the model's state-dict order

  explicit Naming(const std::shared_ptr<torch::nn::Module>& model);
  // What `t` is; ConfigError for a tensor that is not the model's.
  OptParam classify(const at::Tensor& t) const;
  // The parameter names an optimizer tensor stands for.
  std::vector<std::string> names(const OptParam& p) const;
};

// Refuses a tensor listed twice (it would step twice, and its state would
// fill one key twice), then classifies each, group by group.
std::vector<std::vector<OptParam>> classify_all(const std::shared_ptr<torch::nn::Module>& model, const Naming& naming,
                                                const torch::optim::Optimizer& opt, const char* caller);

// PyTorch's form of a step count: a 0-dim float32 tensor (exact up to 2^24).
at::Tensor step_tensor(int64_t step);

// "a, b, c".
std::string join(const std::vector<std::string>& v);

}  // namespace fsdp::detail
