// The restricted unpickler (fsdp/formats/torch_pickle.h): its values, the
// opcodes (Parser::step, on the machine of torch_pickle_impl.h), and tensors read
// from a zip's records. What the accepted globals build: pickle_globals.cpp.
#include "fsdp/formats/torch_pickle.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>

#include "fsdp/formats/format.h"
#include "fsdp/error.h"
#include "torch_pickle_impl.h"

namespace fsdp::formats::pickle {

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

void Parser::step(uint8_t op) {
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

Pickle parse(const std::string& bytes, const std::string& where, Mode mode) {
  Pickle p;
  Parser(bytes, where, mode, p).run();
  return p;
}

void check_byte_order(const formats::FullReader& zip) {
  if (!zip.has("byteorder")) return;  // no record (older PyTorch versions): little-endian
  const std::string order = zip.read("byteorder");
  if (order != "little") {
    throw ConfigError("checkpoint: " + zip.path() + " was written on a " + order.substr(0, 20) +
                      "-endian machine; fsdp-cpp reads little-endian files");
  }
}

at::Tensor read_tensor(const formats::FullReader& zip, const TensorRef& ref, const std::string& where) {
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

}  // namespace fsdp::formats::pickle
