// src/state_dict/state_dict_settings.h — the state dict setting of one FSDP unit,
// as StateDictTypeGuard left it. Private to the library.
#pragma once

#include "fsdp/state_dict/state_dict_options.h"

namespace fsdp::detail {

class UnitView;

struct StateDictSetting {
  StateDictType type = StateDictType::kFull;
  StateDictConfig config = FullStateDictConfig{};
};

// The unit's setting (the default FULL one outside every guard). A lookup in
// a process-wide table under a lock.
StateDictSetting state_dict_setting_of(const UnitView& unit);

}  // namespace fsdp::detail
