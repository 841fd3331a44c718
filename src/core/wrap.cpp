// Wrapping: the slot registry, interposition on Sequential elements,
// parameter ownership, and the tree-level walks (fsdp_modules, full_parameters).
#include <ATen/ATen.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "fsdp/error.h"
#include "fsdp/core/fully_sharded_data_parallel.h"
#include "fsdp/core/utils.h"
#include "fsdp/core/detail/engine.h"
#include "empty_init.h"
#include "unit.h"

namespace fsdp {

namespace detail {
namespace {

// Module -> slot, and parameter -> owning unit. A slot lives as long as its
// module (holders may be temporaries, e.g. an FSDP-wrapped module handed to a
// Sequential); entries of dead modules are swept on the next look-up. Nothing
// here keeps a module alive.
struct SlotEntry {
  std::weak_ptr<const torch::nn::Module> module;
  std::shared_ptr<Slot> slot;
};
struct Registry {
  std::mutex mu;
  std::unordered_map<const torch::nn::Module*, SlotEntry> slots;
  std::unordered_map<const c10::TensorImpl*, std::weak_ptr<UnitState>> owners;
};
Registry& registry() {
  static Registry r;
  return r;
}

std::shared_ptr<UnitState> owner_of(const at::Tensor& p) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.owners.find(p.unsafeGetTensorImpl());
  return it == r.owners.end() ? nullptr : it->second.lock();
}

// Stands in for a Sequential element that became a unit: Sequential calls
// it instead of the element. Not registered as a child, so names stay.
class SequentialElementImpl : public torch::nn::Module {
 public:
  SequentialElementImpl(torch::nn::AnyModule original, std::shared_ptr<Slot> slot)
      : original_(std::move(original)), slot_(std::move(slot)) {}
  at::Tensor forward(at::Tensor x) {
    return call(slot_, [&](at::Tensor in) { return original_.forward<at::Tensor>(std::move(in)); }, std::move(x));
  }

