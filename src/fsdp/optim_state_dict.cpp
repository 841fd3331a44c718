// Optimizer state dicts keyed by parameter names, full or sharded.
#include "fsdp/optim_state_dict.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim.h>

#include <functional>
#include <sstream>
#include <type_traits>
#include <utility>

#include "fsdp/error.h"
#include "state_dict_walk.h"
#include "unit.h"

namespace fsdp {

using namespace detail;
using torch::optim::OptimizerOptions;
using torch::optim::OptimizerParamState;

namespace {

using Options = std::map<std::string, double>;

// What fsdp-cpp knows of one LibTorch optimizer type.
struct Kind {
  std::string name;
  std::vector<std::string> fields;  // per-parameter tensors, shaped like the parameter
  bool has_step = false;
  std::function<std::unique_ptr<OptimizerParamState>()> make;
  std::function<at::Tensor(OptimizerParamState&, const std::string&)> get;
  std::function<void(OptimizerParamState&, const std::string&, const at::Tensor&)> set;
  std::function<int64_t(OptimizerParamState&)> get_step;
  std::function<void(OptimizerParamState&, int64_t)> set_step;
  std::function<Options(const OptimizerOptions&)> read;
  std::function<void(OptimizerOptions&, const Options&)> write;
};

// Sets option `key` through `setter` when `o` has it.
template <class F>
void maybe(const Options& o, const char* key, F setter) {
  auto it = o.find(key);
  if (it != o.end()) setter(it->second);
}

template <class State>
void with_step(Kind& k) {
  k.has_step = true;
  k.get_step = [](OptimizerParamState& s) { return static_cast<State&>(s).step(); };
  k.set_step = [](OptimizerParamState& s, int64_t v) { static_cast<State&>(s).step(v); };
}

Kind sgd_kind() {
  using S = torch::optim::SGDParamState;
  using O = torch::optim::SGDOptions;
  Kind k;
  k.name = "SGD";
  k.fields = {"momentum_buffer"};
  k.make = [] { return std::make_unique<S>(); };
  k.get = [](OptimizerParamState& s, const std::string&) { return static_cast<S&>(s).momentum_buffer(); };
  k.set = [](OptimizerParamState& s, const std::string&, const at::Tensor& t) { static_cast<S&>(s).momentum_buffer(t); };
  k.read = [](const OptimizerOptions& base) {
    const auto& o = static_cast<const O&>(base);
    return Options{{"lr", o.lr()},
                   {"momentum", o.momentum()},
                   {"dampening", o.dampening()},
                   {"weight_decay", o.weight_decay()},
                   {"nesterov", o.nesterov() ? 1.0 : 0.0}};
  };
  k.write = [](OptimizerOptions& base, const Options& m) {
    auto& o = static_cast<O&>(base);
    maybe(m, "lr", [&](double v) { o.lr(v); });
    maybe(m, "momentum", [&](double v) { o.momentum(v); });
    maybe(m, "dampening", [&](double v) { o.dampening(v); });
    maybe(m, "weight_decay", [&](double v) { o.weight_decay(v); });
    maybe(m, "nesterov", [&](double v) { o.nesterov(v != 0); });
  };
  return k;
}

// Adam and AdamW share their state and options' shape.
template <class S, class O>
Kind adam_kind(const char* name) {
  Kind k;
  k.name = name;
  k.fields = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  with_step<S>(k);
  k.make = [] { return std::make_unique<S>(); };
  k.get = [](OptimizerParamState& base, const std::string& f) {
    auto& s = static_cast<S&>(base);
    return f == "exp_avg" ? s.exp_avg() : f == "exp_avg_sq" ? s.exp_avg_sq() : s.max_exp_avg_sq();
  };
  k.set = [](OptimizerParamState& base, const std::string& f, const at::Tensor& t) {
    auto& s = static_cast<S&>(base);
    if (f == "exp_avg") {
      s.exp_avg(t);
    } else if (f == "exp_avg_sq") {
      s.exp_avg_sq(t);
    } else {
      s.max_exp_avg_sq(t);
    }
  };
  k.read = [](const OptimizerOptions& base) {
    const auto& o = static_cast<const O&>(base);
    return Options{{"lr", o.lr()},
                   {"betas.0", std::get<0>(o.betas())},
                   {"betas.1", std::get<1>(o.betas())},
                   {"eps", o.eps()},
                   {"weight_decay", o.weight_decay()},
                   {"amsgrad", o.amsgrad() ? 1.0 : 0.0}};
  };
  k.write = [](OptimizerOptions& base, const Options& m) {
    auto& o = static_cast<O&>(base);
    maybe(m, "lr", [&](double v) { o.lr(v); });
    maybe(m, "betas.0", [&](double v) { o.betas(std::make_tuple(v, std::get<1>(o.betas()))); });
    maybe(m, "betas.1", [&](double v) { o.betas(std::make_tuple(std::get<0>(o.betas()), v)); });
    maybe(m, "eps", [&](double v) { o.eps(v); });
    maybe(m, "weight_decay", [&](double v) { o.weight_decay(v); });
    maybe(m, "amsgrad", [&](double v) { o.amsgrad(v != 0); });
  };
  return k;
}

Kind adagrad_kind() {
  using S = torch::optim::AdagradParamState;
  using O = torch::optim::AdagradOptions;
  Kind k;
  k.name = "Adagrad";
  k.fields = {"sum"};
  with_step<S>(k);
  k.make = [] { return std::make_unique<S>(); };
  k.get = [](OptimizerParamState& s, const std::string&) { return static_cast<S&>(s).sum(); };
  k.set = [](OptimizerParamState& s, const std::string&, const at::Tensor& t) { static_cast<S&>(s).sum(t); };
  k.read = [](const OptimizerOptions& base) {
    const auto& o = static_cast<const O&>(base);
    return Options{{"lr", o.lr()},
                   {"lr_decay", o.lr_decay()},
                   {"weight_decay", o.weight_decay()},
                   {"initial_accumulator_value", o.initial_accumulator_value()},
                   {"eps", o.eps()}};
  };
  k.write = [](OptimizerOptions& base, const Options& m) {
    auto& o = static_cast<O&>(base);
    maybe(m, "lr", [&](double v) { o.lr(v); });
    maybe(m, "lr_decay", [&](double v) { o.lr_decay(v); });
    maybe(m, "weight_decay", [&](double v) { o.weight_decay(v); });
    maybe(m, "initial_accumulator_value", [&](double v) { o.initial_accumulator_value(v); });
    maybe(m, "eps", [&](double v) { o.eps(v); });
  };
  return k;
}

Kind rmsprop_kind() {
  using S = torch::optim::RMSpropParamState;
  using O = torch::optim::RMSpropOptions;
  Kind k;
  k.name = "RMSprop";
  k.fields = {"square_avg", "momentum_buffer", "grad_avg"};
  with_step<S>(k);
  k.make = [] { return std::make_unique<S>(); };
  k.get = [](OptimizerParamState& base, const std::string& f) {
    auto& s = static_cast<S&>(base);
    return f == "square_avg" ? s.square_avg() : f == "momentum_buffer" ? s.momentum_buffer() : s.grad_avg();
  };
  k.set = [](OptimizerParamState& base, const std::string& f, const at::Tensor& t) {
    auto& s = static_cast<S&>(base);
    if (f == "square_avg") {
      s.square_avg(t);
    } else if (f == "momentum_buffer") {
      s.momentum_buffer(t);
    } else {
      s.grad_avg(t);
    }
  };
  k.read = [](const OptimizerOptions& base) {
    const auto& o = static_cast<const O&>(base);
    return Options{{"lr", o.lr()},
                   {"alpha", o.alpha()},
                   {"eps", o.eps()},
                   {"weight_decay", o.weight_decay()},
                   {"momentum", o.momentum()},
                   {"centered", o.centered() ? 1.0 : 0.0}};
  };
  k.write = [](OptimizerOptions& base, const Options& m) {
    auto& o = static_cast<O&>(base);
    maybe(m, "lr", [&](double v) { o.lr(v); });
    maybe(m, "alpha", [&](double v) { o.alpha(v); });
    maybe(m, "eps", [&](double v) { o.eps(v); });
    maybe(m, "weight_decay", [&](double v) { o.weight_decay(v); });
    maybe(m, "momentum", [&](double v) { o.momentum(v); });
    maybe(m, "centered", [&](double v) { o.centered(v != 0); });
  };
  return k;
}

Kind kind_of(const torch::optim::Optimizer& opt) {
  if (dynamic_cast<const torch::optim::SGD*>(&opt)) return sgd_kind();
  if (dynamic_cast<const torch::optim::AdamW*>(&opt)) {
    return adam_kind<torch::optim::AdamWParamState, torch::optim::AdamWOptions>("AdamW");
  }
  if (dynamic_cast<const torch::optim::Adam*>(&opt)) {
    return adam_kind<torch::optim::AdamParamState, torch::optim::AdamOptions>("Adam");
  }
  if (dynamic_cast<const torch::optim::Adagrad*>(&opt)) return adagrad_kind();
  if (dynamic_cast<const torch::optim::RMSprop*>(&opt)) return rmsprop_kind();
  throw ConfigError("optim_state_dict: unsupported optimizer type: expected torch::optim::SGD, Adam, AdamW, "
                    "Adagrad or RMSprop");
}

// The key of a parameter's state in Optimizer::state(): its TensorImpl's
// address, printed (LibTorch 1.x, std::string keys) or as is (2.2+, void*).
using StateKey = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;
template <class Key = StateKey>
Key state_key(const at::Tensor& t) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;  // how LibTorch 1.x prints it (c10::guts::to_string)
    key << static_cast<const void*>(t.unsafeGetTensorImpl());
    return key.str();
  } else {
    return static_cast<Key>(t.unsafeGetTensorImpl());
  }
}

