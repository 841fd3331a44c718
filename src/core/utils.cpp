// The utilities over a wrapped model (fsdp/core/utils.h): no_sync,
// summon_full_params, clip_grad_norm_, the optimizer check, and the memory
// and runtime statistics.
#include <ATen/ATen.h>

#include <torch/optim/lbfgs.h>
#include <torch/optim/optimizer.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "fsdp/error.h"
#include "fsdp/core/utils.h"
#include "fsdp/core/detail/engine.h"
#include "unit.h"

namespace fsdp {

NoSync::NoSync(const std::shared_ptr<torch::nn::Module>& model) : units_(detail::units_of(model)) {
  for (auto& u : units_) u->set_no_sync(true);
}

NoSync::~NoSync() {
  for (auto& u : units_) u->set_no_sync(false);
}

SummonFullParams::SummonFullParams(const std::shared_ptr<torch::nn::Module>& model, SummonOptions options)
    : options_(options) {
  if (options.rank0_only && options.writeback) {
    throw ConfigError("summon_full_params: writeback=true with rank0_only=true is not supported: the other ranks "
                      "hold no full parameters to write back (set writeback=false)");
  }
  auto units = detail::units_of(model);
  if (units.empty()) throw ConfigError("summon_full_params: the model has no FSDP unit");
  if (!options.recurse) units.resize(1);
  for (auto& u : units) {
    u->summon(options);
    units_.push_back(u);
  }
}

SummonFullParams::~SummonFullParams() {
  for (auto it = units_.rbegin(); it != units_.rend(); ++it) (*it)->unsummon(options_);
}

namespace {

// torch's _get_grad_norm (fully_sharded_data_parallel.py): a float32 norm of
// each gradient, stacked, and the float32 norm of the stack; 0 for none.
at::Tensor grad_norm_fp32(const std::vector<at::Tensor>& grads, double norm_type, const at::TensorOptions& zero) {
  if (grads.empty()) return at::zeros({}, zero);
  std::vector<at::Tensor> norms;
  norms.reserve(grads.size());
  for (const auto& g : grads) norms.push_back(at::linalg_vector_norm(g.detach(), norm_type, c10::nullopt, false, at::kFloat));
  return at::linalg_vector_norm(at::stack(norms), norm_type, c10::nullopt, false, at::kFloat);
}

// torch's clamp(max_norm / (total + 1e-6), max=1.0), which Python computes as
// reciprocal() * max_norm, multiplied into every gradient in its own dtype,
// even when it is 1 (so a NaN norm makes every gradient NaN).
void scale_by_clamped_coefficient(const std::vector<at::Tensor>& grads, const at::Tensor& total, double max_norm) {
  const at::Tensor coef = at::clamp((total + 1e-6).reciprocal() * max_norm, c10::nullopt, 1.0);
  for (const auto& g : grads) {
    at::Tensor grad = g;
    grad.mul_(coef.to(grad.device(), grad.scalar_type()));
  }
}

// torch.nn.utils.clip_grad_norm_ over local gradients (what torch's FSDP1
// calls when no unit shards): a norm of each gradient in its own dtype (the
// gradients grouped by device and dtype, in order of first appearance, as
// _foreach_norm takes them), stacked, and the norm of the stack.
at::Tensor clip_local(const std::vector<at::Tensor>& grads, double max_norm, double norm_type,
                      bool error_if_nonfinite) {
  if (grads.empty()) return at::zeros({}, at::kFloat);
  std::vector<std::pair<c10::Device, at::ScalarType>> keys;
  std::vector<std::vector<at::Tensor>> groups;
  for (const auto& g : grads) {
    const auto key = std::make_pair(g.device(), g.scalar_type());
    const size_t i = std::find(keys.begin(), keys.end(), key) - keys.begin();
    if (i == keys.size()) {
      keys.push_back(key);
      groups.emplace_back();
    }
    groups[i].push_back(g);
  }
  std::vector<at::Tensor> norms;
  for (const auto& members : groups) {
    for (const auto& g : members) norms.push_back(at::linalg_vector_norm(g.detach(), norm_type).to(grads[0].device()));
  }
  const at::Tensor total = at::linalg_vector_norm(at::stack(norms), norm_type);
  if (error_if_nonfinite) detail::check_finite_norm(total, norm_type);
  scale_by_clamped_coefficient(grads, total, max_norm);
  return total;
}

void check_norm_type(double norm_type) {
  if (!(norm_type > 0)) {
    throw ConfigError("clip_grad_norm_: norm_type=" + std::to_string(norm_type) + " is invalid: expected p > 0 or INFINITY");
  }
}

// torch's FullyShardedDataParallel.clip_grad_norm_ (or nn.utils' when no unit
// shards); norm_type already checked by clip_grad_norm_.
at::Tensor clip_fsdp1(const std::shared_ptr<torch::nn::Module>& model, double max_norm, double norm_type,
                      bool error_if_nonfinite) {
  const bool inf = std::isinf(norm_type);
  auto units = detail::units_of(model);
  // torch's handle.uses_sharded_strategy: a unit sharded over more than one
  // rank (torch turns any strategy at a shard group of one into NO_SHARD).
  auto sharded = [](const detail::UnitState& u) {
    return u.config().shard_group && u.config().shard_group->size() > 1;
  };
  dist::ProcessGroupPtr group;
  for (auto& u : units) {
    if (!sharded(*u)) continue;
    const auto& g = u->config().shard_group;
    if (group && g != group) {
      throw ConfigError("clip_grad_norm_: the model's units shard over different process groups; "
                        "expected one shard group for the whole model");
    }
    group = g;
  }
  at::NoGradGuard no_grad;
  if (!group) {
    // Every unit is NO_SHARD: torch calls nn.utils.clip_grad_norm_ on the
    // model's parameters (flat parameters, or the original ones with
    // use_orig_params), in parameters() order.
    std::vector<at::Tensor> grads;
    std::unordered_set<const c10::TensorImpl*> seen;
    for (const auto& p : model->parameters(/*recurse=*/true)) {
      if (!seen.insert(p.unsafeGetTensorImpl()).second || !p.grad().defined()) continue;
      grads.push_back(p.grad());
    }
    return clip_local(grads, max_norm, norm_type, error_if_nonfinite);
  }
  // torch's FullyShardedDataParallel.clip_grad_norm_: the gradients of the
  // sharded units (each FlatParameter's, or with use_orig_params each
  // original parameter's part on this rank) apart from those of NO_SHARD
  // units and of parameters no unit manages, in the units' pre-order.
  std::vector<at::Tensor> sharded_grads, nonsharded_grads, all_grads;
  bool any_nonsharded = false;
  for (auto& u : units) {
    const bool s = sharded(*u);
    any_nonsharded |= !s && !u->params().empty();
    for (auto& g : u->sharded_grads()) {
      all_grads.push_back(g);
      // torch's sharded views leave .grad None where a parameter has no element on this rank.
      if (g.numel() == 0 && s && u->config().use_orig_params) continue;
      (s ? sharded_grads : nonsharded_grads).push_back(g);
    }
  }
  for (auto& p : detail::unowned_params(model)) {
    any_nonsharded = true;
    if (!p.grad().defined()) continue;
    nonsharded_grads.push_back(p.grad());
    all_grads.push_back(p.grad());
  }
  const auto zero = at::TensorOptions().dtype(at::kFloat).device(all_grads.empty() ? group->device() : all_grads[0].device());
  const at::Tensor local_sharded = grad_norm_fp32(sharded_grads, norm_type, zero);
  const at::Tensor local_nonsharded = any_nonsharded ? grad_norm_fp32(nonsharded_grads, norm_type, zero) : at::Tensor();
  at::Tensor total;
  if (inf) {
    total = local_nonsharded.defined() ? at::maximum(local_sharded, local_nonsharded) : local_sharded.clone();
    group->all_reduce(total, dist::ReduceOp::kMax).wait();
  } else {
    total = at::pow(local_sharded, norm_type);
    group->all_reduce(total, dist::ReduceOp::kSum).wait();
    // The unsharded gradients are whole on every rank: added after the sum.
    if (local_nonsharded.defined()) total.add_(at::pow(local_nonsharded, norm_type));
    total = at::pow(total, 1.0 / norm_type);
  }
  if (error_if_nonfinite) detail::check_finite_norm(total, norm_type);
  scale_by_clamped_coefficient(all_grads, total, max_norm);
  // In the dtype torch's type promotion gives the gradients (float32 for none).
  if (all_grads.empty()) return total;
  at::ScalarType dtype = all_grads[0].scalar_type();
  for (const auto& g : all_grads) dtype = c10::promoteTypes(dtype, g.scalar_type());
  return total.to(dtype);
}

}  // namespace

namespace detail {

void check_finite_norm(const at::Tensor& total, double norm_type) {
  if (at::isfinite(total).all().item<bool>()) return;
  std::ostringstream order;
  order << norm_type;
  throw Error("clip_grad_norm_: The total norm of order " + order.str() +
              " for gradients from `parameters` is non-finite, so it cannot be clipped. To disable this error and "
              "scale the gradients by the non-finite norm anyway, set `error_if_nonfinite=false`");
}

}  // namespace detail

at::Tensor clip_grad_norm_(const std::shared_ptr<torch::nn::Module>& model, double max_norm, double norm_type,
                           bool error_if_nonfinite) {
  if (!model) throw ConfigError("clip_grad_norm_: the model is null");
  // The engine that sharded the model: fully_shard's modules hold hooks that
  // are its RootEngine, FSDP1's units are core's own.
  const torch::nn::Module* fully_sharded = nullptr;
  bool fsdp1 = false;
  for (const auto& m : model->modules(/*include_self=*/true)) {
    auto slot = detail::find_slot(m.get());
    if (!slot) continue;
    fsdp1 |= detail::unit_of(*slot) != nullptr;
    if (detail::is_fully_shard(*slot) && !fully_sharded) fully_sharded = m.get();
  }
  // One range for both engines, the one documented: torch's nn.utils takes
  // any float, but a norm of order p <= 0 (or NaN) bounds nothing.
  check_norm_type(norm_type);
  if (!fully_sharded) return clip_fsdp1(model, max_norm, norm_type, error_if_nonfinite);
  if (fsdp1) detail::refuse_two_engines("clip_grad_norm_", *fully_sharded, *model);
  auto slot = detail::find_slot(model.get());
  auto* root = slot ? dynamic_cast<detail::RootEngine*>(slot->engine.get()) : nullptr;
  if (!root) {
    throw ConfigError("clip_grad_norm_: module " + fully_sharded->name() + " under " + model->name() +
                      " is sharded by fully_shard, but " + model->name() +
                      " itself is not: pass the root that fully_shard sharded last (its gradients are the model's)");
  }
  return root->clip_grad_norm_(max_norm, norm_type, error_if_nonfinite);
}

std::vector<at::Tensor> unique_parameters(const std::shared_ptr<torch::nn::Module>& model) {
  std::vector<at::Tensor> out;
  if (!model) return out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& p : model->parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  }
  return out;
}

