// fsdp/core/detail/forward_call.h — the glue between the forward-interposing holders in
// fsdp/core/fully_sharded_data_parallel.h and the sharding engine in src/core/.
// Not a public API.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <functional>

#include <memory>
#include <string>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace fsdp::detail {

class UnitState;  // one FSDP unit: a flat parameter and its hooks (src/core/unit.cpp)

// The forward hooks of another engine on the same interposition: fully_shard
// (FSDP2, src/fsdp2/) puts its parameter group here instead of an FSDP1 unit.
// A holder runs pre_forward, the module's forward, then post_forward.
class ForwardHooks {
 public:
  virtual ~ForwardHooks() = default;
  // Before the forward. `inputs` are the forward's tensor arguments, in
  // order; the hooks may replace them (a cast, or a view whose gradient
  // marks the end of this module's backward).
  virtual void pre_forward(std::vector<at::Tensor>& inputs) = 0;
  // After it; may replace the output tensors (a cast to an output dtype).
  virtual void post_forward(std::vector<at::Tensor>& outputs) = 0;
  // The forward threw: undo pre_forward's state; must not throw.
  virtual void forward_failed() noexcept = 0;
};

// Where a module's FSDP unit lives, shared by every holder of that module.
// `unit` is null while the module is not (yet) an FSDP unit.
struct Slot {
  std::shared_ptr<UnitState> unit;
  std::shared_ptr<ForwardHooks> hooks;  // fully_shard's group (never together with `unit`)
  bool checkpoint = false;  // run the forward under activation checkpointing
  // Set for a module built under fsdp::EmptyInitGuard: its parameters and
  // buffers hold no memory yet, and this builds a fresh module of the same
  // structure whose values materialisation takes.
  std::function<std::shared_ptr<torch::nn::Module>()> deferred_init;
};

// True while an fsdp::EmptyInitGuard is alive on this thread.
bool empty_init_active();

// Builds a module with `init` now, frees its parameters and buffers
// (keeping their shapes, dtypes and devices) and records in its slot, for
// materialisation, a rebuild that replays the default CPU generator from the
// state it had before this build, so the rebuilt values are those of this
// build (an eager build's) whenever and on whichever thread it runs.
std::shared_ptr<torch::nn::Module> build_deferred(std::function<std::shared_ptr<torch::nn::Module>()> init);

// ConfigError unless the module of `slot` is materialised.
void check_materialized(const Slot& slot);

// After a LibTorch error in the forward of `unit`: a ConfigError (carrying
// `what`) when units below it still held only their shards without having
// run their forward in this iteration — the trap of calling a unit's module
// directly (unit->forward(x)), which skips the gather; returns otherwise.
void explain_forward_error(UnitState& unit, const std::string& what);

// The slot of `module`: the existing one if some holder or wrapper made it,
// else a new one registered for it. Thread-safe.
std::shared_ptr<Slot> slot_for(const torch::nn::Module* module);

// The slot of `module` if one exists (nullptr otherwise). Thread-safe.
std::shared_ptr<Slot> find_slot(const torch::nn::Module* module);

// Makes `m` (at `path`, a child of `parent`) interposable: its fsdp::Unit
// slot, or a stand-in in its parent Sequential; ConfigError naming `why`
// (the feature that wants it) otherwise (src/core/wrap.cpp). fully_shard
// (src/fsdp2/) interposes the modules an auto-wrap policy selects with it.
std::shared_ptr<Slot> interpose(torch::nn::Module* parent, torch::nn::Module& m, const std::string& path,
                                const std::string& why);

// Marks `module`'s slot as checkpointed; ConfigError if it already is.
void mark_checkpointed(const std::shared_ptr<Slot>& slot, const torch::nn::Module& module);