OptimizerParamState* state_of(const torch::optim::Optimizer& opt, const at::Tensor& t) {
  auto it = opt.state().find(state_key(t));
  return it == opt.state().end() ? nullptr : it->second.get();
}

// One tensor the optimizer steps, and what it is in the model.
struct OptParam {
  at::Tensor tensor;
  UnitState* unit = nullptr;         // a unit's flat shard (param null) or an original parameter's shard
  const ParamInfo* param = nullptr;  // the original parameter (use_orig_params)
  std::string name;                  // plain parameters and original parameters
};

// The model's names for the optimizer's tensors.
struct Naming {
  ModelIndex idx;
  std::unordered_map<const ParamInfo*, std::string> owned;      // first name of each original parameter
  std::unordered_map<const c10::TensorImpl*, std::string> plain;  // parameters outside units
  std::unordered_map<const c10::TensorImpl*, UnitState*> flat;  // flat shards

  explicit Naming(const std::shared_ptr<torch::nn::Module>& model) : idx(index_model(model)) {
    std::vector<Item> items;
    walk(*model, "", idx, StateDictType::kFull, items);
    for (const auto& item : items) {
      if (item.kind == Item::kOwned) owned.emplace(item.param, item.key);
      if (item.kind == Item::kParam) plain.emplace(item.tensor.unsafeGetTensorImpl(), item.key);
    }
    for (const auto& u : idx.units) flat[u->flat_shard().unsafeGetTensorImpl()] = u.get();
  }

