// load_optim_state_dict: an optimizer state dict keyed by parameter names
// back into an optimizer, validated whole before anything is written
// (fsdp/state_dict/optim_state_dict.h).
#include "fsdp/state_dict/optim_state_dict.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim.h>

#include <algorithm>
#include <unordered_set>
#include <utility>

#include "fsdp/error.h"
#include "model_index.h"
#include "optim_naming.h"
#include "fsdp/state_dict/detail/visit.h"
#include "fsdp/state_dict/detail/optimizer_kinds.h"
#include "shard_geometry.h"
#include "fsdp/core/detail/unit_view.h"
#include "fsdp/core/utils.h"

namespace fsdp {

using namespace detail;
using torch::optim::OptimizerParamState;
using Kind = OptimizerKind;

namespace {

// load_optim_state_dict, step 1: the state's parameter groups name the
// optimizer's parameters (as sets: use_orig_params and flat parameters list
// the same names in other orders).
void validate_groups(const OptimStateDict& state, const Naming& naming, const std::vector<std::vector<OptParam>>& groups,
                     std::vector<std::string>& errors) {
  if (state.param_groups.size() != groups.size()) {
    errors.push_back("the state has " + std::to_string(state.param_groups.size()) +
                     " parameter groups, the optimizer " + std::to_string(groups.size()));
    return;
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<std::string> names;
    for (const auto& op : groups[g]) {
      for (auto& n : naming.names(op)) names.push_back(n);
    }
    auto want = state.param_groups[g].params;
    std::sort(names.begin(), names.end());
    std::sort(want.begin(), want.end());
    if (names != want) {
      errors.push_back("param_groups[" + std::to_string(g) + "] holds [" + join(state.param_groups[g].params) +
                       "] but the optimizer's group holds [" + join(names) + "]");
    }
  }
}

// One optimizer tensor's new state (null: it has none in the checkpoint).
struct Staged {
  StateKey key;
  std::unique_ptr<OptimizerParamState> state;
};

// load_optim_state_dict, step 2: builds the new state of each optimizer
// tensor from `state` (this rank's part of it), recording every key it
// expects in `expected` and every problem in `errors`. Writes nothing.
class Planner {
 public:
  Planner(const Kind& kind, const Naming& naming, const OptimStateDict& state, std::vector<std::string>& errors)
      : kind_(kind), naming_(naming), state_(state), errors_(errors) {}

  Staged stage(const OptParam& op) {
    auto st = kind_.make();
    bool any = false;
    for (const auto& f : kind_.fields) {
      bool present = false;
      for (const Item* item : op.items) {
        expected_.insert(item->key + "." + f);
        present |= state_.state.contains(item->key + "." + f);
      }
      if (!present) continue;
      at::Tensor dst = at::zeros_like(op.tensor.detach());
      for (size_t i = 0; i < op.items.size(); ++i) {
        const std::string key = op.items[i]->key + "." + f;
        if (!state_.state.contains(key)) {
          errors_.push_back("missing " + key + " (other parameters of its flat parameter have '" + f + "')");
        } else {
          fill(key, *op.items[i], cut(*op.items[i], dst.view({-1}), op.at[i]));
        }
      }
      kind_.set(*st, f, dst);
      any = true;
    }
    if (kind_.has_step) {
      for (const Item* item : op.items) {
        const std::string key = item->key + ".step";
        expected_.insert(key);
        if (any && state_.state.contains(key)) set_step(key, *st);
      }
    }
    return {state_key(op.tensor), any ? std::move(st) : nullptr};
  }

  // Keys of the state that no optimizer tensor expects.
  void check_unexpected() {
    std::vector<std::string> unexpected;
    for (const auto& [key, v] : state_.state) {
      if (!expected_.count(key)) unexpected.push_back(key);
    }
    if (!unexpected.empty()) errors_.push_back("unexpected key(s): " + join(unexpected));
  }

 private:
  // The state tensor at `key` into `boxes` (the item's boxes, views of the
  // new state), box to box.
  void fill(const std::string& key, const Item& item, std::vector<Shard> boxes) {
    const StateValue& v = state_.state.at(key);
    if (value_shape(v) != item.value.shape()) {
      errors_.push_back("size mismatch for " + key + ": " + shape_str(value_shape(v)) + " in the state, " +
                        shape_str(item.value.shape()) + " in the model");
      return;
    }
    const std::vector<Shard> from = value_boxes(v);
    for (auto& box : boxes) {
      if (held(box, from) != box.tensor.numel()) {
        auto [lo, hi] = flat_span(item.value.shape(), boxes);
        errors_.push_back("the ShardedTensor at '" + key + "' does not hold the elements [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + ") this rank needs (saved with another sharding: gather it first)");
        return;
      }
    }
    for (auto& box : boxes) copy_overlap(box.tensor, box.offsets, from);
  }

  void set_step(const std::string& key, OptimizerParamState& st) {
    const StateValue& v = state_.state.at(key);
    if (!std::holds_alternative<at::Tensor>(v) || std::get<at::Tensor>(v).numel() != 1) {
      errors_.push_back("'" + key + "' must be a tensor of one element (the step count)");
      return;
    }
    kind_.set_step(st, std::get<at::Tensor>(v).item<int64_t>());
  }

  const Kind& kind_;
  const Naming& naming_;
  const OptimStateDict& state_;
  std::vector<std::string>& errors_;
  std::unordered_set<std::string> expected_;
};

// load_optim_state_dict, step 3: installs the staged states and the groups' options.
void apply(torch::optim::Optimizer& optimizer, const Kind& kind, std::vector<Staged>& staged,
           const OptimStateDict& state) {
  for (auto& [key, st] : staged) {
    if (st) {
      optimizer.state()[key] = std::move(st);
    } else {
      optimizer.state().erase(key);
    }
  }
  for (size_t g = 0; g < state.param_groups.size(); ++g) {
    kind.write(optimizer.param_groups()[g].options(), state.param_groups[g].options);
  }
}

}  // namespace

void load_optim_state_dict(const std::shared_ptr<torch::nn::Module>& model, torch::optim::Optimizer& optimizer,
                           const OptimStateDict& state) {
  if (!model) throw ConfigError("load_optim_state_dict: the model is null");
  const Kind kind = kind_of(optimizer);
  Naming naming(model);
  check_idle(naming.idx, "load_optim_state_dict");
  for (auto& u : naming.idx.units) u->follow_module_to();
  for (auto& g : naming.idx.groups) g.reshard();  // FSDP2: the parameters show their rows (the state's shape)
  const auto groups = classify_all(model, naming, optimizer, "load_optim_state_dict");
  std::vector<std::string> errors;
  validate_groups(state, naming, groups, errors);
  at::NoGradGuard no_grad;
  Planner planner(kind, naming, state, errors);
  std::vector<Staged> staged;
  for (const auto& group : groups) {
    for (const auto& op : group) staged.push_back(planner.stage(op));
  }
  planner.check_unexpected();
  if (!errors.empty()) {
    std::string msg = "load_optim_state_dict (" + kind.name + "):";
    for (const auto& e : errors) msg += "\n\t" + e;
    throw ConfigError(msg);
  }
  apply(optimizer, kind, staged, state);
}

}  // namespace fsdp
