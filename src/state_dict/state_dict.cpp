// Model state dicts: FULL, LOCAL and SHARDED, saving and loading.
#include "fsdp/state_dict/state_dict.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <unordered_set>

#include "fsdp/error.h"
#include "model_index.h"
#include "shard_geometry.h"
#include "fsdp/state_dict/detail/visit.h"
#include "fsdp/core/detail/unit_view.h"

namespace fsdp {

using namespace detail;

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
// Saving: the walk's keys, a unit's entries right after its gather.

namespace detail {

bool is_sharded_model(const std::shared_ptr<torch::nn::Module>& model) {
  const ModelIndex idx = index_model(model);
  return !idx.units.empty() || !idx.groups.empty();
}

std::vector<std::string> visit_state_dict(const std::shared_ptr<torch::nn::Module>& model, const std::string& prefix,
                                          const StateSink& sink, bool copy, bool skip_frozen) {
  if (!model) throw ConfigError("state_dict: the model is null");
  ModelIndex idx = index_model(model);
  check_idle(idx, "state_dict");
  for (auto& u : idx.units) u->follow_module_to();
  auto [type, config] = model_type(idx);
  const bool to_cpu = offload_of(config);
  std::vector<Item> items;
  walk(*model, prefix, idx, type, items);
  if (skip_frozen) items.erase(std::remove_if(items.begin(), items.end(), [](const Item& i) { return i.frozen; }), items.end());

  bool emit_units = true, emit_plain = true;
  if (type == StateDictType::kFull && std::get<FullStateDictConfig>(config).rank0_only &&
      (!idx.units.empty() || !idx.groups.empty())) {
    const bool rank0 = world_rank(idx) == 0;
    emit_units = rank0;
    // a non-FSDP root's own parts stay on every rank
    emit_plain = rank0 || !(idx.unit_at.count(model.get()) || fsdp_module_of(*model));
  }

  std::vector<std::string> keys;
  // FULL: a group (an FSDP1 unit, an FSDP2 parameter) is gathered when its
  // first key comes up, and all its keys are handed over then, so that one
  // unit is alive at a time.
  std::unordered_map<const FullGather*, std::vector<const Item*>> group_items;
  if (type == StateDictType::kFull) {
    for (const auto& item : items) {
      if (item.full) group_items[item.full.get()].push_back(&item);
    }
  }
  std::unordered_set<const FullGather*> done;
  at::NoGradGuard no_grad;
  for (const auto& item : items) {
    const bool gathered = type == StateDictType::kFull && item.full;
    const bool emit = gathered ? emit_units : item.whole() ? emit_plain : true;
    if (gathered) {
      if (done.insert(item.full.get()).second) {
        const std::vector<at::Tensor> full = item.full->gather();  // [collective] one per group
        std::unordered_map<size_t, at::Tensor> kept;  // tied parameters: one tensor, every name
        for (const Item* it : emit ? group_items.at(item.full.get()) : std::vector<const Item*>{}) {
          auto f = kept.find(it->member);
          if (f == kept.end()) {
            const at::Tensor& t = full.at(it->member);
            f = kept.emplace(it->member, offload(copy && item.full->views() ? t.clone() : t, to_cpu)).first;
          }
          sink(it->key, f->second);
        }
      }
    } else if (item.whole()) {
      if (emit) {
        const at::Tensor& t = item.value.to_local();
        sink(item.key, offload(item.saved_dtype == at::ScalarType::Undefined ? t : t.to(item.saved_dtype), to_cpu));
      }
    } else {
      ShardedTensor st = item.value.sharded();
      for (auto& s : st.local_shards) s.tensor = offload(s.tensor, to_cpu);
      sink(item.key, std::move(st));
    }
    if (emit) keys.push_back(item.key);
  }
  return keys;
}

}  // namespace detail

namespace detail {

StateDict collect_state_dict(const std::shared_ptr<torch::nn::Module>& model, const std::string& prefix,
                             bool skip_frozen) {
  std::unordered_map<std::string, StateValue> values;
  auto keys = visit_state_dict(
      model, prefix, [&](const std::string& key, StateValue v) { values.emplace(key, std::move(v)); },
      /*copy=*/true, skip_frozen);
  StateDict out;
  for (const auto& key : keys) out.insert(key, std::move(values.at(key)));
  return out;
}

}  // namespace detail

StateDict state_dict(const std::shared_ptr<torch::nn::Module>& model, const std::string& prefix) {
  return collect_state_dict(model, prefix, /*skip_frozen=*/false);
}

// ---------------------------------------------------------------------------
// Loading: validate, plan, apply.

namespace {

// load_state_dict, step 1: the keys and shapes of `state` against the
// model's; every problem is reported at once in one ConfigError.
void validate(const std::vector<Item>& items, const StateDict& state, bool strict, StateDictType type,
              const std::string& model_name) {
  std::vector<std::string> missing, unexpected, mismatched;
  std::unordered_set<std::string> expected;
  for (const auto& item : items) {
    expected.insert(item.key);
    if (!state.contains(item.key)) {
      missing.push_back(item.key);
      continue;
    }
    const StateValue& v = state.at(item.key);
    const std::vector<int64_t>& want = item.value.shape();
    if (value_shape(v) != want) {
      mismatched.push_back("size mismatch for " + item.key + ": copying a param with shape " +
                           shape_str(value_shape(v)) + " from checkpoint, the shape in current model is " +
                           shape_str(want) + ".");
    } else if (item.exact && !std::holds_alternative<ShardedTensor>(v)) {
      mismatched.push_back("'" + item.key + "' must be the ShardedTensor of a LOCAL_STATE_DICT");
    }
  }
  for (const auto& [key, v] : state) {
    if (!expected.count(key)) unexpected.push_back(key);
  }
  if (mismatched.empty() && (!strict || (missing.empty() && unexpected.empty()))) return;
  std::string msg = "load_state_dict (" + std::string(to_string(type)) + "): Error(s) in loading state_dict for " +
                    model_name + ":";
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

// One item's load: the pieces of its value, copied box to box into the
// item's boxes (views of the model's storage).
struct Copy {
  const Item* item;
  std::vector<Shard> from;
};

ConfigError not_covered(const std::string& key, int64_t lo, int64_t hi) {
  return ConfigError("load_state_dict: the ShardedTensor at '" + key + "' does not hold the elements [" +
                     std::to_string(lo) + ", " + std::to_string(hi) +
                     ") this rank needs: it was saved with another sharding; gather it (gather_state_dict) or "
                     "load a FULL_STATE_DICT");
}

// A LOCAL state dict is one rank's shard: it loads only into the same
// sharding (world size and rank), never partly. "[lo, hi)" per piece.
std::string flat_boxes(const std::vector<Shard>& shards) {
  std::string out;
  for (const auto& s : shards) {
    const int64_t lo = s.offsets.size() == 1 ? s.offsets[0] : -1;  // -1: not a box of a flat parameter
    out += "[" + std::to_string(lo) + ", " + std::to_string(lo + s.tensor.numel()) + ")";
  }
  return out.empty() ? std::string("no elements") : out;
}

// load_state_dict, step 2: what to copy where on this rank. ConfigError
// (before anything is written) when a value does not hold what this rank
// needs.
std::vector<Copy> plan(const std::vector<Item>& items, const StateDict& state) {
  std::vector<Copy> copies;
  for (const auto& item : items) {
    if (!state.contains(item.key)) continue;
    const StateValue& v = state.at(item.key);
    const std::vector<Shard>& mine = item.value.local_shards();
    if (item.exact) {
      const auto& theirs = std::get<ShardedTensor>(v).local_shards;
      if (flat_boxes(theirs) != flat_boxes(mine)) {
        throw ConfigError("load_state_dict: the LOCAL_STATE_DICT entry '" + item.key + "' holds the elements " +
                          flat_boxes(theirs) + " of the flat parameter, but this rank's shard is " +
                          flat_boxes(mine) +
                          ": it was saved with another sharding (world size or rank); a LOCAL state dict loads "
                          "only where it was saved — gather it (gather_state_dict) or load a FULL_STATE_DICT or "
                          "SHARDED_STATE_DICT");
      }
    }
    Copy c{&item, value_boxes(v)};
    for (const auto& box : mine) {
      if (held(box, c.from) != box.tensor.numel()) {
        auto [lo, hi] = flat_span(item.value.shape(), mine);
        throw not_covered(item.key, lo, hi);
      }
    }
    copies.push_back(std::move(c));
  }
  return copies;
}

// load_state_dict, step 3: the copies, all checked.
void apply(const std::vector<Copy>& copies) {
  at::NoGradGuard no_grad;
  for (const auto& c : copies) {
    for (const auto& box : c.item->value.local_shards()) {
      at::Tensor dst = box.tensor;
      copy_overlap(dst, box.offsets, c.from);
    }
  }
}

}  // namespace

namespace {

// load_state_dict's first step: the items of `model` (indexed in `idx`,
// which they point into), once no unit is in a forward, every unit and group
// resharded; and the model's state dict type.
std::vector<Item> loadable_items(const std::shared_ptr<torch::nn::Module>& model, ModelIndex& idx, StateDictType& type) {
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
  for (auto& g : idx.groups) g.reshard();  // FSDP2: the parameters show their rows again
  type = model_type(idx).first;
  std::vector<Item> items;
  walk(*model, "", idx, type, items);
  return items;
}

}  // namespace

void load_state_dict(const std::shared_ptr<torch::nn::Module>& model, const StateDict& state, bool strict) {
  if (!model) throw ConfigError("load_state_dict: the model is null");
  ModelIndex idx = index_model(model);
  StateDictType type{};
  const std::vector<Item> items = loadable_items(model, idx, type);
  validate(items, state, strict, type, model->name());
  apply(plan(items, state));
}

void load_state_dict(const std::shared_ptr<torch::nn::Module>& model, const StateDict& shapes,
                     const std::function<StateValue(const std::string&)>& value_of, bool strict) {
  if (!model) throw ConfigError("load_state_dict: the model is null");
  ModelIndex idx = index_model(model);
  StateDictType type{};
  const std::vector<Item> items = loadable_items(model, idx, type);
  validate(items, shapes, strict, type, model->name());
  for (const auto& item : items) {
    if (!shapes.contains(item.key)) continue;
    StateDict one;
    one.insert(item.key, value_of(item.key));
    apply(plan({item}, one));
  }
}

}  // namespace fsdp