 private:
  torch::nn::AnyModule original_;
  std::shared_ptr<Slot> slot_;
};

// torch::nn::Module keeps its parameters in a protected member; a pointer to
// it, formed in a derived class, reads it on any module.
struct ParameterAccess : torch::nn::Module {
  static torch::OrderedDict<std::string, at::Tensor>& of(torch::nn::Module& m) {
    return m.*(&ParameterAccess::parameters_);
  }
};

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

bool is_unit(const torch::nn::Module* m) {
  auto slot = find_slot(m);
  return slot && unit_of(*slot);
}

struct WrapContext {
  const FSDPOptions& options;
  UnitConfig config;
  std::unordered_set<const torch::nn::Module*> ignored_modules;
  std::unordered_set<const c10::TensorImpl*> ignored_params;
};

bool ignored(const WrapContext& ctx, const torch::nn::Module* m) { return ctx.ignored_modules.count(m) > 0; }

// Collects the parameters a unit at `root` owns: those of its subtree outside
// nested units and ignored modules, each once (tied ones with aliases).
void collect_params(const WrapContext& ctx, torch::nn::Module& m, const std::string& prefix,
                    std::vector<ParamInfo>& out) {
  for (auto& item : m.named_parameters(/*recurse=*/false)) {
    const at::Tensor& p = item.value();
    const std::string name = join(prefix, item.key());
    if (ctx.ignored_params.count(p.unsafeGetTensorImpl())) continue;
    if (auto owner = owner_of(p)) {
      throw ConfigError("FSDP: parameter '" + name + "' is also a parameter of another FSDP unit (at module '" +
                        owner->module()->name() + "'): a tied parameter must belong to one unit; wrap the modules "
                        "that share it in one unit (or leave them to a common outer unit)");
    }
    auto same = std::find_if(out.begin(), out.end(), [&](const ParamInfo& x) { return x.param.is_same(p); });
    if (same != out.end()) {
      same->aliases.push_back(name);
      same->places.emplace_back(&m, item.key());
    } else {
      ParamInfo info;
      info.param = p;
      info.name = name;
      info.places.emplace_back(&m, item.key());
      out.push_back(std::move(info));
    }
  }
  for (auto& child : m.named_children()) {
    torch::nn::Module* c = child.value().get();
    if (ignored(ctx, c) || is_unit(c)) continue;
    collect_params(ctx, *c, join(prefix, child.key()), out);
  }
}

void broadcast_from_rank0(const WrapContext& ctx, const std::vector<at::Tensor>& tensors);

// Makes `m` a unit owning what no nested unit owns.
std::shared_ptr<UnitState> make_unit(const WrapContext& ctx, torch::nn::Module& m) {
  // Deferred modules of this unit (EmptyInitGuard) get their values now.
  auto fresh = materialize_deferred(m, ctx.options.device_id(), [&](const torch::nn::Module& x) {
    return &x != &m && (is_unit(&x) || ignored(ctx, &x));
  });
  if (ctx.options.sync_module_states() && !fresh.empty()) broadcast_from_rank0(ctx, fresh);
  std::vector<ParamInfo> params;
  collect_params(ctx, m, "", params);
  if (!ctx.config.use_orig_params && !params.empty()) {
    for (const auto& p : params) {
      if (p.param.requires_grad() != params[0].param.requires_grad()) {
        throw ConfigError("FSDP: the unit at module " + m.name() + " mixes parameters that require gradients and "
                          "frozen ones ('" + params[0].name + "' and '" + p.name + "'), but its flat parameter has "
                          "one requires_grad: use use_orig_params=true, or put frozen modules in units of their own");
      }
    }
  }
  auto unit = std::make_shared<UnitState>(&m, std::move(params), ctx.config);
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (const auto& p : unit->params()) r.owners[p.param.unsafeGetTensorImpl()] = unit;
  }
  if (!ctx.config.use_orig_params) {
    for (const auto& p : unit->params()) {
      for (const auto& [owner, name] : p.places) ParameterAccess::of(*owner).erase(name);
    }
    bool any_grad = false;
    for (const auto& p : unit->params()) any_grad |= p.requires_grad;
    if (!unit->params().empty()) m.register_parameter("flat_param", unit->flat_shard(), any_grad);
  }
  return unit;
}

}  // namespace

torch::OrderedDict<std::string, at::Tensor>& parameters_of(torch::nn::Module& m) { return ParameterAccess::of(m); }

std::shared_ptr<Slot> interpose(torch::nn::Module* parent, torch::nn::Module& m, const std::string& path,
                                const std::string& why) {
  // A Sequential calls its elements itself: give it a stand-in (once).
  if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(parent)) {
    for (auto it = seq->begin(); it != seq->end(); ++it) {
      if (it->ptr().get() != &m) continue;
      auto slot = slot_for(&m);
      *it = torch::nn::AnyModule(std::make_shared<SequentialElementImpl>(*it, slot));
      return slot;
    }
  }
  if (auto slot = find_slot(&m)) return slot;  // held by fsdp::Unit (or already a Sequential stand-in)
  throw ConfigError(why + " selected module '" + path + "' (" + m.name() +
                    "), but fsdp-cpp cannot run code around its forward: hold it in a fsdp::Unit<" + m.name() +
                    "> member of its parent, put it in a torch::nn::Sequential, or (for a torch::nn::ModuleList's "
                    "elements) use a fsdp::UnitList<" + m.name() + "> and call its elements (docs/porting.md)");
}

