// A wrapped model seen from its state (model_index.h).
#include "model_index.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "fsdp/error.h"
#include "shard_geometry.h"
#include "state_dict_settings.h"

namespace fsdp::detail {

namespace {

// A tensor every rank holds whole: a DTensor on a mesh of no dimension.
DTensor whole_value(const at::Tensor& t) { return DTensor::from_local(t, Mesh{}, {}, t.sizes().vec()); }

Item owned_item(std::string key, const Owned& o, const ModelIndex& idx) {
  Item item;
  item.key = std::move(key);
  item.value = param_dtensor(*o.unit, *o.param);
  item.tensor = o.param->param;
  item.frozen = !o.param->requires_grad;
  item.full = idx.unit_gather.at(o.unit);
  item.member = static_cast<size_t>(o.param - o.unit->params().data());
  return item;
}

}  // namespace

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
    idx.unit_gather[u.get()] = unit_gather(u.get());
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
    const UnitView& u = *unit->second;
    Item flat;
    flat.key = prefix + "flat_param";
    flat.value =
        DTensor::from_boxes(unit_mesh(u), {u.numel()}, u.flat_shard().scalar_type(), local_flat(u).local_shards);
    flat.exact = true;
    out.push_back(std::move(flat));
  }
  std::unordered_set<std::string> registered;
  for (const auto& param : m.named_parameters(/*recurse=*/false)) {
    const auto* impl = param.value().unsafeGetTensorImpl();
    registered.insert(param.key());
    if (idx.flat_impls.count(impl)) continue;
    auto owned = idx.by_impl.find(impl);
    if (owned != idx.by_impl.end()) {
      if (type != StateDictType::kLocal) out.push_back(owned_item(prefix + param.key(), owned->second, idx));
      continue;
    }
    Item item;
    item.key = prefix + param.key();
    item.tensor = param.value();
    item.frozen = !param.value().requires_grad();
    auto rows = idx.rows.find(impl);
    if (rows != idx.rows.end()) {
      item.value = rows->second.dtensor(rows->second.local.detach());
      item.full = rows_gather(&rows->second);  // one gather per key, as before
    } else {
      item.value = whole_value(param.value().detach());
    }
    out.push_back(std::move(item));
  }
  auto owned = idx.owned.find(&m);
  if (owned != idx.owned.end() && type != StateDictType::kLocal) {
    for (const auto& [key, o] : owned->second) {
      if (!registered.count(key)) out.push_back(owned_item(prefix + key, o, idx));
    }
  }
  for (const auto& b : m.named_buffers(/*recurse=*/false)) {
    if (!is_persistent(m, b.key())) continue;
    Item item;
    item.key = prefix + b.key();
    item.tensor = b.value();
    item.value = whole_value(b.value());
    auto cast = idx.cast_buffers.find(b.value().unsafeGetTensorImpl());
    if (cast != idx.cast_buffers.end()) item.saved_dtype = cast->second;
    out.push_back(std::move(item));
  }
  for (const auto& child : m.named_children()) walk(*child.value(), prefix + child.key() + ".", idx, type, out);
}

std::pair<int64_t, int64_t> flat_span(const std::vector<int64_t>& shape, const std::vector<Shard>& boxes) {
  if (boxes.empty()) return {0, 0};
  int64_t lo = 0, n = 0;
  for (size_t d = 0; d < shape.size(); ++d) lo = lo * shape[d] + boxes.front().offsets[d];
  for (const auto& b : boxes) n += b.tensor.numel();
  return {lo, lo + n};
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
