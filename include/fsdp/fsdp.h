// fsdp/fsdp.h — Fully Sharded Data Parallel for LibTorch modules.
//
// WRAPPING. `FullyShardedDataParallel<NetImpl> model(net, options)` turns a
// module (and, by `auto_wrap_policy`, chosen submodules) into FSDP units. Each
// unit flattens the parameters it owns (those of its subtree that no nested
// unit owns) into one flat buffer, padded to a multiple of the shard-group
// size, and keeps 1/N of it on each rank. The module tree is not changed:
// named_parameters() names stay those of the unwrapped model (with
// use_orig_params), and buffers stay whole on every rank.
//
// FORWARD INTERPOSITION. C++ modules have no forward hooks, so a unit's
// forward must go through a holder that fsdp-cpp controls:
//   - the root: call `model(x)` or `model.forward(x)` on the
//     FullyShardedDataParallel holder — NOT `model->forward(x)`, which would
//     run on sharded parameters and fail;
//   - a submodule held in a `fsdp::Unit<BlockImpl>` member (a
//     torch::nn::ModuleHolder that behaves exactly like the plain module until
//     a policy or a manual wrap makes it a unit), called as `block(x)`, not
//     `block->forward(x)`: inside a wrapped forward, when LibTorch then fails
//     on the shards, the error is a ConfigError naming the units that were
//     skipped and saying to call unit(x) (a direct call outside any wrapped
//     forward cannot be seen);
//   - an element of a torch::nn::Sequential whose forward is Tensor(Tensor):
//     auto-wrapping needs no change to such models.
// A policy that selects any other module is a ConfigError naming it.
//
// COLLECTIVES. Construction, every forward and backward of a unit, and
// full_parameters() are collectives over the unit's process group(s): every
// rank must run them in the same order (same model, same number of forwards).
// A rank that diverges makes the others fail with fsdp::CollectiveError after
// the group's timeout.
//
// MEMORY. Outside forward and backward each rank holds its shards only
// (FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD): parameters and gradients at
// 1/N of the unit plus padding; a unit's full parameters exist from its
// pre-forward to its post-forward (FULL_SHARD) or to its post-backward
// (SHARD_GRAD_OP), and again from its pre-backward to its post-backward.
// Backward also holds one full-gradient buffer per unit being reduced (at
// most FSDPOptions::max_reductions_in_flight, plus the computing unit's).
//
// OPTIMIZERS. Build any torch::optim optimizer on `model->parameters()`
// after wrapping. use_orig_params=false exposes one flat parameter per unit
// (named "flat_param" at the unit's module); use_orig_params=true exposes the
// original parameters, each holding (outside forward) this rank's 1-D slice
// of it (NO_SHARD: the whole parameter).
#pragma once

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "fsdp/core/detail/forward_call.h"
#include "fsdp/dist/process_group.h"

namespace torch::optim {
class Optimizer;
}

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

// EMPTY INIT (Lightning's module_init_context(empty_init=True)). While an
// EmptyInitGuard lives on a thread, every fsdp::Unit<M>(args...) built there
// constructs its module, then frees the module's parameters and buffers at
// once (shapes, dtypes and devices stay). Wrapping rebuilds each such module
// from copies of its arguments right before it shards the unit that holds
// it, so peak memory while building and wrapping a model is the shards plus
// about one unit, instead of the whole model on every rank. The initial
// values are an eager build's with the same seed: each rebuild replays the
// default CPU generator from the state it had when the module was first
// built, under the default dtype it was built under (under a process-wide
// lock, restoring both afterwards), so
// they do not depend on when, or on which thread, wrapping runs. (Modules
// whose constructors draw from a CUDA generator are not replayed: build on
// CPU and let FSDP move them. Ranks that are threads of one process share
// the generator: let no rank draw from it while another wraps, e.g. a
// barrier before and after setup.) Modules built any other way (plain members,
// Unit(std::make_shared<M>(...))) are allocated as usual. A deferred module
// run before it is materialised (wrapping, or fsdp::materialize) throws:
// ConfigError through its Unit holder, LibTorch's "data is not allocated"
// error when reached another way (a Sequential element). Not thread-shared:
// guard each thread (rank) separately.
class EmptyInitGuard {
 public:
  explicit EmptyInitGuard(bool enabled = true);
  ~EmptyInitGuard();
  EmptyInitGuard(const EmptyInitGuard&) = delete;
  EmptyInitGuard& operator=(const EmptyInitGuard&) = delete;