namespace {

// PyTorch's _recursive_wrap: children first; returns the number of parameters
// of m's subtree that no unit owns.
int64_t recursive_wrap(WrapContext& ctx, torch::nn::Module* parent, torch::nn::Module& m, const std::string& path,
                       bool is_root) {
  int64_t unwrapped = 0;
  for (auto& child : m.named_children()) {
    torch::nn::Module* c = child.value().get();
    if (ignored(ctx, c) || is_unit(c)) continue;
    unwrapped += recursive_wrap(ctx, &m, *c, join(path, child.key()), false);
  }
  for (auto& p : m.named_parameters(/*recurse=*/false)) {
    if (!ctx.ignored_params.count(p.value().unsafeGetTensorImpl())) unwrapped += p.value().numel();
  }
  if (!is_root && ctx.options.auto_wrap_policy()(m, path, unwrapped)) {
    auto slot = interpose(parent, m, path, "FSDP: auto_wrap_policy");
    slot->engine = make_unit(ctx, m);
    return 0;
  }
  return unwrapped;
}

// [collective] Copies rank 0's values of `tensors` to every rank.
void broadcast_from_rank0(const WrapContext& ctx, const std::vector<at::Tensor>& tensors) {
  at::NoGradGuard no_grad;
  auto broadcast_all = [&](const dist::ProcessGroupPtr& g) {
    if (!g || g->size() == 1) return;
    for (auto& t : tensors) {
      at::Tensor c = t.contiguous();
      g->broadcast(c, 0).wait();
      if (!c.is_same(t)) t.copy_(c);
    }
  };
  if (ctx.options.process_group()) {
    broadcast_all(ctx.options.process_group());
  } else {  // mesh only: shard group's rank 0, then across replicas
    broadcast_all(ctx.config.shard_group);
    broadcast_all(ctx.config.replicate_group);
  }
}

// sync_module_states: rank 0's parameters (those no unit owns yet) and
// buffers. Deferred ones (EmptyInitGuard) are synced as their units are made.
void sync_module_states(const WrapContext& ctx, torch::nn::Module& m) {
  std::vector<at::Tensor> tensors;
  for (auto& p : m.parameters(/*recurse=*/true)) {
    if (!owner_of(p) && !is_unallocated(p)) tensors.push_back(p);
  }
  for (auto& b : m.buffers(/*recurse=*/true)) {
    if (!is_unallocated(b)) tensors.push_back(b);
  }
  broadcast_from_rank0(ctx, tensors);
}

// Every parameter FSDP will own must live where the group communicates (a
// CUDA parameter cannot travel through Gloo's CPU path, nor a CPU one through
// NCCL), and CPU offload is not written for CUDA parameters yet.
void check_devices(const WrapContext& ctx, torch::nn::Module& module, const FSDPOptions& o) {
  const dist::ProcessGroupPtr& group = ctx.config.shard_group ? ctx.config.shard_group : ctx.config.replicate_group;
  if (!group) return;
  const at::Device comm = group->device();
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (ctx.ignored_params.count(p.unsafeGetTensorImpl())) continue;
    if (p.device().type() != comm.type()) {
      throw ConfigError("FSDP: parameter '" + item.key() + "' is on " + p.device().str() + ", but the process group '" +
                        group->name() + "' communicates on " + comm.str() + " (" + launch::backend_name(group->backend()) +
                        "): set FSDPOptions::device_id (e.g. " + comm.str() + ") or move the module there first");
    }
    if (o.cpu_offload().offload_params && p.device().type() != at::kCPU) {
      throw ConfigError("FSDP: cpu_offload.offload_params with parameters on " + p.device().str() +
                        " is not implemented yet (parameter '" + item.key() +
                        "'): keep the model on CPU with Gloo, or turn CPU offload off");
    }
  }
}

// Drops the entries of modules that died. Caller holds the registry lock.
void sweep(Registry& r) {
  for (auto it = r.slots.begin(); it != r.slots.end();) {
    it = it->second.module.expired() ? r.slots.erase(it) : std::next(it);
  }
}

}  // namespace

