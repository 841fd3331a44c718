// Optimizer state dicts keyed by parameter names, full or sharded.
#include "fsdp/state_dict/optim_state_dict.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim.h>

#include <algorithm>
#include <unordered_map>
#include <utility>

#include "fsdp/error.h"
#include "model_index.h"
#include "optim_naming.h"
#include "fsdp/state_dict/detail/visit.h"
#include "fsdp/state_dict/detail/optimizer_kinds.h"

namespace fsdp {

using namespace detail;
using torch::optim::OptimizerParamState;
using Kind = OptimizerKind;

namespace {

// FULL: one engine gather's keys that the optimizer steps (an FSDP1 unit's
// original parameters, an FSDP2 parameter), in member order: the state that
// holds each and where its local elements begin there.
struct Member {
  const Item* item;
  OptimizerParamState* state;  // null: none on this rank yet
  int64_t at;
};
struct Group {
  const FullGather* gather;
  std::vector<Member> members;
};
// Groups whose flags of "which state exists" travel in one exchange, in the
// order the optimizer first names them.
struct Batch {
  const FlagExchange* exchange;
  std::vector<Group> groups;
  bool done = false;
};

// The engine gather an optimizer tensor's keys go through (null: whole on
// every rank).
const FullGather* gather_of(const OptParam& op) { return op.items.empty() ? nullptr : op.items.front()->full.get(); }

// FULL: the batches of every gathered optimizer tensor, by exchange.
std::vector<Batch> batches_of(const torch::optim::Optimizer& opt, const std::vector<std::vector<OptParam>>& groups,
                              std::unordered_map<const FlagExchange*, size_t>& batch_at) {
  std::vector<Batch> out;
  std::unordered_map<const FullGather*, std::pair<size_t, size_t>> group_at;  // (batch, group)
  for (const auto& group : groups) {
    for (const auto& op : group) {
      if (!gather_of(op)) continue;
      OptimizerParamState* st = state_of(opt, op.tensor);
      for (size_t i = 0; i < op.items.size(); ++i) {
        const FullGather* g = op.items[i]->full.get();
        auto at = group_at.find(g);
        if (at == group_at.end()) {
          auto [b, fresh] = batch_at.emplace(&g->flags(), out.size());
          if (fresh) out.push_back(Batch{&g->flags(), {}});
          out[b->second].groups.push_back(Group{g, {}});
          at = group_at.emplace(g, std::make_pair(b->second, out[b->second].groups.size() - 1)).first;
        }
        out[at->second.first].groups[at->second.second].members.push_back(Member{op.items[i], st, op.at[i]});
      }
    }
  }
  for (auto& b : out) {
    for (auto& g : b.groups) {
      std::stable_sort(g.members.begin(), g.members.end(),
                       [](const Member& x, const Member& y) { return x.item->member < y.item->member; });
    }
  }
  return out;
}

// FULL: a batch's state, gathered group by group and field by field (one
// group-sized buffer alive at a time), after one exchange of which fields
// any rank has and the largest step of each key.
void gather_batch(const Kind& kind, const Batch& b, bool emit, bool to_cpu, bool copy, const StateSink& out) {
  const size_t nf = kind.fields.size();
  const int64_t width = static_cast<int64_t>(nf) + 1;
  std::vector<FlagMember> keys;
  for (const auto& g : b.groups) {
    for (const auto& m : g.members) keys.push_back(FlagMember{&m.item->key, &m.item->value.mesh()});
  }
  // Per key: whether each field is present, then step + 1 (0: none).
  at::Tensor info = at::zeros({static_cast<int64_t>(keys.size()) * width}, at::kDouble);
  auto mine = info.accessor<double, 1>();
  int64_t row = 0;
  for (const auto& g : b.groups) {
    for (const auto& m : g.members) {
      for (size_t f = 0; f < nf && m.state; ++f) {
        if (kind.get(*m.state, kind.fields[f]).defined()) mine[row * width + static_cast<int64_t>(f)] = 1.0;
      }
      if (m.state && kind.has_step) mine[row * width + width - 1] = static_cast<double>(kind.get_step(*m.state) + 1);
      ++row;
    }
  }
  const at::Tensor merged = b.exchange->max_over_ranks(info, keys).contiguous();  // [collective]
  auto flag = merged.accessor<double, 1>();  // any rank's flag, largest step
  at::NoGradGuard no_grad;
  row = 0;
  for (const auto& g : b.groups) {
    const int64_t n = static_cast<int64_t>(g.members.size());
    for (size_t f = 0; f < nf; ++f) {
      const auto flagged = [&](int64_t j) { return flag[(row + j) * width + static_cast<int64_t>(f)] > 0; };
      bool any = false;
      for (int64_t j = 0; j < n; ++j) any |= flagged(j);
      if (!any) continue;  // the field exists nowhere (e.g. max_exp_avg_sq without amsgrad)
      std::unordered_map<OptimizerParamState*, at::Tensor> sources;  // one per optimizer tensor
      std::vector<StatePart> parts;
      for (const auto& m : g.members) {
        auto src = sources.find(m.state);
        if (src == sources.end()) {
          const at::Tensor t = m.state ? kind.get(*m.state, kind.fields[f]) : at::Tensor();
          src = sources.emplace(m.state, t.defined() ? t.detach().reshape({-1}) : at::Tensor()).first;
        }
        parts.push_back(StatePart{m.item->member, src->second, m.at});
      }
      const std::vector<at::Tensor> full = g.gather->gather_state(parts);  // [collective]
      for (int64_t j = 0; emit && j < n; ++j) {
        if (!flagged(j)) continue;
        const at::Tensor& t = full[static_cast<size_t>(j)];
        out(g.members[static_cast<size_t>(j)].item->key + "." + kind.fields[f],
            offload(copy && g.gather->views() ? t.clone() : t, to_cpu));
      }
    }
    for (int64_t j = 0; emit && kind.has_step && j < n; ++j) {
      const double step = flag[(row + j) * width + width - 1];
      if (step > 0) out(g.members[static_cast<size_t>(j)].item->key + ".step", step_tensor(static_cast<int64_t>(step) - 1));
    }
    row += n;
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
  // FULL: each engine gather's keys are gathered when the optimizer first
  // names one of them, with every other group of its batch (FSDP1: a unit;
  // FSDP2: every parameter, after one exchange of what exists).
  std::unordered_map<const FlagExchange*, size_t> batch_at;
  std::vector<Batch> batches = full ? batches_of(optimizer, groups, batch_at) : std::vector<Batch>{};
  for (const auto& group : groups) {
    for (const auto& op : group) {
      const FullGather* g = full ? gather_of(op) : nullptr;
      if (!g) {
        if (emit || !full) local_state(kind, optimizer, op, full, to_cpu, sink);
        continue;
      }
      Batch& b = batches[batch_at.at(&g->flags())];
      if (b.done) continue;
      b.done = true;
      gather_batch(kind, b, emit, to_cpu, copy, sink);
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
