// Optimizer state dicts keyed by parameter names, full or sharded.
#include "fsdp/state_dict/optim_state_dict.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim.h>

#include <algorithm>
#include <unordered_set>
#include <utility>

#include "fsdp/error.h"
#include "model_index.h"
#include "optim_naming.h"
#include "fsdp/state_dict/detail/visit.h"
#include "fsdp/state_dict/detail/optimizer_kinds.h"
#include "shard_geometry.h"
#include "fsdp/core/detail/unit_view.h"
#include "fsdp/core/utils.h"

namespace fsdp {

using namespace detail;
using torch::optim::OptimizerParamState;
using Kind = OptimizerKind;

namespace {

// FULL: the state of one unit's parameters, gathered over its shard group.
void gather_unit(const Kind& kind, const torch::optim::Optimizer& opt, const Naming& naming, const UnitView& u,
                 const std::vector<OptParam>& in_optimizer, bool emit, bool to_cpu, bool copy, const StateSink& out) {
  // The unit's parameters the optimizer holds state for, in unit order.
  std::vector<const ParamInfo*> ps;
  std::vector<OptimizerParamState*> states;
  const bool flat = !in_optimizer.front().param;
  OptimizerParamState* flat_state = flat ? state_of(opt, in_optimizer.front().tensor) : nullptr;
  for (const auto& q : u.params()) {
    if (flat) {
      ps.push_back(&q);
      states.push_back(flat_state);
      continue;
    }
    for (const auto& op : in_optimizer) {
      if (op.param == &q) {
        ps.push_back(&q);
        states.push_back(state_of(opt, op.tensor));
      }
    }
  }
  const size_t nf = kind.fields.size();
  const int64_t width = static_cast<int64_t>(nf) + 1;
  // Per parameter: whether each field is present, then step + 1 (0: none).
  at::Tensor info = at::zeros({static_cast<int64_t>(ps.size()) * width}, at::kDouble);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < ps.size(); ++i) {
    if (!states[i]) continue;
    for (size_t f = 0; f < nf; ++f) {
      if (kind.get(*states[i], kind.fields[f]).defined()) info[static_cast<int64_t>(i) * width + static_cast<int64_t>(f)] = 1.0;
    }
    if (kind.has_step) info[static_cast<int64_t>(i) * width + width - 1] = static_cast<double>(kind.get_step(*states[i]) + 1);
  }
  const auto& group = u.shard_group();
  const bool sharded = u.shard_size() > 1;
  at::Tensor all_info = info;
  if (sharded) {  // [collective] presence and steps of every rank
    all_info = at::empty({info.numel() * u.shard_size()}, info.options());
    group->all_gather(all_info, info).wait();
  }
  at::Tensor merged = all_info.view({-1, info.numel()}).amax(0);  // any rank's flag, largest step
  const at::Tensor& shard = u.flat_shard();
  // One field at a time, so that one unit-sized buffer is alive.
  for (size_t f = 0; f < nf; ++f) {
    bool any = false;
    for (size_t i = 0; i < ps.size(); ++i) any |= merged[static_cast<int64_t>(i) * width + static_cast<int64_t>(f)].item<double>() > 0;
    if (!any) continue;  // the field exists nowhere (e.g. max_exp_avg_sq without amsgrad)
    // This rank's part, laid out like the flat shard: the flat parameter's
    // state tensor itself, or the original parameters' states put in place.
    at::Tensor local;
    if (flat && flat_state && kind.get(*flat_state, kind.fields[f]).defined()) {
      local = kind.get(*flat_state, kind.fields[f]).detach().reshape({-1});
    } else {
      local = at::zeros({shard.numel()}, shard.options().requires_grad(false));
      for (size_t i = 0; i < ps.size() && !flat; ++i) {
        if (!states[i]) continue;
        at::Tensor t = kind.get(*states[i], kind.fields[f]);
        if (!t.defined()) continue;
        auto [lo, hi] = local_range(u, *ps[i]);
        if (hi > lo) local.narrow(0, shard_index(u, *ps[i], lo), hi - lo).copy_(t.reshape({-1}));
      }
    }
    at::Tensor full = local;
    if (sharded) {  // [collective] one gather per unit and field
      full = at::empty({u.padded_numel()}, local.options());
      group->all_gather_unbuffered(full, local);
    }
    if (!emit) continue;
    for (size_t i = 0; i < ps.size(); ++i) {
      if (merged[static_cast<int64_t>(i) * width + static_cast<int64_t>(f)].item<double>() == 0) continue;
      at::Tensor view = param_view(full, *ps[i]);
      out(naming.owned.at(ps[i]) + "." + kind.fields[f], offload(copy ? view.clone() : view, to_cpu));
    }
  }
  if (!emit || !kind.has_step) return;
  for (size_t i = 0; i < ps.size(); ++i) {
    const double step = merged[static_cast<int64_t>(i) * width + width - 1].item<double>();
    if (step > 0) out(naming.owned.at(ps[i]) + ".step", step_tensor(static_cast<int64_t>(step) - 1));
  }
}

// FULL: the state of the FSDP2 parameters `ps` (in the optimizer's order),
// gathered one tensor at a time over their shard group. One all-reduce first
// finds, for each parameter, the fields any rank has and the largest step.
void gather_rows(const Kind& kind, const torch::optim::Optimizer& opt, const std::vector<OptParam>& ps, bool emit,
                 bool to_cpu, const StateSink& out) {
  if (ps.empty()) return;
  const auto& group = ps.front().rows->mesh.shard_group();
  for (const auto& op : ps) {
    if (op.rows->mesh.shard_group() != group) {
      throw ConfigError("optim_state_dict: the fully_shard parameters " + ps.front().items[0]->key + " and " +
                        op.items[0]->key + " are sharded over different meshes; a FULL optimizer state dict needs one mesh");
    }
  }
  const size_t nf = kind.fields.size();
  const int64_t width = static_cast<int64_t>(nf) + 1;
  at::Tensor info = at::zeros({static_cast<int64_t>(ps.size()) * width}, at::kDouble);
  for (size_t i = 0; i < ps.size(); ++i) {
    OptimizerParamState* st = state_of(opt, ps[i].tensor);
    if (!st) continue;
    const int64_t base = static_cast<int64_t>(i) * width;
    for (size_t f = 0; f < nf; ++f) {
      if (kind.get(*st, kind.fields[f]).defined()) info[base + static_cast<int64_t>(f)] = 1.0;
    }
    if (kind.has_step) info[base + width - 1] = static_cast<double>(kind.get_step(*st) + 1);
  }
  if (group->size() > 1) group->all_reduce(info, dist::ReduceOp::kMax).wait();  // [collective]
  auto flags = info.accessor<double, 1>();
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < ps.size(); ++i) {
    const OptParam& op = ps[i];
    const int64_t base = static_cast<int64_t>(i) * width;
    OptimizerParamState* st = state_of(opt, op.tensor);
    for (size_t f = 0; f < nf; ++f) {
      if (flags[base + static_cast<int64_t>(f)] == 0) continue;
      at::Tensor t = st ? kind.get(*st, kind.fields[f]) : at::Tensor();
      if (!t.defined()) t = at::zeros_like(op.rows->local);
      at::Tensor full = op.rows->gather(t.detach());  // [collective]
      if (emit) out(op.items[0]->key + "." + kind.fields[f], offload(full, to_cpu));
    }
    if (emit && kind.has_step && flags[base + width - 1] > 0) {
      out(op.items[0]->key + ".step", step_tensor(static_cast<int64_t>(flags[base + width - 1]) - 1));
    }
  }
}