std::shared_ptr<Slot> slot_for(const torch::nn::Module* module) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  sweep(r);
  auto it = r.slots.find(module);
  if (it != r.slots.end()) return it->second.slot;
  auto slot = std::make_shared<Slot>();
  r.slots[module] = SlotEntry{module->shared_from_this(), slot};
  return slot;
}

bool is_flat_param(const at::Tensor& t) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& [m, e] : r.slots) {
    if (e.module.expired()) continue;
    auto unit = unit_of(*e.slot);
    if (unit && unit->flat_shard().is_same(t)) return true;
  }
  return false;
}

std::shared_ptr<Slot> find_slot(const torch::nn::Module* module) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.slots.find(module);
  if (it == r.slots.end() || it->second.module.expired()) return nullptr;
  return it->second.slot;
}

void interpose_sequential_elements(torch::nn::Module& root) {
  for (const auto& m : root.modules(/*include_self=*/true)) {
    auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(m.get());
    if (seq == nullptr) continue;
    for (const auto& child : seq->named_children()) {
      auto slot = find_slot(child.value().get());
      if (slot && (unit_of(*slot) || slot->checkpoint)) interpose(seq, *child.value(), child.key(), "FSDP");
    }
  }
}

void refuse_torch_serialize(const torch::nn::Module& module, bool saving) {
  auto slot = find_slot(&module);
  if (slot && is_fully_shard(*slot)) {  // FSDP2: every parameter holds this rank's rows
    throw ConfigError(std::string("fully_shard: torch::") + (saving ? "save of" : "load into") + " the module " +
                      module.name() + ", which fully_shard sharded, would " +
                      (saving ? "write this rank's rows of each parameter under the parameter's full name"
                              : "replace each parameter's rows with the file's whole tensors, unchecked") +
                      ". Use fsdp::save_checkpoint / fsdp::load_checkpoint, or fsdp::get_model_state_dict / "
                      "fsdp::set_model_state_dict (fsdp/state_dict/distributed_state_dict.h) with full_state_dict");
  }
  if (saving) {
    throw ConfigError("FSDP: torch::save of the FSDP-wrapped module " + module.name() +
                      " would write this rank's shards of its parameters under their full names. Save it with "
                      "fsdp::save_checkpoint (the full format is one torch.save file; the sharded one is "
                      "torch.distributed.checkpoint's), or gather the full parameters on every rank with "
                      "fsdp::full_parameters or fsdp::state_dict under FULL_STATE_DICT and save those");
  }
  throw ConfigError("FSDP: torch::load into the FSDP-wrapped module " + module.name() +
                    " would replace the shards of its parameters with the file's tensors, unchecked. Load with "
                    "fsdp::load_checkpoint (either checkpoint format), or fsdp::load_state_dict");
}

void refuse_two_engines(const std::string& who, const torch::nn::Module& sharded, const torch::nn::Module& model) {
  throw ConfigError(who + ": module " + sharded.name() + (&sharded == &model ? "" : " (under " + model.name() + ")") +
                    " is sharded by fully_shard (FSDP2); one model takes one engine: FullyShardedDataParallel "
                    "or fully_shard, not both");
}

