// Model state dicts: FULL, LOCAL and SHARDED, saving and loading.
#include "fsdp/state_dict.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstring>
#include <mutex>
#include <sstream>
#include <unordered_set>

#include "fsdp/error.h"
#include "state_dict_walk.h"
#include "unit.h"

namespace fsdp {

using namespace detail;

// ---------------------------------------------------------------------------
// Types.

const char* to_string(StateDictType type) {
  switch (type) {
    case StateDictType::kFull: return "FULL_STATE_DICT";
    case StateDictType::kLocal: return "LOCAL_STATE_DICT";
    case StateDictType::kSharded: return "SHARDED_STATE_DICT";
  }
  return "?";
}

const char* config_name(const StateDictConfig& config) {
  switch (config.index()) {
    case 0: return "FullStateDictConfig";
    case 1: return "LocalStateDictConfig";
    default: return "ShardedStateDictConfig";
  }
}

namespace detail {

int64_t product(const std::vector<int64_t>& v) {
  int64_t n = 1;
  for (int64_t x : v) n *= x;
  return n;
}

std::string shape_str(at::IntArrayRef shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

}  // namespace detail

int64_t ShardedTensor::global_numel() const { return product(global_shape); }

int64_t ShardedTensor::local_numel() const {
  int64_t n = 0;
  for (const auto& s : local_shards) n += s.tensor.numel();
  return n;
}

void StateDict::insert(const std::string& key, StateValue value) {
  if (contains(key)) throw ConfigError("StateDict: key '" + key + "' is already present");
  index_[key] = entries_.size();
  entries_.emplace_back(key, std::move(value));
}

void StateDict::set(const std::string& key, StateValue value) {
  auto it = index_.find(key);
  if (it == index_.end()) {
    insert(key, std::move(value));
  } else {
    entries_[it->second].second = std::move(value);
  }
}

const StateValue& StateDict::at(const std::string& key) const {
  auto it = index_.find(key);
  if (it == index_.end()) throw ConfigError("StateDict: no key '" + key + "'");
  return entries_[it->second].second;
}

bool StateDict::is_sharded(const std::string& key) const { return std::holds_alternative<ShardedTensor>(at(key)); }

const at::Tensor& StateDict::tensor(const std::string& key) const {
  const auto& v = at(key);
  if (!std::holds_alternative<at::Tensor>(v)) {
    throw ConfigError("StateDict: '" + key + "' is a ShardedTensor, not a tensor (gather_state_dict makes it one)");
  }
  return std::get<at::Tensor>(v);
}

const ShardedTensor& StateDict::sharded(const std::string& key) const {
  const auto& v = at(key);
  if (!std::holds_alternative<ShardedTensor>(v)) {
    throw ConfigError("StateDict: '" + key + "' is a tensor, not a ShardedTensor");
  }
  return std::get<ShardedTensor>(v);
}

void StateDict::erase(const std::string& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  entries_.erase(entries_.begin() + static_cast<long>(it->second));
  index_.clear();
  for (size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].first] = i;
}

std::vector<std::string> StateDict::keys() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e.first);
  return out;
}

