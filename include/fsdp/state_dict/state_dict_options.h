// fsdp/state_dict/state_dict_options.h — what a model's state dict holds, and in which
// form: the state dict type of its FSDP units and the type's config
// (PyTorch's StateDictType and *StateDictConfig, set with
// StateDictTypeGuard as with FSDP.state_dict_type), and which buffers are
// left out (non-persistent). fsdp/state_dict/state_dict.h, which includes this header,
// describes what each type gives. Everything here is local (no collective)
// and cheap: a lookup or an assignment per unit.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace torch::nn {
class Module;
}

namespace fsdp {

enum class StateDictType { kFull, kLocal, kSharded };

// "FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT".
const char* to_string(StateDictType type);

struct FullStateDictConfig {
  bool rank0_only = false;      // only rank 0 receives the gathered tensors
  bool offload_to_cpu = false;  // tensors on CPU
};
struct LocalStateDictConfig {
  bool offload_to_cpu = false;
};
struct ShardedStateDictConfig {
  bool offload_to_cpu = false;
};
using StateDictConfig = std::variant<FullStateDictConfig, LocalStateDictConfig, ShardedStateDictConfig>;

// The name of a config's type ("FullStateDictConfig", ...).
const char* config_name(const StateDictConfig& config);

// PyTorch's FSDP.state_dict_type(model, type, config): sets the state dict
// type (and config: the default of the type when absent) of every FSDP unit
// in `model` for the guard's lifetime, then restores each unit's previous
// setting. Outside every guard a unit's type is FULL_STATE_DICT with the
// default FullStateDictConfig. The guard sets the modules that fully_shard
// sharded (FSDP2) as well; their type outside every guard is
// SHARDED_STATE_DICT (torch's fully_shard gives DTensors), and they have no
// LOCAL_STATE_DICT (a ConfigError when a state dict is taken). A config of another type than `type` is a
// ConfigError whose message contains "Expected state_dict_config of type".
// Guards nest; they must end in the reverse order of their creation (as
// scopes do). Thread-safe: the settings live in a process-wide table keyed
// by unit, so ranks that are threads of one process each guard their own
// model.
class StateDictTypeGuard {
 public:
  StateDictTypeGuard(const std::shared_ptr<torch::nn::Module>& model, StateDictType type,
                     std::optional<StateDictConfig> config = std::nullopt);
  ~StateDictTypeGuard();
  StateDictTypeGuard(const StateDictTypeGuard&) = delete;
  StateDictTypeGuard& operator=(const StateDictTypeGuard&) = delete;

 private:
  struct Saved;
  std::vector<std::shared_ptr<Saved>> saved_;  // one per unit: the setting to restore
};

// [local] The state dict type of the FSDP unit (or fully_shard module) at
// `unit_module` (FULL for a module that is neither).
StateDictType state_dict_type_of(const torch::nn::Module& unit_module);

// [local] Marks buffer `name` of `module` (not of its children) as
// persistent or not (PyTorch's register_buffer(..., persistent=False)):
// non-persistent buffers are left out of state dicts. ConfigError if the
// module has no such buffer.
void set_persistent(torch::nn::Module& module, const std::string& name, bool persistent);
bool is_persistent(const torch::nn::Module& module, const std::string& name);

}  // namespace fsdp
