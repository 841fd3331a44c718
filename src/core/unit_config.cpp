// A unit's configuration from its FSDPOptions, and its process groups
// resolved (unit.h: UnitConfig, resolve_groups).
#include <ATen/ATen.h>

#include "fsdp/error.h"
#include "unit.h"

namespace fsdp::detail {

UnitConfig::UnitConfig(const FSDPOptions& o)
    : strategy(o.sharding_strategy()),
      use_orig_params(o.use_orig_params()),
      param_dtype(o.mixed_precision().param_dtype),
      reduce_dtype(o.mixed_precision().reduce_dtype ? o.mixed_precision().reduce_dtype
                                                    : o.mixed_precision().param_dtype),
      buffer_dtype(o.mixed_precision().buffer_dtype),
      forward_prefetch(o.forward_prefetch()),
      backward_prefetch(o.backward_prefetch()),
      limit_all_gathers(o.limit_all_gathers()),
      max_reductions_in_flight(o.max_reductions_in_flight()) {}

UnitConfig resolve_groups(const FSDPOptions& o) {
  auto check_float = [](const std::optional<at::ScalarType>& t, const char* what) {
    if (t && !at::isFloatingType(*t)) {
      throw ConfigError(std::string("FSDP: mixed_precision.") + what + "=" + c10::toString(*t) +
                        " is not a floating-point dtype: expected e.g. BFloat16, Half or Float");
    }
  };
  check_float(o.mixed_precision().param_dtype, "param_dtype");
  check_float(o.mixed_precision().reduce_dtype, "reduce_dtype");
  check_float(o.mixed_precision().buffer_dtype, "buffer_dtype");
  if (o.max_reductions_in_flight() < 0) {
    throw ConfigError("FSDP: max_reductions_in_flight=" + std::to_string(o.max_reductions_in_flight()) +
                      " is negative: expected 0 (wait for each reduction where it is issued) or more");
  }
  UnitConfig c(o);
  const std::string strategy = to_string(o.sharding_strategy());
  if (o.process_group() && o.device_mesh()) {
    throw ConfigError("FSDP: process_group and device_mesh are mutually exclusive: pass only one of them");
  }
  if (o.sharding_strategy() == ShardingStrategy::kHybridShard) {
    if (o.device_mesh()) {
      if (!o.device_mesh()->shard_group || !o.device_mesh()->replicate_group) {
        throw ConfigError("FSDP: HYBRID_SHARD's device_mesh lacks this rank's shard or replicate group");
      }
      c.shard_group = o.device_mesh()->shard_group;
      c.replicate_group = o.device_mesh()->replicate_group;
    } else if (o.process_group() && o.hybrid_shard_size() > 0) {
      if (o.process_group()->size() % o.hybrid_shard_size() != 0) {
        throw ConfigError("FSDP: hybrid_shard_size=" + std::to_string(o.hybrid_shard_size()) +
                          " does not divide the world size " + std::to_string(o.process_group()->size()));
      }
      auto mesh = dist::init_device_mesh(o.process_group(), o.process_group()->size() / o.hybrid_shard_size(),
                                         o.hybrid_shard_size());
      c.shard_group = mesh.shard_group;
      c.replicate_group = mesh.replicate_group;
    } else {
      throw ConfigError(
          "FSDP: the hybrid sharding strategy (HYBRID_SHARD) needs a device_mesh (its shard and replicate groups), "
          "or a process_group with hybrid_shard_size (the ranks of one shard group)");
    }
    return c;
  }
  if (!o.process_group()) {
    throw ConfigError("FSDP: options.process_group is null: expected the group of ranks that share the model (" +
                      strategy + ")");
  }
  if (o.sharding_strategy() == ShardingStrategy::kNoShard) {
    c.replicate_group = o.process_group();
  } else {
    c.shard_group = o.process_group();
  }
  return c;
}

}  // namespace fsdp::detail
