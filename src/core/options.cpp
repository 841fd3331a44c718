// FSDP's options (fsdp/core/options.h): the names of the enums, as PyTorch
// spells them, their parsers, and the size-based auto-wrap policy.
#include <cctype>
#include <string>

#include "fsdp/core/options.h"
#include "fsdp/error.h"
#include "fsdp/text/enum_names.h"

namespace fsdp {

namespace {
// `name` in upper case, '-' as '_': the form the tables below compare.
std::string canonical_name(const std::string& name) {
  std::string n;
  for (char c : name) n += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return n;
}

constexpr text::EnumName<ShardingStrategy> kShardingStrategyNames[] = {
    {ShardingStrategy::kFullShard, "FULL_SHARD"},
    {ShardingStrategy::kShardGradOp, "SHARD_GRAD_OP"},
    {ShardingStrategy::kNoShard, "NO_SHARD"},
    {ShardingStrategy::kHybridShard, "HYBRID_SHARD"}};
// The aliases are the command line's short names (the part after
// "BACKWARD_"), compared in lower case.
constexpr text::EnumName<BackwardPrefetch> kBackwardPrefetchNames[] = {
    {BackwardPrefetch::kBackwardPre, "BACKWARD_PRE", "pre"},
    {BackwardPrefetch::kBackwardPost, "BACKWARD_POST", "post"},
    {BackwardPrefetch::kNone, "NONE", "none"}};
}  // namespace

const char* to_string(ShardingStrategy s) { return text::name_of(kShardingStrategyNames, s); }

ShardingStrategy parse_sharding_strategy(const std::string& name) {
  if (auto s = text::value_of(kShardingStrategyNames, canonical_name(name))) return *s;
  throw ConfigError("sharding strategy '" + name + "' is unknown: expected one of " +
                    text::list_names(kShardingStrategyNames));
}

const char* to_string(BackwardPrefetch when) { return text::name_of(kBackwardPrefetchNames, when); }

BackwardPrefetch parse_backward_prefetch(const std::string& name) {
  std::string n = canonical_name(name);
  if (auto w = text::value_of(kBackwardPrefetchNames, n)) return *w;
  if (auto w = text::value_of(kBackwardPrefetchNames, text::to_lower(n))) return *w;
  throw ConfigError("backward prefetch '" + name + "' is unknown: expected one of " +
                    text::list_names(kBackwardPrefetchNames));
}

AutoWrapPolicy size_based_auto_wrap_policy(int64_t min_num_params) {
  return [min_num_params](const torch::nn::Module&, const std::string&, int64_t unwrapped) {
    return unwrapped >= min_num_params;
  };
}

}  // namespace fsdp
