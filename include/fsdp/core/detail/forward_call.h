// fsdp/core/detail/forward_call.h — the glue between the forward-interposing holders in
// fsdp/core/fully_sharded_data_parallel.h and the engine of each module (FSDP1's
// unit in src/core/, or fully_shard's hooks in src/fsdp2/), one interface for both.
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

class UnitState;  // FSDP1's unit: a flat parameter and its hooks (src/core/unit.h)

// The engine of a module on core's forward interposition: a holder runs
// pre_forward, the module's forward, then post_forward. FSDP1's unit
// (UnitState, src/core/unit.h) and fully_shard's (FSDP2, src/fsdp2/)
// hooks of a parameter group both implement it.
class ForwardHooks {
 public:
  virtual ~ForwardHooks() = default;
  // Before the forward. `inputs` are the forward's tensor arguments (those
  // inside vectors, pairs and tuples too), in order; the hooks may replace
  // them (a cast, or a view whose gradient marks the end of this module's
  // backward).
  virtual void pre_forward(std::vector<at::Tensor>& inputs) = 0;
  // After it; may replace the output tensors (a cast to an output dtype).
  virtual void post_forward(std::vector<at::Tensor>& outputs) = 0;
  // The forward threw: undo pre_forward's state; must not throw.
  virtual void forward_failed() noexcept = 0;
  // After forward_failed, when the forward threw a LibTorch error (c10::Error,
  // its message `what`): may throw a ConfigError that explains it; returning
  // lets the LibTorch error through.
  virtual void explain_forward_error(const std::string& /*what*/) {}
};

// Where a module's engine lives, shared by every holder of that module.
struct Slot {
  // FSDP1's unit or fully_shard's hooks; null while the module is in no
  // engine. unit_of and is_fully_shard tell which.
  std::shared_ptr<ForwardHooks> engine;
  bool checkpoint = false;  // run the forward under activation checkpointing
  // Set for a module built under fsdp::EmptyInitGuard: its parameters and
  // buffers hold no memory yet, and this builds a fresh module of the same
  // structure whose values materialisation takes.
  std::function<std::shared_ptr<torch::nn::Module>()> deferred_init;
};

// The FSDP1 unit in `slot`, or null (no engine, or fully_shard's) (unit.cpp).
std::shared_ptr<UnitState> unit_of(const Slot& slot);
// True when fully_shard (FSDP2) sharded the module of `slot` (unit.cpp).
bool is_fully_shard(const Slot& slot);

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

template <class T> struct IsVector : std::false_type {};
template <class T, class A> struct IsVector<std::vector<T, A>> : std::true_type {};
template <class T> struct IsPair : std::false_type {};
template <class A, class B> struct IsPair<std::pair<A, B>> : std::true_type {};
template <class T> struct IsTuple : std::false_type {};
template <class... Ts> struct IsTuple<std::tuple<Ts...>> : std::true_type {};

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

// Whether for_each_tensor finds tensors in a T: a tensor, or vectors, pairs
// and tuples holding one.
template <class T> struct HoldsTensors : std::is_same<T, at::Tensor> {};
template <class T, class A> struct HoldsTensors<std::vector<T, A>> : HoldsTensors<T> {};
template <class A, class B>
struct HoldsTensors<std::pair<A, B>> : std::disjunction<HoldsTensors<A>, HoldsTensors<B>> {};
template <class... Ts> struct HoldsTensors<std::tuple<Ts...>> : std::disjunction<HoldsTensors<Ts>...> {};

// How call_hooked keeps a forward argument: a copy when it holds tensors
// (the hooks may replace them; the caller's own stay as they are), else the
// argument itself.
template <class A>
using HookedArg = std::conditional_t<HoldsTensors<std::decay_t<A>>::value, std::decay_t<A>, A&&>;

// A kept argument as the forward receives it: a copy as an lvalue, a
// reference as it was passed (an lvalue, or an rvalue).
template <class E, class X>
decltype(auto) pass_hooked(X& x) {
  if constexpr (std::is_reference_v<E>) {
    return static_cast<E&&>(x);
  } else {
    return (x);
  }
}

template <class F, class Tuple, size_t... I>
decltype(auto) apply_hooked(F& f, Tuple& kept, std::index_sequence<I...>) {
  return f(pass_hooked<std::tuple_element_t<I, Tuple>>(std::get<I>(kept))...);
}

// Runs forward(args...) between an engine's hooks (ForwardHooks),
// checkpointed when asked (inside the hooks: the re-run in backward finds
// the parameters already gathered): the tensors of the arguments, kept as
// copies, are what pre_forward may replace; the result's tensors are what
// post_forward may replace.
template <class F, class... Args>
auto call_hooked(ForwardHooks& hooks, bool checkpoint, F& forward, Args&&... args)
    -> decltype(forward(std::forward<Args>(args)...)) {
  using R = std::decay_t<decltype(forward(std::forward<Args>(args)...))>;
  using Kept = std::tuple<HookedArg<Args>...>;
  Kept kept(std::forward<Args>(args)...);
  std::vector<at::Tensor> inputs;
  std::apply([&](auto&... a) { (for_each_tensor(a, [&](at::Tensor& t) { inputs.push_back(t); }), ...); }, kept);
  hooks.pre_forward(inputs);
  size_t i = 0;
  std::apply([&](auto&... a) { (for_each_tensor(a, [&](at::Tensor& t) { t = inputs[i++]; }), ...); }, kept);
  std::optional<R> out;
  const auto seq = std::index_sequence_for<Args...>{};
  try {
    if (checkpoint) {
      auto run = [&](auto&&... a) { return checkpoint_call(forward, std::forward<decltype(a)>(a)...); };
      out.emplace(apply_hooked(run, kept, seq));
    } else {
      out.emplace(apply_hooked(forward, kept, seq));
    }
  } catch (const c10::Error& e) {
    hooks.forward_failed();
    hooks.explain_forward_error(e.what_without_backtrace());
    throw;
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

// Runs forward(args...) as the module's slot says: between its engine's
// hooks, checkpointed, or plainly (no slot, or an empty one).
template <class F, class... Args>
auto call(const std::shared_ptr<Slot>& slot, F&& forward, Args&&... args)
    -> decltype(forward(std::forward<Args>(args)...)) {
  if (!slot) return forward(std::forward<Args>(args)...);
  if (slot->deferred_init) check_materialized(*slot);
  if (slot->engine) return call_hooked(*slot->engine, slot->checkpoint, forward, std::forward<Args>(args)...);
  if (slot->checkpoint) return checkpoint_call(forward, std::forward<Args>(args)...);
  return forward(std::forward<Args>(args)...);
}

}  // namespace fsdp::detail
