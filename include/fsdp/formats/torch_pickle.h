// fsdp/formats/torch_pickle.h — reads the pickle of a file that torch.save (or
// LibTorch's torch::pickle_save) wrote, into a tree of Python values, without
// running any code: the C++ counterpart of torch.load(weights_only=True).
// Part of the formats module (FSDP-free, usable alone).
//
// Why not LibTorch's own unpickler (torch::pickle_load): it cannot read
// model.state_dict() files, because it does not build collections.OrderedDict
// (PyTorch issues #37213, #100741: "Expected GenericDict but got None").
//
// Accepted, as torch.load(weights_only=True) accepts them: protocols 2 to 5;
// None, bools, ints (64-bit), floats, strings, bytes, tuples, lists, dicts;
// tensors (torch._utils._rebuild_tensor_v2, _rebuild_parameter,
// _rebuild_parameter_with_state, with the storages torch.<T>Storage as
// persistent ids; torch._tensor._rebuild_from_type_v2 of those, as FSDP's
// and Lightning's state dicts wrap their tensors, its attributes ignored); collections.OrderedDict (its attributes, such as a state
// dict's _metadata, are ignored); torch.Size; LibTorch's
// torch.jit._pickle.restore_type_tag. Any other global (a Python class or
// function) is refused by name, before anything runs.
//
// Mode::kDcpMetadata (a torch.distributed.checkpoint `.metadata`, which
// Python reads with plain pickle.load) accepts besides exactly DCP's metadata
// globals (docs/python-formats.md §2): the dataclasses of
// torch.distributed.checkpoint.metadata and filesystem._StorageInfo, dtypes
// (torch.float32, ...), torch.serialization._get_layout,
// builtins.getattr of _MEM_FORMAT_ENCODING and pathlib.PosixPath. They become
// symbolic values (Kind::kObject: the class and its NEWOBJ/BUILD state;
// Kind::kGlobal: a dtype or an enum member by name); nothing is executed.
//
// Memory: every parse runs under a budget proportional to the pickle's size
// (parse_budget below), so a few bytes that expand into millions of values
// end in a ConfigError within a fraction of a second, not in gigabytes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fsdp::formats {
class FullReader;
}

namespace fsdp::formats::pickle {

// torch.save's storage class of a dtype ("FloatStorage", ...) and back
// (nullopt for a class fsdp-cpp does not read).
const char* storage_class(at::ScalarType dtype);
std::optional<at::ScalarType> storage_dtype(const std::string& storage_class);

// A tensor as the pickle describes it: a view of a storage whose bytes are
// the zip record "data/<storage>".
struct TensorRef {
  std::string storage;         // the record's key
  at::ScalarType dtype = at::kFloat;
  int64_t storage_numel = 0;   // elements of the storage
  int64_t offset = 0;          // elements into the storage
  std::vector<int64_t> sizes, strides;
};

// One Python value. Kept small (what a pickle of N opcodes may cost is
// charged against the parse's budget, below): a dict's key index and a
// tensor's description live on the heap, only for dicts and tensors. None,
// True, False and the ints 0-255 are shared within a Pickle (as in Python);
// values are never changed once the parse has returned.
struct Value {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kBytes, kTuple, kList, kDict, kTensor, kStorage, kGlobal, kObject };
  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  double floating = 0;
  std::string text;                                      // string, bytes, a global's "module.name"
  std::vector<Value*> items;                             // tuple, list; an object's NEWOBJ / REDUCE arguments
  std::vector<std::pair<Value*, Value*>> entries;        // dict, in insertion order
  Value* state = nullptr;                                // object: its BUILD state (null: none)
  // dict: "s" + a string key, "i" + an int key -> entry (null for other kinds)
  std::unique_ptr<std::unordered_map<std::string, size_t>> index;
  std::unique_ptr<TensorRef> ref;                        // tensor, storage (null for other kinds)

  // tensor, storage: what it describes (an empty TensorRef for other kinds).
  const TensorRef& tensor() const;
  // dict: the value at a string key (null if absent or not a dict).
  const Value* get(const std::string& key) const;
};

enum class Mode { kTorchLoad, kDcpMetadata };

// "None", "a dict", "a tensor", "the string 'x'", ... for error messages.
std::string describe(const Value& v);

// The memory budget of parsing a pickle of `input_bytes` bytes:
// kBudgetSlack + kBudgetPerByte * input_bytes. Every value the parser
// builds is charged against it as it is built: sizeof(Value), its strings,
// the growth of its vectors and of a dict's index, and the growth of the
// parser's stack, marks and memo. Real pickles build a value every 5 to 10
// bytes and are charged 13 (DCP `.metadata`) to 28 (torch.save's state
// dicts, memoizing nearly every value) bytes per byte (measured,
// docs/checkpoint-format.md "Parser budgets"); a hostile one that builds a
// value every one or two bytes is charged 80 to 140 and stops at the budget.
constexpr size_t kBudgetSlack = size_t{1} << 20;  // 1 MiB: any small pickle
constexpr size_t kBudgetPerByte = 40;  // real pickles: at most about 28
constexpr size_t parse_budget(size_t input_bytes) { return kBudgetSlack + kBudgetPerByte * input_bytes; }

// A parsed pickle; owns every value of the tree (which may share values:
// the pickle's memo, and None, bools and small ints).
class Pickle {
 public:
  const Value& root() const { return *root_; }
  // The bytes the parse charged against parse_budget (at most that budget).
  size_t charged_bytes() const { return charged_; }

 private:
  friend Pickle parse(const std::string& bytes, const std::string& where, Mode mode);
  friend class Parser;
  std::deque<Value> values_;
  Value* root_ = nullptr;
  size_t charged_ = 0;
};

// Parses `bytes` (a data.pkl; with kDcpMetadata a DCP .metadata).
// ConfigError naming `where` and the byte offset for anything malformed or
// not accepted (above), and for a pickle that would take more memory than
// parse_budget(bytes.size()) allows. Costs O(bytes.size()) time and at most
// parse_budget(bytes.size()) bytes of memory (plus the vector growth in
// flight), whatever the bytes are.
Pickle parse(const std::string& bytes, const std::string& where, Mode mode = Mode::kTorchLoad);

// ConfigError if `zip` records that it was written big-endian (tensor
// bytes are read as little-endian). Call it once per file.
void check_byte_order(const formats::FullReader& zip);

// The tensor `ref` describes, read from its storage record in `zip` (a
// view of the record's bytes, on the CPU); ConfigError naming `where` if the
// record is missing or too short for the view. Bytes are taken as
// little-endian: check_byte_order first.
at::Tensor read_tensor(const formats::FullReader& zip, const TensorRef& ref, const std::string& where);

}  // namespace fsdp::formats::pickle
