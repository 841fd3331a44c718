// What FSDPStrategy is told (fsdp/strategy/strategy_options.h): the
// precision names and the options' string setters.
#include "fsdp/strategy/strategy_options.h"

#include <optional>
#include <string>
#include <utility>

#include "fsdp/error.h"

namespace fsdp {

namespace {

// Lightning's precision names, each written once: its short alias, and
// what it sets (the whole model's dtype, or FSDP's mixed precision with
// float32 masters; 16-mixed with the gradient scaler).
struct PrecisionRow {
  const char* name;
  const char* alias;  // nullptr: none
  std::optional<at::ScalarType> mixed;  // param, reduce and buffer dtype
  std::optional<at::ScalarType> model_dtype;
  bool needs_grad_scaler;
};
const PrecisionRow kPrecisions[] = {
    {"32-true", "32", std::nullopt, std::nullopt, false},
    {"16-mixed", "16", at::kHalf, std::nullopt, true},
    {"bf16-mixed", "bf16", at::kBFloat16, std::nullopt, false},
    {"16-true", nullptr, std::nullopt, at::kHalf, false},
    {"bf16-true", nullptr, std::nullopt, at::kBFloat16, false},
};

}  // namespace

PrecisionConfig parse_precision(const std::string& name) {
  for (const auto& row : kPrecisions) {
    if (name != row.name && (row.alias == nullptr || name != row.alias)) continue;
    PrecisionConfig p;
    p.name = row.name;
    if (row.mixed) p.mixed = MixedPrecision{*row.mixed, *row.mixed, *row.mixed};
    p.model_dtype = row.model_dtype;
    p.needs_grad_scaler = row.needs_grad_scaler;
    return p;
  }
  std::string names, aliases;
  for (const auto& row : kPrecisions) {
    names += std::string(names.empty() ? "" : ", ") + "\"" + row.name + "\"";
    if (row.alias != nullptr) aliases += std::string(aliases.empty() ? "" : ", ") + "\"" + row.alias + "\"";
  }
  throw ConfigError("precision '" + name + "' is not supported: expected one of " + names + " (or " + aliases + ")");
}

FSDPStrategyOptions& FSDPStrategyOptions::sharding_strategy(const std::string& name) {
  return sharding_strategy(parse_sharding_strategy(name));
}
FSDPStrategyOptions& FSDPStrategyOptions::cpu_offload(bool on) { return cpu_offload(CPUOffload{on}); }
FSDPStrategyOptions& FSDPStrategyOptions::precision(const std::string& name) {
  parse_precision(name);  // fails early for unknown names
  precision_ = name;
  return *this;
}
FSDPStrategyOptions& FSDPStrategyOptions::state_dict_type(const std::string& name) {
  return state_dict_type(parse_checkpoint_format(name, "state_dict_type"));
}
FSDPStrategyOptions& FSDPStrategyOptions::device_mesh(int replicate, int shard) {
  device_mesh_ = std::make_pair(replicate, shard);
  return *this;
}
FSDPStrategyOptions& FSDPStrategyOptions::process_group_backend(const std::string& name) {
  return process_group_backend(launch::parse_backend(name, "process_group_backend"));
}

}  // namespace fsdp