// Pre-forward (unshard) on construction; post-forward (reshard, backward
// hooks on `outputs`) in finish(); cleanup if the forward threw.
class ForwardScope {
 public:
  explicit ForwardScope(UnitState& unit);
  ~ForwardScope();
  void finish(const std::vector<at::Tensor>& outputs);
  // A forward argument as the unit's forward receives it: floating-point
  // tensors cast to the unit's compute dtype, anything else as is.
  template <class X>
  decltype(auto) cast(X&& x) {
    if constexpr (std::is_same_v<std::decay_t<X>, at::Tensor>) {
      return cast_tensor(x);
    } else {
      return std::forward<X>(x);
    }
  }
  at::Tensor cast_tensor(const at::Tensor& t) const;
  ForwardScope(const ForwardScope&) = delete;
  ForwardScope& operator=(const ForwardScope&) = delete;

 private:
  UnitState& unit_;
  bool finished_ = false;
};

template <class T> struct IsVector : std::false_type {};
template <class T, class A> struct IsVector<std::vector<T, A>> : std::true_type {};
template <class T> struct IsPair : std::false_type {};
template <class A, class B> struct IsPair<std::pair<A, B>> : std::true_type {};
template <class T> struct IsTuple : std::false_type {};
template <class... Ts> struct IsTuple<std::tuple<Ts...>> : std::true_type {};

// Tensors inside a forward's result, to hook the pre-backward unshard on.
// Tensors, vectors, pairs and tuples of them are searched; anything else holds
// no tensors we can see, and such a unit keeps its full parameters until
// backward (see fsdp.h).
template <class T>
void collect_tensors(const T& x, std::vector<at::Tensor>& out) {
  if constexpr (std::is_same_v<T, at::Tensor>) {
    out.push_back(x);
  } else if constexpr (IsVector<T>::value) {
    for (const auto& e : x) collect_tensors(e, out);
  } else if constexpr (IsPair<T>::value) {
    collect_tensors(x.first, out);
    collect_tensors(x.second, out);
  } else if constexpr (IsTuple<T>::value) {
    std::apply([&](const auto&... es) { (collect_tensors(es, out), ...); }, x);
  }
}

// Activation checkpointing (src/core/activation_checkpointing.cpp): runs fn(inputs)
// without keeping its activations and returns its output tensors, made
// differentiable; backward re-runs fn (same RNG state) and back-propagates
// through the re-run. Outside grad mode: just fn(inputs).
std::vector<at::Tensor> run_checkpointed(
    std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)> fn, std::vector<at::Tensor> inputs);

// Calls f(t) on every tensor inside x (tensors, vectors, pairs, tuples of
// them), in order; f may replace the tensor.
template <class T, class F>
void for_each_tensor(T& x, F&& f) {
  if constexpr (std::is_same_v<T, at::Tensor>) {
    f(x);
  } else if constexpr (IsVector<T>::value) {
    for (auto& e : x) for_each_tensor(e, f);
  } else if constexpr (IsPair<T>::value) {
    for_each_tensor(x.first, f);
    for_each_tensor(x.second, f);
  } else if constexpr (IsTuple<T>::value) {
    std::apply([&](auto&... es) { (for_each_tensor(es, f), ...); }, x);
  }
}

// forward(args...) under activation checkpointing: tensor arguments are the
// inputs that backward differentiates, other arguments are kept as copies;
// the tensors of the result (a tensor, or vectors/pairs/tuples of them) come
// back differentiable, anything else in it as the first run computed it.
template <class F, class... Args>
auto checkpoint_call(F& forward, Args&&... args) -> decltype(forward(std::forward<Args>(args)...)) {
  using R = std::decay_t<decltype(forward(std::forward<Args>(args)...))>;
  auto stored = std::make_shared<std::tuple<std::decay_t<Args>...>>(std::forward<Args>(args)...);
  std::vector<at::Tensor> inputs;
  std::apply([&](auto&... a) { (for_each_tensor(a, [&](at::Tensor& t) { inputs.push_back(t); }), ...); }, *stored);
  auto first = std::make_shared<std::optional<R>>();  // the first run's result, for its shape
  auto fn = [forward, stored, first](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    auto call_args = *stored;
    size_t i = 0;
    std::apply([&](auto&... a) { (for_each_tensor(a, [&](at::Tensor& t) { t = xs[i++]; }), ...); }, call_args);
    R out = std::apply(forward, call_args);
    std::vector<at::Tensor> tensors;
    for_each_tensor(out, [&](at::Tensor& t) { tensors.push_back(t); });
    if (!first->has_value()) *first = std::move(out);
    return tensors;
  };
  std::vector<at::Tensor> outs = run_checkpointed(std::move(fn), std::move(inputs));
  R result = std::move(**first);
  size_t i = 0;
  for_each_tensor(result, [&](at::Tensor& t) { t = outs[i++]; });
  return result;
}

