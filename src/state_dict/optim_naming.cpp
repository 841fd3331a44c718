// The model's names for an optimizer's tensors (optim_naming.h).
#include "optim_naming.h"

#include <unordered_set>

#include "fsdp/core/utils.h"
#include "fsdp/dtensor/detail/boxes.h"
#include "fsdp/error.h"

namespace fsdp::detail {

Naming::Naming(const std::shared_ptr<torch::nn::Module>& model) : idx(index_model(model)) {
  std::vector<Item> items;
  walk(*model, "", idx, StateDictType::kFull, items);
  std::unordered_set<const c10::TensorImpl*> params;  // buffers are no optimizer's
  for (const auto& p : model->parameters()) params.insert(p.unsafeGetTensorImpl());
  std::unordered_map<const c10::TensorImpl*, std::string> first;  // each parameter's first name
  for (const auto& item : items) {
    position.emplace(item.key, position.size());
    if (item.full || (item.tensor.defined() && params.count(item.tensor.unsafeGetTensorImpl()))) {
      first.emplace(item.tensor.unsafeGetTensorImpl(), item.key);
    }
  }
  for (const auto& [impl, key] : first) {
    if (auto it = idx.by_impl.find(impl); it != idx.by_impl.end()) {
      owned.emplace(it->second.param, key);
    } else if (auto r = idx.rows.find(impl); r != idx.rows.end()) {
      rows.emplace(impl, std::make_pair(key, &r->second));
    } else {
      plain.emplace(impl, key);
    }
  }
  for (const auto& u : idx.units) flat[u->flat_shard().unsafeGetTensorImpl()] = u.get();
}

OptParam Naming::classify(const at::Tensor& t) const {
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
  if (auto it = rows.find(impl); it != rows.end()) {
    p.name = it->second.first;
    p.rows = it->second.second;
    return p;
  }
  throw ConfigError("optim_state_dict: the optimizer steps a tensor of shape " + shape_str(t.sizes()) +
                    " that is not a parameter of the model (build the optimizer on model->parameters() after "
                    "wrapping)");
}

std::vector<std::string> Naming::names(const OptParam& p) const {
  if (p.unit && !p.param) {
    std::vector<std::string> out;
    for (const auto& q : p.unit->params()) out.push_back(owned.at(&q));
    return out;
  }
  return {p.name};
}

std::vector<std::vector<OptParam>> classify_all(const std::shared_ptr<torch::nn::Module>& model, const Naming& naming,
                                                const torch::optim::Optimizer& opt, const char* caller) {
  check_parameters_listed_once({model}, opt, caller);
  std::vector<std::vector<OptParam>> groups;
  for (const auto& g : opt.param_groups()) {
    groups.emplace_back();
    for (const auto& t : g.params()) groups.back().push_back(naming.classify(t));
  }
  return groups;
}

at::Tensor step_tensor(int64_t step) { return at::scalar_tensor(static_cast<double>(step), at::kFloat); }

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

}  // namespace fsdp::detail
