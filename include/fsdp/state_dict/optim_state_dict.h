// fsdp/state_dict/optim_state_dict.h — optimizer state dicts of FSDP models, keyed by
// parameter names (PyTorch's FSDP.optim_state_dict / optim_state_dict_to_load).
//
// An optimizer built on a wrapped model steps flat shards
// (use_orig_params=false) or the original parameters' shards (true); its
// LibTorch state is per such tensor and useless at another world size or
// layout. These functions translate it to and from the original parameters:
//
//   state["<parameter name>.<field>"]: the per-parameter state of the
//       optimizer, for each field it keeps ("momentum_buffer" for SGD;
//       "exp_avg", "exp_avg_sq", "max_exp_avg_sq" for Adam / AdamW; "sum"
//       for Adagrad; "square_avg", "momentum_buffer", "grad_avg" for RMSprop),
//       shaped like the parameter, and "<parameter name>.step" (a 0-dim
//       float32 tensor, as in PyTorch; loading takes any number) where the
//       optimizer counts steps;
//   param_groups: each group's hyper-parameters and parameter names.
//
// The form follows the model's state dict type (StateDictTypeGuard):
// FULL_STATE_DICT gives full tensors (gathered: a collective; rank0_only:
// only rank 0 gets them), SHARDED_STATE_DICT gives ShardedTensors of this
// rank's pieces (views of the optimizer's state, no gather). Either loads into
// a model of any world size and layout, as long as each rank finds the part
// it needs (full tensors always hold it). Tied parameters appear once, under
// their first name. Supported optimizers: SGD, Adam, AdamW, Adagrad, RMSprop
// (others: ConfigError).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/state_dict/state_dict.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace fsdp {

struct OptimParamGroup {
  std::vector<std::string> params;        // parameter names, in the optimizer's order
  std::map<std::string, double> options;  // "lr", "momentum", "betas.0", "amsgrad" (0 / 1), ...
};

struct OptimStateDict {
  StateDict state;
  std::vector<OptimParamGroup> param_groups;
};

// [collective for FULL_STATE_DICT, over the shard group: FSDP1, per unit,
// one all-gather of which state exists and the step counts, then one per
// state field; FSDP2, one MAX all-reduce of which state exists and the step
// counts for all parameters, then one all-gather per parameter and field;
// local for SHARDED]
// The state of `optimizer`, which steps `model`'s parameters. LOCAL_STATE_DICT
// has no optimizer form: ConfigError.
OptimStateDict optim_state_dict(const std::shared_ptr<torch::nn::Module>& model,
                                const torch::optim::Optimizer& optimizer);

// [local] Loads `state` into `optimizer` (built on `model`, as wrapped now):
// hyper-parameters per group and the per-parameter state of every parameter
// named in it. ConfigError listing every problem at once: other groups or
// parameter names, unknown keys, shapes that differ, sharded values that do
// not hold this rank's part.
void load_optim_state_dict(const std::shared_ptr<torch::nn::Module>& model, torch::optim::Optimizer& optimizer,
                           const OptimStateDict& state);

}  // namespace fsdp
