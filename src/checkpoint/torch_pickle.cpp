#include "torch_pickle.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>

#include "format.h"
#include "fsdp/error.h"

namespace fsdp::detail::pickle {

namespace {

const std::vector<std::pair<at::ScalarType, const char*>>& storage_classes() {
  static const std::vector<std::pair<at::ScalarType, const char*>> classes = {
      {at::kFloat, "FloatStorage"}, {at::kDouble, "DoubleStorage"}, {at::kHalf, "HalfStorage"},
      {at::kBFloat16, "BFloat16Storage"}, {at::kLong, "LongStorage"}, {at::kInt, "IntStorage"},
      {at::kShort, "ShortStorage"}, {at::kChar, "CharStorage"}, {at::kByte, "ByteStorage"},
      {at::kBool, "BoolStorage"}};
  return classes;
}

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s.substr(0, 60)) out += (c >= 32 && c < 127) ? c : '?';
  return out + (s.size() > 60 ? "...'" : "'");
}

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

bool dcp_class(const std::string& module, const std::string& name) {
  static const char* const metadata[] = {"Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                                         "ChunkStorageMetadata", "TensorProperties", "MetadataIndex", "StorageMeta"};
  if (module == "torch.distributed.checkpoint.metadata") {
    return std::find(std::begin(metadata), std::end(metadata), name) != std::end(metadata);
  }
  return module == "torch.distributed.checkpoint.filesystem" && name == "_StorageInfo";
}

std::optional<Global> dcp_global(const std::string& module, const std::string& name) {
  if (dcp_class(module, name)) return Global::kDcpClass;
  if (module == "torch.distributed.checkpoint.metadata" && name == "_MEM_FORMAT_ENCODING") return Global::kEnumClass;
  if (module == "torch.serialization" && name == "_get_layout") return Global::kGetLayout;
  if (module == "builtins" && name == "getattr") return Global::kGetattr;
  if (module == "pathlib" && (name == "PosixPath" || name == "PurePosixPath")) return Global::kPath;
  if (module == "torch") {
    try {
      checkpoint::parse_dtype(name, "");
      return Global::kDtype;
    } catch (const std::exception&) {
    }
  }
  return std::nullopt;
}

std::optional<Global> accepted_global(const std::string& module, const std::string& name, Mode mode) {
  if (mode == Mode::kDcpMetadata) {
    if (auto g = dcp_global(module, name)) return g;
  }
  if (module == "collections" && name == "OrderedDict") return Global::kOrderedDict;
  if (module == "torch._utils" && name == "_rebuild_tensor_v2") return Global::kRebuildTensor;
  if (module == "torch._utils" && name == "_rebuild_parameter") return Global::kRebuildParameter;
  if (module == "torch._utils" && name == "_rebuild_parameter_with_state") return Global::kRebuildParameterWithState;
  if (module == "torch._tensor" && name == "_rebuild_from_type_v2") return Global::kRebuildFromType;
  if ((module == "torch" && name == "Tensor") || (module == "torch.nn.parameter" && name == "Parameter")) {
    return Global::kTensorType;
  }
  if (module == "torch.jit._pickle" && name == "restore_type_tag") return Global::kRestoreTypeTag;
  if (module == "torch" && name == "Size") return Global::kSize;
  if (module == "torch" && storage_dtype(name)) return Global::kStorage;
  return std::nullopt;
}

// A heap block of n bytes as glibc's malloc takes it (a header, 32 bytes at least).
constexpr size_t heap(size_t n) { return n == 0 ? 0 : std::max<size_t>(n + 8, 32); }
// A hash map's node (next pointer, key, value, cached hash) and its share
// of the bucket array (about two pointers); a string key's bytes beyond
// the node are charged apart.
constexpr size_t kNodeBytes = heap(sizeof(void*) + sizeof(std::string) + 2 * sizeof(size_t)) + 2 * sizeof(void*);

}  // namespace

const char* storage_class(at::ScalarType dtype) {
  for (const auto& [t, name] : storage_classes()) {
    if (t == dtype) return name;
  }
  throw ConfigError(std::string("checkpoint: tensors of dtype ") + c10::toString(dtype) + " have no storage class");
}

std::optional<at::ScalarType> storage_dtype(const std::string& storage_class) {
  for (const auto& [t, name] : storage_classes()) {
    if (storage_class == name) return t;
  }
  return std::nullopt;
}

