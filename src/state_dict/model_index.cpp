// A wrapped model seen from its state (model_index.h).
#include "model_index.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "fsdp/error.h"
#include "state_dict_settings.h"

namespace fsdp::detail {

ModelIndex index_model(const std::shared_ptr<torch::nn::Module>& model) {
  ModelIndex idx;
  idx.groups = fully_shard_modules(model);
  for (const auto& g : idx.groups) {
    for (auto& sp : g.sharded_params()) {
      const auto* impl = sp.param.unsafeGetTensorImpl();
      idx.rows.emplace(impl, std::move(sp));
    }
  }
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
        out.push_back({Item::kOwned, prefix + item.key(), owned->second.unit, owned->second.param, {}, nullptr,
                       !owned->second.param->requires_grad});
      }
      continue;
    }
    auto rows = idx.rows.find(impl);
    if (rows != idx.rows.end()) {
      out.push_back({Item::kRows, prefix + item.key(), nullptr, nullptr, {}, &rows->second,
                     !item.value().requires_grad()});
      continue;
    }
    out.push_back({Item::kParam, prefix + item.key(), nullptr, nullptr, item.value(), nullptr,
                   !item.value().requires_grad()});
  }
  auto owned = idx.owned.find(&m);
  if (owned != idx.owned.end() && type != StateDictType::kLocal) {
    for (const auto& [key, o] : owned->second) {
      if (!registered.count(key)) {
        out.push_back({Item::kOwned, prefix + key, o.unit, o.param, {}, nullptr, !o.param->requires_grad});
      }
    }
  }
  for (const auto& b : m.named_buffers(/*recurse=*/false)) {
    if (is_persistent(m, b.key())) out.push_back({Item::kBuffer, prefix + b.key(), nullptr, nullptr, b.value()});
  }
  for (const auto& child : m.named_children()) walk(*child.value(), prefix + child.key() + ".", idx, type, out);
}


// The one state dict type of the model's units or groups (FULL for a plain
// model; SHARDED for an FSDP2 model outside every guard, as torch's
// fully_shard gives DTensors).
std::pair<StateDictType, StateDictConfig> model_type(const ModelIndex& idx) {
  if (!idx.groups.empty()) {
    const StateDictSetting first =
        state_dict_setting_of(idx.groups.front().group().get(), StateDictType::kSharded);
    for (const auto& g : idx.groups) {
      if (state_dict_setting_of(g.group().get(), StateDictType::kSharded).type != first.type) {
        throw ConfigError("state_dict: the model's fully_shard modules have different state dict types (at " +
                          idx.groups.front().module().name() + " and " + g.module().name() +
                          "): set one type for the whole model with StateDictTypeGuard");
      }
    }
    if (first.type == StateDictType::kLocal) {
      throw ConfigError("state_dict: LOCAL_STATE_DICT is FSDP1's (the shard of a unit's flat parameter); the model at " +
                        idx.groups.front().module().name() +
                        " is sharded by fully_shard, whose SHARDED_STATE_DICT is already each parameter's local "
                        "rows: use SHARDED_STATE_DICT or FULL_STATE_DICT");
    }
    return {first.type, first.config};
  }
  if (idx.units.empty()) return {StateDictType::kFull, FullStateDictConfig{}};
  const auto& first = idx.units.front();
  const StateDictSetting setting = state_dict_setting_of(first.get(), StateDictType::kFull);
  for (const auto& u : idx.units) {
    const StateDictType type = state_dict_setting_of(u.get(), StateDictType::kFull).type;
    if (type != setting.type) {
      throw ConfigError(std::string("state_dict: the model's FSDP units have different state dict types (") +
                        to_string(setting.type) + " at " + first->module()->name() + ", " + to_string(type) +
                        " at " + u->module()->name() + "): set one type for the whole model with StateDictTypeGuard");
    }
  }
  return {setting.type, setting.config};
}

int world_rank(const ModelIndex& idx) {
  if (!idx.units.empty()) return idx.units.front()->world_rank();
  const auto groups = broadcast_groups(idx);  // FSDP2: the mesh's (shard, replicate)
  if (groups.empty()) return 0;
  const auto& shard = groups[0];
  const auto& replicate = groups[1];
  return (replicate ? replicate->rank() * shard->size() : 0) + shard->rank();
}

std::vector<dist::ProcessGroupPtr> broadcast_groups(const ModelIndex& idx) {
  if (!idx.units.empty()) {
    const auto& u = idx.units.front();
    if (!u->shard_group()) return {};
    return {u->shard_group(), u->replicate_group()};
  }
  if (idx.rows.empty()) return {};  // no FSDP2 parameter either
  const Mesh& mesh = idx.rows.begin()->second.mesh;
  return {mesh.shard_group(), mesh.replicate_group()};
}

ShardedTensor rows_value(const ShardedParam& p, const at::Tensor& t) { return p.dtensor(t).sharded(); }

std::pair<int64_t, int64_t> rows_range(const ShardedParam& p) {
  const DTensor d = p.dtensor();
  if (d.local_shards().empty()) return {0, 0};
  const int64_t first = d.local_shards()[0].offsets[0] * d.stride()[0];
  return {first, first + p.local.numel()};
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
