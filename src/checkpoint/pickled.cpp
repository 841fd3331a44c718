// Full checkpoints that PyTorch or Lightning wrote: their pickle read into
// FullPickleReader's index (readers.h, index_pickled).
#include <c10/util/irange.h>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "readers.h"
#include "fsdp/error.h"

namespace fsdp::detail {

using formats::pickle::Value;
using Kind = formats::pickle::Value::Kind;

namespace {

// The value of a dict's string key `name` (null if absent).
const Value* field(const Value& dict, const std::string& name) { return dict.get(name); }

bool is_optimizer(const Value& v) { return v.kind == Kind::kDict && field(v, "state") && field(v, "param_groups"); }

bool is_model(const Value& v) {
  if (v.kind != Kind::kDict || v.entries.empty()) return false;
  for (const auto& [k, x] : v.entries) {
    if (k->kind != Kind::kString || x->kind != Kind::kTensor) return false;
  }
  return true;
}

class PickleIndexer {
 public:
  PickleIndexer(const std::string& where, formats::Index& ix, std::map<std::string, formats::pickle::TensorRef>& pickled,
                std::set<std::string>& numbered)
      : where_(where), ix_(ix), pickled_(pickled), numbered_(numbered) {}

  void values(const Value& dict, const std::string& prefix, int depth) {
    if (depth > 16) fail("nests dicts more than 16 deep at '" + prefix + "'");
    for (const auto& [k, v] : dict.entries) {
      if (k->kind != Kind::kString) continue;  // not a name fsdp-cpp can ask for
      const std::string name = prefix.empty() ? k->text : prefix + "." + k->text;
      if (is_optimizer(*v)) {
        optimizer(name, *v);
      } else if (is_model(*v)) {
        model(name, *v);
      } else if (v->kind == Kind::kDict) {
        values(*v, name, depth + 1);
      } else {
        value(name, *v);
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& why) const { throw ConfigError("checkpoint: " + where_ + " " + why); }

  void tensor(const std::string& key, const formats::pickle::TensorRef& ref) {
    ix_.tensors[key] = formats::TensorEntry{ref.dtype, ref.sizes, {}};
    ix_.tensor_order.push_back(key);
    pickled_[key] = ref;
  }

  formats::EntryRecord& add(const std::string& name, formats::EntryType type) {
    formats::EntryRecord e;
    e.name = name;
    e.type = type;
    ix_.entries.push_back(std::move(e));
    return ix_.entries.back();
  }

  void model(const std::string& name, const Value& dict) {
    auto& e = add(name, formats::EntryType::kModel);
    for (const auto& [k, t] : dict.entries) {
      e.keys.push_back(k->text);
      tensor(name + "/" + k->text, t->tensor());
    }
  }

  void value(const std::string& name, const Value& v) {
    switch (v.kind) {
      case Kind::kBool: add(name, formats::EntryType::kBool).value = v.boolean; break;
      case Kind::kInt: add(name, formats::EntryType::kInt).value = v.integer; break;
      case Kind::kFloat: add(name, formats::EntryType::kFloat).value = v.floating; break;
      case Kind::kString: add(name, formats::EntryType::kStr).value = v.text; break;
      case Kind::kTensor:
        add(name, formats::EntryType::kTensor);
        tensor(name, v.tensor());
        break;
      default: break;  // None, lists, tuples, ...: nothing fsdp-cpp can load
    }
  }

  // A parameter's key in the state: its name, or PyTorch's id (numbered).
  std::string param_key(const Value& k, const std::string& where, bool& numbered, bool& named) {
    if (k.kind == Kind::kString) {
      named = true;
      if (k.text.empty() || k.text.find('/') != std::string::npos) fail(where + " names the parameter '" + k.text + "'");
      return k.text;
    }
    if (k.kind == Kind::kInt && k.integer >= 0) {
      numbered = true;
      return std::to_string(k.integer);
    }
    fail(where + " has " + formats::pickle::describe(k) + " as a parameter (expected a name or an id 0, 1, ...)");
  }

  void optimizer(const std::string& name, const Value& opt) {
    const std::string where = "optimizer '" + name + "'";
    const Value& state = *field(opt, "state");
    const Value& groups = *field(opt, "param_groups");
    if (state.kind != Kind::kDict) fail(where + ": 'state' is " + formats::pickle::describe(state) + ", not a dict");
    if (groups.kind != Kind::kList) fail(where + ": 'param_groups' is " + formats::pickle::describe(groups) + ", not a list");
    auto& e = add(name, formats::EntryType::kOptimizer);
    bool numbered = false, named = false;
    for (const auto& [k, fields] : state.entries) {
      const std::string param = param_key(*k, where + "'s state", numbered, named);
      if (fields->kind != Kind::kDict) fail(where + ": the state of '" + param + "' is " + formats::pickle::describe(*fields));
      for (const auto& [f, t] : fields->entries) {
        if (f->kind != Kind::kString || t->kind != Kind::kTensor) {
          fail(where + ": the state of '" + param + "' holds " + formats::pickle::describe(*f) + " = " + formats::pickle::describe(*t) +
               " (expected field names and tensors; a step that is a number is torch < 1.12's form)");
        }
        const std::string key = param + "." + f->text;
        e.keys.push_back(key);
        tensor(name + "/" + key, t->tensor());
      }
    }
    for (const Value* g : groups.items) {
      if (g->kind != Kind::kDict || !field(*g, "params")) {
        fail(where + ": a param group is " + formats::pickle::describe(*g) + ", not a dict with 'params'");
      }
      e.param_groups.push_back(group(*g, where, numbered, named));
    }
    if (numbered && named) fail(where + " keys parameters both by name and by id");
    if (numbered) numbered_.insert(name);
  }

  // A param group: its parameters, and its options as numbers (bools 0 / 1,
  // a tuple of numbers as key.0, key.1, ...; None and other values left out).
  formats::ParamGroup group(const Value& g, const std::string& where, bool& numbered, bool& named) {
    formats::ParamGroup out;
    auto number = [](const Value& v, double& x) {
      if (v.kind == Kind::kFloat) x = v.floating;
      else if (v.kind == Kind::kInt) x = static_cast<double>(v.integer);
      else if (v.kind == Kind::kBool) x = v.boolean ? 1 : 0;
      else return false;
      return true;
    };
    for (const auto& [k, v] : g.entries) {
      if (k->kind != Kind::kString) continue;
      if (k->text == "params") {
        if (v->kind != Kind::kList) fail(where + ": a param group's 'params' is " + formats::pickle::describe(*v));
        for (const Value* p : v->items) out.params.push_back(param_key(*p, where + "'s param_groups", numbered, named));
        continue;
      }
      double x = 0;
      if (number(*v, x)) {
        out.options[k->text] = x;
      } else if (v->kind == Kind::kTuple) {
        for (const auto i : c10::irange(v->items.size())) {
          if (number(*v->items[i], x)) out.options[k->text + "." + std::to_string(i)] = x;
        }
      }
    }
    return out;
  }

  const std::string& where_;
  formats::Index& ix_;
  std::map<std::string, formats::pickle::TensorRef>& pickled_;
  std::set<std::string>& numbered_;
};

}  // namespace

void FullPickleReader::index_pickled() {
  const auto parsed = formats::pickle::parse(full_->read("data.pkl"), where_);
  formats::pickle::check_byte_order(*full_);
  const Value& root = parsed.root();
  if (root.kind != Kind::kDict) {
    throw ConfigError("checkpoint: " + where_ + " holds " + formats::pickle::describe(root) +
                      ", not a checkpoint (a dict of state dicts and values)");
  }
  if (is_model(root)) {
    throw ConfigError("checkpoint: " + where_ + " holds a module's state dict, not a checkpoint: it loads with "
                      "load_checkpoint(path, module)");
  }
  PickleIndexer(where_, ix_, pickled_, numbered_).values(root, "", 0);
}

}  // namespace fsdp::detail