 private:
  bool enabled_;
};

// [local] Gives every deferred module under `module` (see EmptyInitGuard)
// its values, on `device` (default: CPU), without wrapping. Cost: one
// rebuild per deferred module. FSDP wrapping does this itself, unit by unit.
void materialize(const std::shared_ptr<torch::nn::Module>& module, std::optional<at::Device> device = std::nullopt);

// Holder for a submodule that may become an FSDP unit. Until a policy (or a
// FullyShardedDataParallel built on it) activates it, forward() is the plain
// module's forward. Register it like any holder:
//   block = register_module("block", fsdp::Unit<BlockImpl>(args...));
// and call it as block(x) or block.forward(x) (not block->forward(x)).
namespace detail {
// A module, a module holder (torch::nn::Linear, ...) or a shared_ptr to a
// module: an argument that shares state with the module it builds.
template <class T>
struct is_module_argument
    : std::bool_constant<std::is_base_of_v<torch::nn::Module, T> ||
                         std::is_base_of_v<torch::detail::ModuleHolderIndicator, T>> {};
template <class T>
struct is_module_argument<std::shared_ptr<T>> : std::is_base_of<torch::nn::Module, T> {};
}  // namespace detail

template <class ModuleImpl>
class Unit : public torch::nn::ModuleHolder<ModuleImpl> {
  using Base = torch::nn::ModuleHolder<ModuleImpl>;

 public:
  /* implicit */ Unit(std::nullptr_t) : Base(nullptr) {}
  /* implicit */ Unit(std::shared_ptr<ModuleImpl> module) : Base(std::move(module)) { attach(); }
  /* implicit */ Unit(const torch::nn::ModuleHolder<ModuleImpl>& holder) : Base(holder.ptr()) { attach(); }
  // Constructs the module from its constructor arguments. Under an
  // EmptyInitGuard (and with copyable arguments that are not modules) the
  // module is built, then its memory freed at once; FSDP rebuilds it from
  // copies of the arguments when it shards this unit (see EmptyInitGuard).
  // Arguments that are modules (e.g. Sequential's elements) were built, with
  // their memory, before the Unit: such a unit is built as usual.
  template <class Head, class... Tail,
            class = std::enable_if_t<!std::is_convertible_v<Head, std::shared_ptr<ModuleImpl>> &&
                                     !std::is_base_of_v<torch::nn::ModuleHolder<ModuleImpl>, std::decay_t<Head>>>>
  explicit Unit(Head&& head, Tail&&... tail) : Base(nullptr) {
    if constexpr (std::conjunction_v<std::is_copy_constructible<std::decay_t<Head>>,
                                      std::is_copy_constructible<std::decay_t<Tail>>...> &&
                  !std::disjunction_v<detail::is_module_argument<std::decay_t<Head>>,
                                      detail::is_module_argument<std::decay_t<Tail>>...>) {
      if (detail::empty_init_active()) {
        auto args = std::make_shared<std::tuple<std::decay_t<Head>, std::decay_t<Tail>...>>(
            std::forward<Head>(head), std::forward<Tail>(tail)...);
        auto init = [args]() -> std::shared_ptr<torch::nn::Module> {
          return std::apply([](const auto&... a) { return std::make_shared<ModuleImpl>(a...); }, *args);
        };
        // LibTorch's modules reach Module as a virtual base (through
        // Cloneable): a dynamic cast, not a static one.
        this->impl_ = std::dynamic_pointer_cast<ModuleImpl>(detail::build_deferred(std::move(init)));
        attach();
        return;
      }
    }
    this->impl_ = std::make_shared<ModuleImpl>(std::forward<Head>(head), std::forward<Tail>(tail)...);
    attach();
  }