// SHARDED, or FULL for a parameter outside every unit: this rank's state of
// one optimizer tensor, for each key it stands for: its boxes cut from the
// state tensor (a tensor whole on every rank as it is).
void local_state(const Kind& kind, const torch::optim::Optimizer& opt, const OptParam& op, bool full, bool to_cpu,
                 const StateSink& out) {
  OptimizerParamState* st = state_of(opt, op.tensor);
  if (!st) return;
  for (size_t i = 0; i < op.items.size(); ++i) {
    const Item& item = *op.items[i];
    for (const auto& f : kind.fields) {
      at::Tensor t = kind.get(*st, f);
      if (!t.defined()) continue;
      t = t.detach();
      if (item.whole()) {
        out(item.key + "." + f, offload(full ? t.clone() : t, to_cpu));
        continue;
      }
      ShardedTensor value{item.value.shape(), t.scalar_type(), cut(item, t.reshape({-1}), op.at[i])};
      for (auto& s : value.local_shards) s.tensor = offload(s.tensor, to_cpu);
      out(item.key + "." + f, std::move(value));
    }
    if (kind.has_step) out(item.key + ".step", step_tensor(kind.get_step(*st)));
  }
}

}  // namespace

namespace detail {

std::vector<OptimParamGroup> visit_optim_state_dict(const std::shared_ptr<torch::nn::Module>& model,
                                                   const torch::optim::Optimizer& optimizer, const StateSink& sink,
                                                   bool copy) {
  if (!model) throw ConfigError("optim_state_dict: the model is null");
  const Kind kind = kind_of(optimizer);
  Naming naming(model);
  check_idle(naming.idx, "optim_state_dict");
  auto [type, config] = model_type(naming.idx);
  if (type == StateDictType::kLocal) {
    throw ConfigError("optim_state_dict: LOCAL_STATE_DICT has no optimizer form: use FULL_STATE_DICT or "
                      "SHARDED_STATE_DICT (StateDictTypeGuard)");
  }
  const bool full = type == StateDictType::kFull;
  const bool to_cpu = offload_of(config);
  bool emit = true;
  if (full && std::get<FullStateDictConfig>(config).rank0_only &&
      (!naming.idx.units.empty() || !naming.idx.groups.empty())) {
    emit = world_rank(naming.idx) == 0;
  }
  const auto groups = classify_all(model, naming, optimizer, "optim_state_dict");
  std::vector<OptimParamGroup> out;
  std::unordered_set<const UnitView*> done;
  if (full) {  // FSDP2 parameters, all together (one exchange of what exists)
    std::vector<OptParam> rows;
    for (const auto& group : groups) {
      for (const auto& op : group) {
        if (op.rows) rows.push_back(op);
      }
    }
    gather_rows(kind, optimizer, rows, emit, to_cpu, sink);
  }
  for (const auto& group : groups) {
    for (const auto& op : group) {
      if (full && op.rows) continue;
      if (!full || !op.unit) {
        if (emit || !full) local_state(kind, optimizer, op, full, to_cpu, sink);
        continue;
      }
      if (!done.insert(op.unit).second) continue;
      std::vector<OptParam> of_unit;  // every optimizer tensor of this unit
      for (const auto& g : groups) {
        for (const auto& x : g) {
          if (x.unit == op.unit) of_unit.push_back(x);
        }
      }
      gather_unit(kind, optimizer, naming, *op.unit, of_unit, emit, to_cpu, copy, sink);
    }
  }
  if (!emit) return out;
  for (size_t g = 0; g < groups.size(); ++g) {
    OptimParamGroup pg;
    for (const auto& op : groups[g]) {
      for (auto& n : naming.names(op)) pg.params.push_back(n);
    }
    pg.options = kind.read(optimizer.param_groups()[g].options());
    out.push_back(std::move(pg));
  }
  return out;
}

std::vector<std::vector<std::string>> optimizer_param_names(const std::shared_ptr<torch::nn::Module>& model,
                                                           const torch::optim::Optimizer& optimizer) {
  const Naming naming(model);
  std::vector<std::vector<std::string>> out;
  for (const auto& group : classify_all(model, naming, optimizer, "optimizer_param_names")) {
    auto& names = out.emplace_back();
    for (const auto& p : group) {
      for (auto& n : naming.names(p)) names.push_back(std::move(n));
    }
    std::sort(names.begin(), names.end(),
              [&](const std::string& a, const std::string& b) { return naming.position.at(a) < naming.position.at(b); });
  }
  return out;
}

}  // namespace detail

OptimStateDict optim_state_dict(const std::shared_ptr<torch::nn::Module>& model,
                                const torch::optim::Optimizer& optimizer) {
  OptimStateDict out;
  out.param_groups = visit_optim_state_dict(model, optimizer, [&](const std::string& key, StateValue v) {
    out.state.insert(key, std::move(v));
  });
  return out;
}

}  // namespace fsdp
