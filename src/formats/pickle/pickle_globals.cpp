// What the globals a pickle may name build (fsdp/formats/torch_pickle.h
// lists them): which are accepted in each mode, and the values REDUCE and
// BINPERSID make of them (tensors, storages, OrderedDicts, DCP's metadata
// classes). The opcodes themselves: torch_pickle.cpp.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include "fsdp/error.h"
#include "fsdp/formats/format.h"
#include "fsdp/formats/torch_pickle.h"
#include "torch_pickle_impl.h"

namespace fsdp::formats::pickle {

namespace {

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
      formats::parse_dtype(name, "");
      return Global::kDtype;
    } catch (const std::exception&) {
    }
  }
  return std::nullopt;
}

}  // namespace

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

Value* Parser::reduce(Value* callable, Value* args) {
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
Value* Parser::persistent_load(Value* pid) {
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

}  // namespace fsdp::formats::pickle
