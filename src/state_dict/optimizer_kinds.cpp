// What fsdp-cpp knows of each LibTorch optimizer type (optimizer_kinds.h).
#include "fsdp/state_dict/detail/optimizer_kinds.h"

#include <torch/optim.h>

#include "fsdp/error.h"

namespace fsdp::detail {

using torch::optim::OptimizerOptions;
using torch::optim::OptimizerParamState;
using Options = OptimOptions;
using Kind = OptimizerKind;

namespace {

// A per-parameter state tensor of optimizer state S, by name.
template <class S>
struct StateField {
  const char* name;
  at::Tensor (*get)(S&);
  void (*set)(S&, const at::Tensor&);
};

// An option of options O as a number (bools 0 / 1; a pair as key.0, key.1).
template <class O>
struct OptionField {
  const char* key;
  double (*get)(const O&);
  void (*set)(O&, double);
};

#define FSDP_STATE(S, f) \
  StateField<S> { #f, [](S& s) -> at::Tensor { return s.f(); }, [](S& s, const at::Tensor& t) { s.f(t); } }
#define FSDP_NUMBER(O, k) \
  OptionField<O> { #k, [](const O& o) -> double { return o.k(); }, [](O& o, double v) { o.k(v); } }
#define FSDP_BOOL(O, k) \
  OptionField<O> { #k, [](const O& o) { return o.k() ? 1.0 : 0.0; }, [](O& o, double v) { o.k(v != 0); } }
#define FSDP_PAIR(O, k, i)                                        \
  OptionField<O> {                                                \
    #k "." #i, [](const O& o) -> double { return std::get<i>(o.k()); }, \
        [](O& o, double v) {                                      \
          auto pair = o.k();                                      \
          std::get<i>(pair) = v;                                  \
          o.k(pair);                                              \
        }                                                         \
  }

// The kind of an optimizer with state S and options O, from its fields and
// options; with a step count when HasStep.
template <class S, class O, bool HasStep>
Kind make_kind(const char* name, std::vector<StateField<S>> fields, std::vector<OptionField<O>> options) {
  Kind k;
  k.name = name;
  for (const auto& f : fields) k.fields.push_back(f.name);
  if constexpr (HasStep) {
    k.has_step = true;
    k.get_step = [](OptimizerParamState& s) { return static_cast<S&>(s).step(); };
    k.set_step = [](OptimizerParamState& s, int64_t v) { static_cast<S&>(s).step(v); };
  }
  k.make = [] { return std::make_unique<S>(); };
  // A name not among the fields is the last field's, as each kind used to answer.
  const auto field = [fields](const std::string& f) {
    for (const auto& x : fields) {
      if (f == x.name) return x;
    }
    return fields.back();
  };
  k.get = [field](OptimizerParamState& s, const std::string& f) { return field(f).get(static_cast<S&>(s)); };
  k.set = [field](OptimizerParamState& s, const std::string& f, const at::Tensor& t) {
    field(f).set(static_cast<S&>(s), t);
  };
  k.read = [options](const OptimizerOptions& base) {
    const auto& o = static_cast<const O&>(base);
    Options out;
    for (const auto& x : options) out[x.key] = x.get(o);
    return out;
  };
  k.write = [options](OptimizerOptions& base, const Options& m) {
    auto& o = static_cast<O&>(base);
    for (const auto& x : options) {
      auto it = m.find(x.key);
      if (it != m.end()) x.set(o, it->second);
    }
  };
  return k;
}

// One optimizer type: how to recognise it, its kind, and its param group
// keys as PyTorch writes them.
struct Row {
  bool (*is)(const torch::optim::Optimizer&);
  Kind kind;
  std::vector<PythonOption> python;
};

template <class Optimizer>
bool is(const torch::optim::Optimizer& opt) {
  return dynamic_cast<const Optimizer*>(&opt) != nullptr;
}

// Adam and AdamW share their state's and options' shape.
template <class S, class O>
Kind adam_kind(const char* name) {
  return make_kind<S, O, true>(name, {FSDP_STATE(S, exp_avg), FSDP_STATE(S, exp_avg_sq), FSDP_STATE(S, max_exp_avg_sq)},
                               {FSDP_NUMBER(O, lr), FSDP_PAIR(O, betas, 0), FSDP_PAIR(O, betas, 1), FSDP_NUMBER(O, eps),
                                FSDP_NUMBER(O, weight_decay), FSDP_BOOL(O, amsgrad)});
}

// The table: one row per optimizer type, AdamW before Adam (kind_of takes
// the first row whose type `opt` is). The param group keys are torch 2.15's
// optimizer.state_dict()["param_groups"][i], key by key in its order
// ("params" comes last); docs/python-formats.md §4.
const std::vector<Row>& rows() {
  static const std::vector<Row> table = [] {
    namespace optim = torch::optim;
    using T = PythonOption::Type;
    using SgdS = optim::SGDParamState;
    using SgdO = optim::SGDOptions;
    using AdagradS = optim::AdagradParamState;
    using AdagradO = optim::AdagradOptions;
    using RmsS = optim::RMSpropParamState;
    using RmsO = optim::RMSpropOptions;
    auto adam = [](bool decoupled) {
      return std::vector<PythonOption>{{"lr", T::kNumber},          {"betas", T::kPair},
                                       {"eps", T::kNumber},         {"weight_decay", T::kNumber},
                                       {"amsgrad", T::kBool},       {"maximize", T::kFalse, true},
                                       {"foreach", T::kNone},       {"capturable", T::kFalse},
                                       {"differentiable", T::kFalse}, {"fused", T::kNone},
                                       {"decoupled_weight_decay", decoupled ? T::kTrue : T::kFalse, true}};
    };
    std::vector<Row> t;
    t.push_back({is<optim::SGD>,
                 make_kind<SgdS, SgdO, false>("SGD", {FSDP_STATE(SgdS, momentum_buffer)},
                                              {FSDP_NUMBER(SgdO, lr), FSDP_NUMBER(SgdO, momentum),
                                               FSDP_NUMBER(SgdO, dampening), FSDP_NUMBER(SgdO, weight_decay),
                                               FSDP_BOOL(SgdO, nesterov)}),
                 {{"lr", T::kNumber}, {"momentum", T::kNumber}, {"dampening", T::kNumber},
                  {"weight_decay", T::kNumber}, {"nesterov", T::kBool}, {"maximize", T::kFalse, true},
                  {"foreach", T::kNone}, {"differentiable", T::kFalse}, {"fused", T::kNone}}});
    t.push_back({is<optim::AdamW>, adam_kind<optim::AdamWParamState, optim::AdamWOptions>("AdamW"), adam(true)});
    t.push_back({is<optim::Adam>, adam_kind<optim::AdamParamState, optim::AdamOptions>("Adam"), adam(false)});
    t.push_back({is<optim::Adagrad>,
                 make_kind<AdagradS, AdagradO, true>(
                     "Adagrad", {FSDP_STATE(AdagradS, sum)},
                     {FSDP_NUMBER(AdagradO, lr), FSDP_NUMBER(AdagradO, lr_decay), FSDP_NUMBER(AdagradO, weight_decay),
                      FSDP_NUMBER(AdagradO, initial_accumulator_value), FSDP_NUMBER(AdagradO, eps)}),
                 {{"lr", T::kNumber}, {"lr_decay", T::kNumber}, {"eps", T::kNumber}, {"weight_decay", T::kNumber},
                  {"initial_accumulator_value", T::kNumber}, {"foreach", T::kNone}, {"maximize", T::kFalse, true},
                  {"differentiable", T::kFalse}, {"fused", T::kNone}}});
    t.push_back({is<optim::RMSprop>,
                 make_kind<RmsS, RmsO, true>(
                     "RMSprop",
                     {FSDP_STATE(RmsS, square_avg), FSDP_STATE(RmsS, momentum_buffer), FSDP_STATE(RmsS, grad_avg)},
                     {FSDP_NUMBER(RmsO, lr), FSDP_NUMBER(RmsO, alpha), FSDP_NUMBER(RmsO, eps),
                      FSDP_NUMBER(RmsO, weight_decay), FSDP_NUMBER(RmsO, momentum), FSDP_BOOL(RmsO, centered)}),
                 {{"lr", T::kNumber}, {"momentum", T::kNumber}, {"alpha", T::kNumber}, {"eps", T::kNumber},
                  {"centered", T::kBool}, {"weight_decay", T::kNumber}, {"capturable", T::kFalse},
                  {"foreach", T::kNone}, {"maximize", T::kFalse, true}, {"differentiable", T::kFalse}}});
    return t;
  }();
  return table;
}

#undef FSDP_STATE
#undef FSDP_NUMBER
#undef FSDP_BOOL
#undef FSDP_PAIR

}  // namespace

const std::vector<PythonOption>& python_options(const std::string& kind) {
  static const std::vector<PythonOption> none;
  for (const Row& row : rows()) {
    if (row.kind.name == kind) return row.python;
  }
  return none;
}

OptimOptions libtorch_options(const std::string& kind, const OptimOptions& python, const std::string& where) {
  using T = PythonOption::Type;
  OptimOptions out = python;
  for (const auto& o : python_options(kind)) {
    if (o.type != T::kFalse && o.type != T::kTrue && o.type != T::kNone) continue;
    auto it = out.find(o.key);
    if (it == out.end()) continue;
    const bool want = o.type == T::kTrue;
    if (o.checked && (it->second != 0) != want) {
      throw ConfigError(where + ": param group option " + o.key + "=" + (it->second != 0 ? "True" : "False") +
                        " has no equivalent in LibTorch's " + kind + " (it behaves as " + o.key + "=" +
                        (want ? "True" : "False") + ")" +
                        (o.key == "decoupled_weight_decay" ? "; load it into torch::optim::" +
                                                                 std::string(want ? "Adam" : "AdamW")
                                                           : ""));
    }
    out.erase(it);
  }
  return out;
}

Kind kind_of(const torch::optim::Optimizer& opt) {
  for (const Row& row : rows()) {
    if (row.is(opt)) return row.kind;
  }
  if (dynamic_cast<const torch::optim::LBFGS*>(&opt)) {
    throw ConfigError("optim_state_dict: torch::optim::LBFGS is not supported on a sharded model: its line search "
                      "and history take dot products and norms over all parameters, which each rank's shards "
                      "cannot give; use an elementwise optimizer: fsdp::optim::AdamW, torch::optim::SGD, Adam, "
                      "AdamW, Adagrad or RMSprop");
  }
  throw ConfigError("optim_state_dict: unsupported optimizer type: expected fsdp::optim::AdamW, torch::optim::SGD, "
                    "Adam, AdamW, Adagrad or RMSprop");
}

OptimizerParamState* state_of(const torch::optim::Optimizer& opt, const at::Tensor& t) {
  auto it = opt.state().find(state_key(t));
  return it == opt.state().end() ? nullptr : it->second.get();
}

}  // namespace fsdp::detail
