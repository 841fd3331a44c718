// src/state_dict/state_dict_visit.h — a model's state dict handed over entry by
// entry, for writers that stream it. Private to the library.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model_index.h"

namespace fsdp::detail {

// [collective on models with FULL_STATE_DICT units; local otherwise]
// state_dict(), handing each entry to `sink` as soon as it exists (FULL: a
// unit's entries right after its gather, so that one unit is alive at a
// time). Returns the keys handed over, in the state dict's order. copy=false:
// FULL tensors are views of the unit's gathered buffer (valid as long as the
// sink holds them; no copy, for writers that consume them at once).
std::vector<std::string> visit_state_dict(const std::shared_ptr<torch::nn::Module>& model, const std::string& prefix,
                                          const StateSink& sink, bool copy = true);

}  // namespace fsdp::detail
