// fsdp/strategy/strategy_options.h — what FSDPStrategy is told: Lightning
// Fabric's FSDPStrategy constructor arguments (FSDPStrategyOptions) and its
// precision names (PrecisionConfig, parse_precision). Values only: setting
// an option is local and cheap, and nothing here communicates. The strategy
// itself is fsdp/strategy/strategy.h, which includes this header.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/arg.h>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/core/activation_checkpointing.h"
#include "fsdp/core/options.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/launch/env.h"
#include "fsdp/observability/loggers.h"

namespace fsdp {

// A precision setting by Lightning's name.
struct PrecisionConfig {
  std::string name;                             // "32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"
  std::optional<MixedPrecision> mixed;          // "-mixed": FSDP's MixedPrecision (float32 masters)
  std::optional<at::ScalarType> model_dtype;    // "-true": the whole model in this dtype
  bool needs_grad_scaler = false;               // "16-mixed"
};
// Parses a precision name ("32", "16", "bf16" and "32-true" ... "bf16-true");
// ConfigError listing the valid names otherwise.
PrecisionConfig parse_precision(const std::string& name);

// FSDPStrategyOptions::NAME(value) sets fsdp().NAME and returns the
// strategy's options; NAME() reads fsdp().NAME (Lightning passes these
// arguments through to FSDP).
#define FSDP_STRATEGY_PASS_THROUGH(T, name)           \
 public:                                              \
  FSDPStrategyOptions& name(T value) {                \
    fsdp_.name(std::move(value));                     \
    return *this;                                     \
  }                                                   \
  const T& name() const noexcept { return fsdp_.name(); }

// Lightning's FSDPStrategy constructor arguments, with chainable setters in
// LibTorch's TORCH_ARG idiom (`name(value)` sets and returns *this, `name()`
// reads). Plain values; setting one is local and cheap (precision and the
// string overloads parse their name at once: ConfigError for an unknown one).
class FSDPStrategyOptions {
 public:
  FSDPStrategyOptions() { fsdp_.use_orig_params(true); }

  // The FSDP options the model is wrapped with (FSDPOptions's defaults,
  // except use_orig_params = true, Lightning's). The strategy completes
  // them at setup_module: process_group unset means the world group (with
  // device_mesh below: the mesh's groups instead); HYBRID_SHARD without a
  // mesh shards within a node (hybrid_shard_size = LOCAL_WORLD_SIZE when it
  // divides the group); device_id unset means the group's CUDA device under
  // NCCL; mixed_precision is replaced by the one mixed_precision() or
  // precision() below gives, if any.
  TORCH_ARG(FSDPOptions, fsdp);

  // Pass-through FSDP options (see FSDPOptions; Lightning's arguments of
  // the same names).
  FSDP_STRATEGY_PASS_THROUGH(ShardingStrategy, sharding_strategy)
  // Parses `name` as parse_sharding_strategy does (case-insensitive).
  FSDPStrategyOptions& sharding_strategy(const std::string& name);
  FSDP_STRATEGY_PASS_THROUGH(CPUOffload, cpu_offload)
  // Lightning's cpu_offload=True / False.
  FSDPStrategyOptions& cpu_offload(bool on);
  FSDP_STRATEGY_PASS_THROUGH(AutoWrapPolicy, auto_wrap_policy)
  // Lightning's auto_wrap_policy={Block, ...}: wrap every module of these types.
  template <class... ModuleImpls>
  FSDPStrategyOptions& auto_wrap_module_types() {
    return auto_wrap_policy(transformer_auto_wrap_policy<ModuleImpls...>());
  }
  // FSDP's process_group: the ranks that shard the model (default: the world).
  FSDP_STRATEGY_PASS_THROUGH(dist::ProcessGroupPtr, process_group)
  FSDP_STRATEGY_PASS_THROUGH(bool, use_orig_params)
  FSDP_STRATEGY_PASS_THROUGH(bool, forward_prefetch)
  FSDP_STRATEGY_PASS_THROUGH(BackwardPrefetch, backward_prefetch)
  FSDP_STRATEGY_PASS_THROUGH(bool, limit_all_gathers)
  FSDP_STRATEGY_PASS_THROUGH(bool, sync_module_states)
  FSDP_STRATEGY_PASS_THROUGH(std::vector<std::shared_ptr<torch::nn::Module>>, ignored_modules)

 public:
  // Lightning's precision name ("32-true" by default; see parse_precision,
  // which checks it here).
  FSDPStrategyOptions& precision(const std::string& name);
  const std::string& precision() const noexcept { return precision_; }
  // An explicit MixedPrecision wins over the precision name's (unset by default).
  TORCH_ARG(std::optional<MixedPrecision>, mixed_precision);
  // Which modules run under activation checkpointing (none by default).
  TORCH_ARG(CheckpointCheck, activation_checkpointing_policy);

 public:
  // Lightning's activation_checkpointing_policy={Block, ...}.
  template <class... ModuleImpls>
  FSDPStrategyOptions& activation_checkpointing_module_types() {
    return activation_checkpointing_policy(checkpoint_module_types<ModuleImpls...>());
  }
  // Deprecated (as in Lightning): use activation_checkpointing_policy.
  TORCH_ARG(CheckpointCheck, activation_checkpointing);
  // The format save_checkpoint writes: Lightning's state_dict_type, "full"
  // (one file) or "sharded" (a directory, the default). A CheckpointFormat
  // (fsdp/checkpoint/checkpoint_io.h), not an fsdp::StateDictType: the setting decides
  // the checkpoint's form on disk, and StateDictType::kLocal has none.
  TORCH_ARG(CheckpointFormat, state_dict_type) = CheckpointFormat::kSharded;

 public:
  // Lightning's string form: parses "full" / "sharded" (parse_checkpoint_format).
  FSDPStrategyOptions& state_dict_type(const std::string& name);

 public:
  // HYBRID_SHARD: a (replicate, shard) mesh; the product must be the world
  // size (checked at setup_environment). Unset by default.
  FSDPStrategyOptions& device_mesh(int replicate, int shard);
  const std::optional<std::pair<int, int>>& device_mesh() const noexcept { return device_mesh_; }
  // The collectives' timeout; unset (the default): the environment's
  // (FSDP_TIMEOUT_S) or launch::kDefaultTimeout.
  TORCH_ARG(std::optional<std::chrono::milliseconds>, timeout);
  // The backend setup_environment joins with; unset (the default): the
  // environment's (FSDP_BACKEND, else kAuto).
  TORCH_ARG(std::optional<launch::Backend>, process_group_backend);

 public:
  // Lightning's string form: parses "auto", "gloo", "nccl" (launch::parse_backend).
  FSDPStrategyOptions& process_group_backend(const std::string& name);

 public:
  // The world group to use instead of joining one from the environment in
  // setup_environment (ranks as threads, or a group made elsewhere). Unset
  // by default.
  TORCH_ARG(dist::ProcessGroupPtr, world);
  // Set on every rank at setup_environment (default 0).
  TORCH_ARG(uint64_t, seed) = 0;
  // Lightning Fabric's loggers=[...]: where log / log_dict write, on rank 0
  // only. setup_environment opens them there (a log directory that cannot be
  // written fails every rank then, not at the first log). None by default.
  TORCH_ARG(std::vector<std::shared_ptr<Logger>>, loggers);

 private:
  std::string precision_ = "32-true";
  std::optional<std::pair<int, int>> device_mesh_;
};

#undef FSDP_STRATEGY_PASS_THROUGH

}  // namespace fsdp
