// src/fsdp/optim_state_dict_visit.h — an optimizer's state dict handed over
// entry by entry, for writers that stream it. Private to the library.
#pragma once

#include <memory>
#include <vector>

#include "fsdp/optim_state_dict.h"
#include "model_index.h"

namespace fsdp::detail {

// [collective on models with FULL_STATE_DICT units; local otherwise]
// optim_state_dict(), handing each state entry to `sink` as it exists (FULL:
// one unit's gathered state at a time); returns the parameter groups.
// copy=false: FULL tensors may be views of a gathered buffer (valid as long
// as the sink holds them).
std::vector<OptimParamGroup> visit_optim_state_dict(const std::shared_ptr<torch::nn::Module>& model,
                                                   const torch::optim::Optimizer& optimizer, const StateSink& sink,
                                                   bool copy = true);

}  // namespace fsdp::detail