void check_parameters_listed_once(const std::vector<std::shared_ptr<torch::nn::Module>>& models,
                                  const torch::optim::Optimizer& optimizer, const std::string& caller) {
  // Where each tensor is listed first: (group, position).
  std::unordered_map<const c10::TensorImpl*, std::pair<size_t, size_t>> first;
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto [it, fresh] = first.emplace(params[i].unsafeGetTensorImpl(), std::make_pair(g, i));
      if (fresh) continue;
      std::vector<std::string> names;  // the tensor's names in the models, in parameters() order
      for (const auto& model : models) {
        if (!model) continue;
        for (const auto& item : model->named_parameters()) {
          if (item.value().unsafeGetTensorImpl() == it->first) names.push_back(item.key());
        }
      }
      std::ostringstream what;
      if (names.empty()) {
        what << "a tensor of shape " << params[i].sizes() << " (no parameter of the model)";
      } else {
        what << "parameter '" << names[0] << "'";
        for (size_t n = 1; n < names.size(); ++n) what << (n == 1 ? " (also named '" : ", '") << names[n] << "'";
        if (names.size() > 1) what << ")";
      }
      const auto [g0, i0] = it->second;
      std::ostringstream where;
      if (g0 == g) {
        where << "in param group " << g << " at positions " << i0 << " and " << i;
      } else {
        where << "in param groups " << g0 << " (position " << i0 << ") and " << g << " (position " << i << ")";
      }
      throw ConfigError(caller + ": the optimizer lists " + what.str() + " twice, " + where.str() +
                        ", and would step it twice per step. LibTorch's Module::parameters() lists a tied parameter "
                        "once per name (PyTorch's lists it once): build the optimizer on "
                        "fsdp::unique_parameters(model), and list each tensor in one param group only");
    }
  }
}

