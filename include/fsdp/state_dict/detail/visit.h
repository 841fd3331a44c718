// fsdp/state_dict/detail/visit.h — a model's and an optimizer's state dicts
// handed over entry by entry, for writers that stream them (the checkpoint
// module). The state_dict module's door for the modules above it; not for
// applications (namespace fsdp::detail, no stability promise).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/state_dict/sharded_tensor.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}
namespace fsdp {
struct OptimParamGroup;  // fsdp/state_dict/optim_state_dict.h, which a caller includes to use the result
class StateDict;        // fsdp/state_dict/state_dict.h, likewise
}

namespace fsdp::detail {

// Receives the entries of a state dict one by one.
using StateSink = std::function<void(const std::string& key, StateValue value)>;

// [collective on models with FULL_STATE_DICT units; local otherwise]
// state_dict(), handing each entry to `sink` as soon as it exists (FULL: a
// unit's entries right after its gather, so that one unit is alive at a
// time). Returns the keys handed over, in the state dict's order. copy=false:
// FULL tensors are views of the unit's gathered buffer (valid as long as the
// sink holds them; no copy, for writers that consume them at once).
// skip_frozen: parameters with requires_grad false are left out, and not
// gathered (torch's ignore_frozen_params).
std::vector<std::string> visit_state_dict(const std::shared_ptr<torch::nn::Module>& model, const std::string& prefix,
                                          const StateSink& sink, bool copy = true, bool skip_frozen = false);

// [as visit_state_dict] Its entries collected into a StateDict, in order:
// state_dict() (fsdp/state_dict/state_dict.h) with skip_frozen.
StateDict collect_state_dict(const std::shared_ptr<torch::nn::Module>& model, const std::string& prefix,
                             bool skip_frozen);

// [local] True when `model` holds FSDP units or modules that fully_shard
// sharded: the model whose state is sharded over ranks.
bool is_sharded_model(const std::shared_ptr<torch::nn::Module>& model);

// [collective on models with FULL_STATE_DICT units or modules, as
// optim_state_dict; local otherwise]
// optim_state_dict(), handing each state entry to `sink` as it exists (FULL:
// one gather group's state at a time, each group through its engine's
// FullGather: an FSDP1 unit, an FSDP2 parameter); returns the parameter
// groups.
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
