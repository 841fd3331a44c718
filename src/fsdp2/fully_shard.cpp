// fully_shard (fsdp/fsdp2/fully_shard.h): the checks torch's fully_shard
// makes, the parameters a call manages, and FSDPModule's methods over the
// states and groups of the engine (fsdp_state.h, param_group.h).
#include "fsdp/fsdp2/fully_shard.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <unordered_set>

#include "fsdp/core/detail/engine.h"
#include "fsdp/error.h"
#include "fsdp_state.h"

namespace fsdp {

using detail::FSDPParam;
using detail::FSDPParamGroup;

void UnshardHandle::wait() {
  if (wait_) {
    auto w = std::move(wait_);
    wait_ = nullptr;
    w();
  }
}

DTensor ShardedParam::dtensor(const at::Tensor& rows) const {
  std::vector<placement::Placement> placements(mesh.ndim(), placement::Replicate{});
  placements.back() = placement::Shard{kShardDim};
  return DTensor::from_local(rows.defined() ? rows : local, mesh, std::move(placements), global_shape);
}

at::Tensor ShardedParam::gather(const at::Tensor& rows) const {
  if (rows.sizes() != local.sizes()) {
    throw ConfigError("ShardedParam::gather: " + name + ": the rows given have another shape than this rank's shard");
  }
  return dtensor(rows).full_tensor();
}

namespace {

// A parameter belongs to one group; the parameter's memory says which
// (FSDPParam::managing_group).
bool managed(const at::Tensor& t) { return FSDPParam::managing_group(t) != nullptr; }

// The parameters fully_shard leaves alone (options.ignored_params), by TensorImpl.
std::unordered_set<const void*> ignored_of(const FullyShardOptions& options) {
  std::unordered_set<const void*> out;
  for (const auto& t : options.ignored_params()) out.insert(t.unsafeGetTensorImpl());
  return out;
}

void check_mesh(const Mesh& mesh, const std::string& module) {
  if (mesh.ndim() != 1 && mesh.ndim() != 2) {
    throw ConfigError("fully_shard: module " + module + ": expects a 1-D or 2-D mesh, but the mesh has " +
                      std::to_string(mesh.ndim()) + " dimensions");
  }
  for (const auto& g : mesh.groups) {
    if (!g) throw ConfigError("fully_shard: module " + module + ": a dimension of the mesh has no process group");
  }
  if (mesh.ndim() == 2 && (mesh.dim_names.size() != 2 || mesh.dim_names[0].empty() || mesh.dim_names[1].empty())) {
    throw ConfigError("fully_shard: module " + module +
                      ": a 2-D mesh (HSDP) needs its dimension names, such as {\"replicate\", \"shard\"}, as torch's "
                      "DeviceMesh needs mesh_dim_names");
  }
}

// torch's _get_post_forward_mesh_info: an int must be a factor of the shard
// size; 1 means false and the shard size true. `post_size` gets the int
// otherwise (0: none).
std::optional<bool> check_reshard_after_forward(const FullyShardOptions& o, const std::string& module, int& post_size) {
  post_size = 0;
  const auto& raf = o.reshard_after_forward();
  if (!raf) return std::nullopt;
  if (raf->is_bool()) return raf->size() != 0;
  const int s = o.mesh().shard_group()->size();
  const int n = raf->size();
  if (n < 1 || n > s || s % n != 0) {
    throw ConfigError("fully_shard: module " + module + ": reshard_after_forward as an int must be a factor of " +
                      std::to_string(s) + " (the shard group's size), not " + std::to_string(n));
  }
  if (n == 1) return false;  // torch: resharding to one rank, i.e. false
  if (n < s) post_size = n;
  return true;
}

// [collective over the shard group] The group of `n` consecutive ranks of
// `shard` that this rank belongs to (torch's mesh.view(-1, n)), made for
// each fully_shard call that asks for it, as torch makes its post-forward
// mesh.
dist::ProcessGroupPtr post_forward_group(const dist::ProcessGroupPtr& shard, int n) {
  dist::ProcessGroupPtr mine;
  for (int first = 0; first < shard->size(); first += n) {
    std::vector<int> ranks;
    for (int r = first; r < first + n; ++r) ranks.push_back(r);
    auto g = shard->new_group(ranks, "fully_shard.post_forward");
    if (g) mine = g;
  }
  return mine;
}

std::vector<std::shared_ptr<FSDPParamGroup>> groups_under(const FSDPParamGroup& g, bool recurse) {
  std::vector<std::shared_ptr<FSDPParamGroup>> out;
  if (!recurse) {
    out.push_back(detail::group_of(*g.module()));
    return out;
  }
  for (const auto* member : g.modules()) {
    for (const auto& m : member->modules(/*include_self=*/true)) {
      if (auto x = detail::group_of(*m)) {
        if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
      }
    }
  }
  return out;
}

FSDPParamGroup& checked(const std::shared_ptr<FSDPParamGroup>& g) {
  if (!g) throw ConfigError("FSDPModule: this handle refers to no module (default-constructed)");
  return *g;
}

}  // namespace

namespace {

// torch's _get_root_modules: the modules of `modules` that no other of them
// holds, in order, each once.
std::vector<std::shared_ptr<torch::nn::Module>> root_modules(const std::vector<std::shared_ptr<torch::nn::Module>>& modules) {
  std::vector<std::shared_ptr<torch::nn::Module>> out;
  for (const auto& candidate : modules) {
    if (!candidate) throw ConfigError("fully_shard: a module of the list is null");
    bool held = false;
    for (const auto& other : modules) {
      if (other.get() == candidate.get()) continue;
      for (const auto& m : other->modules(/*include_self=*/false)) held = held || m.get() == candidate.get();
    }
    const bool again = std::any_of(out.begin(), out.end(), [&](const auto& m) { return m.get() == candidate.get(); });
    if (!held && !again) out.push_back(candidate);
  }
  return out;
}

// The checks on one module fully_shard is applied to; its slot.
std::shared_ptr<detail::Slot> checked_slot(const std::shared_ptr<torch::nn::Module>& module) {
  const std::string name = module->name();
  if (dynamic_cast<torch::nn::ModuleListImpl*>(module.get()) || dynamic_cast<torch::nn::ModuleDictImpl*>(module.get())) {
    throw ConfigError("fully_shard: module " + name +
                      " is a container without a forward of its own (ModuleList or ModuleDict): shard its "
                      "elements, or the module that calls them");
  }
  auto slot = detail::find_slot(module.get());
  if (!slot) {
    throw ConfigError("fully_shard: module " + name +
                      " is held by no fsdp::Unit holder, so its forward cannot be interposed (LibTorch has no module "
                      "hooks): register it as fsdp::Unit<" + name + "Impl> and call it as m(x), or hold the root "
                      "in fsdp::FullyShard");
  }
  if (detail::unit_of(*slot)) {
    throw ConfigError("fully_shard: module " + name +
                      " is already wrapped by FullyShardedDataParallel; one model takes one engine");
  }
  if (detail::is_fully_shard(*slot)) throw ConfigError("fully_shard: module " + name + " is already sharded by fully_shard; shard each module once");
  return slot;
}

}  // namespace

FSDPModule fully_shard(const std::vector<std::shared_ptr<torch::nn::Module>>& modules, const FullyShardOptions& options) {
  if (modules.empty()) throw ConfigError("fully_shard: the list of modules is empty");
  const std::vector<std::shared_ptr<torch::nn::Module>> roots = root_modules(modules);
  std::vector<std::shared_ptr<detail::Slot>> slots;
  std::string name;
  for (const auto& m : roots) {
    slots.push_back(checked_slot(m));
    name += (name.empty() ? "" : ", ") + m->name();
  }
  if (roots.size() > 1) name = "[" + name + "]";
  check_mesh(options.mesh(), name);
  int post_size = 0;
  const std::optional<bool> raf = check_reshard_after_forward(options, name, post_size);
  if (options.offload_policy().offload_params && options.mesh().shard_group()->device().is_cuda()) {
    throw ConfigError("fully_shard: module " + name +
                      ": offload_policy with CUDA parameters is not implemented in fsdp-cpp yet (on a CPU mesh it "
                      "is accepted and changes nothing, as in torch)");
  }

  // Deferred modules (built under fsdp::EmptyInitGuard) get an eager
  // build's values now, group by group as fully_shard goes bottom-up: the
  // parameters of modules sharded already hold their rows and stay.
  for (const auto& m : roots) materialize(m);
  const std::unordered_set<const void*> ignored = ignored_of(options);
  // torch's _get_managed_modules and _get_managed_states: the modules in
  // post-order (children first) from each root, not entering modules
  // sharded already; their own parameters in order, each once.
  std::unordered_set<const torch::nn::Module*> root_set;
  for (const auto& m : roots) root_set.insert(m.get());
  std::vector<std::pair<std::string, torch::nn::Module*>> managed_modules;
  std::unordered_set<const torch::nn::Module*> visited;
  std::function<void(const std::string&, torch::nn::Module&)> dfs = [&](const std::string& path, torch::nn::Module& m) {
    if (!root_set.count(&m)) {
      auto s = detail::find_slot(&m);
      if (s && detail::unit_of(*s)) {
        throw ConfigError("fully_shard: module " + name + " holds module " + path +
                          ", which FullyShardedDataParallel wrapped; one model takes one engine");
      }
      if (s && detail::is_fully_shard(*s)) return;  // a nested fully_shard module: its parameters are its own
    }
    visited.insert(&m);
    for (const auto& child : m.named_children()) {
      if (!visited.count(child.value().get())) dfs(path.empty() ? child.key() : path + "." + child.key(), *child.value());
    }
    managed_modules.emplace_back(path, &m);
  };
  for (const auto& m : roots) dfs("", *m);
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  std::unordered_set<const void*> seen;
  for (const auto& [path, m] : managed_modules) {
    for (const auto& sub : m->named_parameters(/*recurse=*/false)) {
      const at::Tensor& t = sub.value();
      const void* impl = t.unsafeGetTensorImpl();
      if (ignored.count(impl) || !seen.insert(impl).second) continue;
      const std::string pname = path.empty() ? sub.key() : path + "." + sub.key();
      if (auto other = FSDPParam::managing_group(t)) {
        // torch's _validate_no_duplicate_params.
        throw ConfigError("fully_shard: module " + name + ": parameter " + pname +
                          " is shared with a parameter that another fully_shard group already manages (module " +
                          other->name() +
                          "); a shared (tied) parameter belongs to one group: apply fully_shard to the modules "
                          "that share it together, as a list (fully_shard({a, b}, ...))");
      }
      if (t.dim() == 0) {
        throw ConfigError("fully_shard: module " + name + ": parameter " + pname +
                          " is a scalar (0-d); fully_shard shards dimension 0: make it a 1-D tensor of one "
                          "element");
      }
      params.push_back(t);
      names.push_back(pname);
    }
  }
  std::vector<torch::nn::Module*> members;
  for (const auto& m : roots) members.push_back(m.get());
  auto group = FSDPParamGroup::create(std::move(members), std::move(params), std::move(names), options);
  group->reshard_after_forward = raf;
  if (post_size > 0) group->post_forward_group = post_forward_group(options.mesh().shard_group(), post_size);
  auto state = std::make_shared<detail::FSDPState>(group);
  for (size_t i = 0; i < roots.size(); ++i) slots[i]->engine = std::make_shared<detail::ModuleHooks>(state, roots[i].get());
  return FSDPModule(group);
}

FSDPModule fully_shard(const std::shared_ptr<torch::nn::Module>& module, const FullyShardOptions& options) {
  if (!module) throw ConfigError("fully_shard: the module is null");
  return fully_shard(std::vector<std::shared_ptr<torch::nn::Module>>{module}, options);
}

namespace {

// Children first, so that each module the policy selects takes what its
// sharded descendants left (FSDP1's recursive_wrap, and torch's bottom-up
// calls).
void shard_selected(torch::nn::Module* parent, const std::shared_ptr<torch::nn::Module>& m, const std::string& path,
                    const FullyShardOptions& options, const std::unordered_set<const void*>& ignored,
                    const AutoWrapPolicy& policy) {
  for (const auto& child : m->named_children()) {
    shard_selected(m.get(), child.value(), path.empty() ? child.key() : path + "." + child.key(), options, ignored,
                   policy);
  }
  if (detail::group_of(*m)) return;
  int64_t unsharded = 0;
  for (const auto& p : m->parameters(/*recurse=*/true)) {
    if (!managed(p) && !ignored.count(p.unsafeGetTensorImpl())) unsharded += p.numel();
  }
  if (!policy(*m, path, unsharded)) return;
  detail::interpose(parent, *m, path, "fully_shard_tree: the auto-wrap policy");
  fully_shard(m, options);
}

}  // namespace

FSDPModule fully_shard_tree(const std::shared_ptr<torch::nn::Module>& root, const FullyShardOptions& options,
                            const AutoWrapPolicy& policy) {
  if (!root) throw ConfigError("fully_shard: the module is null");
  if (policy) {
    const std::unordered_set<const void*> ignored = ignored_of(options);
    for (const auto& child : root->named_children()) {
      shard_selected(root.get(), child.value(), child.key(), options, ignored, policy);
    }
  }
  return fully_shard(root, options);
}

std::optional<FSDPModule> fsdp_module_of(const torch::nn::Module& module) {
  auto g = detail::group_of(module);
  if (!g) return std::nullopt;
  return FSDPModule(g);
}

namespace detail {

// torch.nn.utils.clip_grad_norm_ over the DTensor gradients of the groups under `root`.
at::Tensor clip_grad_norm_of(FSDPParamGroup& r, double max_norm, double norm_type, bool error_if_nonfinite) {
  std::unordered_set<const void*> managed_here;
  for (const auto& g : groups_under(r, /*recurse=*/true)) {
    if (g->unsharded()) {
      throw ConfigError("clip_grad_norm_: module " + g->name() +
                        " still holds its full parameters; call it after the last backward of the step, with the "
                        "parameters resharded (reshard())");
    }
    for (const auto& p : g->params()) managed_here.insert(p.param().unsafeGetTensorImpl());
  }
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  std::unordered_set<const void*> seen;
  for (const auto* member : r.modules()) {
    for (const auto& item : member->named_parameters()) {
      const at::Tensor& g = item.value().grad();
      if (!g.defined() || !seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
      if (!managed_here.count(item.value().unsafeGetTensorImpl())) {
        throw ConfigError("clip_grad_norm_: parameter " + item.key() + " of module " + member->name() +
                          " has a gradient but no fully_shard group under it manages it (an ignored parameter?); "
                          "its gradient is not sharded like the others");
      }
      grads.push_back(g);
    }
  }
  const auto& group = r.options().mesh().shard_group();
  if (grads.empty()) return at::zeros({}, at::TensorOptions().device(group->device()));
  // torch's _get_total_norm on DTensors: a norm per gradient (its local
  // shard's: a _NormPartial), stacked; the stack is reduced (the
  // _NormPartial's reduction: the ranks' norm_type-th powers summed, or their
  // maximum for an infinite norm_type), then its norm taken.
  std::vector<at::Tensor> norms;
  for (const auto& g : grads) norms.push_back(at::linalg_vector_norm(g, norm_type));
  at::Tensor stacked = at::stack(norms);
  if (group->size() > 1) {
    if (std::isinf(norm_type)) {
      if (norm_type < 0) stacked = stacked.neg();  // the minimum is minus the maximum of the negated
      group->all_reduce(stacked, dist::ReduceOp::kMax).wait();
      if (norm_type < 0) stacked = stacked.neg();
    } else {
      stacked = at::pow(stacked, norm_type);
      group->all_reduce(stacked, dist::ReduceOp::kSum).wait();
      stacked = at::pow(stacked, 1.0 / norm_type);
    }
  }
  const at::Tensor total = at::linalg_vector_norm(stacked, norm_type);
  if (error_if_nonfinite) check_finite_norm(total, norm_type);
  // torch: max_norm / (total + 1e-6), which Python computes as reciprocal() * max_norm.
  const at::Tensor coef = at::clamp((total + 1e-6).reciprocal() * max_norm, c10::nullopt, 1.0);
  for (auto& g : grads) g.mul_(coef);
  return total;
}

at::Tensor ModuleHooks::clip_grad_norm_(double max_norm, double norm_type, bool error_if_nonfinite) {
  return clip_grad_norm_of(*state->group(), max_norm, norm_type, error_if_nonfinite);
}

}  // namespace detail

at::Tensor clip_grad_norm_(const FSDPModule& root, double max_norm, double norm_type) {
  return detail::clip_grad_norm_of(checked(root.group()), max_norm, norm_type, /*error_if_nonfinite=*/false);
}

torch::nn::Module& FSDPModule::module() const { return *checked(group_).module(); }

std::vector<torch::nn::Module*> FSDPModule::modules() const { return checked(group_).modules(); }

std::vector<ShardedParam> FSDPModule::sharded_params() const {
  const FSDPParamGroup& g = checked(group_);
  std::vector<ShardedParam> out;
  for (const auto& p : g.params()) {
    out.push_back(ShardedParam{p.name(), p.param(), p.local(), p.shape(), p.row_offset(), g.options().mesh()});
  }
  return out;
}

UnshardHandle FSDPModule::unshard(bool async_op) {
  FSDPParamGroup& g = checked(group_);
  g.start_unshard();
  std::weak_ptr<FSDPParamGroup> weak = group_;
  UnshardHandle h([weak] {
    if (auto x = weak.lock()) x->wait_unshard();
  });
  if (!async_op) h.wait();
  return h;
}

void FSDPModule::reshard() { checked(group_).reshard(); }

void FSDPModule::set_requires_gradient_sync(bool required, bool recurse) {
  for (auto& g : groups_under(checked(group_), recurse)) g->requires_gradient_sync = required;
}

void FSDPModule::set_requires_all_reduce(bool required, bool recurse) {
  for (auto& g : groups_under(checked(group_), recurse)) g->requires_all_reduce = required;
}

void FSDPModule::set_reshard_after_forward(bool reshard, bool recurse) {
  for (auto& g : groups_under(checked(group_), recurse)) {
    g->reshard_after_forward = reshard;
    g->post_forward_group = nullptr;
  }
}

void FSDPModule::set_reshard_after_backward(bool reshard, bool recurse) {
  for (auto& g : groups_under(checked(group_), recurse)) g->reshard_after_backward = reshard;
}

void FSDPModule::set_is_last_backward(bool last) {
  FSDPParamGroup& g = checked(group_);
  auto state = detail::state_of(*g.module());
  if (!state || !state->context()) {
    throw ConfigError("FSDPModule::set_is_last_backward at module " + g.name() +
                      ": the root is known at its first forward; call it after one");
  }
  state->context()->is_last_backward = last;
}

void FSDPModule::set_modules_to_forward_prefetch(const std::vector<FSDPModule>& modules) {
  FSDPParamGroup& g = checked(group_);
  g.forward_prefetch.clear();
  for (const auto& m : modules) g.forward_prefetch.push_back(checked(m.group()).shared_from_this());
}

void FSDPModule::set_modules_to_backward_prefetch(const std::vector<FSDPModule>& modules) {
  FSDPParamGroup& g = checked(group_);
  g.backward_prefetch.clear();
  for (const auto& m : modules) g.backward_prefetch.push_back(checked(m.group()).shared_from_this());
}

void FSDPModule::set_gradient_divide_factor(double factor) {
  if (!(factor > 0)) throw ConfigError("FSDPModule::set_gradient_divide_factor: the factor must be positive, not " + std::to_string(factor));
  checked(group_).gradient_divide_factor = factor;
}

void FSDPModule::set_force_sum_reduction_for_comms(bool enable) { checked(group_).force_sum_reduction = enable; }

}  // namespace fsdp