  template <class... Args>
  auto forward(Args&&... args) {
    return detail::call(
        slot_, [this](auto&&... a) { return this->impl_->forward(std::forward<decltype(a)>(a)...); },
        std::forward<Args>(args)...);
  }
  template <class... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  // True once this module is an FSDP unit.
  bool is_fsdp_unit() const { return slot_ && slot_->unit != nullptr; }

 protected:
  void attach() {
    if (this->impl_) slot_ = detail::slot_for(this->impl_.get());
  }
  std::shared_ptr<detail::Slot> slot_;
};

namespace detail {
// Makes `module` (and, by policy, its submodules) FSDP units. Collective.
void wrap(const std::shared_ptr<torch::nn::Module>& module, const FSDPOptions& options);
}  // namespace detail

// [collective] An FSDP-wrapped module: a Unit activated at construction.
// Used for the root model and for manual nesting (a member, or an element of
// a Sequential, wrapped before the outer model is wrapped):
//   fsdp::FullyShardedDataParallel<NetImpl> model(std::make_shared<NetImpl>(), options);
//   auto loss = model(x).sum(); loss.backward(); optimizer.step();
// Throws ConfigError for bad options, a module wrapped twice, a policy that
// selects a module whose forward cannot be interposed, or a parameter shared
// by two units.
template <class ModuleImpl>
class FullyShardedDataParallel : public Unit<ModuleImpl> {
 public:
  FullyShardedDataParallel(std::shared_ptr<ModuleImpl> module, const FSDPOptions& options)
      : Unit<ModuleImpl>(std::move(module)) {
    detail::wrap(this->impl_, options);
  }
  FullyShardedDataParallel(const torch::nn::ModuleHolder<ModuleImpl>& module, const FSDPOptions& options)
      : FullyShardedDataParallel(module.ptr(), options) {}
};

template <class ModuleImpl>
using FSDP = FullyShardedDataParallel<ModuleImpl>;

// [local] The FSDP units in `module`'s tree, pre-order, as (path, module) pairs.
std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> fsdp_modules(
    const std::shared_ptr<torch::nn::Module>& module);

// [collective] The full (unsharded) value of every parameter of the model,
// keyed by its name in the unwrapped model (tied parameters under each name),
// as copies on every rank. For tests, evaluation and export.
std::vector<std::pair<std::string, at::Tensor>> full_parameters(const std::shared_ptr<torch::nn::Module>& module);

// [local] Gradient accumulation without communication, like PyTorch's
// model.no_sync(): backward passes inside the scope keep each unit's full
// (unreduced) gradient; the first backward after it reduces the sum. Do not
// step the optimizer inside the scope. Costs one full gradient buffer per unit.
class NoSync {
 public:
  explicit NoSync(const std::shared_ptr<torch::nn::Module>& model);
  ~NoSync();
  NoSync(const NoSync&) = delete;
  NoSync& operator=(const NoSync&) = delete;

 private:
  std::vector<std::shared_ptr<detail::UnitState>> units_;
};

struct SummonOptions {
  bool recurse = true;          // every unit of the tree (false: the module's own unit only)
  bool writeback = true;        // changes to the full parameters persist in the shards
  bool rank0_only = false;      // other ranks keep their shards (needs writeback = false)
  bool offload_to_cpu = false;  // full parameters on CPU (already the case on CPU)
};

// Scoped full parameters, like PyTorch's summon_full_params: inside the scope
// every original parameter holds its full value (tensors of the original
// shapes). Construction is a [collective] (an all-gather per unit);
// destruction is local. Running forward or backward, or summoning again,
// inside the scope is a ConfigError. Parameters that already live whole
// (NO_SHARD, world 1) are used in place and never freed.
class SummonFullParams {
 public:
  SummonFullParams(const std::shared_ptr<torch::nn::Module>& model, SummonOptions options = {});
  ~SummonFullParams();
  SummonFullParams(const SummonFullParams&) = delete;
  SummonFullParams& operator=(const SummonFullParams&) = delete;

 private:
  std::vector<std::shared_ptr<detail::UnitState>> units_;
  SummonOptions options_;
};

