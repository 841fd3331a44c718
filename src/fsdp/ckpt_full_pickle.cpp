// The pickle (protocol 2) that makes a full checkpoint a torch.load-able dict.
#include <algorithm>

#include "ckpt_format.h"
#include "pickle_writer.h"
#include "torch_pickle.h"

namespace fsdp::detail::ckpt {

std::string full_pickle(const Index& index, const std::map<std::string, std::string>& record_of) {
  pickle::Writer p;
  auto tensor = [&](const std::string& key) {
    const auto& t = index.tensors.at(key);
    const std::string& record = record_of.at(key);  // "data/<n>"
    p.tensor(record.substr(5), pickle::storage_class(t.dtype), t.shape);
  };
  p.empty_dict();
  for (const auto& e : index.entries) {
    p.mark();
    p.str(e.name);
    if (e.type == EntryType::kModel) {
      p.empty_dict();
      for (const auto& k : e.keys) {
        p.mark();
        p.str(k);
        tensor(e.name + "/" + k);
        p.setitems();
      }
    } else if (e.type == EntryType::kOptimizer) {
      // {"state": {param: {field: tensor}}, "param_groups": [{"params": [...], option: value}]}
      p.empty_dict();
      p.mark();
      p.str("state");
      p.empty_dict();
      // Keys grouped by parameter, in order of first appearance.
      std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>> params;
      for (const auto& k : e.keys) {
        const auto dot = k.rfind('.');
        const std::string param = k.substr(0, dot), field = k.substr(dot + 1);
        auto it = std::find_if(params.begin(), params.end(), [&](const auto& x) { return x.first == param; });
        if (it == params.end()) it = params.insert(params.end(), {param, {}});
        it->second.emplace_back(field, k);
      }
      for (const auto& [param, fields] : params) {
        p.mark();
        p.str(param);
        p.empty_dict();
        p.mark();
        for (const auto& [field, k] : fields) {
          p.str(field);
          tensor(e.name + "/" + k);
        }
        p.setitems();
        p.setitems();
      }
      p.str("param_groups");
      p.empty_list();
      for (const auto& g : e.param_groups) {
        p.mark();
        p.empty_dict();
        p.mark();
        p.str("params");
        p.empty_list();
        for (const auto& name : g.params) {
          p.mark();
          p.str(name);
          p.appends();
        }
        for (const auto& [k, v] : g.options) {
          p.str(k);
          p.floating(v);
        }
        p.setitems();
        p.appends();
      }
      p.setitems();
    } else if (e.type == EntryType::kInt) {
      p.integer(std::get<int64_t>(e.value));
    } else if (e.type == EntryType::kFloat) {
      p.floating(std::get<double>(e.value));
    } else if (e.type == EntryType::kBool) {
      p.boolean(std::get<bool>(e.value));
    } else if (e.type == EntryType::kStr) {
      p.str(std::get<std::string>(e.value));
    } else {
      tensor(e.name);
    }
    p.setitems();
  }
  return p.finish();
}

}  // namespace fsdp::detail::ckpt