// Runs forward(args...) between another engine's hooks (ForwardHooks): the
// arguments are kept as copies whose tensors pre_forward may replace, the
// result's tensors post_forward may replace.
template <class F, class... Args>
auto call_hooked(ForwardHooks& hooks, bool checkpoint, F& forward, Args&&... args)
    -> decltype(forward(std::forward<Args>(args)...)) {
  using R = std::decay_t<decltype(forward(std::forward<Args>(args)...))>;
  std::tuple<std::decay_t<Args>...> stored(std::forward<Args>(args)...);
  std::vector<at::Tensor> inputs;
  std::apply([&](auto&... a) { (for_each_tensor(a, [&](at::Tensor& t) { inputs.push_back(t); }), ...); }, stored);
  hooks.pre_forward(inputs);
  size_t i = 0;
  std::apply([&](auto&... a) { (for_each_tensor(a, [&](at::Tensor& t) { t = inputs[i++]; }), ...); }, stored);
  std::optional<R> out;
  try {
    if (checkpoint) {
      out.emplace(std::apply([&](auto&... a) { return checkpoint_call(forward, a...); }, stored));
    } else {
      out.emplace(std::apply([&](auto&... a) { return forward(a...); }, stored));
    }
  } catch (...) {
    hooks.forward_failed();
    throw;
  }
  std::vector<at::Tensor> outputs;
  for_each_tensor(*out, [&](at::Tensor& t) { outputs.push_back(t); });
  hooks.post_forward(outputs);
  i = 0;
  for_each_tensor(*out, [&](at::Tensor& t) { t = outputs[i++]; });
  return std::move(*out);
}

// Runs forward(args...) inside the unit's forward scope (or plainly, without
// a unit), checkpointed when the slot says so (inside the unit's scope: the
// re-run in backward finds the parameters already gathered).
template <class F, class... Args>
auto call(const std::shared_ptr<Slot>& slot, F&& forward, Args&&... args)
    -> decltype(forward(std::forward<Args>(args)...)) {
  UnitState* unit = slot ? slot->unit.get() : nullptr;
  const bool checkpoint = slot && slot->checkpoint;
  if (slot && slot->deferred_init) check_materialized(*slot);
  if (slot && slot->hooks) return call_hooked(*slot->hooks, checkpoint, forward, std::forward<Args>(args)...);
  if (unit == nullptr) {
    if (checkpoint) return checkpoint_call(forward, std::forward<Args>(args)...);
    return forward(std::forward<Args>(args)...);
  }
  ForwardScope scope(*unit);
  auto run = [&]() -> decltype(forward(std::forward<Args>(args)...)) {
    try {
      return checkpoint ? checkpoint_call(forward, scope.cast(std::forward<Args>(args))...)
                        : forward(scope.cast(std::forward<Args>(args))...);
    } catch (const c10::Error& e) {
      explain_forward_error(*unit, e.what_without_backtrace());
      throw;
    }
  };
  auto out = run();
  std::vector<at::Tensor> tensors;
  collect_tensors(out, tensors);
  scope.finish(tensors);
  return out;
}

}  // namespace fsdp::detail
