// Deferred initialisation: modules built under fsdp::EmptyInitGuard hold no
// parameter memory until wrapping (or fsdp::materialize) rebuilds them.
#include "empty_init.h"

#include <ATen/ATen.h>
#include <c10/core/DefaultDtype.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>

#include <map>
#include <mutex>
#include <string>

#include "fsdp/error.h"
#include "fsdp/core/fully_sharded_data_parallel.h"

namespace fsdp {
namespace detail {

namespace {

thread_local int empty_init_depth = 0;

// A tensor of `sizes` and `options` that owns no bytes.
at::Tensor unallocated(at::IntArrayRef sizes, const at::TensorOptions& options) {
  at::Tensor t = at::empty({0}, options);
  t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return t;
}

template <class F>
void for_each_tensor(torch::nn::Module& module, F&& f) {
  for (auto& item : module.named_parameters(/*recurse=*/true)) f(item.key(), item.value());
  for (auto& item : module.named_buffers(/*recurse=*/true)) f(item.key(), item.value());
}

// Takes, for each unallocated tensor of `placeholder`, the value of the same
// name in a freshly built module.
void materialize_one(torch::nn::Module& placeholder, Slot& slot, const std::optional<at::Device>& device,
                     std::vector<at::Tensor>& out) {
  std::shared_ptr<torch::nn::Module> fresh;
  {
    at::NoGradGuard no_grad;
    fresh = slot.deferred_init();
  }
  std::map<std::string, at::Tensor> values;
  for_each_tensor(*fresh, [&](const std::string& name, const at::Tensor& t) { values[name] = t; });
  at::NoGradGuard no_grad;
  for_each_tensor(placeholder, [&](const std::string& name, at::Tensor& t) {
    if (!is_unallocated(t)) return;
    auto it = values.find(name);
    if (it != values.end() && is_unallocated(it->second)) {
      throw ConfigError("fsdp: materialising deferred module " + placeholder.name() + ": its tensor '" + name +
                        "' holds no memory in the rebuilt module either: its constructor reuses a module built "
                        "under fsdp::EmptyInitGuard; pass constructor arguments that are not modules");
    }
    if (it == values.end() || it->second.sizes() != t.sizes()) {
      throw ConfigError("fsdp: materialising deferred module " + placeholder.name() + ": its tensor '" + name +
                        "' (shape " + c10::str(t.sizes()) + ") has no counterpart " +
                        (it == values.end() ? std::string("of that name") : "of that shape") +
                        " in a freshly built module: its constructor must build the same structure every time");
    }
    t.set_data(it->second.to(device.value_or(t.device()), t.scalar_type()));
    out.push_back(t);
  });
  // Everything below it came from the rebuild too.
  for (const auto& m : placeholder.modules(/*include_self=*/true)) {
    if (auto s = find_slot(m.get())) s->deferred_init = nullptr;
  }
}

}  // namespace

bool empty_init_active() { return empty_init_depth > 0; }

bool is_unallocated(const at::Tensor& t) {
  return t.defined() && t.numel() > 0 && t.has_storage() && t.storage().nbytes() == 0;
}

std::shared_ptr<torch::nn::Module> build_deferred(std::function<std::shared_ptr<torch::nn::Module>()> init) {
  const caffe2::TypeMeta dtype = c10::get_default_dtype();  // e.g. bf16 under a "-true" module_init_context
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  at::Tensor before;
  {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    before = cpu.get_state();
  }
  std::shared_ptr<torch::nn::Module> module = init();
  {
    at::NoGradGuard no_grad;
    for_each_tensor(*module, [](const std::string&, at::Tensor& t) {
      if (t.numel() > 0) t.set_data(unallocated(t.sizes(), t.options()));
    });
  }
  // The rebuild draws what this build drew: the generator is set to `before`
  // for it and given back its own state after. Rebuilds of every thread take
  // one lock, so thread ranks wrapping at once do not interleave draws.
  slot_for(module.get())->deferred_init = [before, dtype, init = std::move(init)]() {
    static std::mutex replay_mutex;
    std::lock_guard<std::mutex> replay(replay_mutex);
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    at::Tensor current;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      current = gen.get_state();
      gen.set_state(before);
    }
    const caffe2::TypeMeta current_dtype = c10::get_default_dtype();
    c10::set_default_dtype(dtype);
    auto restore = [&] {
      c10::set_default_dtype(current_dtype);
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(current);
    };
    try {
      auto fresh = init();
      restore();
      return fresh;
    } catch (...) {
      restore();
      throw;
    }
  };
  return module;
}

void check_materialized(const Slot& slot) {
  if (!slot.deferred_init) return;
  throw ConfigError(
      "fsdp: this module was built under fsdp::EmptyInitGuard (module_init_context(empty_init=true)) and holds no "
      "values yet: wrap it with FSDP (strategy.setup_module) or call fsdp::materialize(module) before its forward");
}

std::vector<at::Tensor> materialize_deferred(torch::nn::Module& root, const std::optional<at::Device>& device,
                                             const std::function<bool(const torch::nn::Module&)>& skip) {
  std::vector<at::Tensor> out;
  std::function<void(torch::nn::Module&)> visit = [&](torch::nn::Module& m) {
    if (skip && skip(m)) return;
    auto slot = find_slot(&m);
    if (slot && slot->deferred_init) {
      materialize_one(m, *slot, device, out);
      return;
    }
    for (auto& child : m.children()) visit(*child);
  };
  visit(root);
  return out;
}

void module_to(torch::nn::Module& module, const std::optional<at::Device>& device,
               const std::optional<at::ScalarType>& dtype) {
  bool deferred = false;
  for_each_tensor(module, [&](const std::string&, at::Tensor& t) { deferred |= is_unallocated(t); });
  if (!deferred) {
    if (device) module.to(*device);
    if (dtype) module.to(*dtype);
    return;
  }
  at::NoGradGuard no_grad;
  for_each_tensor(module, [&](const std::string&, at::Tensor& t) {
    at::TensorOptions o = t.options();
    if (device) o = o.device(*device);
    if (dtype) o = o.dtype(*dtype);
    t.set_data(is_unallocated(t) ? unallocated(t.sizes(), o) : t.to(o));
  });
}

}  // namespace detail

EmptyInitGuard::EmptyInitGuard(bool enabled) : enabled_(enabled) {
  if (enabled_) ++detail::empty_init_depth;
}
EmptyInitGuard::~EmptyInitGuard() {
  if (enabled_) --detail::empty_init_depth;
}

void materialize(const std::shared_ptr<torch::nn::Module>& module, std::optional<at::Device> device) {
  if (!module) throw ConfigError("fsdp::materialize: the module is null");
  detail::materialize_deferred(*module, device, nullptr);
}

}  // namespace fsdp
