// The model's names for an optimizer's tensors (optim_naming.h).
#include "optim_naming.h"

#include <unordered_set>

#include "fsdp/core/utils.h"
#include "fsdp/dtensor/detail/boxes.h"
#include "fsdp/error.h"
#include "shard_geometry.h"

namespace fsdp::detail {

Naming::Naming(const std::shared_ptr<torch::nn::Module>& model) : idx(index_model(model)) {
  walk(*model, "", idx, StateDictType::kFull, items);
  std::unordered_set<const c10::TensorImpl*> params;  // buffers are no optimizer's
  for (const auto& p : model->parameters()) params.insert(p.unsafeGetTensorImpl());
  for (const auto& item : items) {
    position.emplace(item.key, position.size());
    if (item.full || params.count(item.tensor.unsafeGetTensorImpl())) {
      first.emplace(item.tensor.unsafeGetTensorImpl(), &item);
    }
  }
  for (const auto& u : idx.units) flat[u->flat_shard().unsafeGetTensorImpl()] = u.get();
}

OptParam Naming::classify(const at::Tensor& t) const {
  const auto* impl = t.unsafeGetTensorImpl();
  OptParam p;
  p.tensor = t;
  if (auto f = flat.find(impl); f != flat.end()) {
    const UnitView& u = *f->second;
    for (const auto& q : u.params()) {  // each original parameter at its place in the shard
      auto [lo, hi] = local_range(u, q);
      p.items.push_back(first.at(q.param.unsafeGetTensorImpl()));
      p.at.push_back(hi > lo ? shard_index(u, q, lo) : 0);
    }
    return p;
  }
  auto it = first.find(impl);
  if (it == first.end()) {
    throw ConfigError("optim_state_dict: the optimizer steps a tensor of shape " + shape_str(t.sizes()) +
                      " that is not a parameter of the model (build the optimizer on model->parameters() after "
                      "wrapping)");
  }
  p.items = {it->second};
  p.at = {0};
  return p;
}

std::vector<std::string> Naming::names(const OptParam& p) const {
  std::vector<std::string> out;
  for (const Item* item : p.items) out.push_back(item->key);
  return out;
}

std::vector<Shard> cut(const Item& item, const at::Tensor& elements, int64_t at) {
  std::vector<Shard> out;
  for (const auto& box : item.value.local_shards()) {
    const int64_t n = box.tensor.numel();
    out.push_back(Shard{box.offsets, elements.narrow(0, at, n).view(box.tensor.sizes())});
    at += n;
  }
  return out;
}

int64_t local_numel(const Item& item) {
  int64_t n = 0;
  for (const auto& box : item.value.local_shards()) n += box.tensor.numel();
  return n;
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