void wrap(const std::shared_ptr<torch::nn::Module>& module, const FSDPOptions& options) {
  if (!module) throw ConfigError("FSDP: cannot wrap a null module");
  auto slot = slot_for(module.get());
  if (unit_of(*slot)) {
    throw ConfigError("FSDP: module " + module->name() +
                      " is already wrapped by FullyShardedDataParallel; wrap each module once");
  }
  for (const auto& m : module->modules(/*include_self=*/true)) {
    auto s = find_slot(m.get());
    if (s && is_fully_shard(*s)) refuse_two_engines("FSDP", *m, *module);
  }
  WrapContext ctx{options, resolve_groups(options), {}, {}};
  for (const auto& m : options.ignored_modules()) {
    if (!m) continue;
    for (const auto& sub : m->modules(/*include_self=*/true)) ctx.ignored_modules.insert(sub.get());
    for (const auto& p : m->parameters(/*recurse=*/true)) ctx.ignored_params.insert(p.unsafeGetTensorImpl());
  }
  if (options.device_id()) module_to(*module, options.device_id(), std::nullopt);
  check_devices(ctx, *module, options);
  for (const auto& m : options.ignored_modules()) {
    if (m) materialize_deferred(*m, options.device_id(), nullptr);  // ignored modules stay whole
  }
  // Units and checkpointed modules placed in a Sequential before this wrap
  // (the `Sequential(FSDP(lin1), lin2)` pattern) get their stand-ins now.
  interpose_sequential_elements(*module);
  if (options.sync_module_states()) sync_module_states(ctx, *module);
  if (options.auto_wrap_policy()) recursive_wrap(ctx, nullptr, *module, "", /*is_root=*/true);
  auto root_unit = make_unit(ctx, *module);
  slot->engine = root_unit;
  // The units below (auto-wrapped or wrapped before) learn their outermost
  // wrapped module: a forward of theirs that runs before its own is the
  // model's module called directly (model->forward(x)), which pre_forward names.
  for (const auto& m : module->modules(/*include_self=*/false)) {
    auto inner = find_slot(m.get());
    auto unit = inner ? unit_of(*inner) : nullptr;
    if (unit) unit->set_outer(root_unit);
  }
}

namespace {

// Every unit under `module` with its path, pre-order.
void find_units(torch::nn::Module& m, const std::string& path,
                std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>& out,
                const std::shared_ptr<torch::nn::Module>& self) {
  if (is_unit(&m)) out.emplace_back(path, self);
  for (auto& child : m.named_children()) find_units(*child.value(), join(path, child.key()), out, child.value());
}

}  // namespace

std::vector<std::shared_ptr<UnitState>> units_of(const std::shared_ptr<torch::nn::Module>& model) {
  std::vector<std::shared_ptr<UnitState>> out;
  for (auto& entry : fsdp_modules(model)) out.push_back(unit_of(*find_slot(entry.second.get())));
  return out;
}

std::vector<at::Tensor> unowned_params(const std::shared_ptr<torch::nn::Module>& model) {
  std::unordered_set<const c10::TensorImpl*> flat, seen;
  for (auto& u : units_of(model)) flat.insert(u->flat_shard().unsafeGetTensorImpl());
  std::vector<at::Tensor> out;
  for (auto& p : model->parameters(/*recurse=*/true)) {
    const auto* impl = p.unsafeGetTensorImpl();
    if (flat.count(impl) || owner_of(p) || !seen.insert(impl).second) continue;
    out.push_back(p);
  }
  return out;
}

}  // namespace detail

std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> fsdp_modules(
    const std::shared_ptr<torch::nn::Module>& module) {
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> out;
  if (module) detail::find_units(*module, "", out, module);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> full_parameters(const std::shared_ptr<torch::nn::Module>& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::unordered_set<const c10::TensorImpl*> flat_params;
  at::NoGradGuard no_grad;
  for (auto& [path, m] : fsdp_modules(module)) {
    auto unit = detail::unit_of(*detail::find_slot(m.get()));
    flat_params.insert(unit->flat_shard().unsafeGetTensorImpl());
    at::Tensor flat = unit->gather_master();
    for (const auto& p : unit->params()) {
      at::Tensor full = detail::param_view(flat, p).clone();
      out.emplace_back(detail::join(path, p.name), full);
      for (const auto& alias : p.aliases) out.emplace_back(detail::join(path, alias), full);
    }
  }
  // Parameters outside every unit (ignored modules).
  for (auto& item : module->named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (flat_params.count(p.unsafeGetTensorImpl()) || detail::owner_of(p)) continue;
    out.emplace_back(item.key(), p.detach().clone());
  }
  return out;
}

}  // namespace fsdp