void check_optimizer(const std::shared_ptr<torch::nn::Module>& model, const torch::optim::Optimizer& optimizer) {
  check_optimizer(std::vector<std::shared_ptr<torch::nn::Module>>{model}, optimizer);
}

void check_optimizer(const std::vector<std::shared_ptr<torch::nn::Module>>& models,
                     const torch::optim::Optimizer& optimizer) {
  check_parameters_listed_once(models, optimizer, "check_optimizer");
  std::unordered_set<const c10::TensorImpl*> fsdp_params;
  bool sharded = false;
  for (const auto& model : models) {
    // FSDP2: the parameter objects stay the module's own (each holds its rows).
    for (const auto& m : model ? model->modules(/*include_self=*/true) : std::vector<std::shared_ptr<torch::nn::Module>>{}) {
      auto slot = detail::find_slot(m.get());
      if (!slot || !detail::is_fully_shard(*slot)) continue;
      sharded = true;
      for (const auto& p : m->parameters()) fsdp_params.insert(p.unsafeGetTensorImpl());
    }
    const auto units = detail::units_of(model);
    sharded |= !units.empty();
    for (auto& u : units) {
      if (u->config().use_orig_params) {
        for (const auto& p : u->params()) fsdp_params.insert(p.param.unsafeGetTensorImpl());
      } else {
        fsdp_params.insert(u->flat_shard().unsafeGetTensorImpl());
      }
    }
  }
  bool found = false;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      if (fsdp_params.count(p.unsafeGetTensorImpl())) found = true;
    }
  }
  if (sharded && dynamic_cast<const torch::optim::LBFGS*>(&optimizer)) {
    throw ConfigError("check_optimizer: torch::optim::LBFGS cannot step a sharded model: its line search and history "
                      "take dot products and norms over all parameters, and each rank holds only its shards. Use an "
                      "elementwise optimizer: fsdp::optim::AdamW, torch::optim::SGD, Adam, AdamW, Adagrad or RMSprop");
  }
  if (found) return;
  throw ConfigError(
      "The optimizer does not seem to reference any FSDP parameters. HINT: Make sure to create the optimizer after "
      "setting up the model.");
}

