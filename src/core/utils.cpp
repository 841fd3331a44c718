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

#include "fsdp/error.h"
#include "fsdp/core/utils.h"
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

at::Tensor clip_grad_norm_(const std::shared_ptr<torch::nn::Module>& model, double max_norm, double norm_type,
                           bool error_if_nonfinite) {
  if (!(norm_type > 0)) {
    throw ConfigError("clip_grad_norm_: norm_type=" + std::to_string(norm_type) + " is invalid: expected p > 0 or INFINITY");
  }
  const bool inf = std::isinf(norm_type);
  auto units = detail::units_of(model);
  dist::ProcessGroupPtr group;
  for (auto& u : units) {
    const auto& g = u->config().shard_group;
    if (group && g && g != group) {
      throw ConfigError("clip_grad_norm_: the model's units shard over different process groups; "
                        "expected one shard group for the whole model");
    }
    if (g) group = g;
  }
  at::NoGradGuard no_grad;
  // Each shard counted once: sum over the shard group only (replicas hold copies).
  auto accumulate = [&](const std::vector<at::Tensor>& grads) {
    double acc = 0;
    for (const auto& g : grads) {
      if (g.numel() == 0) continue;
      at::Tensor a = g.detach().to(at::kDouble).abs();
      acc = inf ? std::max(acc, a.max().item<double>()) : acc + a.pow(norm_type).sum().item<double>();
    }
    return acc;
  };
  std::vector<at::Tensor> sharded;
  for (auto& u : units) {
    for (auto& g : u->sharded_grads()) sharded.push_back(g);
  }
  at::Tensor total = at::full({1}, accumulate(sharded), at::TensorOptions().dtype(at::kDouble));
  if (group && group->size() > 1) group->all_reduce(total, inf ? dist::ReduceOp::kMax : dist::ReduceOp::kSum).wait();
  std::vector<at::Tensor> local;
  for (auto& p : detail::unowned_params(model)) {
    if (p.grad().defined()) local.push_back(p.grad());
  }
  double t = total.item<double>();
  const double l = accumulate(local);
  t = inf ? std::max(t, l) : std::pow(t + l, 1.0 / norm_type);
  if (error_if_nonfinite && !std::isfinite(t)) {
    std::ostringstream order;
    order << norm_type;
    throw Error("clip_grad_norm_: The total norm of order " + order.str() +
                " for gradients from `parameters` is non-finite, so it cannot be clipped. To disable this error and "
                "scale the gradients by the non-finite norm anyway, set `error_if_nonfinite=false`");
  }
  const double coef = max_norm / (t + 1e-6);
  if (coef < 1.0) {
    for (auto& g : sharded) g.mul_(coef);
    for (auto& g : local) g.mul_(coef);
  }
  return at::scalar_tensor(t, at::TensorOptions().dtype(at::kFloat));
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
      if (!slot || !slot->hooks) continue;
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
    auto unit = detail::find_slot(m.get())->unit;
    const int64_t item = unit->flat_shard().element_size();
    s.sharded_param_bytes += unit->flat_shard().numel() * item;
    s.unsharded_param_bytes += unit->live_full_param_bytes();
    s.grad_bytes += unit->live_grad_bytes();
    s.largest_unit_bytes = std::max(s.largest_unit_bytes, unit->padded_numel() * item);
  }
  return s;
}

}  // namespace fsdp
