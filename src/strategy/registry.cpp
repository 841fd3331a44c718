// StrategyRegistry (fsdp/strategy/registry.h): strategies by name.
#include "fsdp/strategy/registry.h"

#include "fsdp/error.h"

namespace fsdp {

StrategyRegistry::StrategyRegistry() {
  register_strategy("fsdp", [] { return FSDPStrategyOptions(); }, "Fully Sharded Data Parallel (FSDP) training");
  register_strategy("fsdp_cpu_offload", [] { return FSDPStrategyOptions().cpu_offload(true); },
                    "Fully Sharded Data Parallel (FSDP) training with Full Sharding and CPU Offloading");
}

StrategyRegistry& StrategyRegistry::instance() {
  static StrategyRegistry r;
  return r;
}

void StrategyRegistry::register_strategy(const std::string& name, Factory factory, const std::string& description) {
  if (entries_.count(name)) throw ConfigError("StrategyRegistry: a strategy named '" + name + "' is already registered");
  entries_[name] = {std::move(factory), description};
}

FSDPStrategyOptions StrategyRegistry::options(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    std::string known;
    for (const auto& [n, e] : entries_) known += (known.empty() ? "" : ", ") + n;
    throw ConfigError("StrategyRegistry: no strategy named '" + name + "': registered are " + known);
  }
  return it->second.first();
}

std::vector<std::string> StrategyRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [n, e] : entries_) out.push_back(n);
  return out;
}

const std::string& StrategyRegistry::description(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw ConfigError("StrategyRegistry: no strategy named '" + name + "'");
  return it->second.second;
}

}  // namespace fsdp
