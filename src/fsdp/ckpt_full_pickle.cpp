// The pickle (protocol 2) that makes a full checkpoint a torch.load-able dict.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "ckpt_format.h"
#include "torch_pickle.h"

namespace fsdp::detail::ckpt {

namespace {

class Pickler {
 public:
  std::string out;
  Pickler() { out += "\x80\x02"; }
  void op(char c) { out += c; }
  void str(const std::string& s) {
    op('X');
    u32(static_cast<uint32_t>(s.size()));
    out += s;
  }
  void integer(int64_t v) {
    if (v >= INT32_MIN && v <= INT32_MAX) {
      op('J');
      u32(static_cast<uint32_t>(static_cast<int32_t>(v)));
    } else {
      op('\x8a');
      out += static_cast<char>(8);
      for (int i = 0; i < 8; ++i) out += static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
    }
  }
  void floating(double v) {
    op('G');
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    for (int i = 7; i >= 0; --i) out += static_cast<char>((bits >> (8 * i)) & 0xff);
  }
  void boolean(bool b) { op(b ? '\x88' : '\x89'); }
  void global(const char* module, const char* name) {
    op('c');
    out += module;
    out += '\n';
    out += name;
    out += '\n';
  }
  void tensor(const std::string& storage_key, at::ScalarType dtype, const std::vector<int64_t>& shape) {
    global("torch._utils", "_rebuild_tensor_v2");
    op('(');
    op('(');
    str("storage");
    global("torch", pickle::storage_class(dtype));
    str(storage_key);
    str("cpu");
    int64_t numel = 1;
    for (auto s : shape) numel *= s;
    integer(numel);
    op('t');
    op('Q');  // BINPERSID
    integer(0);
    op('(');
    for (auto s : shape) integer(s);
    op('t');
    op('(');
    int64_t stride = 1;
    std::vector<int64_t> strides(shape.size());
    for (size_t i = shape.size(); i-- > 0;) {
      strides[i] = stride;
      stride *= std::max<int64_t>(shape[i], 1);
    }
    for (auto s : strides) integer(s);
    op('t');
    boolean(false);
    global("collections", "OrderedDict");
    op(')');
    op('R');
    op('t');
    op('R');
  }

 private:
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
  }
};

}  // namespace

std::string full_pickle(const Index& index, const std::map<std::string, std::string>& record_of) {
  Pickler p;
  auto tensor = [&](const std::string& key) {
    const auto& t = index.tensors.at(key);
    const std::string& record = record_of.at(key);  // "data/<n>"
    p.tensor(record.substr(5), t.dtype, t.shape);
  };
  p.op('}');
  for (const auto& e : index.entries) {
    p.op('(');
    p.str(e.name);
    if (e.type == EntryType::kModel) {
      p.op('}');
      for (const auto& k : e.keys) {
        p.op('(');
        p.str(k);
        tensor(e.name + "/" + k);
        p.op('u');
      }
    } else if (e.type == EntryType::kOptimizer) {
      // {"state": {param: {field: tensor}}, "param_groups": [{"params": [...], option: value}]}
      p.op('}');
      p.op('(');
      p.str("state");
      p.op('}');
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
        p.op('(');
        p.str(param);
        p.op('}');
        p.op('(');
        for (const auto& [field, k] : fields) {
          p.str(field);
          tensor(e.name + "/" + k);
        }
        p.op('u');
        p.op('u');
      }
      p.str("param_groups");
      p.op(']');
      for (const auto& g : e.param_groups) {
        p.op('(');
        p.op('}');
        p.op('(');
        p.str("params");
        p.op(']');
        for (const auto& name : g.params) {
          p.op('(');
          p.str(name);
          p.op('e');
        }
        for (const auto& [k, v] : g.options) {
          p.str(k);
          p.floating(v);
        }
        p.op('u');
        p.op('e');
      }
      p.op('u');
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
    p.op('u');
  }
  p.op('.');
  return p.out;
}

}  // namespace fsdp::detail::ckpt
