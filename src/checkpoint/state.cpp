// CheckpointState, and what a state turns into: entries, their tensors
// handed on as they come.
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "parts.h"
#include "fsdp/error.h"
#include "fsdp/state_dict/optim_state_dict.h"
#include "fsdp/state_dict/detail/visit.h"
#include "fsdp/state_dict/detail/optimizer_kinds.h"

namespace fsdp {

void CheckpointState::add(Entry::Kind kind, const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos) {
    throw ConfigError("CheckpointState: entry name '" + name + "' must be non-empty and contain no '/'");
  }
  auto nests_in = [](const std::string& inner, const std::string& outer) {
    return inner.size() > outer.size() && inner.compare(0, outer.size(), outer) == 0 && inner[outer.size()] == '.';
  };
  for (const auto& e : entries_) {
    if (nests_in(name, e.name) || nests_in(e.name, name)) {
      throw ConfigError("CheckpointState: entries '" + e.name + "' and '" + name + "' collide: in Python a name "
                        "with dots is nested dicts ('a.b' is {'a': {'b': ...}}), so one cannot hold the other");
    }
    if (e.name == name && e.kind != kind) {
      throw ConfigError("CheckpointState: entry '" + name + "' is already a " +
                        (e.kind == Entry::kModel ? "model" : e.kind == Entry::kOptimizer ? "optimizer" : "value"));
    }
    if (e.name == name) return;
  }
  entries_.push_back({kind, name});
}

CheckpointState& CheckpointState::model(const std::string& name, std::shared_ptr<torch::nn::Module> module) {
  if (!module) throw ConfigError("CheckpointState: model '" + name + "' is null");
  add(Entry::kModel, name);
  models_[name] = std::move(module);
  return *this;
}

CheckpointState& CheckpointState::optimizer(const std::string& name, torch::optim::Optimizer& optimizer) {
  add(Entry::kOptimizer, name);
  optimizers_[name] = &optimizer;
  return *this;
}

CheckpointState& CheckpointState::value(const std::string& name, CheckpointValue value) {
  add(Entry::kValue, name);
  values_[name] = std::move(value);
  return *this;
}

const CheckpointValue& CheckpointState::value(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw ConfigError("CheckpointState: no value '" + name + "'");
  return it->second;
}

void CheckpointState::throw_wrong_type(const std::string& name) const {
  static const char* names[] = {"int64_t", "double", "bool", "std::string", "at::Tensor"};
  throw ConfigError("CheckpointState: value '" + name + "' holds a " + names[value(name).index()] +
                    ", not the type asked for");
}

