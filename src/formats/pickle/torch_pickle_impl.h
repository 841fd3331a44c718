// src/formats/pickle/torch_pickle_impl.h — the unpickler's machine (the Parser behind
// pickle::parse), shared by its two halves: torch_pickle.cpp runs the
// opcodes (Parser::step), pickle_globals.cpp builds what the accepted
// globals make (Parser::reduce, Parser::persistent_load). Private to the
// formats module.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "fsdp/error.h"
#include "fsdp/formats/torch_pickle.h"

namespace fsdp::formats::pickle {

// The globals a pickle may name (see the header); everything else is refused.
enum class Global { kOrderedDict, kRebuildTensor, kRebuildParameter, kRebuildParameterWithState, kRebuildFromType,
                    kTensorType, kRestoreTypeTag,
                    kSize, kStorage,
                    // Mode::kDcpMetadata only:
                    kDcpClass,   // a dataclass of DCP's metadata: NEWOBJ + BUILD
                    kDtype,      // torch.float32, ...: the value itself
                    kGetLayout,  // torch.serialization._get_layout('torch.strided')
                    kGetattr,    // builtins.getattr(_MEM_FORMAT_ENCODING, 'TORCH_CONTIGUOUS_FORMAT')
                    kEnumClass,  // _MEM_FORMAT_ENCODING (only as getattr's object)
                    kPath };     // pathlib.PosixPath(*parts)

// Which accepted global module.name is in `mode`; nullopt for any other
// (pickle_globals.cpp).
std::optional<Global> accepted_global(const std::string& module, const std::string& name, Mode mode);

// A heap block of n bytes as glibc's malloc takes it (a header, 32 bytes at least).
constexpr size_t heap(size_t n) { return n == 0 ? 0 : std::max<size_t>(n + 8, 32); }
// A hash map's node (next pointer, key, value, cached hash) and its share
// of the bucket array (about two pointers); a string key's bytes beyond
// the node are charged apart.
constexpr size_t kNodeBytes = heap(sizeof(void*) + sizeof(std::string) + 2 * sizeof(size_t)) + 2 * sizeof(void*);

class Parser {
 public:
  Parser(const std::string& bytes, const std::string& where, Mode mode, Pickle& out)
      : in_(bytes), where_(where), mode_(mode), out_(out) {}

  void run() {
    budget_ = parse_budget(in_.size());
    while (true) {
      if (pos_ >= in_.size()) fail("ends without STOP (the pickle is truncated)");
      op_at_ = pos_;
      const auto op = static_cast<uint8_t>(in_[pos_++]);
      if (op == '.') break;  // STOP
      step(op);
    }
    if (stack_.size() != 1 || !marks_.empty()) fail("STOP with " + std::to_string(stack_.size()) + " values on the stack");
    out_.root_ = stack_.back();
    out_.charged_ = charged_;
  }

 private:
  const std::string& in_;
  const std::string& where_;
  const Mode mode_;
  Pickle& out_;
  size_t pos_ = 0, op_at_ = 0;
  std::vector<Value*> stack_;
  std::vector<size_t> marks_;
  // The memo: keys 0, 1, 2, ... as picklers write them in a vector (8
  // bytes an entry), any other key in a map.
  std::vector<Value*> memo_dense_;
  std::unordered_map<uint64_t, Value*> memo_sparse_;
  size_t budget_ = 0, charged_ = 0;
  Value* none_ = nullptr;
  Value* bools_[2] = {nullptr, nullptr};
  Value* small_ints_[256] = {};

  // The memory budget: every allocation the parse makes is charged here
  // before it is made (an approximation of the allocator's bytes: sizes of
  // the objects and of the vectors' and maps' storage).
  void charge(size_t n) {
    charged_ += n;
    if (charged_ > budget_) {
      fail("expands beyond what its size allows: building it takes more than " + std::to_string(budget_) +
           " bytes of memory, the budget of a pickle of " + std::to_string(in_.size()) + " bytes (" +
           std::to_string(kBudgetSlack) + " + " + std::to_string(kBudgetPerByte) +
           " per byte); real checkpoints take far less, so it is damaged or hostile");
    }
  }
  // Appends to a vector, charging the growth of its storage.
  template <typename V, typename T>
  void push(V& v, T&& x) {
    if (v.size() == v.capacity()) {
      const size_t elem = sizeof(typename V::value_type);
      charge(v.capacity() ? v.capacity() * elem : heap(elem));  // doubling; the first block with its header
    }
    v.push_back(std::forward<T>(x));
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw ConfigError("checkpoint: " + where_ + ": the pickle at byte " + std::to_string(op_at_) + " " + what);
  }

  TensorRef& make_ref(Value* v) {
    charge(heap(sizeof(TensorRef)));
    v->ref = std::make_unique<TensorRef>();
    return *v->ref;
  }
  void put(uint64_t key) {
    Value* v = top();
    if (key < memo_dense_.size()) {
      memo_dense_[key] = v;
      return;
    }
    if (key == memo_dense_.size() && !memo_sparse_.count(key)) {
      push(memo_dense_, v);
      return;
    }
    auto [it, inserted] = memo_sparse_.emplace(key, v);
    if (inserted) {
      charge(kNodeBytes);
    } else {
      it->second = v;
    }
  }