std::string describe(const Value& v) {
  using K = Value::Kind;
  switch (v.kind) {
    case K::kNone: return "None";
    case K::kBool: return v.boolean ? "True" : "False";
    case K::kInt: return "the int " + std::to_string(v.integer);
    case K::kFloat: return "a float";
    case K::kString: return "the string " + quoted(v.text);
    case K::kBytes: return "bytes";
    case K::kTuple: return "a tuple of " + std::to_string(v.items.size());
    case K::kList: return "a list of " + std::to_string(v.items.size());
    case K::kDict: return "a dict of " + std::to_string(v.entries.size());
    case K::kTensor: return "a tensor";
    case K::kStorage: return "a storage";
    case K::kGlobal: return "the Python global " + v.text;
    case K::kObject: return "a " + v.text.substr(v.text.rfind('.') + 1) + " object";
  }
  return "a value";
}

const TensorRef& Value::tensor() const {
  static const TensorRef none;
  return ref ? *ref : none;
}

const Value* Value::get(const std::string& key) const {
  if (kind != Kind::kDict || !index) return nullptr;
  auto it = index->find("s" + key);
  return it == index->end() ? nullptr : entries[it->second].second;
}

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

  Value* reduce(Value* callable, Value* args) {
    if (callable->kind != Value::Kind::kGlobal) fail("calls " + describe(*callable) + ", not an accepted global");
    if (args->kind != Value::Kind::kTuple) fail("calls " + callable->text + " with " + describe(*args) + ", not a tuple");
    const auto dot = callable->text.rfind('.');
    const auto accepted = accepted_global(callable->text.substr(0, dot), callable->text.substr(dot + 1), mode_);
    if (!accepted) fail("calls " + callable->text);
    const Global g = *accepted;
    auto& a = args->items;
    auto arity = [&](size_t lo, size_t hi) {
      if (a.size() < lo || a.size() > hi) {
        fail("calls " + callable->text + " with " + std::to_string(a.size()) + " arguments");
      }
    };
    switch (g) {
      case Global::kOrderedDict:
        arity(0, 0);
        return make(Value::Kind::kDict);
      case Global::kRestoreTypeTag:  // LibTorch's pickler: (value, "Dict[str, Tensor]")
        arity(2, 2);
        return a[0];
      case Global::kSize: {  // torch.Size((2, 3))
        arity(1, 1);
        ints(a[0], "the dimensions of a torch.Size");
        return a[0];
      }
      case Global::kRebuildParameter:  // (data, requires_grad, backward_hooks)
        arity(3, 3);
        return expect(a[0], Value::Kind::kTensor, "a parameter's data");
      case Global::kRebuildParameterWithState:  // (data, requires_grad, backward_hooks, state)
        arity(4, 4);
        return expect(a[0], Value::Kind::kTensor, "a parameter's data");
      case Global::kRebuildFromType: {  // (rebuild function, tensor type, its arguments, attributes): FSDP's state dicts
        arity(4, 4);
        expect(a[1], Value::Kind::kGlobal, "a tensor type");
        const auto d = a[1]->text.rfind('.');
        if (*accepted_global(a[1]->text.substr(0, d), a[1]->text.substr(d + 1), mode_) != Global::kTensorType) {
          fail("rebuilds a tensor as " + a[1]->text + ", not torch.Tensor or torch.nn.Parameter");
        }
        Value* rebuilt = reduce(expect(a[0], Value::Kind::kGlobal, "a tensor's rebuild function"), a[2]);
        return expect(rebuilt, Value::Kind::kTensor, "a rebuilt tensor");
      }
      case Global::kTensorType:
        fail("calls the tensor type " + callable->text);
      case Global::kRebuildTensor: {  // (storage, offset, size, stride, requires_grad, backward_hooks[, metadata])
        arity(6, 7);
        Value* storage = expect(a[0], Value::Kind::kStorage, "a tensor's storage");
        Value* t = make(Value::Kind::kTensor);
        TensorRef& ref = make_ref(t);
        ref = storage->tensor();
        ref.offset = expect(a[1], Value::Kind::kInt, "a tensor's storage offset")->integer;
        ref.sizes = ints(a[2], "a tensor's size");
        ref.strides = ints(a[3], "a tensor's stride");
        charge(heap(ref.storage.size()) + heap(ref.sizes.size() * sizeof(int64_t)) +
               heap(ref.strides.size() * sizeof(int64_t)));
        if (ref.sizes.size() != ref.strides.size()) {
          fail("describes a tensor with " + std::to_string(ref.sizes.size()) + " sizes but " +
               std::to_string(ref.strides.size()) + " strides");
        }
        return t;
      }
      case Global::kStorage:
        fail("calls the storage class " + callable->text + " (storages come as persistent ids)");
      case Global::kGetLayout:
      case Global::kPath: {  // symbolic: the call and its (string) arguments
        for (Value* x : a) expect(x, Value::Kind::kString, "an argument of " + callable->text);
        Value* o = make(Value::Kind::kObject);
        set_text(o, callable->text);
        charge(heap(a.size() * sizeof(Value*)));
        o->items = a;
        return o;
      }
      case Global::kGetattr: {  // an enum member: getattr(<the enum class>, 'NAME')
        arity(2, 2);
        Value* cls = expect(a[0], Value::Kind::kGlobal, "getattr's object");
        const auto dot2 = cls->text.rfind('.');
        if (accepted_global(cls->text.substr(0, dot2), cls->text.substr(dot2 + 1), mode_) != Global::kEnumClass) {
          fail("calls getattr on " + cls->text + " (only DCP's _MEM_FORMAT_ENCODING is read)");
        }
        Value* member = make(Value::Kind::kGlobal);
        set_text(member, cls->text + "." + expect(a[1], Value::Kind::kString, "getattr's name")->text);
        return member;
      }
      case Global::kDcpClass:
      case Global::kDtype:
      case Global::kEnumClass:
        break;
    }
    fail("calls " + callable->text);
  }

  // ('storage', torch.<T>Storage, key, location, numel)
  Value* persistent_load(Value* pid) {
    if (pid->kind != Value::Kind::kTuple || pid->items.size() != 5 || pid->items[0]->kind != Value::Kind::kString ||
        pid->items[0]->text != "storage") {
      fail("has the persistent id " + describe(*pid) + ", not ('storage', class, key, location, numel)");
    }
    Value* cls = expect(pid->items[1], Value::Kind::kGlobal, "a storage class");
    Value* s = make(Value::Kind::kStorage);
    const auto dtype = storage_dtype(cls->text.substr(cls->text.rfind('.') + 1));
    if (!dtype || cls->text.rfind("torch.", 0) != 0) fail("has the storage class " + cls->text);
    TensorRef& ref = make_ref(s);
    ref.dtype = *dtype;
    ref.storage = expect(pid->items[2], Value::Kind::kString, "a storage key")->text;
    charge(heap(ref.storage.size()));
    expect(pid->items[3], Value::Kind::kString, "a storage location");
    ref.storage_numel = expect(pid->items[4], Value::Kind::kInt, "a storage's size")->integer;
    return s;
  }

  void step(uint8_t op) {
    using K = Value::Kind;
    switch (op) {
      case 0x80: {  // PROTO
        const auto v = le(1);
        if (v < 2 || v > 5) fail("is of protocol " + std::to_string(v) + " (fsdp-cpp reads 2 to 5)");
        return;
      }
      case 0x95: le(8); return;  // FRAME: a hint only
      case '(': push(marks_, stack_.size()); return;
      case '0': pop(); return;                       // POP
      case '1': pop_mark(); return;                  // POP_MARK
      case '2': push(stack_, top()); return;     // DUP
      case 'N': push(stack_, make_none()); return;
      case 0x88:
      case 0x89: push(stack_, make_bool(op == 0x88)); return;
      case 'J': push(stack_, make_int(static_cast<int32_t>(static_cast<uint32_t>(le(4))))); return;  // BININT
      case 'K': push(stack_, make_int(static_cast<int64_t>(le(1)))); return;                          // BININT1
      case 'M': push(stack_, make_int(static_cast<int64_t>(le(2)))); return;                          // BININT2
      case 0x8a: push(stack_, make_int(long_bytes(static_cast<size_t>(le(1))))); return;              // LONG1
      case 0x8b: push(stack_, make_int(long_bytes(static_cast<size_t>(le(4))))); return;              // LONG4
      case 'G': {  // BINFLOAT: big-endian
        const auto* p = reinterpret_cast<const uint8_t*>(take(8));
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | p[i];
        Value* f = make(K::kFloat);
        std::memcpy(&f->floating, &bits, 8);
        push(stack_, f);
        return;
      }
      case 'X':   // BINUNICODE
      case 0x8c:  // SHORT_BINUNICODE
      case 0x8d:  // BINUNICODE8
      case 'B':   // BINBYTES
      case 'C':   // SHORT_BINBYTES
      case 0x8e: {  // BINBYTES8
        const size_t width = (op == 0x8c || op == 'C') ? 1 : (op == 0x8d || op == 0x8e) ? 8 : 4;
        push(stack_, make_text((op == 'B' || op == 'C' || op == 0x8e) ? K::kBytes : K::kString, sized(le(width))));
        return;
      }
      case ')': push(stack_, tuple({})); return;  // EMPTY_TUPLE
      case 't': push(stack_, tuple(pop_mark())); return;
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        std::vector<Value*> items(static_cast<size_t>(op - 0x84));
        charge(heap(items.size() * sizeof(Value*)));
        for (size_t i = items.size(); i-- > 0;) items[i] = pop();
        push(stack_, tuple(std::move(items)));
        return;
      }
      case ']': push(stack_, make(K::kList)); return;  // EMPTY_LIST
      case 'l': {  // LIST
        Value* l = make(K::kList);
        l->items = pop_mark();
        push(stack_, l);
        return;
      }
      case 'a': {  // APPEND
        Value* item = pop();
        append(top(), item);
        return;
      }
      case 'e': {  // APPENDS
        auto items = pop_mark();
        Value* list = top();
        for (Value* i : items) append(list, i);
        return;
      }
      case '}': push(stack_, make(K::kDict)); return;  // EMPTY_DICT
      case 'd': {  // DICT
        auto items = pop_mark();
        if (items.size() % 2) fail("builds a dict from an odd number of values");
        Value* d = make(K::kDict);
        for (size_t i = 0; i < items.size(); i += 2) set_item(d, items[i], items[i + 1]);
        push(stack_, d);
        return;
      }
      case 's': {  // SETITEM
        Value* value = pop();
        Value* key = pop();
        set_item(top(), key, value);
        return;
      }
      case 'u': {  // SETITEMS
        auto items = pop_mark();
        if (items.size() % 2) fail("sets items from an odd number of values");
        Value* d = top();
        for (size_t i = 0; i < items.size(); i += 2) set_item(d, items[i], items[i + 1]);
        return;
      }
      case 'c': {  // GLOBAL
        std::string module = line();
        std::string name = line();
        global(module, name);
        return;
      }
      case 0x93: {  // STACK_GLOBAL
        Value* name = pop();
        Value* module = pop();
        global(expect(module, K::kString, "a module name")->text, expect(name, K::kString, "a global's name")->text);
        return;
      }
      case 'R': {  // REDUCE
        Value* args = pop();
        Value* callable = pop();
        push(stack_, reduce(callable, args));
        return;
      }
      case 'b': {  // BUILD: a DCP object's state, or a dict's attributes (an OrderedDict's _metadata), ignored
        Value* state = pop();
        Value* obj = top();
        if (obj->kind == K::kObject && !obj->state) {
          obj->state = state;
          return;
        }
        if (obj->kind != K::kDict) fail("sets the attributes " + describe(*state) + " of " + describe(*obj));
        return;
      }
      case 0x81: {  // NEWOBJ: only DCP's dataclasses (Mode::kDcpMetadata)
        Value* args = expect(pop(), K::kTuple, "NEWOBJ's arguments");
        Value* cls = pop();
        if (cls->kind != K::kGlobal) fail("creates an object of " + describe(*cls));
        const auto dot = cls->text.rfind('.');
        if (accepted_global(cls->text.substr(0, dot), cls->text.substr(dot + 1), mode_) != Global::kDcpClass) {
          fail("creates an object of " + cls->text + ", which fsdp-cpp does not load");
        }
        Value* o = make(K::kObject);
        set_text(o, cls->text);
        charge(heap(args->items.size() * sizeof(Value*)));
        o->items = args->items;
        push(stack_, o);
        return;
      }
      case 'Q': {  // BINPERSID
        Value* pid = pop();
        push(stack_, persistent_load(pid));
        return;
      }
      case 'q': put(le(1)); return;  // BINPUT
      case 'r': put(le(4)); return;  // LONG_BINPUT
      case 0x94: {                             // MEMOIZE
        put(memo_dense_.size() + memo_sparse_.size());
        return;
      }
      case 'h':    // BINGET
      case 'j': {  // LONG_BINGET
        const uint64_t k = le(op == 'h' ? 1 : 4);
        if (k < memo_dense_.size()) {
          push(stack_, memo_dense_[k]);
          return;
        }
        auto it = memo_sparse_.find(k);
        if (it == memo_sparse_.end()) fail("gets memo entry " + std::to_string(k) + ", which was never put");
        push(stack_, it->second);
        return;
      }
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        fail(std::string("has the opcode ") + hex + ", which fsdp-cpp does not read (sets, Python objects and "
             "protocol-0 text opcodes are not part of a state dict)");
      }
    }
  }
};

