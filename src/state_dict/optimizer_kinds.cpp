// What fsdp-cpp knows of each LibTorch optimizer type (optimizer_kinds.h).
#include "optimizer_kinds.h"

#include <torch/optim.h>

#include "fsdp/error.h"

namespace fsdp::detail {

using torch::optim::OptimizerOptions;
using torch::optim::OptimizerParamState;
using Options = OptimOptions;
using Kind = OptimizerKind;

namespace {

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

}  // namespace

const std::vector<PythonOption>& python_options(const std::string& kind) {
  using T = PythonOption::Type;
  // torch 2.15's optimizer.state_dict()["param_groups"][i], key by key in its
  // order ("params" comes last); docs/python-formats.md §4.
  static const std::map<std::string, std::vector<PythonOption>> table = [] {
    auto adam = [](bool decoupled) {
      return std::vector<PythonOption>{{"lr", T::kNumber},          {"betas", T::kPair},
                                       {"eps", T::kNumber},         {"weight_decay", T::kNumber},
                                       {"amsgrad", T::kBool},       {"maximize", T::kFalse, true},
                                       {"foreach", T::kNone},       {"capturable", T::kFalse},
                                       {"differentiable", T::kFalse}, {"fused", T::kNone},
                                       {"decoupled_weight_decay", decoupled ? T::kTrue : T::kFalse, true}};
    };
    std::map<std::string, std::vector<PythonOption>> t;
    t["SGD"] = {{"lr", T::kNumber},       {"momentum", T::kNumber},     {"dampening", T::kNumber},
                {"weight_decay", T::kNumber}, {"nesterov", T::kBool},   {"maximize", T::kFalse, true},
                {"foreach", T::kNone},    {"differentiable", T::kFalse}, {"fused", T::kNone}};
    t["Adam"] = adam(false);
    t["AdamW"] = adam(true);
    t["Adagrad"] = {{"lr", T::kNumber},  {"lr_decay", T::kNumber},       {"eps", T::kNumber},
                    {"weight_decay", T::kNumber}, {"initial_accumulator_value", T::kNumber},
                    {"foreach", T::kNone}, {"maximize", T::kFalse, true}, {"differentiable", T::kFalse},
                    {"fused", T::kNone}};
    t["RMSprop"] = {{"lr", T::kNumber},      {"momentum", T::kNumber}, {"alpha", T::kNumber},
                    {"eps", T::kNumber},     {"centered", T::kBool},   {"weight_decay", T::kNumber},
                    {"capturable", T::kFalse}, {"foreach", T::kNone},  {"maximize", T::kFalse, true},
                    {"differentiable", T::kFalse}};
    return t;
  }();
  static const std::vector<PythonOption> none;
  auto it = table.find(kind);
  return it == table.end() ? none : it->second;
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

OptimizerParamState* state_of(const torch::optim::Optimizer& opt, const at::Tensor& t) {
  auto it = opt.state().find(state_key(t));
  return it == opt.state().end() ? nullptr : it->second.get();
}

}  // namespace fsdp::detail