  Value* make(Value::Kind kind) {
    charge(sizeof(Value));
    out_.values_.emplace_back();
    Value* v = &out_.values_.back();
    v->kind = kind;
    return v;
  }
  Value* make_int(int64_t i) {
    const bool small = i >= 0 && i < 256;
    if (small && small_ints_[i]) return small_ints_[i];
    Value* v = make(Value::Kind::kInt);
    v->integer = i;
    if (small) small_ints_[i] = v;
    return v;
  }
  Value* make_none() { return none_ ? none_ : (none_ = make(Value::Kind::kNone)); }
  Value* make_bool(bool b) {
    Value*& v = bools_[b ? 1 : 0];
    if (!v) {
      v = make(Value::Kind::kBool);
      v->boolean = b;
    }
    return v;
  }
  Value* make_text(Value::Kind kind, std::string text) {
    Value* v = make(kind);
    set_text(v, std::move(text));
    return v;
  }
  void set_text(Value* v, std::string text) {
    charge(text.size() > 15 ? heap(text.size() + 1) : 0);  // beyond the string's inline buffer
    v->text = std::move(text);
  }

  // Reading the operands.
  const char* take(size_t n) {
    if (n > in_.size() - pos_) fail("is truncated (an operand runs past the end)");
    const char* p = in_.data() + pos_;
    pos_ += n;
    return p;
  }
  uint64_t le(size_t n) {
    const auto* p = reinterpret_cast<const uint8_t*>(take(n));
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
    return v;
  }
  std::string line() {
    const size_t end = in_.find('\n', pos_);
    if (end == std::string::npos) fail("is truncated (a GLOBAL name has no end of line)");
    std::string s = in_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }
  std::string sized(uint64_t n) {
    if (n > in_.size() - pos_) fail("is truncated (a string of " + std::to_string(n) + " bytes runs past the end)");
    return std::string(take(static_cast<size_t>(n)), static_cast<size_t>(n));
  }

  // The stack.
  Value* pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) fail("pops an empty stack");
    Value* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Value* top() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) fail("reads an empty stack");
    return stack_.back();
  }
  std::vector<Value*> pop_mark() {
    if (marks_.empty()) fail("has no MARK to pop to");
    const size_t m = marks_.back();
    marks_.pop_back();
    charge(heap((stack_.size() - m) * sizeof(Value*)));
    std::vector<Value*> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  Value* tuple(std::vector<Value*> items) {  // (items: charged by their maker)
    Value* t = make(Value::Kind::kTuple);
    t->items = std::move(items);
    return t;
  }

  Value* expect(Value* v, Value::Kind kind, const std::string& what) {
    if (v->kind != kind) fail("has " + describe(*v) + " where " + what + " belongs");
    return v;
  }

  static std::string key_of(const Value& k) {
    if (k.kind == Value::Kind::kString) return "s" + k.text;
    if (k.kind == Value::Kind::kInt) return std::string(1, 'i').append(std::to_string(k.integer));
    if (k.kind == Value::Kind::kBool) return k.boolean ? "i1" : "i0";  // True == 1 in Python
    if (k.kind == Value::Kind::kObject) return "o" + std::to_string(reinterpret_cast<uintptr_t>(&k));  // by identity
    return "";
  }
  void set_item(Value* dict, Value* key, Value* value) {
    if (dict->kind != Value::Kind::kDict) fail("sets an item of " + describe(*dict) + ", not a dict");
    const std::string k = key_of(*key);
    if (k.empty()) fail("uses " + describe(*key) + " as a dict key (fsdp-cpp reads string and int keys)");
    if (!dict->index) {
      charge(heap(sizeof(std::unordered_map<std::string, size_t>)));
      dict->index = std::make_unique<std::unordered_map<std::string, size_t>>();
    }
    auto [it, inserted] = dict->index->emplace(k, dict->entries.size());
    if (inserted) {
      charge(kNodeBytes + (k.size() > 15 ? heap(k.size() + 1) : 0));
      push(dict->entries, std::make_pair(key, value));
    } else {
      dict->entries[it->second].second = value;
    }
  }
  void append(Value* list, Value* item) {
    if (list->kind != Value::Kind::kList) fail("appends to " + describe(*list) + ", not a list");
    push(list->items, item);
  }

  int64_t long_bytes(size_t n) {
    if (n > 8) fail("has an int of " + std::to_string(n) + " bytes (fsdp-cpp reads 64-bit ints)");
    if (n == 0) return 0;
    uint64_t v = le(n);
    if (n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign-extend
    return static_cast<int64_t>(v);
  }

  void global(const std::string& module, const std::string& name) {
    if (!accepted_global(module, name, mode_)) {
      fail("names the Python global " + module + "." + name +
           ", which fsdp-cpp does not load (it reads tensors, numbers, strings and containers, as "
           "torch.load(weights_only=True) does)");
    }
    Value* g = make(Value::Kind::kGlobal);
    set_text(g, module + "." + name);
    push(stack_, g);
  }

  std::vector<int64_t> ints(Value* v, const char* what) {
    if (v->kind != Value::Kind::kTuple && v->kind != Value::Kind::kList) fail("has " + describe(*v) + " as " + what);
    std::vector<int64_t> out;
    for (Value* i : v->items) out.push_back(expect(i, Value::Kind::kInt, what)->integer);
    return out;
  }

  // What calling the accepted global `callable` with `args` builds
  // (REDUCE): an OrderedDict, a tensor, a torch.Size, one of DCP's
  // dataclasses, ... (pickle_globals.cpp).
  Value* reduce(Value* callable, Value* args);
  // ('storage', torch.<T>Storage, key, location, numel): a storage (pickle_globals.cpp).
  Value* persistent_load(Value* pid);
  // One opcode (torch_pickle.cpp).
  void step(uint8_t op);
};

}  // namespace fsdp::formats::pickle
