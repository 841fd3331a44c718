// The pickle (protocol 2) that makes a full checkpoint what PyTorch FSDP and
// Lightning write for state_dict_type="full" (docs/checkpoint-format.md).
#include <algorithm>
#include <set>

#include "fsdp/formats/format.h"
#include "fsdp/formats/pickle_writer.h"
#include "fsdp/formats/torch_pickle.h"
#include "fsdp/state_dict/detail/optimizer_kinds.h"
#include "parts.h"

namespace fsdp::detail {

using formats::EntryRecord;
using formats::EntryType;
using formats::Index;

namespace {

class FullPickler {
 public:
  FullPickler(const Index& index, const std::map<std::string, std::string>& record_of)
      : index_(index), record_of_(record_of) {}

  std::string write() {
    // Entries nest by the dots in their names: a value "config.model.dim"
    // is {"config": {"model": {"dim": ...}}} (CheckpointState refuses names
    // that would collide).
    Node root;
    for (const auto& e : index_.entries) {
      Node* n = &root;
      size_t start = 0;
      for (;;) {
        const size_t dot = e.name.find('.', start);
        n = &n->child(e.name.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
        if (dot == std::string::npos) break;
        start = dot + 1;
      }
      n->entry = &e;
    }
    node(root);
    return p_.finish();
  }

 private:
  struct Node {
    std::string name;
    const EntryRecord* entry = nullptr;
    std::vector<Node> children;
    Node& child(const std::string& n) {
      for (auto& c : children) {
        if (c.name == n) return c;
      }
      children.push_back(Node{n, nullptr, {}});
      return children.back();
    }
  };

  void node(const Node& n) {
    if (n.entry) return entry(*n.entry);
    p_.empty_dict();
    for (const auto& c : n.children) {
      p_.str(c.name);
      node(c);
      p_.setitem();
    }
  }

  void tensor(const std::string& key) {
    const auto& t = index_.tensors.at(key);
    const std::string& record = record_of_.at(key);  // "data/<n>"
    p_.tensor(record.substr(5), formats::pickle::storage_class(t.dtype), t.shape);
  }

  void entry(const EntryRecord& e) {
    switch (e.type) {
      case EntryType::kModel: return model(e);
      case EntryType::kOptimizer: return optimizer(e);
      case EntryType::kInt: return p_.integer(std::get<int64_t>(e.value));
      case EntryType::kFloat: return p_.floating(std::get<double>(e.value));
      case EntryType::kBool: return p_.boolean(std::get<bool>(e.value));
      case EntryType::kStr: return p_.str(std::get<std::string>(e.value));
      case EntryType::kTensor: return tensor(e.name);
    }
  }

  // An OrderedDict, as module.state_dict() returns.
  void model(const EntryRecord& e) {
    p_.global("collections", "OrderedDict");
    p_.empty_tuple();
    p_.reduce();
    for (const auto& k : e.keys) {
      p_.str(k);
      tensor(e.name + "/" + k);
      p_.setitem();
    }
  }

  // FSDP.optim_state_dict's form: {"state": {param: {"step": ..., field: tensor}},
  // "param_groups": [{option: value, ..., "params": [names]}]}.
  void optimizer(const EntryRecord& e) {
    std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>> params;
    auto of = [&](const std::string& param) -> auto& {
      auto it = std::find_if(params.begin(), params.end(), [&](const auto& x) { return x.first == param; });
      return it == params.end() ? params.emplace_back(param, std::vector<std::pair<std::string, std::string>>{}).second
                                : it->second;
    };
    // The state in the model's order (its first model entry's keys), then
    // in param_groups order.
    for (const auto& m : index_.entries) {
      if (m.type != EntryType::kModel) continue;
      std::set<std::string> named;
      for (const auto& g : e.param_groups) named.insert(g.params.begin(), g.params.end());
      for (const auto& k : m.keys) {
        if (named.count(k)) of(k);
      }
      break;
    }
    for (const auto& g : e.param_groups) {
      for (const auto& name : g.params) of(name);
    }
    for (const auto& k : e.keys) {
      const auto dot = k.rfind('.');
      auto& fields = of(k.substr(0, dot));
      const std::string field = k.substr(dot + 1);
      // "step" first, as PyTorch's optimizers create it.
      fields.emplace(field == "step" ? fields.begin() : fields.end(), field, k);
    }
    p_.empty_dict();
    p_.mark();
    p_.str("state");
    p_.empty_dict();
    for (const auto& [param, fields] : params) {
      if (fields.empty()) continue;  // no state yet (never stepped)
      p_.mark();
      p_.str(param);
      p_.empty_dict();
      p_.mark();
      for (const auto& [field, k] : fields) {
        p_.str(field);
        tensor(e.name + "/" + k);
      }
      p_.setitems();
      p_.setitems();
    }
    p_.str("param_groups");
    p_.empty_list();
    for (const auto& g : e.param_groups) {
      p_.empty_dict();
      p_.mark();
      options(e.optimizer_class, g.options);
      p_.str("params");
      p_.empty_list();
      p_.mark();
      for (const auto& name : g.params) p_.str(name);
      p_.appends();
      p_.setitems();
      p_.append();
    }
    p_.setitems();
  }

  void options(const std::string& kind, const std::map<std::string, double>& options) {
    for (const auto& [key, write] : python_group_options(kind, options)) {
      p_.str(key);
      write(p_);
    }
  }

  const Index& index_;
  const std::map<std::string, std::string>& record_of_;
  formats::pickle::Writer p_;
};

}  // namespace

std::vector<std::pair<std::string, std::function<void(formats::pickle::Writer&)>>> python_group_options(
    const std::string& kind, const std::map<std::string, double>& options) {
  using T = PythonOption::Type;
  std::vector<std::pair<std::string, std::function<void(formats::pickle::Writer&)>>> out;
  const auto& table = python_options(kind);
  if (table.empty()) {  // a checkpoint without the optimizer's class: the numbers as stored
    for (const auto& [k, v] : options) out.emplace_back(k, [v = v](formats::pickle::Writer& w) { w.floating(v); });
    return out;
  }
  auto number = [&](const std::string& k) {
    auto it = options.find(k);
    return it == options.end() ? 0.0 : it->second;
  };
  for (const auto& o : table) {
    std::function<void(formats::pickle::Writer&)> write;
    switch (o.type) {
      case T::kNumber: write = [v = number(o.key)](formats::pickle::Writer& w) { w.floating(v); }; break;
      case T::kBool: write = [v = number(o.key) != 0](formats::pickle::Writer& w) { w.boolean(v); }; break;
      case T::kPair:
        write = [a = number(o.key + ".0"), b = number(o.key + ".1")](formats::pickle::Writer& w) {
          w.floating(a);
          w.floating(b);
          w.tuple2();
        };
        break;
      case T::kNone: write = [](formats::pickle::Writer& w) { w.none(); }; break;
      case T::kFalse: write = [](formats::pickle::Writer& w) { w.boolean(false); }; break;
      case T::kTrue: write = [](formats::pickle::Writer& w) { w.boolean(true); }; break;
    }
    out.emplace_back(o.key, std::move(write));
  }
  return out;
}

std::string full_pickle(const Index& index, const std::map<std::string, std::string>& record_of) {
  return FullPickler(index, record_of).write();
}

}  // namespace fsdp::detail