// [collective] Clips the gradients of the whole model so that their global
// norm (over all shards, of order `norm_type`: any p > 0, or INFINITY) is at
// most max_norm, and returns that norm as computed before clipping, like
// torch.nn.utils.clip_grad_norm_ on the unsharded model. Call after
// backward, before the optimizer step. A non-finite norm (an inf or NaN
// gradient on any rank): with error_if_nonfinite, every rank throws
// fsdp::Error with PyTorch's message and the gradients are left as they are;
// without it (the default, as in PyTorch) the gradients are scaled by it
// anyway (inf becomes NaN) and the non-finite norm is returned.
at::Tensor clip_grad_norm_(const std::shared_ptr<torch::nn::Module>& model, double max_norm, double norm_type = 2.0,
                           bool error_if_nonfinite = false);

// [local] Checks that `optimizer` steps the wrapped model's parameters. An
// optimizer built before wrapping (with use_orig_params=false) references the
// original parameters, which FSDP no longer trains: throws ConfigError
// "The optimizer does not seem to reference any FSDP parameters. HINT: Make
// sure to create the optimizer after setting up the model." (Lightning's words).
void check_optimizer(const std::shared_ptr<torch::nn::Module>& model, const torch::optim::Optimizer& optimizer);
// [local] The same for several models: `optimizer` must step parameters of
// at least one of them (ConfigError as above otherwise, also for no models).
void check_optimizer(const std::vector<std::shared_ptr<torch::nn::Module>>& models,
                     const torch::optim::Optimizer& optimizer);

// [local] Bytes this rank holds right now for the model's FSDP units (padding included).
struct MemoryStats {
  int64_t sharded_param_bytes = 0;    // flat shards
  int64_t unsharded_param_bytes = 0;  // full parameters currently materialised
  int64_t grad_bytes = 0;             // sharded gradients and live full-gradient buffers
  int64_t largest_unit_bytes = 0;     // largest unit's full (padded) size
};
MemoryStats memory_stats(const std::shared_ptr<torch::nn::Module>& module);

// [local] What the FSDP runtime did on this rank for one wrapped model since
// its first forward (or the last reset_runtime_stats): the collectives it
// issued for its units, and how many were in flight at once. "In flight":
// issued and not yet waited by this rank (the backend may have finished).
// Counters cost nothing measurable; they exist for tests, benchmarks and
// fsdp-train's logs. The bytes are the collectives' payloads; in a ring each
// rank sends (world - 1) / world of them.
struct RuntimeStats {
  int64_t all_gathers = 0;              // parameter all-gathers issued (forward, backward, prefetch)
  int64_t prefetches = 0;               // of them, issued ahead of the unit's own use
  int all_gathers_in_flight = 0;        // now
  int peak_all_gathers_in_flight = 0;
  int peak_units_unsharded = 0;         // units other than the root holding (or gathering) full parameters at once
  int64_t reductions = 0;               // gradient reductions issued (one per unit and synced backward)
  int reductions_in_flight = 0;         // now
  int peak_reductions_in_flight = 0;   // at the end of each post-backward hook (see max_reductions_in_flight)
  double all_gather_wait_s = 0;        // time this rank's host blocked waiting for all-gathers
  double reduction_wait_s = 0;         // ... and for reductions
  int64_t all_gather_bytes = 0;        // the full parameters gathered (the all-gathers' output), in bytes
  int64_t reduction_bytes = 0;         // the gradients reduced (the reductions' input), in bytes
};
// All zero for a model that has not run forward yet (or has no unit).
RuntimeStats runtime_stats(const std::shared_ptr<torch::nn::Module>& model);
// Sets the counters and peaks to zero (what is in flight now stays counted).
void reset_runtime_stats(const std::shared_ptr<torch::nn::Module>& model);

// [local] Whether this LibTorch computes in float16 on `device_type`: the
// kernels a transformer needs (matmul, GELU, tanh, softmax, layer norm,
// cross-entropy) run on a tiny float16 tensor. CPU LibTorch 2.x has them,
// 1.13 has none. The first call per device type costs a few milliseconds;
// later calls return the cached answer.
bool float16_compute_available(at::DeviceType device_type);

// [local] This process's resident memory right now, in MiB (from
// /proc/self/statm; 0 where that does not exist).
double resident_memory_mib();

}  // namespace fsdp
