// src/state_dict/state_dict_settings.h — the state dict setting of one FSDP unit,
// as StateDictTypeGuard left it. Private to the library.
#pragma once

#include <memory>
#include <vector>

#include "fsdp/fsdp2/fully_shard.h"
#include "fsdp/state_dict/state_dict_options.h"

namespace fsdp::detail {

struct StateDictSetting {
  StateDictType type = StateDictType::kFull;
  StateDictConfig config = FullStateDictConfig{};
};

// The setting of an FSDP1 unit (its UnitView) or of an FSDP2 group (its
// FSDPModule's group), as StateDictTypeGuard left it; outside every guard,
// `fallback` with its default config (FULL for units, SHARDED for groups, as
// PyTorch's). A lookup in a process-wide table under a lock.
StateDictSetting state_dict_setting_of(const void* unit_or_group, StateDictType fallback);

// The modules under `model` (itself included, pre-order) that fully_shard
// sharded; none for a null model.
std::vector<FSDPModule> fully_shard_modules(const std::shared_ptr<torch::nn::Module>& model);

}  // namespace fsdp::detail
