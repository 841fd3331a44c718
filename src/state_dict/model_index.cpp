// A wrapped model seen from its state (model_index.h).
#include "model_index.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "fsdp/core/detail/forward_call.h"
#include "fsdp/error.h"
#include "state_dict_settings.h"

namespace fsdp::detail {

ModelIndex index_model(const std::shared_ptr<torch::nn::Module>& model) {
  // An FSDP2 model's parameters hold this rank's rows: read as a model's,
  // they would be saved (or loaded) as if whole.
  for (const auto& m : model ? model->modules(/*include_self=*/true) : std::vector<std::shared_ptr<torch::nn::Module>>{}) {
    auto slot = detail::find_slot(m.get());
    if (slot && slot->hooks) {
      throw ConfigError("state dicts: module " + m->name() +
                        " is sharded by fully_shard (FSDP2), whose parameters hold this rank's rows only; fsdp-cpp's "
                        "state-dict and checkpoint functions do not read or write FSDP2 models yet. Gather a "
                        "parameter with FSDPModule::sharded_params()[i].full_tensor() (docs/fsdp2.md)");
    }
  }
  ModelIndex idx;
  idx.units = detail::unit_views_of(model);
  for (auto& u : idx.units) {
    idx.unit_at[u->module()] = u.get();
    idx.flat_impls.insert(u->flat_shard().unsafeGetTensorImpl());
    for (const auto& p : u->params()) {
      idx.by_impl[p.param.unsafeGetTensorImpl()] = Owned{u.get(), &p};
      for (const auto& [owner, key] : p.places) idx.owned[owner].emplace_back(key, Owned{u.get(), &p});
    }
    for (const auto& [b, dtype] : u->cast_buffers()) idx.cast_buffers[b.unsafeGetTensorImpl()] = dtype;
  }
  return idx;
}

void walk(torch::nn::Module& m, const std::string& prefix, const ModelIndex& idx, StateDictType type,
          std::vector<Item>& out) {
  auto unit = idx.unit_at.find(&m);
  if (type == StateDictType::kLocal && unit != idx.unit_at.end() && !unit->second->params().empty()) {
    out.push_back({Item::kFlat, prefix + "flat_param", unit->second, nullptr, {}});
  }
  std::unordered_set<std::string> registered;
  for (const auto& item : m.named_parameters(/*recurse=*/false)) {
    const auto* impl = item.value().unsafeGetTensorImpl();
    registered.insert(item.key());
    if (idx.flat_impls.count(impl)) continue;
    auto owned = idx.by_impl.find(impl);
    if (owned != idx.by_impl.end()) {
      if (type != StateDictType::kLocal) {
        out.push_back({Item::kOwned, prefix + item.key(), owned->second.unit, owned->second.param, {}});
      }
      continue;
    }
    out.push_back({Item::kParam, prefix + item.key(), nullptr, nullptr, item.value()});
  }
  auto owned = idx.owned.find(&m);
  if (owned != idx.owned.end() && type != StateDictType::kLocal) {
    for (const auto& [key, o] : owned->second) {
      if (!registered.count(key)) out.push_back({Item::kOwned, prefix + key, o.unit, o.param, {}});
    }
  }
  for (const auto& b : m.named_buffers(/*recurse=*/false)) {
    if (is_persistent(m, b.key())) out.push_back({Item::kBuffer, prefix + b.key(), nullptr, nullptr, b.value()});
  }
  for (const auto& child : m.named_children()) walk(*child.value(), prefix + child.key() + ".", idx, type, out);
}


// The one state dict type of the model's units (FULL for a plain model).
std::pair<StateDictType, StateDictConfig> model_type(const ModelIndex& idx) {
  if (idx.units.empty()) return {StateDictType::kFull, FullStateDictConfig{}};
  const auto& first = idx.units.front();
  const StateDictSetting setting = state_dict_setting_of(*first);
  for (const auto& u : idx.units) {
    const StateDictType type = state_dict_setting_of(*u).type;
    if (type != setting.type) {
      throw ConfigError(std::string("state_dict: the model's FSDP units have different state dict types (") +
                        to_string(setting.type) + " at " + first->module()->name() + ", " + to_string(type) +
                        " at " + u->module()->name() + "): set one type for the whole model with StateDictTypeGuard");
    }
  }
  return {setting.type, setting.config};
}

at::Tensor offload(const at::Tensor& t, bool to_cpu) { return to_cpu ? t.cpu() : t; }

bool offload_of(const StateDictConfig& c) {
  return std::visit([](const auto& x) { return x.offload_to_cpu; }, c);
}

void check_idle(const ModelIndex& idx, const char* what) {
  for (const auto& u : idx.units) {
    if (u->summoned()) {
      throw ConfigError(std::string(what) + ": the FSDP unit at module " + u->module()->name() +
                        " is inside summon_full_params: leave the SummonFullParams scope first");
    }
  }
}

}  // namespace fsdp::detail
