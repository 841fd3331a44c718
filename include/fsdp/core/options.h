// fsdp/core/options.h — what FSDP is told: PyTorch FSDP's constructor
// arguments as fsdp::FSDPOptions, the sharding strategies, mixed precision,
// CPU offload, backward prefetch, and the auto-wrap policies. Values only:
// nothing here communicates or allocates. The wrapper that takes them is in
// fsdp/core/fully_sharded_data_parallel.h.
#pragma once

#include <torch/arg.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/distributed/process_group.h"

namespace fsdp {

enum class ShardingStrategy {
  kFullShard,    // shard parameters, gradients, optimizer state; reshard after forward
  kShardGradOp,  // as kFullShard, but keep full parameters from forward to backward
  kNoShard,      // replicate everything, all-reduce gradients (DDP)
  kHybridShard,  // kFullShard inside a shard group, replicate across groups
};

// "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD".
const char* to_string(ShardingStrategy strategy);
// Parses those names (case-insensitive, '-' or '_'); ConfigError otherwise.
ShardingStrategy parse_sharding_strategy(const std::string& name);

// Decides whether `module`, at `name` (its path in the wrapped model), becomes
// a unit. `unwrapped_numel` counts the parameters of its subtree that no unit
// owns yet. Called bottom-up (children before parents); never for the root.
using AutoWrapPolicy =
    std::function<bool(const torch::nn::Module& module, const std::string& name, int64_t unwrapped_numel)>;

// PyTorch's size_based_auto_wrap_policy: wrap when unwrapped_numel >= min_num_params.
AutoWrapPolicy size_based_auto_wrap_policy(int64_t min_num_params = 100000000);

// PyTorch's transformer_auto_wrap_policy: wrap every module whose type is (or
// derives from) one of `ModuleImpls`.
template <class... ModuleImpls>
AutoWrapPolicy transformer_auto_wrap_policy() {
  return [](const torch::nn::Module& m, const std::string&, int64_t) {
    return ((dynamic_cast<const ModuleImpls*>(&m) != nullptr) || ...);
  };
}

// PyTorch's MixedPrecision. Shards stay in the parameters' dtype (the
// "master" copy the optimizer steps, e.g. float32); forward and backward run
// on full parameters cast to param_dtype; gradients are reduced in
// reduce_dtype (default: param_dtype) and handed to the optimizer in the
// master dtype. Floating-point tensor arguments of every unit's forward are
// cast to param_dtype. Buffers are cast to buffer_dtype at the first forward
// and stay so (unset: left alone). float16 param_dtype on CPU needs a
// LibTorch with CPU float16 kernels (2.x; not 1.13: see
// float16_compute_available); float16 reduce_dtype works everywhere.
struct MixedPrecision {
  std::optional<at::ScalarType> param_dtype;
  std::optional<at::ScalarType> reduce_dtype;
  std::optional<at::ScalarType> buffer_dtype;
};

// PyTorch's CPUOffload. offload_params: shards and their gradients live in
// CPU memory and the optimizer steps there. With CPU parameters (Gloo)
// everything already lives on CPU, so the flag is accepted and changes
// nothing; with CUDA parameters it is not implemented yet and wrapping throws
// ConfigError.
struct CPUOffload {
  bool offload_params = false;
};

// When to prefetch (all-gather) the next unit's parameters in backward.
enum class BackwardPrefetch {
  kNone,
  kBackwardPre,   // when the current unit's backward starts (most overlap, more memory)
  kBackwardPost,  // when the current unit's gradients are ready, before its reduce-scatter
};

// "NONE", "BACKWARD_PRE", "BACKWARD_POST" (PyTorch's names).
const char* to_string(BackwardPrefetch when);
// Parses those names, or the command line's short ones "none", "pre",
// "post" (case-insensitive, '-' or '_'); ConfigError listing them otherwise.
BackwardPrefetch parse_backward_prefetch(const std::string& name);

// PyTorch's FSDP constructor arguments, with chainable setters in LibTorch's
// TORCH_ARG idiom: `name(value)` sets and returns *this, `name()` reads.
//   auto o = fsdp::FSDPOptions().process_group(world).use_orig_params(true)
//                .auto_wrap_policy(fsdp::transformer_auto_wrap_policy<BlockImpl>());
// Plain values: copying costs the fields' copies (shared pointers, functions).
struct FSDPOptions {
  // The ranks that share the model (all of them, usually). Required, except
  // for kHybridShard with a device_mesh. Default: none.
  TORCH_ARG(dist::ProcessGroupPtr, process_group);
  // How parameters, gradients and optimizer state are sharded. Default kFullShard.
  TORCH_ARG(ShardingStrategy, sharding_strategy) = ShardingStrategy::kFullShard;
  // kHybridShard: shard inside mesh.shard_group, replicate across
  // mesh.replicate_group. Alternatively give process_group and
  // hybrid_shard_size: the mesh is made from it (a collective). Default:
  // none, and hybrid_shard_size 0.
  TORCH_ARG(std::optional<dist::DeviceMesh>, device_mesh);
  TORCH_ARG(int, hybrid_shard_size) = 0;
  // Which submodules become units of their own (empty, the default: none).
  TORCH_ARG(AutoWrapPolicy, auto_wrap_policy);
  // Modules whose parameters stay whole and unsharded on every rank, outside
  // every unit (their gradients are not reduced either, as in PyTorch).
  // Default: none.
  TORCH_ARG(std::vector<std::shared_ptr<torch::nn::Module>>, ignored_modules);
  // false (the default): expose one flat parameter per unit; true: the
  // original parameters.
  TORCH_ARG(bool, use_orig_params) = false;
  // PyTorch's device_id: the module (parameters and buffers, ignored modules
  // too) is moved to this device before it is sharded. Unset (the default):
  // it stays where it is, and every parameter must already be on the
  // process group's device type (CPU for Gloo, CUDA for NCCL), else wrapping
  // throws ConfigError.
  TORCH_ARG(std::optional<at::Device>, device_id);
  // Broadcast rank 0's parameters and buffers at construction. Default false.
  TORCH_ARG(bool, sync_module_states) = false;
  // Default: no dtype set (everything in the parameters' dtype).
  TORCH_ARG(MixedPrecision, mixed_precision);
  // Default: offload_params false.
  TORCH_ARG(CPUOffload, cpu_offload);
  // Start the next unit's all-gather (in the order of the previous
  // iteration) when a unit's forward starts, so it overlaps this compute.
  // On by default here (PyTorch's default is off): measured to cut the time
  // forward waits for all-gathers by a third to a half at 100 M parameters,
  // at no memory cost under limit_all_gathers (docs/performance.md).
  TORCH_ARG(bool, forward_prefetch) = true;
  // Default kBackwardPre.
  TORCH_ARG(BackwardPrefetch, backward_prefetch) = BackwardPrefetch::kBackwardPre;
  // Prefetch only while fewer than two units (besides the root) hold full
  // parameters, bounding memory. Default true.
  TORCH_ARG(bool, limit_all_gathers) = true;
  // Gradient reductions run while backward goes on: a unit's reduce-scatter
  // (NO_SHARD: all-reduce; HYBRID_SHARD: reduce-scatter, then the replicate
  // all-reduce) is issued as soon as its gradients are ready and completed
  // later: when more than this many are in flight (the oldest is waited),
  // and at the latest when backward ends, before loss.backward() returns.
  // (A post-backward hook issues its unit's reduction first, then waits for
  // the oldest until at most this many remain: backward computes with at
  // most this many in flight.)
  // The optimizer only ever sees reduced gradients. Each reduction in flight
  // holds one unit-sized full-gradient buffer. 0: every reduction is waited
  // where it is issued (no overlap, least memory). Default 2; negative is a
  // ConfigError at wrapping.
  TORCH_ARG(int, max_reductions_in_flight) = 2;
};

// How SummonFullParams (fsdp/core/utils.h) gathers.
struct SummonOptions {
  bool recurse = true;          // every unit of the tree (false: the module's own unit only)
  bool writeback = true;        // changes to the full parameters persist in the shards
  bool rank0_only = false;      // other ranks keep their shards (needs writeback = false)
  bool offload_to_cpu = false;  // full parameters on CPU (already the case on CPU)
};

}  // namespace fsdp