StateDict map_tensors(const StateDict& state, const std::function<at::Tensor(const at::Tensor&)>& fn) {
  StateDict out;
  for (const auto& [key, v] : state) {
    if (std::holds_alternative<at::Tensor>(v)) {
      out.insert(key, fn(std::get<at::Tensor>(v)));
    } else {
      ShardedTensor st = std::get<ShardedTensor>(v);
      for (auto& s : st.local_shards) s.tensor = fn(s.tensor);
      out.insert(key, std::move(st));
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// Persistence of buffers.

namespace {

struct PersistRegistry {
  struct Entry {
    std::weak_ptr<const torch::nn::Module> module;
    bool owned = false;  // `module` was set (false while the module was still being constructed)
    std::unordered_set<std::string> non_persistent;
  };
  std::mutex mu;
  std::unordered_map<const torch::nn::Module*, Entry> entries;
};

PersistRegistry& persist_registry() {
  static PersistRegistry r;
  return r;
}

// The entry of `m`, dropping one left by a dead module at the same address.
// Caller holds the lock.
PersistRegistry::Entry* entry_of(PersistRegistry& r, const torch::nn::Module& m, bool create) {
  auto it = r.entries.find(&m);
  if (it != r.entries.end() && it->second.owned && it->second.module.expired()) {
    r.entries.erase(it);
    it = r.entries.end();
  }
  if (it == r.entries.end()) {
    if (!create) return nullptr;
    it = r.entries.emplace(&m, PersistRegistry::Entry{}).first;
  }
  auto& e = it->second;
  if (!e.owned) {
    try {
      e.module = m.shared_from_this();
      e.owned = true;
    } catch (const std::bad_weak_ptr&) {
      // still being constructed: keyed by address only until it is owned
    }
  }
  return &e;
}

}  // namespace

void set_persistent(torch::nn::Module& module, const std::string& name, bool persistent) {
  if (!module.named_buffers(/*recurse=*/false).contains(name)) {
    throw ConfigError("set_persistent: module " + module.name() + " has no buffer '" + name +
                      "' of its own (register_buffer it first)");
  }
  auto& r = persist_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto* e = entry_of(r, module, /*create=*/true);
  if (persistent) {
    e->non_persistent.erase(name);
  } else {
    e->non_persistent.insert(name);
  }
}

bool is_persistent(const torch::nn::Module& module, const std::string& name) {
  auto& r = persist_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto* e = entry_of(r, module, /*create=*/false);
  return e == nullptr || e->non_persistent.count(name) == 0;
}

// ---------------------------------------------------------------------------
// Boxes.

namespace {

using Box = std::pair<std::vector<int64_t>, std::vector<int64_t>>;

void boxes_rec(const std::vector<int64_t>& shape, size_t dim, std::vector<int64_t>& base, int64_t lo, int64_t hi,
               std::vector<Box>& out) {
  if (lo >= hi) return;
  const size_t nd = shape.size();
  auto emit = [&](int64_t first, int64_t count) {  // slices [first, first+count) of dim, whole below
    Box b;
    b.first = base;
    b.first.push_back(first);
    b.second.assign(dim, 1);
    b.second.push_back(count);
    for (size_t d = dim + 1; d < nd; ++d) {
      b.first.push_back(0);
      b.second.push_back(shape[d]);
    }
    out.push_back(std::move(b));
  };
  int64_t inner = 1;
  for (size_t d = dim + 1; d < nd; ++d) inner *= shape[d];
  if (inner == 0) return;
  if (lo % inner == 0 && hi % inner == 0) {
    emit(lo / inner, hi / inner - lo / inner);
    return;
  }
  auto sub = [&](int64_t index, int64_t a, int64_t b) {
    base.push_back(index);
    boxes_rec(shape, dim + 1, base, a, b, out);
    base.pop_back();
  };
  if (lo / inner == (hi - 1) / inner) {  // inside one slice
    sub(lo / inner, lo % inner, hi - (lo / inner) * inner);
    return;
  }
  int64_t a = lo / inner;
  if (lo % inner != 0) {
    sub(a, lo % inner, inner);
    ++a;
  }
  const int64_t b = hi / inner;
  if (a < b) emit(a, b - a);
  if (hi % inner != 0) sub(b, 0, hi % inner);
}

}  // namespace

std::vector<Box> flat_range_boxes(const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  std::vector<Box> out;
  if (begin >= end) return out;
  if (shape.empty()) {
    out.emplace_back();
    return out;
  }
  std::vector<int64_t> base;
  boxes_rec(shape, 0, base, begin, end, out);
  return out;
}

int64_t copy_overlap(at::Tensor& target, const std::vector<int64_t>& target_offsets, const std::vector<Shard>& shards) {
  at::NoGradGuard no_grad;
  int64_t copied = 0;
  const int64_t nd = target.dim();
  for (const auto& s : shards) {
    if (s.tensor.dim() != nd || static_cast<int64_t>(s.offsets.size()) != nd) continue;
    at::Tensor dst = target;
    at::Tensor src = s.tensor;
    bool empty = false;
    for (int64_t d = 0; d < nd && !empty; ++d) {
      const int64_t lo = std::max(target_offsets[d], s.offsets[d]);
      const int64_t hi = std::min(target_offsets[d] + target.size(d), s.offsets[d] + s.tensor.size(d));
      if (hi <= lo) {
        empty = true;
        break;
      }
      dst = dst.narrow(d, lo - target_offsets[d], hi - lo);
      src = src.narrow(d, lo - s.offsets[d], hi - lo);
    }
    if (empty) continue;
    dst.copy_(src);
    copied += dst.numel();
  }
  return copied;
}

// ---------------------------------------------------------------------------
// The model walk: every key of a state dict, in PyTorch's order.

namespace detail {

ModelIndex index_model(const std::shared_ptr<torch::nn::Module>& model) {
  ModelIndex idx;
  idx.units = detail::units_of(model);
  for (auto& u : idx.units) {
    idx.unit_at[u->module()] = u.get();
    idx.flat_impls.insert(u->flat_shard().unsafeGetTensorImpl());
    for (const auto& p : u->params()) {
      idx.by_impl[p.param.unsafeGetTensorImpl()] = Owned{u.get(), &p};
      for (const auto& [owner, key] : p.places) idx.owned[owner].emplace_back(key, Owned{u.get(), &p});
    }
    if (auto root = u->root()) {
      for (const auto& [b, dtype] : root->cast_buffers()) idx.cast_buffers[b.unsafeGetTensorImpl()] = dtype;
    }
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
  for (const auto& u : idx.units) {
    if (u->state_dict_type != first->state_dict_type) {
      throw ConfigError(std::string("state_dict: the model's FSDP units have different state dict types (") +
                        to_string(first->state_dict_type) + " at " + first->module()->name() + ", " +
                        to_string(u->state_dict_type) + " at " + u->module()->name() +
                        "): set one type for the whole model with StateDictTypeGuard");
    }
  }
  return {first->state_dict_type, first->state_dict_config};
}

// This rank's range [lo, hi) of parameter p, relative to p.
std::pair<int64_t, int64_t> local_range(const UnitState& u, const ParamInfo& p) {
  if (u.shard_size() == 1) return {0, p.numel};
  const int64_t lo = std::max(p.offset, u.shard_begin());
  const int64_t hi = std::min(p.offset + p.numel, u.shard_begin() + u.shard_numel());
  return {lo - p.offset, std::max(hi, lo) - p.offset};
}

// Where p's element `rel` lives in the unit's flat shard.
int64_t shard_index(const UnitState& u, const ParamInfo& p, int64_t rel) {
  return p.offset + rel - (u.shard_size() == 1 ? 0 : u.shard_begin());
}

// This rank's pieces of p: views of the shard.
std::vector<Shard> local_shards(const UnitState& u, const ParamInfo& p, const at::Tensor& shard_like) {
  std::vector<Shard> out;
  auto [lo, hi] = local_range(u, p);
  at::Tensor flat = (shard_like.defined() ? shard_like : u.flat_shard()).detach();
  int64_t cursor = shard_index(u, p, lo);
  for (auto& [offsets, sizes] : flat_range_boxes(p.shape, lo, hi)) {
    const int64_t n = product(sizes);
    out.push_back(Shard{offsets, flat.narrow(0, cursor, n).view(sizes)});
    cursor += n;
  }
  return out;
}

// The unpadded part of the unit's flat shard, as a sharded flat parameter.
ShardedTensor local_flat(const UnitState& u) {
  ShardedTensor st;
  st.global_shape = {u.numel()};
  st.dtype = u.flat_shard().scalar_type();
  const int64_t begin = u.shard_size() == 1 ? 0 : u.shard_begin();
  const int64_t n = std::max<int64_t>(0, std::min(u.shard_numel(), u.numel() - begin));
  if (u.shard_size() == 1) {
    st.local_shards.push_back(Shard{{0}, u.flat_shard().detach().narrow(0, 0, u.numel())});
  } else if (n > 0) {
    st.local_shards.push_back(Shard{{begin}, u.flat_shard().detach().narrow(0, 0, n)});
  }
  return st;
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

}  // namespace detail

namespace detail {

std::vector<std::string> visit_state_dict(const std::shared_ptr<torch::nn::Module>& model, const std::string& prefix,
                                          const StateSink& sink, bool copy) {
  if (!model) throw ConfigError("state_dict: the model is null");
  ModelIndex idx = index_model(model);
  check_idle(idx, "state_dict");
  for (auto& u : idx.units) u->follow_module_to();
  auto [type, config] = model_type(idx);
  const bool to_cpu = offload_of(config);
  std::vector<Item> items;
  walk(*model, prefix, idx, type, items);

  bool emit_units = true, emit_plain = true;
  if (type == StateDictType::kFull && std::get<FullStateDictConfig>(config).rank0_only && !idx.units.empty()) {
    const bool rank0 = idx.units.front()->world_rank() == 0;
    emit_units = rank0;
    emit_plain = rank0 || !idx.unit_at.count(model.get());  // a non-FSDP root's own parts stay on every rank
  }

  std::vector<std::string> keys;
  // FULL: a unit is gathered when its first key comes up, and all its keys
  // are handed over then, so that one unit is alive at a time.
  std::unordered_map<const UnitState*, std::vector<const Item*>> unit_items;
  for (const auto& item : items) {
    if (item.kind == Item::kOwned) unit_items[item.unit].push_back(&item);
  }
  std::unordered_set<const UnitState*> done;
  at::NoGradGuard no_grad;
  for (const auto& item : items) {
    switch (item.kind) {
      case Item::kFlat: {
        ShardedTensor st = local_flat(*item.unit);
        for (auto& s : st.local_shards) s.tensor = offload(s.tensor, to_cpu);
        sink(item.key, std::move(st));
        break;
      }
      case Item::kOwned: {
        const UnitState& u = *item.unit;
        const ParamInfo& p = *item.param;
        if (type == StateDictType::kSharded) {
          ShardedTensor st{p.shape, u.flat_shard().scalar_type(), local_shards(u, p)};
          for (auto& s : st.local_shards) s.tensor = offload(s.tensor, to_cpu);
          sink(item.key, std::move(st));
          break;
        }
        if (!done.insert(&u).second) break;  // handed over with the unit's first key
        at::Tensor flat = u.gather_master();  // [collective] one all-gather per unit
        if (!emit_units) break;
        std::unordered_map<const ParamInfo*, at::Tensor> full;  // tied parameters: one tensor, every name
        for (const Item* it : unit_items.at(&u)) {
          auto f = full.find(it->param);
          if (f == full.end()) {
            at::Tensor view = param_view(flat, *it->param);
            f = full.emplace(it->param, offload(copy ? view.clone() : view, to_cpu)).first;
          }
          sink(it->key, f->second);
        }
        break;
      }
      case Item::kParam:
        if (emit_plain) sink(item.key, offload(item.tensor.detach(), to_cpu));
        break;
      case Item::kBuffer: {
        if (!emit_plain) break;
        auto cast = idx.cast_buffers.find(item.tensor.unsafeGetTensorImpl());
        at::Tensor b = cast == idx.cast_buffers.end() ? item.tensor : item.tensor.to(cast->second);
        sink(item.key, offload(b, to_cpu));
        break;
      }
    }
    const bool emitted = item.kind == Item::kOwned ? emit_units : item.kind == Item::kFlat || emit_plain;
    if (emitted) keys.push_back(item.key);
  }
  return keys;
}

}  // namespace detail

StateDict state_dict(const std::shared_ptr<torch::nn::Module>& model, const std::string& prefix) {
  std::unordered_map<std::string, StateValue> values;
  auto keys = visit_state_dict(model, prefix, [&](const std::string& key, StateValue v) { values.emplace(key, std::move(v)); });
  StateDict out;
  for (const auto& key : keys) out.insert(key, std::move(values.at(key)));
  return out;
}

namespace detail {

std::vector<int64_t> value_shape(const StateValue& v) {
  if (std::holds_alternative<at::Tensor>(v)) return std::get<at::Tensor>(v).sizes().vec();
  return std::get<ShardedTensor>(v).global_shape;
}

// Copies what `value` holds of the global tensor's elements [lo, hi) (flat,
// relative to the tensor of `shape`) into `dst` (those elements, flat).
// Returns false if `value` does not hold all of them.
bool copy_range(const StateValue& value, const std::vector<int64_t>& shape, int64_t lo, int64_t hi, at::Tensor dst) {
  if (hi <= lo) return true;
  if (std::holds_alternative<at::Tensor>(value)) {
    dst.copy_(std::get<at::Tensor>(value).reshape({-1}).narrow(0, lo, hi - lo));
    return true;
  }
  const auto& st = std::get<ShardedTensor>(value);
  int64_t cursor = 0, copied = 0;
  for (auto& [offsets, sizes] : flat_range_boxes(shape, lo, hi)) {
    const int64_t n = product(sizes);
    at::Tensor target = dst.narrow(0, cursor, n).view(sizes);
    copied += copy_overlap(target, offsets, st.local_shards);
    cursor += n;
  }
  return copied == hi - lo;
}

}  // namespace detail

void load_state_dict(const std::shared_ptr<torch::nn::Module>& model, const StateDict& state, bool strict) {
  if (!model) throw ConfigError("load_state_dict: the model is null");
  ModelIndex idx = index_model(model);
  check_idle(idx, "load_state_dict");
  for (const auto& u : idx.units) {
    if (u->awaiting_backward()) {
      throw ConfigError("load_state_dict: a forward of the FSDP unit at module " + u->module()->name() +
                        " is waiting for its backward; run backward first (or the forward under "
                        "torch::NoGradGuard) — loading now would be lost or corrupt the gradients");
    }
  }
  for (auto& u : idx.units) {
    u->follow_module_to();
    u->reshard();  // full parameters left from a forward without backward are rebuilt from the shards
  }
  auto [type, config] = model_type(idx);
  std::vector<Item> items;
  walk(*model, "", idx, type, items);

  // Check everything first, report all problems at once.
  std::vector<std::string> missing, unexpected, mismatched;
  std::unordered_set<std::string> expected;
  for (const auto& item : items) {
    expected.insert(item.key);
    if (!state.contains(item.key)) {
      missing.push_back(item.key);
      continue;
    }
    const StateValue& v = state.at(item.key);
    std::vector<int64_t> want;
    switch (item.kind) {
      case Item::kFlat: want = {item.unit->numel()}; break;
      case Item::kOwned: want = item.param->shape; break;
      default: want = item.tensor.sizes().vec();
    }
    if (value_shape(v) != want) {
      mismatched.push_back("size mismatch for " + item.key + ": copying a param with shape " +
                           shape_str(value_shape(v)) + " from checkpoint, the shape in current model is " +
                           shape_str(want) + ".");
    } else if (item.kind == Item::kFlat && !std::holds_alternative<ShardedTensor>(v)) {
      mismatched.push_back("'" + item.key + "' must be the ShardedTensor of a LOCAL_STATE_DICT");
    }
  }
  for (const auto& [key, v] : state) {
    if (!expected.count(key)) unexpected.push_back(key);
  }
  if (!mismatched.empty() || (strict && (!missing.empty() || !unexpected.empty()))) {
    std::string msg = "load_state_dict (" + std::string(to_string(type)) + "): Error(s) in loading state_dict for " +
                      model->name() + ":";
    auto list = [&](const char* what, const std::vector<std::string>& keys) {
      if (keys.empty()) return;
      msg += std::string("\n\t") + what + " key(s) in state_dict: ";
      for (size_t i = 0; i < keys.size(); ++i) msg += (i ? ", \"" : "\"") + keys[i] + "\"";
      msg += ".";
    };
    if (strict) {
      list("Missing", missing);
      list("Unexpected", unexpected);
    }
    for (const auto& m : mismatched) msg += "\n\t" + m;
    throw ConfigError(msg);
  }

  at::NoGradGuard no_grad;
  auto not_covered = [&](const std::string& key, int64_t lo, int64_t hi) {
    return ConfigError("load_state_dict: the ShardedTensor at '" + key + "' does not hold the elements [" +
                       std::to_string(lo) + ", " + std::to_string(hi) +
                       ") this rank needs: it was saved with another sharding; gather it (gather_state_dict) or "
                       "load a FULL_STATE_DICT");
  };
  for (const auto& item : items) {
    if (!state.contains(item.key)) continue;
    const StateValue& v = state.at(item.key);
    switch (item.kind) {
      case Item::kFlat: {
        const UnitState& u = *item.unit;
        ShardedTensor mine = local_flat(u);
        // A LOCAL state dict is one rank's shard: it loads only into the same
        // sharding (world size and rank), never partly.
        const auto& theirs = std::get<ShardedTensor>(v).local_shards;
        auto boxes = [](const std::vector<Shard>& shards) {
          std::string out;
          for (const auto& s : shards) {
            const int64_t lo = s.offsets.size() == 1 ? s.offsets[0] : -1;  // -1: not a box of a flat parameter
            out += "[" + std::to_string(lo) + ", " + std::to_string(lo + s.tensor.numel()) + ")";
          }
          return out.empty() ? std::string("no elements") : out;
        };
        if (boxes(theirs) != boxes(mine.local_shards)) {
          throw ConfigError("load_state_dict: the LOCAL_STATE_DICT entry '" + item.key + "' holds the elements " +
                            boxes(theirs) + " of the flat parameter, but this rank's shard is " +
                            boxes(mine.local_shards) +
                            ": it was saved with another sharding (world size or rank); a LOCAL state dict loads "
                            "only where it was saved — gather it (gather_state_dict) or load a FULL_STATE_DICT or "
                            "SHARDED_STATE_DICT");
        }
        for (auto& s : mine.local_shards) {
          if (copy_overlap(s.tensor, s.offsets, std::get<ShardedTensor>(v).local_shards) != s.tensor.numel()) {
            throw not_covered(item.key, s.offsets[0], s.offsets[0] + s.tensor.numel());
          }
        }
        break;
      }
      case Item::kOwned: {
        const UnitState& u = *item.unit;
        const ParamInfo& p = *item.param;
        auto [lo, hi] = local_range(u, p);
        if (hi <= lo) break;  // no element of it on this rank
        at::Tensor dst = u.flat_shard().detach().narrow(0, shard_index(u, p, lo), hi - lo);
        if (!copy_range(v, p.shape, lo, hi, dst)) throw not_covered(item.key, lo, hi);
        break;
      }
      default: {
        at::Tensor t = item.tensor.detach();
        if (std::holds_alternative<at::Tensor>(v)) {
          t.copy_(std::get<at::Tensor>(v));
        } else if (t.numel() > 0 && !copy_range(v, t.sizes().vec(), 0, t.numel(), t.view({-1}))) {
          throw not_covered(item.key, 0, t.numel());
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// The type guard.

namespace {

StateDictConfig default_config(StateDictType type) {
  switch (type) {
    case StateDictType::kFull: return FullStateDictConfig{};
    case StateDictType::kLocal: return LocalStateDictConfig{};
    default: return ShardedStateDictConfig{};
  }
}

}  // namespace

StateDictTypeGuard::StateDictTypeGuard(const std::shared_ptr<torch::nn::Module>& model, StateDictType type,
                                       std::optional<StateDictConfig> config) {
  const StateDictConfig c = config ? *config : default_config(type);
  if (c.index() != default_config(type).index()) {
    throw ConfigError(std::string("state_dict_type: Expected state_dict_config of type ") +
                      config_name(default_config(type)) + " for " + to_string(type) + " but got " + config_name(c));
  }
  for (auto& u : detail::units_of(model)) {
    saved_.push_back({u, u->state_dict_type, u->state_dict_config});
    u->state_dict_type = type;
    u->state_dict_config = c;
  }
}

StateDictTypeGuard::~StateDictTypeGuard() {
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
    it->unit->state_dict_type = it->type;
    it->unit->state_dict_config = it->config;
  }
}

StateDictType state_dict_type_of(const torch::nn::Module& unit_module) {
  auto slot = detail::find_slot(&unit_module);
  return slot && slot->unit ? slot->unit->state_dict_type : StateDictType::kFull;
}

// ---------------------------------------------------------------------------
// Gathering sharded tensors.

namespace {

void put_i64(std::string& s, int64_t v) { s.append(reinterpret_cast<const char*>(&v), sizeof v); }

struct Reader {
  const std::string& s;
  size_t pos = 0;
  int64_t i64() {
    if (pos + sizeof(int64_t) > s.size()) throw CollectiveError("gather_state_dict: short metadata", "all_gather_bytes");
    int64_t v;
    std::memcpy(&v, s.data() + pos, sizeof v);
    pos += sizeof v;
    return v;
  }
  std::string str() {
    const int64_t n = i64();
    if (n < 0 || pos + static_cast<size_t>(n) > s.size()) {
      throw CollectiveError("gather_state_dict: bad metadata", "all_gather_bytes");
    }
    std::string out = s.substr(pos, static_cast<size_t>(n));
    pos += static_cast<size_t>(n);
    return out;
  }
};

struct PieceMeta {
  std::vector<int64_t> offsets, sizes;
};

}  // namespace

StateDict gather_state_dict(const StateDict& state, dist::ProcessGroup& group) {
  // Metadata of every sharded entry: key, then each local piece's box.
  std::string meta;
  std::vector<std::string> sharded_keys;
  for (const auto& [key, v] : state) {
    if (!std::holds_alternative<ShardedTensor>(v)) continue;
    sharded_keys.push_back(key);
    const auto& st = std::get<ShardedTensor>(v);
    put_i64(meta, static_cast<int64_t>(key.size()));
    meta += key;
    put_i64(meta, static_cast<int64_t>(st.local_shards.size()));
    for (const auto& s : st.local_shards) {
      put_i64(meta, s.tensor.dim());
      for (int64_t d = 0; d < s.tensor.dim(); ++d) put_i64(meta, s.offsets.at(static_cast<size_t>(d)));
      for (int64_t d = 0; d < s.tensor.dim(); ++d) put_i64(meta, s.tensor.size(d));
    }
  }
  const auto all = group.all_gather_bytes(meta);  // [collective]
  const int world = group.size();
  // pieces[rank][entry] = boxes
  std::vector<std::vector<std::vector<PieceMeta>>> pieces(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    Reader rd{all[static_cast<size_t>(r)]};
    for (const auto& key : sharded_keys) {
      if (rd.str() != key) {
        throw ConfigError("gather_state_dict: rank " + std::to_string(r) + " has other sharded keys than rank " +
                          std::to_string(group.rank()) + " (expected '" + key +
                          "'): every rank must pass the state dict of the same model");
      }
      std::vector<PieceMeta> boxes(static_cast<size_t>(rd.i64()));
      for (auto& b : boxes) {
        const int64_t nd = rd.i64();
        b.offsets.resize(static_cast<size_t>(nd));
        b.sizes.resize(static_cast<size_t>(nd));
        for (auto& x : b.offsets) x = rd.i64();
        for (auto& x : b.sizes) x = rd.i64();
      }
      pieces[static_cast<size_t>(r)].push_back(std::move(boxes));
    }
  }
  StateDict out;
  size_t entry = 0;
  at::NoGradGuard no_grad;
  for (const auto& [key, v] : state) {
    if (!std::holds_alternative<ShardedTensor>(v)) {
      out.insert(key, v);
      continue;
    }
    const auto& st = std::get<ShardedTensor>(v);
    int64_t max_numel = 0;
    for (int r = 0; r < world; ++r) {
      int64_t n = 0;
      for (const auto& b : pieces[static_cast<size_t>(r)][entry]) n += product(b.sizes);
      max_numel = std::max(max_numel, n);
    }
    auto options = at::TensorOptions().dtype(st.dtype);
    at::Tensor full = at::zeros(st.global_shape, options);
    at::Tensor covered = at::zeros(st.global_shape, at::TensorOptions().dtype(at::kBool));
    if (max_numel > 0) {
      at::Tensor local = at::zeros({max_numel}, options);
      int64_t cursor = 0;
      for (const auto& s : st.local_shards) {
        local.narrow(0, cursor, s.tensor.numel()).copy_(s.tensor.reshape({-1}));
        cursor += s.tensor.numel();
      }
      at::Tensor gathered = at::empty({max_numel * world}, options);
      group.all_gather(gathered, local).wait();  // [collective]
      for (int r = 0; r < world; ++r) {
        int64_t c = static_cast<int64_t>(r) * max_numel;
        for (const auto& b : pieces[static_cast<size_t>(r)][entry]) {
          const int64_t n = product(b.sizes);
          at::Tensor dst = full, mask = covered;
          for (size_t d = 0; d < b.sizes.size(); ++d) {
            dst = dst.narrow(static_cast<int64_t>(d), b.offsets[d], b.sizes[d]);
            mask = mask.narrow(static_cast<int64_t>(d), b.offsets[d], b.sizes[d]);
          }
          dst.copy_(gathered.narrow(0, c, n).view(b.sizes));
          mask.fill_(true);
          c += n;
        }
      }
    }
    if (full.numel() > 0 && !covered.all().item<bool>()) {
      throw ConfigError("gather_state_dict: the pieces of '" + key + "' on the " + std::to_string(world) +
                        " ranks do not cover its shape " + shape_str(st.global_shape));
    }
    out.insert(key, full);
    ++entry;
  }
  return out;
}

}  // namespace fsdp
