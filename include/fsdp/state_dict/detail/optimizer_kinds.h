// fsdp/state_dict/detail/optimizer_kinds.h — what fsdp-cpp knows of each LibTorch
// optimizer type: the names of its per-parameter state tensors, its step
// count, and its options as name -> number (PyTorch's param_groups).
// The state_dict module's door for checkpoint; not for applications (namespace
// fsdp::detail, no stability promise). Local.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/optim/detail/state_key.h"  // StateKey, state_key

namespace fsdp::detail {

using OptimOptions = std::map<std::string, double>;

// One LibTorch optimizer type.
struct OptimizerKind {
  std::string name;                  // "SGD", "Adam", "AdamW", "Adagrad", "RMSprop"
  std::vector<std::string> fields;   // per-parameter tensors, shaped like the parameter
  bool has_step = false;
  std::function<std::unique_ptr<torch::optim::OptimizerParamState>()> make;
  std::function<at::Tensor(torch::optim::OptimizerParamState&, const std::string&)> get;
  std::function<void(torch::optim::OptimizerParamState&, const std::string&, const at::Tensor&)> set;
  std::function<int64_t(torch::optim::OptimizerParamState&)> get_step;
  std::function<void(torch::optim::OptimizerParamState&, int64_t)> set_step;
  std::function<OptimOptions(const torch::optim::OptimizerOptions&)> read;
  std::function<void(torch::optim::OptimizerOptions&, const OptimOptions&)> write;
};

// How PyTorch writes one of a kind's param group options (torch 2.15's
// optimizer.state_dict()): kNumber, kBool (options[key] != 0) and kPair
// (options[key.0], options[key.1]: betas) come from LibTorch's options; the
// rest are constants LibTorch's optimizer behaves as (foreach and fused
// None; maximize, capturable, differentiable False; decoupled_weight_decay
// True for AdamW, False for Adam). `checked`: a file that says otherwise
// changes the math, and loading it is refused.
struct PythonOption {
  enum class Type { kNumber, kBool, kPair, kNone, kFalse, kTrue };
  std::string key;
  Type type = Type::kNumber;
  bool checked = false;
};
// The param group keys of optimizer kind `kind` ("AdamW", ...), in
// PyTorch's order, "params" (which comes last) not included; empty for a
// name fsdp-cpp does not know.
const std::vector<PythonOption>& python_options(const std::string& kind);
// `python` (a param group PyTorch wrote, as numbers: bools 0 / 1, pairs as
// key.0 / key.1, None left out) without the options that have no LibTorch
// equivalent. ConfigError naming `where` for a checked one whose value
// LibTorch's `kind` cannot honour (maximize=True, ...).
OptimOptions libtorch_options(const std::string& kind, const OptimOptions& python, const std::string& where);

// The kind of `opt`: SGD, Adam, AdamW, Adagrad or RMSprop; ConfigError for
// any other type.
OptimizerKind kind_of(const torch::optim::Optimizer& opt);

// The optimizer's state of tensor `t` (null: none yet).
torch::optim::OptimizerParamState* state_of(const torch::optim::Optimizer& opt, const at::Tensor& t);

}  // namespace fsdp::detail
