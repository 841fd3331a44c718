// src/state_dict/optim_state_dict_visit.h — an optimizer's state dict handed over
// entry by entry, for writers that stream it. Private to the library.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model_index.h"  // StateSink

namespace torch::optim {
class Optimizer;
}
namespace fsdp {
struct OptimParamGroup;  // fsdp/state_dict/optim_state_dict.h, which a caller includes to use the result
}

namespace fsdp::detail {

// [collective on models with FULL_STATE_DICT units; local otherwise]
// optim_state_dict(), handing each state entry to `sink` as it exists (FULL:
// one unit's gathered state at a time); returns the parameter groups.
// copy=false: FULL tensors may be views of a gathered buffer (valid as long
// as the sink holds them).
std::vector<OptimParamGroup> visit_optim_state_dict(const std::shared_ptr<torch::nn::Module>& model,
                                                   const torch::optim::Optimizer& optimizer, const StateSink& sink,
                                                   bool copy = true);

// [local] The names of the parameters of each of `optimizer`'s groups, in
// the model's state-dict order (tied parameters once, under their first
// name): what a PyTorch optimizer built on model.parameters() numbers 0, 1,
// ... in its state_dict().
std::vector<std::vector<std::string>> optimizer_param_names(const std::shared_ptr<torch::nn::Module>& model,
                                                           const torch::optim::Optimizer& optimizer);

}  // namespace fsdp::detail
