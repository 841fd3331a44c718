// What a model's state dict holds (fsdp/state_dict/state_dict_options.h):
// the names of the types and configs, and persistent buffers. The state dict
// types of units (the guard) are in state_dict_settings.cpp.
#include "fsdp/state_dict/state_dict_options.h"

#include <torch/nn/module.h>

#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "fsdp/error.h"
#include "fsdp/text/enum_names.h"

namespace fsdp {

// ---------------------------------------------------------------------------
// Types.

namespace {
constexpr text::EnumName<StateDictType> kStateDictTypeNames[] = {{StateDictType::kFull, "FULL_STATE_DICT"},
                                                                 {StateDictType::kLocal, "LOCAL_STATE_DICT"},
                                                                 {StateDictType::kSharded, "SHARDED_STATE_DICT"}};
}  // namespace

const char* to_string(StateDictType type) { return text::name_of(kStateDictTypeNames, type); }

const char* config_name(const StateDictConfig& config) {
  switch (config.index()) {
    case 0: return "FullStateDictConfig";
    case 1: return "LocalStateDictConfig";
    default: return "ShardedStateDictConfig";
  }
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