  OptParam classify(const at::Tensor& t) const {
    const auto* impl = t.unsafeGetTensorImpl();
    OptParam p;
    p.tensor = t;
    if (auto it = flat.find(impl); it != flat.end()) {
      p.unit = it->second;
      return p;
    }
    if (auto it = idx.by_impl.find(impl); it != idx.by_impl.end()) {
      p.unit = it->second.unit;
      p.param = it->second.param;
      p.name = owned.at(p.param);
      return p;
    }
    if (auto it = plain.find(impl); it != plain.end()) {
      p.name = it->second;
      return p;
    }
    throw ConfigError("optim_state_dict: the optimizer steps a tensor of shape " + shape_str(t.sizes()) +
                      " that is not a parameter of the model (build the optimizer on model->parameters() after "
                      "wrapping)");
  }

  // The parameter names an optimizer tensor stands for.
  std::vector<std::string> names(const OptParam& p) const {
    if (p.unit && !p.param) {
      std::vector<std::string> out;
      for (const auto& q : p.unit->params()) out.push_back(owned.at(&q));
      return out;
    }
    return {p.name};
  }
};

std::vector<std::vector<OptParam>> classify_all(const Naming& naming, const torch::optim::Optimizer& opt) {
  std::vector<std::vector<OptParam>> groups;
  for (const auto& g : opt.param_groups()) {
    groups.emplace_back();
    for (const auto& t : g.params()) groups.back().push_back(naming.classify(t));
  }
  return groups;
}