bool float16_compute_available(at::DeviceType device_type) {
  static std::mutex mu;
  static std::map<at::DeviceType, bool> known;
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(device_type);
  if (it != known.end()) return it->second;
  bool ok = true;
  try {
    at::AutoGradMode grad(true);  // backward kernels too
    const auto opts = at::TensorOptions().dtype(at::kHalf).device(device_type);
    at::Tensor x = at::ones({2, 4}, opts);
    at::Tensor w = at::ones({4, 4}, opts).requires_grad_(true);
    at::Tensor h = at::gelu(at::matmul(x, w)).tanh();
    h = at::layer_norm(at::softmax(h, -1), {4}, at::ones({4}, opts), at::zeros({4}, opts));
    at::cross_entropy_loss(h, at::zeros({2}, at::TensorOptions().dtype(at::kLong).device(device_type))).backward();
  } catch (const std::exception&) {
    ok = false;  // "... not implemented for 'Half'"
  }
  known[device_type] = ok;
  return ok;
}

double resident_memory_mib() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  long pages = 0, resident = 0;
  if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  std::fclose(f);
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

namespace {
std::shared_ptr<detail::RootState> shared_of(const std::shared_ptr<torch::nn::Module>& model) {
  for (auto& u : detail::units_of(model)) {
    if (u->root_state()) return u->root_state();
  }
  return nullptr;
}
}  // namespace

RuntimeStats runtime_stats(const std::shared_ptr<torch::nn::Module>& model) {
  auto shared = shared_of(model);
  return shared ? shared->stats : RuntimeStats{};
}

void reset_runtime_stats(const std::shared_ptr<torch::nn::Module>& model) {
  auto shared = shared_of(model);
  if (!shared) return;
  RuntimeStats& st = shared->stats;
  const int gathers = st.all_gathers_in_flight, reductions = st.reductions_in_flight;
  st = RuntimeStats{};
  st.all_gathers_in_flight = st.peak_all_gathers_in_flight = gathers;
  st.reductions_in_flight = st.peak_reductions_in_flight = reductions;
}

MemoryStats memory_stats(const std::shared_ptr<torch::nn::Module>& module) {
  MemoryStats s;
  for (auto& [path, m] : fsdp_modules(module)) {
    auto unit = detail::unit_of(*detail::find_slot(m.get()));
    const int64_t item = unit->flat_shard().element_size();
    s.sharded_param_bytes += unit->flat_shard().numel() * item;
    s.unsharded_param_bytes += unit->live_full_param_bytes();
    s.grad_bytes += unit->live_grad_bytes();
    s.largest_unit_bytes = std::max(s.largest_unit_bytes, unit->padded_numel() * item);
  }
  return s;
}

}  // namespace fsdp