Pickle parse(const std::string& bytes, const std::string& where, Mode mode) {
  Pickle p;
  Parser(bytes, where, mode, p).run();
  return p;
}

void check_byte_order(const checkpoint::FullReader& zip) {
  if (!zip.has("byteorder")) return;  // no record (older PyTorch versions): little-endian
  const std::string order = zip.read("byteorder");
  if (order != "little") {
    throw ConfigError("checkpoint: " + zip.path() + " was written on a " + order.substr(0, 20) +
                      "-endian machine; fsdp-cpp reads little-endian files");
  }
}

at::Tensor read_tensor(const checkpoint::FullReader& zip, const TensorRef& ref, const std::string& where) {
  const std::string record = "data/" + ref.storage;
  const std::string at_ = "checkpoint: " + zip.path() + ": " + where + " (storage record " + record + ")";
  if (ref.storage.empty() || ref.storage.find('/') != std::string::npos || !zip.has(record)) {
    throw ConfigError(at_ + " is missing from the file");
  }
  const int64_t elem = static_cast<int64_t>(c10::elementSize(ref.dtype));
  constexpr int64_t kMax = int64_t{1} << 48;
  if (ref.storage_numel < 0 || ref.storage_numel > kMax / elem || ref.offset < 0) {
    throw ConfigError(at_ + ": a storage of " + std::to_string(ref.storage_numel) + " elements at offset " +
                      std::to_string(ref.offset) + " is impossible");
  }
  // The view must lie inside the storage: offset + sum((size - 1) * stride) < numel.
  int64_t last = ref.offset, numel = 1;
  for (size_t d = 0; d < ref.sizes.size(); ++d) {
    const int64_t size = ref.sizes[d], stride = ref.strides[d];
    if (size < 0 || stride < 0 || size > kMax || stride > kMax) {
      throw ConfigError(at_ + ": a tensor of size " + std::to_string(size) + " and stride " + std::to_string(stride) +
                        " in dimension " + std::to_string(d) + " is impossible");
    }
    if (size == 0) numel = 0;
    if (numel && size > kMax / numel) throw ConfigError(at_ + ": the tensor is implausibly large");
    numel *= size;
    if (size > 0) {
      if (stride && size - 1 > (kMax - last) / stride) throw ConfigError(at_ + ": the tensor is implausibly large");
      last += (size - 1) * stride;
    }
  }
  if (numel > 0 && last >= ref.storage_numel) {
    throw ConfigError(at_ + ": the tensor reaches element " + std::to_string(last) + " of a storage of " +
                      std::to_string(ref.storage_numel));
  }
  auto bytes = std::make_shared<std::string>(zip.read(record));
  if (static_cast<int64_t>(bytes->size()) < ref.storage_numel * elem) {
    throw ConfigError(at_ + " holds " + std::to_string(bytes->size()) + " bytes; its storage of " +
                      std::to_string(ref.storage_numel) + " " + c10::toString(ref.dtype) + " elements needs " +
                      std::to_string(ref.storage_numel * elem));
  }
  if (numel == 0) return at::empty(ref.sizes, at::TensorOptions().dtype(ref.dtype));
  return at::from_blob(bytes->data() + ref.offset * elem, ref.sizes, ref.strides, [bytes](void*) {},
                       at::TensorOptions().dtype(ref.dtype));
}

}  // namespace fsdp::detail::pickle
