// load_checkpoint: open the storage (storage_registry.cpp), plan what this rank
// reads (plan.cpp), apply the plan (apply.cpp); fsdp/checkpoint/storage.h
// describes the seam.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/checkpoint/storage.h"
#include "fsdp/checkpoint/storage_registry.h"
#include "fsdp/error.h"
#include "loading.h"
#include "parts.h"

namespace fsdp {

namespace {

// The model optimizers belong to: the FSDP model, or an unwrapped model
// when it is the only one (it loads as well; Lightning requires FSDP here).
std::shared_ptr<torch::nn::Module> model_of_optimizers(const CheckpointState& state) {
  bool has_fsdp = false;
  for (const auto& [n, m] : state.models()) has_fsdp |= detail::has_fsdp_units(m);
  if (has_fsdp || state.models().size() != 1) return detail::the_fsdp_model(state, "load").second;
  return state.models().begin()->second;
}

// Every entry `state` asks for has its kind in the checkpoint; strict: every one is there.
void check_entries(const StorageReader& src, const std::string& what, const CheckpointState& state, bool strict) {
  using Kind = CheckpointState::Entry::Kind;
  std::vector<std::string> missing;
  for (const auto& e : state.entries()) {
    const formats::EntryRecord* rec = detail::find_entry(src, e.name);
    if (!rec) {
      missing.push_back(e.name);
      continue;
    }
    const bool fits = e.kind == Kind::kModel       ? rec->type == formats::EntryType::kModel
                      : e.kind == Kind::kOptimizer ? rec->type == formats::EntryType::kOptimizer
                                                   : !rec->is_state_dict();
    if (!fits) {
      throw ConfigError("load_checkpoint: entry '" + e.name + "' is a " + formats::entry_type_name(rec->type) + " in " +
                        what + ", but the state asks for a " +
                        (e.kind == Kind::kModel ? "model" : e.kind == Kind::kOptimizer ? "optimizer" : "value"));
    }
  }
  if (strict && !missing.empty()) {
    throw ConfigError("The requested state contains a key '" + missing.front() +
                      "' that does not exist in the loaded checkpoint. To disable strict loading, set strict=False.");
  }
}

// Loads what `state` asks for that the storage holds, as `plan` plans it,
// entry by entry; returns the values the storage holds beyond those.
std::map<std::string, CheckpointValue> load_entries(const StorageReader& src, const LoadPlan& plan,
                                                    CheckpointState& state,
                                                    const std::shared_ptr<torch::nn::Module>& model, bool strict) {
  for (const auto& e : state.entries()) {
    const formats::EntryRecord* rec = detail::find_entry(src, e.name);
    if (!rec) continue;
    if (e.kind == CheckpointState::Entry::kModel) {
      detail::load_model(src, plan, e.name, state.models().at(e.name), strict);
    } else if (e.kind == CheckpointState::Entry::kOptimizer) {
      detail::load_optimizer(src, plan, e.name, model, *state.optimizers().at(e.name));
    } else if (auto v = detail::read_value(src, plan, *rec)) {
      state.mutable_values()[e.name] = std::move(*v);
    }
  }
  std::map<std::string, CheckpointValue> leftovers;
  for (const auto& rec : src.index().entries) {
    if (rec.is_state_dict()) continue;
    bool requested = false;
    for (const auto& e : state.entries()) requested |= e.name == rec.name;
    if (requested) continue;
    if (auto v = detail::read_value(src, plan, rec)) leftovers[rec.name] = std::move(*v);
  }
  return leftovers;
}

// load_checkpoint(..., state, ...) from the storage `open()` gives.
std::map<std::string, CheckpointValue> load_state(const std::function<const StorageReader&()>& open,
                                                  const std::string& what, CheckpointState& state,
                                                  dist::ProcessGroup& group, bool strict, const LoadPlanner& planner) {
  wait_for_checkpoint(group);
  if (state.entries().empty()) {
    throw ConfigError("Got load_checkpoint(..., state) with an empty state, but a state with at least a model "
                      "instance to reload is required. Pass it in like so: load_checkpoint(path, "
                      "fsdp::CheckpointState().model(\"model\", model.ptr()), group)");
  }
  const auto model = model_of_optimizers(state);
  std::map<std::string, CheckpointValue> leftovers;
  const dist::Failure error = dist::capture([&] {
    const StorageReader& src = open();
    check_entries(src, what, state, strict);
    LoadPlan plan = detail::plan_state(src, state, model);
    if (planner) plan = planner(src, std::move(plan));
    leftovers = load_entries(src, plan, state, model, strict);
  });
  dist::agree(group, error, "load_checkpoint of " + what);
  return leftovers;
}

// load_checkpoint(..., module, ...) from the storage `open()` gives.
void load_module(const std::function<const StorageReader&()>& open, const std::string& what,
                 const std::shared_ptr<torch::nn::Module>& module, dist::ProcessGroup& group, bool strict,
                 const LoadPlanner& planner) {
  if (!module) throw ConfigError("load_checkpoint: the module is null");
  wait_for_checkpoint(group);
  const dist::Failure error = dist::capture([&] {
    const StorageReader& src = open();
    const std::string entry = detail::the_model(src, "load_checkpoint", what).name;
    LoadPlan plan = detail::plan_model(src, entry, module);
    if (planner) plan = planner(src, std::move(plan));
    detail::load_model(src, plan, entry, module, strict);
  });
  dist::agree(group, error, "load_checkpoint of " + what);
}

}  // namespace

std::map<std::string, CheckpointValue> load_checkpoint(const std::string& path, CheckpointState& state,
                                                       dist::ProcessGroup& group, bool strict) {
  std::unique_ptr<StorageReader> src;
  return load_state([&]() -> const StorageReader& { return *(src = open_checkpoint_storage(path, {})); }, path, state,
                    group, strict, nullptr);
}

void load_checkpoint(const std::string& path, const std::shared_ptr<torch::nn::Module>& module,
                     dist::ProcessGroup& group, bool strict) {
  std::unique_ptr<StorageReader> src;
  load_module(
      [&]() -> const StorageReader& {
        DetectOptions options;
        options.module_state = true;
        return *(src = open_checkpoint_storage(path, options));
      },
      path, module, group, strict, nullptr);
}

std::map<std::string, CheckpointValue> load_checkpoint(const StorageReader& reader, CheckpointState& state,
                                                       dist::ProcessGroup& group, bool strict,
                                                       const LoadPlanner& planner) {
  return load_state([&]() -> const StorageReader& { return reader; }, reader.location(), state, group, strict,
                    planner);
}

void load_checkpoint(const StorageReader& reader, const std::shared_ptr<torch::nn::Module>& module,
                     dist::ProcessGroup& group, bool strict, const LoadPlanner& planner) {
  load_module([&]() -> const StorageReader& { return reader; }, reader.location(), module, group, strict, planner);
}

}  // namespace fsdp
