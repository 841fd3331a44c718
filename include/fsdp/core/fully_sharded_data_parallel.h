// fsdp/core/fully_sharded_data_parallel.h — Fully Sharded Data Parallel for
// LibTorch modules: the wrapper, fsdp::Unit and deferred initialisation.
// Options and policies are in fsdp/core/options.h, the utilities (no_sync,
// summon_full_params, clipping, statistics) in fsdp/core/utils.h.
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
//
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
// A unit with no parameter that requires a gradient (frozen) whose outputs
// still require one (trainable layers run before it) is gathered again when
// backward reaches it, since the gradient flowing through it needs its full
// weights, and is freed at the end of backward.
// Backward also holds one full-gradient buffer per unit being reduced (at
// most FSDPOptions::max_reductions_in_flight, plus the computing unit's).
//
// OPTIMIZERS. Build any torch::optim optimizer on `model->parameters()`
// after wrapping. use_orig_params=false exposes one flat parameter per unit
// (named "flat_param" at the unit's module); use_orig_params=true exposes the
// original parameters, each holding (outside forward) this rank's 1-D slice
// of it (NO_SHARD: the whole parameter).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "fsdp/core/detail/forward_call.h"
#include "fsdp/core/options.h"

namespace torch::serialize {
class OutputArchive;
class InputArchive;
}  // namespace torch::serialize

namespace fsdp {

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

// Holder for a submodule that may become an FSDP unit. Until a policy (or a
// FullyShardedDataParallel built on it) activates it, forward() is the plain
// module's forward. Register it like any holder:
//   block = register_module("block", fsdp::Unit<BlockImpl>(args...));
// and call it as block(x) or block.forward(x) (not block->forward(x)).
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
  bool is_fsdp_unit() const { return slot_ && detail::unit_of(*slot_) != nullptr; }
  // True once fully_shard (FSDP2, fsdp/fsdp2/fully_shard.h) sharded this module.
  bool is_fully_shard() const { return slot_ && detail::is_fully_shard(*slot_); }

 protected:
  void attach() {
    if (this->impl_) slot_ = detail::slot_for(this->impl_.get());
  }
  std::shared_ptr<detail::Slot> slot_;
};

namespace detail {
// Makes `module` (and, by policy, its submodules) FSDP units. Collective.
void wrap(const std::shared_ptr<torch::nn::Module>& module, const FSDPOptions& options);
// The ConfigError of torch::save / torch::load on an FSDP unit (below).
[[noreturn]] void refuse_torch_serialize(const torch::nn::Module& module, bool saving);
}  // namespace detail

// TORCH::SAVE AND TORCH::LOAD. `torch::save(model, path)` and
// `torch::load(model, path)` on a holder of an FSDP unit (a
// FullyShardedDataParallel, or a Unit that became one) or of a module that
// fully_shard sharded (FSDP2: FullyShard too) throw ConfigError,
// on every rank and before touching the file: LibTorch's Module::save would
// write this rank's shards of the parameters (1-D slices, or empty tensors)
// under the parameters' full names, and Module::load would replace the shards
// with whatever the file holds, unchecked. Save with fsdp::save_checkpoint
// (fsdp/checkpoint/checkpoint_io.h; its full format is one torch.save file),
// or gather the full parameters with fsdp::full_parameters or fsdp::state_dict
// under FULL_STATE_DICT (collectives) and save those; load with
// fsdp::load_checkpoint. A holder whose module is no unit saves and loads as
// LibTorch's do. (Reaching the module another way, as
// torch::save(model.ptr(), path) or model->save(archive), is LibTorch's
// Module::save, which fsdp-cpp cannot see: it writes the shards.)
template <class ModuleImpl>
torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive, const Unit<ModuleImpl>& unit) {
  if (unit.is_fsdp_unit() || unit.is_fully_shard()) detail::refuse_torch_serialize(*unit.ptr(), /*saving=*/true);
  unit.ptr()->save(archive);
  return archive;
}
template <class ModuleImpl>
torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive, Unit<ModuleImpl>& unit) {
  if (unit.is_fsdp_unit() || unit.is_fully_shard()) detail::refuse_torch_serialize(*unit.ptr(), /*saving=*/false);
  unit.ptr()->load(archive);
  return archive;
}

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

}  // namespace fsdp