namespace detail {


bool has_fsdp_units(const std::shared_ptr<torch::nn::Module>& model) { return is_sharded_model(model); }

std::pair<std::string, std::shared_ptr<torch::nn::Module>> the_fsdp_model(const CheckpointState& state,
                                                                          const char* verb) {
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> found;
  for (const auto& [name, m] : state.models()) {
    if (has_fsdp_units(m)) found.emplace_back(name, m);
  }
  if (found.empty() && !state.models().empty()) {
    // The user gave a model, but one that no engine shards: say so, rather
    // than ask for the model they already passed.
    std::string names;
    for (const auto& m : state.models()) names += (names.empty() ? "'" : ", '") + m.first + "'";
    throw ConfigError(std::string("Could not find a FSDP model in the provided checkpoint state: ") + names +
                      (state.models().size() == 1 ? " is" : " are") +
                      " not sharded (no FullyShardedDataParallel unit and no fully_shard module inside). " + verb +
                      "_checkpoint " + (verb[0] == 's' ? "writes" : "reads into") +
                      " a sharded model: shard it first (fsdp::FullyShardedDataParallel, fsdp::fully_shard or "
                      "strategy.setup_module), or " +
                      (verb[0] == 's' ? "save" : "load") + " an unsharded model with torch::" + verb + ".");
  }
  if (found.empty()) {
    throw ConfigError(std::string("Could not find a FSDP model in the provided checkpoint state. Please provide the "
                                  "model as part of the state like so: `") +
                      verb + "_checkpoint(path, fsdp::CheckpointState().model(\"model\", model.ptr()), ...)`. Make "
                      "sure you wrap the model (and build optimizers on it) before " +
                      (verb[0] == 's' ? "saving" : "loading") + " the checkpoint.");
  }
  if (found.size() > 1) {
    throw ConfigError(std::string("Found multiple FSDP models in the given state. ") +
                      (verb[0] == 's' ? "Saving" : "Loading") +
                      " checkpoints with FSDP is currently limited to a single model per checkpoint. To " + verb +
                      " multiple models, call the " + verb + " function for each model separately with a different path.");
  }
  return found.front();
}

namespace {

bool keep(const CheckpointOptions& o, const std::string& entry, const std::string& key) {
  return !o.filter() || o.filter()(entry, key);
}

// The index entry of a user value (its bytes, for a tensor, are data).
formats::EntryRecord value_record(const std::string& name, const CheckpointValue& v) {
  formats::EntryRecord e;
  e.name = name;
  switch (v.index()) {
    case 0: e.type = formats::EntryType::kInt; e.value = std::get<int64_t>(v); break;
    case 1: e.type = formats::EntryType::kFloat; e.value = std::get<double>(v); break;
    case 2: e.type = formats::EntryType::kBool; e.value = std::get<bool>(v); break;
    case 3: e.type = formats::EntryType::kStr; e.value = std::get<std::string>(v); break;
    default: e.type = formats::EntryType::kTensor;
  }
  return e;
}

std::vector<formats::ParamGroup> param_groups(const std::vector<OptimParamGroup>& groups) {
  std::vector<formats::ParamGroup> out;
  for (const auto& g : groups) out.push_back({g.params, g.options});
  return out;
}

// A model's entry: its keys, its tensors to `put`. No copies: every tensor is
// written (or copied, when async) as it comes.
formats::EntryRecord model_entry(const std::string& name, const std::shared_ptr<torch::nn::Module>& model,
                            const CheckpointOptions& options, const Put& put) {
  formats::EntryRecord rec;
  rec.name = name;
  rec.type = formats::EntryType::kModel;
  auto keys = visit_state_dict(
      model, "", [&](const std::string& key, StateValue v) {
        if (keep(options, name, key)) put(name + "/" + key, v);
      },
      /*copy=*/false);
  for (auto& k : keys) {
    if (keep(options, name, k)) rec.keys.push_back(k);
  }
  return rec;
}

formats::EntryRecord optimizer_entry(const std::string& name, const std::shared_ptr<torch::nn::Module>& fsdp_model,
                                torch::optim::Optimizer& optimizer, const CheckpointOptions& options, const Put& put) {
  formats::EntryRecord rec;
  rec.name = name;
  rec.type = formats::EntryType::kOptimizer;
  auto groups = visit_optim_state_dict(
      fsdp_model, optimizer, [&](const std::string& key, StateValue v) {
        if (!keep(options, name, key)) return;
        rec.keys.push_back(key);
        put(name + "/" + key, v);
      },
      /*copy=*/false);
  rec.param_groups = param_groups(groups);
  rec.optimizer_class = kind_of(optimizer).name;
  return rec;
}

}  // namespace

std::vector<formats::EntryRecord> visit_state(const CheckpointState& state,
                                         const std::shared_ptr<torch::nn::Module>& fsdp_model, StateDictType type,
                                         const CheckpointOptions& options, const Put& put) {
  std::vector<formats::EntryRecord> entries;
  const StateDictConfig config = type == StateDictType::kFull ? StateDictConfig{FullStateDictConfig{true, true}}
                                                              : StateDictConfig{ShardedStateDictConfig{}};
  for (const auto& e : state.entries()) {
    if (e.kind == CheckpointState::Entry::kModel) {
      const auto& model = state.models().at(e.name);
      StateDictTypeGuard guard(model, type, config);
      entries.push_back(model_entry(e.name, model, options, put));
    } else if (e.kind == CheckpointState::Entry::kOptimizer) {
      StateDictTypeGuard guard(fsdp_model, type, config);
      entries.push_back(optimizer_entry(e.name, fsdp_model, *state.optimizers().at(e.name), options, put));
    } else if (keep(options, e.name, "")) {
      const auto& v = state.values().at(e.name);
      entries.push_back(value_record(e.name, v));
      if (std::holds_alternative<at::Tensor>(v)) put(e.name, std::get<at::Tensor>(v).detach());
    }
  }
  return entries;
}

}  // namespace detail

}  // namespace fsdp
