// The state dict type of each unit (state_dict_settings.h), and
// StateDictTypeGuard, which sets it (fsdp/state_dict/state_dict_options.h).
#include "state_dict_settings.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "fsdp/error.h"
#include "fsdp/state_dict/state_dict_options.h"
#include "fsdp/core/detail/unit_view.h"

namespace fsdp {

// ---------------------------------------------------------------------------
// State dict types of units: a table keyed by unit, holding an entry only
// while a guard covers the unit (the guard keeps the unit alive, so no entry
// outlives its unit).

namespace {

struct SettingTable {
  std::mutex mu;
  std::unordered_map<const void*, detail::StateDictSetting> settings;  // by UnitView or FSDP2 group
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

StateDictSetting state_dict_setting_of(const void* unit_or_group, StateDictType fallback) {
  auto& t = setting_table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.settings.find(unit_or_group);
  return it == t.settings.end() ? StateDictSetting{fallback, default_config(fallback)} : it->second;
}

std::vector<FSDPModule> fully_shard_modules(const std::shared_ptr<torch::nn::Module>& model) {
  std::vector<FSDPModule> out;
  if (!model) return out;
  for (const auto& m : model->modules(/*include_self=*/true)) {
    auto g = fsdp_module_of(*m);
    // A group of several modules (fully_shard on a list) once.
    if (g && std::none_of(out.begin(), out.end(), [&](const FSDPModule& x) { return x.group() == g->group(); })) {
      out.push_back(*g);
    }
  }
  return out;
}

}  // namespace detail

struct StateDictTypeGuard::Saved {
  std::shared_ptr<const void> unit;  // a UnitView or an FSDP2 group, kept alive
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
  std::vector<std::shared_ptr<const void>> keys;
  for (auto& u : detail::unit_views_of(model)) keys.push_back(u);
  for (const auto& g : detail::fully_shard_modules(model)) keys.push_back(g.group());
  for (auto& key : keys) {
    auto saved = std::make_shared<Saved>();
    auto it = t.settings.find(key.get());
    if (it != t.settings.end()) saved->previous = it->second;
    t.settings[key.get()] = detail::StateDictSetting{type, c};
    saved->unit = std::move(key);
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
  auto unit = detail::unit_view_at(unit_module);
  if (unit) return detail::state_dict_setting_of(unit.get(), StateDictType::kFull).type;
  auto group = fsdp_module_of(unit_module);
  return group ? detail::state_dict_setting_of(group->group().get(), StateDictType::kSharded).type
               : StateDictType::kFull;
}

}  // namespace fsdp