// Pieces of elements [lo, hi) of a tensor of `shape`, cut from `flat` (which
// holds exactly those elements).
std::vector<Shard> pieces(const std::vector<int64_t>& shape, int64_t lo, int64_t hi, const at::Tensor& flat) {
  std::vector<Shard> out;
  int64_t cursor = 0;
  for (auto& [offsets, sizes] : flat_range_boxes(shape, lo, hi)) {
    const int64_t n = product(sizes);
    out.push_back(Shard{offsets, flat.narrow(0, cursor, n).view(sizes)});
    cursor += n;
  }
  return out;
}

at::Tensor step_tensor(int64_t step) { return at::scalar_tensor(static_cast<double>(step), at::kLong); }

// FULL: the state of one unit's parameters, gathered over its shard group.
void gather_unit(const Kind& kind, const torch::optim::Optimizer& opt, const Naming& naming, UnitState& u,
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
  const auto& group = u.config().shard_group;
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

// SHARDED, or FULL for a parameter outside every unit: this rank's state of one optimizer tensor.
void local_state(const Kind& kind, const torch::optim::Optimizer& opt, const Naming& naming, const OptParam& op,
                 bool full, bool to_cpu, const StateSink& out) {
  OptimizerParamState* st = state_of(opt, op.tensor);
  if (!st) return;
  std::vector<const ParamInfo*> ps;
  if (op.unit && !op.param) {
    for (const auto& q : op.unit->params()) ps.push_back(&q);
  } else {
    ps.push_back(op.param);  // null for a plain parameter
  }
  for (const ParamInfo* p : ps) {
    const std::string name = p ? naming.owned.at(p) : op.name;
    for (const auto& f : kind.fields) {
      at::Tensor t = kind.get(*st, f);
      if (!t.defined()) continue;
      t = t.detach();
      if (!op.unit) {  // whole on every rank
        out(name + "." + f, offload(full ? t.clone() : t, to_cpu));
        continue;
      }
      ShardedTensor value{p->shape, t.scalar_type(), {}};
      if (!op.param) {
        value.local_shards = local_shards(*op.unit, *p, t);
      } else {
        auto [lo, hi] = local_range(*op.unit, *p);
        value.local_shards = pieces(p->shape, lo, hi, t.reshape({-1}));
      }
      for (auto& s : value.local_shards) s.tensor = offload(s.tensor, to_cpu);
      out(name + "." + f, std::move(value));
    }
    if (kind.has_step) out(name + ".step", step_tensor(kind.get_step(*st)));
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
  if (full && std::get<FullStateDictConfig>(config).rank0_only && !naming.idx.units.empty()) {
    emit = naming.idx.units.front()->world_rank() == 0;
  }
  const auto groups = classify_all(naming, optimizer);
  std::vector<OptimParamGroup> out;
  std::unordered_set<const UnitState*> done;
  for (const auto& group : groups) {
    for (const auto& op : group) {
      if (!full || !op.unit) {
        if (emit || !full) local_state(kind, optimizer, naming, op, full, to_cpu, sink);
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

}  // namespace detail

OptimStateDict optim_state_dict(const std::shared_ptr<torch::nn::Module>& model,
                                const torch::optim::Optimizer& optimizer) {
  OptimStateDict out;
  out.param_groups = visit_optim_state_dict(model, optimizer, [&](const std::string& key, StateValue v) {
    out.state.insert(key, std::move(v));
  });
  return out;
}

void load_optim_state_dict(const std::shared_ptr<torch::nn::Module>& model, torch::optim::Optimizer& optimizer,
                           const OptimStateDict& state) {
  if (!model) throw ConfigError("load_optim_state_dict: the model is null");
  const Kind kind = kind_of(optimizer);
  Naming naming(model);
  check_idle(naming.idx, "load_optim_state_dict");
  for (auto& u : naming.idx.units) u->follow_module_to();
  const auto groups = classify_all(naming, optimizer);
  std::vector<std::string> errors;
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
    return s;
  };
  if (state.param_groups.size() != groups.size()) {
    errors.push_back("the state has " + std::to_string(state.param_groups.size()) +
                     " parameter groups, the optimizer " + std::to_string(groups.size()));
  } else {
    for (size_t g = 0; g < groups.size(); ++g) {
      std::vector<std::string> names;
      for (const auto& op : groups[g]) {
        for (auto& n : naming.names(op)) names.push_back(n);
      }
      // Groups are sets: use_orig_params and flat parameters list the same names in other orders.
      auto want = state.param_groups[g].params;
      std::sort(names.begin(), names.end());
      std::sort(want.begin(), want.end());
      if (names != want) {
        errors.push_back("param_groups[" + std::to_string(g) + "] holds [" + join(state.param_groups[g].params) +
                         "] but the optimizer's group holds [" + join(names) + "]");
      }
    }
  }

  // Build every new state first; install only if nothing is wrong.
  std::vector<std::pair<StateKey, std::unique_ptr<OptimizerParamState>>> staged;
  std::unordered_set<std::string> expected;
  at::NoGradGuard no_grad;
  auto fill = [&](const std::string& key, const std::vector<int64_t>& shape, int64_t lo, int64_t hi,
                  const at::Tensor& dst) {
    const StateValue& v = state.state.at(key);
    if (value_shape(v) != shape) {
      errors.push_back("size mismatch for " + key + ": " + shape_str(value_shape(v)) + " in the state, " +
                       shape_str(shape) + " in the model");
      return;
    }
    if (hi > lo && !copy_range(v, shape, lo, hi, dst)) {
      errors.push_back("the ShardedTensor at '" + key + "' does not hold the elements [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + ") this rank needs (saved with another sharding: gather it first)");
    }
  };
  for (const auto& group : groups) {
    for (const auto& op : group) {
      auto st = kind.make();
      bool any = false;
      std::vector<const ParamInfo*> ps;
      if (op.unit && !op.param) {
        for (const auto& q : op.unit->params()) ps.push_back(&q);
      } else {
        ps.push_back(op.param);
      }
      auto name_of = [&](const ParamInfo* p) { return p ? naming.owned.at(p) : op.name; };
      for (const auto& f : kind.fields) {
        bool present = false;
        for (const ParamInfo* p : ps) {
          expected.insert(name_of(p) + "." + f);
          present |= state.state.contains(name_of(p) + "." + f);
        }
        if (!present) continue;
        at::Tensor dst = at::zeros_like(op.tensor.detach());
        for (const ParamInfo* p : ps) {
          const std::string key = name_of(p) + "." + f;
          if (!state.state.contains(key)) {
            errors.push_back("missing " + key + " (other parameters of its flat parameter have '" + f + "')");
            continue;
          }
          if (!p) {
            fill(key, op.tensor.sizes().vec(), 0, op.tensor.numel(), dst.view({-1}));
          } else {
            auto [lo, hi] = local_range(*op.unit, *p);
            at::Tensor slot = op.param ? dst.view({-1}) : dst.narrow(0, hi > lo ? shard_index(*op.unit, *p, lo) : 0,
                                                                     hi - lo);
            fill(key, p->shape, lo, hi, slot);
          }
        }
        kind.set(*st, f, dst);
        any = true;
      }
      if (kind.has_step) {
        for (const ParamInfo* p : ps) {
          const std::string key = name_of(p) + ".step";
          expected.insert(key);
          if (!state.state.contains(key) || any == false) continue;
          const StateValue& v = state.state.at(key);
          if (!std::holds_alternative<at::Tensor>(v) || std::get<at::Tensor>(v).numel() != 1) {
            errors.push_back("'" + key + "' must be a tensor of one element (the step count)");
            continue;
          }
          kind.set_step(*st, std::get<at::Tensor>(v).item<int64_t>());
        }
      }
      staged.emplace_back(state_key(op.tensor), any ? std::move(st) : nullptr);
    }
  }
  std::vector<std::string> unexpected;
  for (const auto& [key, v] : state.state) {
    if (!expected.count(key)) unexpected.push_back(key);
  }
  if (!unexpected.empty()) errors.push_back("unexpected key(s): " + join(unexpected));
  if (!errors.empty()) {
    std::string msg = "load_optim_state_dict (" + kind.name + "):";
    for (const auto& e : errors) msg += "\n\t" + e;
    throw ConfigError(msg);
  }
  for (auto& [key, st] : staged) {
    if (st) {
      optimizer.state()[key] = std::move(st);
    } else {
      optimizer.state().erase(key);
    }
  }
  for (size_t g = 0; g < groups.size(); ++g) kind.write(optimizer.param_groups()[g].options(), state.param_groups[g].options);
}

}  // namespace fsdp
