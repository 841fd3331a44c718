// fsdp/strategy/registry.h — strategies by name, as Lightning's
// StrategyRegistry: an application picks the options of one from its command
// line ("fsdp", "fsdp_cpu_offload") or registers its own. Local: nothing here
// communicates.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/strategy/strategy.h"

namespace fsdp {

// Named strategies, so that an application can pick one from its command
// line: "fsdp" and "fsdp_cpu_offload" are registered.
class StrategyRegistry {
 public:
  using Factory = std::function<FSDPStrategyOptions()>;
  static StrategyRegistry& instance();
  // ConfigError if `name` is taken.
  void register_strategy(const std::string& name, Factory factory, const std::string& description);
  // ConfigError listing the registered names if `name` is unknown.
  FSDPStrategyOptions options(const std::string& name) const;
  FSDPStrategy get(const std::string& name) const { return FSDPStrategy(options(name)); }
  std::vector<std::string> names() const;
  const std::string& description(const std::string& name) const;

 private:
  StrategyRegistry();
  std::map<std::string, std::pair<Factory, std::string>> entries_;
};

}  // namespace fsdp
