// What a model's state dict holds: state dict types of units (the guard)
// and persistent buffers (fsdp/state_dict/state_dict_options.h).
#include "fsdp/state_dict/state_dict_options.h"

#include <torch/nn/module.h>

#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "fsdp/error.h"
#include "state_dict_settings.h"
#include "../core/unit.h"

namespace fsdp {

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

// ---------------------------------------------------------------------------
// State dict types of units: a table keyed by unit, holding an entry only
// while a guard covers the unit (the guard keeps the unit alive, so no entry
// outlives its unit).

namespace {

struct SettingTable {
  std::mutex mu;
  std::unordered_map<const detail::UnitState*, detail::StateDictSetting> settings;
};

SettingTable& setting_table() {
  static SettingTable t;
  return t;
}

StateDictConfig default_config(StateDictType type) {
  switch (type) {
    case StateDictType::kFull: return FullStateDictConfig{};
    case StateDictType::kLocal: return LocalStateDictConfig{};
    default: return ShardedStateDictConfig{};
  }
}

}  // namespace

namespace detail {

StateDictSetting state_dict_setting_of(const UnitState& unit) {
  auto& t = setting_table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.settings.find(&unit);
  return it == t.settings.end() ? StateDictSetting{} : it->second;
}

}  // namespace detail

struct StateDictTypeGuard::Saved {
  std::shared_ptr<detail::UnitState> unit;
  std::optional<detail::StateDictSetting> previous;  // none: the unit had the default
};

StateDictTypeGuard::StateDictTypeGuard(const std::shared_ptr<torch::nn::Module>& model, StateDictType type,
                                       std::optional<StateDictConfig> config) {
  const StateDictConfig c = config ? *config : default_config(type);
  if (c.index() != default_config(type).index()) {
    throw ConfigError(std::string("state_dict_type: Expected state_dict_config of type ") +
                      config_name(default_config(type)) + " for " + to_string(type) + " but got " + config_name(c));
  }
  auto& t = setting_table();
  std::lock_guard<std::mutex> lock(t.mu);
  for (auto& u : detail::units_of(model)) {
    auto saved = std::make_shared<Saved>();
    saved->unit = u;
    auto it = t.settings.find(u.get());
    if (it != t.settings.end()) saved->previous = it->second;
    t.settings[u.get()] = detail::StateDictSetting{type, c};
    saved_.push_back(std::move(saved));
  }
}

StateDictTypeGuard::~StateDictTypeGuard() {
  auto& t = setting_table();
  std::lock_guard<std::mutex> lock(t.mu);
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
    const auto* unit = (*it)->unit.get();
    if ((*it)->previous) {
      t.settings[unit] = *(*it)->previous;
    } else {
      t.settings.erase(unit);
    }
  }
}

StateDictType state_dict_type_of(const torch::nn::Module& unit_module) {
  auto slot = detail::find_slot(&unit_module);
  return slot && slot->unit ? detail::state_dict_setting_of(*slot->unit).type : StateDictType::kFull;
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

}  // namespace fsdp
