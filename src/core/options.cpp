// FSDP's options (fsdp/core/options.h): the names of the enums, as PyTorch
// spells them, their parsers, and the size-based auto-wrap policy.
#include <cctype>
#include <string>

#include "fsdp/core/options.h"
#include "fsdp/error.h"

namespace fsdp {

const char* to_string(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::kFullShard: return "FULL_SHARD";
    case ShardingStrategy::kShardGradOp: return "SHARD_GRAD_OP";
    case ShardingStrategy::kNoShard: return "NO_SHARD";
    case ShardingStrategy::kHybridShard: return "HYBRID_SHARD";
  }
  return "?";
}

namespace {
// `name` in upper case, '-' as '_': the form the tables below compare.
std::string canonical_name(const std::string& name) {
  std::string n;
  for (char c : name) n += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return n;
}
}  // namespace

ShardingStrategy parse_sharding_strategy(const std::string& name) {
  const std::string n = canonical_name(name);
  for (auto s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp, ShardingStrategy::kNoShard,
                 ShardingStrategy::kHybridShard}) {
    if (n == to_string(s)) return s;
  }
  throw ConfigError("sharding strategy '" + name +
                    "' is unknown: expected one of FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD");
}

const char* to_string(BackwardPrefetch when) {
  switch (when) {
    case BackwardPrefetch::kNone: return "NONE";
    case BackwardPrefetch::kBackwardPre: return "BACKWARD_PRE";
    case BackwardPrefetch::kBackwardPost: return "BACKWARD_POST";
  }
  return "?";
}

BackwardPrefetch parse_backward_prefetch(const std::string& name) {
  const std::string n = canonical_name(name);
  for (auto w : {BackwardPrefetch::kNone, BackwardPrefetch::kBackwardPre, BackwardPrefetch::kBackwardPost}) {
    // The command line's short names: the part after "BACKWARD_".
    if (n == to_string(w) || "BACKWARD_" + n == to_string(w)) return w;
  }
  throw ConfigError("backward prefetch '" + name +
                    "' is unknown: expected one of BACKWARD_PRE (or pre), BACKWARD_POST (or post), NONE (or none)");
}

AutoWrapPolicy size_based_auto_wrap_policy(int64_t min_num_params) {
  return [min_num_params](const torch::nn::Module&, const std::string&, int64_t unwrapped) {
    return unwrapped >= min_num_params;
  };
}

}  // namespace fsdp
