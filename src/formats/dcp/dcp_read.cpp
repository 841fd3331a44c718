// Reading DCP checkpoints: `.metadata` into typed records, and the index of
// chunks located inside the items of the data files.
#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "fsdp/formats/dcp.h"
#include "fsdp/error.h"
#include "fsdp/formats/torch_pickle.h"

namespace fsdp::formats {

namespace {

namespace fs = std::filesystem;
using pickle::Value;
using K = Value::Kind;

constexpr size_t kMaxDims = 16;
constexpr int64_t kMaxDim = int64_t{1} << 40;
constexpr int64_t kMaxOffset = int64_t{1} << 56;

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw ConfigError("checkpoint: " + where + ": " + what);
}

bool is_object(const Value* v, const char* cls) {
  if (!v || v->kind != K::kObject) return false;
  const auto dot = v->text.rfind('.');
  return v->text.substr(dot + 1) == cls;
}

const Value& object(const Value* v, const char* cls, const std::string& where) {
  if (!is_object(v, cls)) bad(where, std::string("expected a ") + cls + " object, found " + (v ? pickle::describe(*v) : "nothing"));
  return *v;
}

// A field of a dataclass object's BUILD state (null if absent).
const Value* field(const Value& obj, const char* name) { return obj.state ? obj.state->get(name) : nullptr; }
const Value& need(const Value& obj, const char* name, const std::string& where) {
  const Value* f = field(obj, name);
  if (!f) bad(where, std::string("a ") + obj.text.substr(obj.text.rfind('.') + 1) + " has no field '" + name + "'");
  return *f;
}

int64_t int_of(const Value& v, const std::string& what, int64_t hi, const std::string& where) {
  if (v.kind != K::kInt) bad(where, what + " is " + pickle::describe(v) + ", not an int");
  if (v.integer < 0 || v.integer > hi) bad(where, what + " = " + std::to_string(v.integer) + " is out of range");
  return v.integer;
}

std::string str_of(const Value& v, const std::string& what, const std::string& where) {
  if (v.kind != K::kString) bad(where, what + " is " + pickle::describe(v) + ", not a string");
  return v.text;
}

// A torch.Size or tuple of ints (torch.Size's REDUCE yields its tuple).
std::vector<int64_t> ints_of(const Value& v, const std::string& what, const std::string& where) {
  if (v.kind != K::kTuple && v.kind != K::kList) bad(where, what + " is " + pickle::describe(v) + ", not a tuple of ints");
  if (v.items.size() > kMaxDims) bad(where, what + " has too many dimensions");
  std::vector<int64_t> out;
  for (const Value* x : v.items) out.push_back(int_of(*x, what, kMaxDim, where));
  return out;
}

DcpStorage storage_of(const Value& info, const std::string& where) {
  object(&info, "_StorageInfo", where);
  DcpStorage s;
  s.file = str_of(need(info, "relative_path", where), "relative_path", where);
  if (!safe_file_name(s.file)) bad(where, "the data file name '" + s.file + "' is not a plain name inside the directory");
  s.offset = int_of(need(info, "offset", where), "an item's offset", kMaxOffset, where);
  s.length = int_of(need(info, "length", where), "an item's length", kMaxOffset, where);
  const Value* td = field(info, "transform_descriptors");
  if (td && td->kind != K::kNone && !td->items.empty()) {
    bad(where, "item in " + s.file + " has storage transforms (DCP extensions such as compression), which fsdp-cpp "
               "does not read");
  }
  return s;
}

// storage_data's key: (fqn, chunk offsets) for tensors, (fqn) for bytes.
using StorageKey = std::tuple<std::string, bool, std::vector<int64_t>>;

std::map<StorageKey, DcpStorage> storage_data(const Value& md, const std::string& where) {
  const Value& sd = need(md, "storage_data", where);
  if (sd.kind != K::kDict) bad(where, "storage_data is " + pickle::describe(sd) + ", not a dict");
  std::map<StorageKey, DcpStorage> out;
  for (const auto& [k, v] : sd.entries) {
    const Value& mi = object(k, "MetadataIndex", where + " (storage_data)");
    const std::string fqn = str_of(need(mi, "fqn", where), "a MetadataIndex's fqn", where);
    const Value* off = field(mi, "offset");
    const bool tensor = off && off->kind != K::kNone;
    StorageKey key{fqn, tensor, tensor ? ints_of(*off, "a MetadataIndex's offset", where) : std::vector<int64_t>{}};
    out[key] = storage_of(*v, where + " (storage of '" + fqn + "')");
  }
  return out;
}

// The path of a flattened key in planner_data: strings and ints (as text).
std::vector<std::string> path_of(const Value* planner, const std::string& key, const std::string& where,
                                 std::vector<bool>& is_int) {
  const Value* p = planner ? planner->get(key) : nullptr;
  if (!p) {
    bad(where, "planner_data has no path for '" + key + "' (fsdp-cpp needs it to tell models from optimizers, "
               "as Lightning and dcp_to_torch_save do)");
  }
  if (p->kind != K::kTuple && p->kind != K::kList) bad(where, "planner_data of '" + key + "' is not a tuple");
  std::vector<std::string> out;
  for (const Value* x : p->items) {
    is_int.push_back(x->kind == K::kInt);
    if (x->kind == K::kString) {
      out.push_back(x->text);
    } else if (x->kind == K::kInt) {
      out.push_back(std::to_string(x->integer));
    } else {
      bad(where, "planner_data of '" + key + "' holds " + pickle::describe(*x));
    }
  }
  if (out.empty()) bad(where, "planner_data of '" + key + "' is empty");
  return out;
}

at::ScalarType dtype_of(const Value& props, const std::string& where) {
  object(&props, "TensorProperties", where);
  const Value* st = props.state;
  const Value* dtype = nullptr;
  if (st && st->kind == K::kTuple && !st->items.empty()) dtype = st->items[0];  // __getstate__'s tuple
  if (st && st->kind == K::kDict) dtype = st->get("dtype");
  if (!dtype || dtype->kind != K::kGlobal || dtype->text.rfind("torch.", 0) != 0) bad(where, "TensorProperties without a dtype");
  return parse_dtype(dtype->text.substr(6), where);
}

}  // namespace

DcpMetadata parse_dcp_metadata(const std::string& bytes, const std::string& where) {
  const pickle::Pickle p = pickle::parse(bytes, where, pickle::Mode::kDcpMetadata);
  const Value& md = object(&p.root(), "Metadata", where);
  DcpMetadata out;
  const Value* sm = field(md, "storage_meta");
  if (sm && is_object(sm, "StorageMeta")) {
    const Value* id = field(*sm, "save_id");
    if (id && id->kind == K::kString) out.save_id = id->text;
  }
  const auto storage = storage_data(md, where);
  const Value* planner = field(md, "planner_data");
  const Value& sdm = need(md, "state_dict_metadata", where);
  if (sdm.kind != K::kDict) bad(where, "state_dict_metadata is " + pickle::describe(sdm) + ", not a dict");
  for (const auto& [k, v] : sdm.entries) {
    DcpItem item;
    item.key = str_of(*k, "a key of state_dict_metadata", where);
    const std::string at = where + " (key '" + item.key + "')";
    item.path = path_of(planner, item.key, at, item.path_is_int);
    if (is_object(v, "BytesStorageMetadata")) {
      item.is_bytes = true;
      auto it = storage.find(StorageKey{item.key, false, {}});
      if (it == storage.end()) bad(at, "storage_data has no entry for this bytes item");
      item.bytes = it->second;
    } else {
      const Value& tsm = object(v, "TensorStorageMetadata", at);
      item.dtype = dtype_of(need(tsm, "properties", at), at);
      item.shape = ints_of(need(tsm, "size", at), "a tensor's size", at);
      const Value& chunks = need(tsm, "chunks", at);
      if (chunks.kind != K::kList) bad(at, "chunks is " + pickle::describe(chunks) + ", not a list");
      for (const Value* c : chunks.items) {
        const Value& cm = object(c, "ChunkStorageMetadata", at);
        DcpItem::Piece piece;
        piece.offsets = ints_of(need(cm, "offsets", at), "a chunk's offsets", at);
        piece.sizes = ints_of(need(cm, "sizes", at), "a chunk's sizes", at);
        if (piece.offsets.size() != item.shape.size() || piece.sizes.size() != item.shape.size()) {
          bad(at, "a chunk's offsets and sizes must have one value per dimension of the tensor");
        }
        for (size_t d = 0; d < item.shape.size(); ++d) {
          if (piece.offsets[d] + piece.sizes[d] > item.shape[d]) bad(at, "a chunk lies outside the tensor's size");
        }
        auto it = storage.find(StorageKey{item.key, true, piece.offsets});
        if (it == storage.end()) bad(at, "storage_data has no entry for a chunk of this tensor");
        piece.storage = it->second;
        item.chunks.push_back(std::move(piece));
      }
    }
    out.items.push_back(std::move(item));
  }
  return out;
}

namespace {

std::string join(const std::vector<std::string>& parts, size_t from) {
  std::string s;
  for (size_t i = from; i < parts.size(); ++i) s += (i > from ? "." : "") + parts[i];
  return s;
}

// A tensor's raw bytes inside a torch.save zip (`zip`, which lies at
// `storage` in the directory): the tensor is its whole storage, contiguous,
// of `sizes`, in record data/<key>; the chunk covers the box at `offsets`.
Chunk chunk_in(const FullReader& zip, const pickle::TensorRef& t, const DcpStorage& storage,
               const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes, const std::string& at) {
  if (t.sizes != sizes) bad(at, "holds a tensor whose size differs from its chunk's");
  int64_t stride = 1;
  for (size_t d = t.sizes.size(); d-- > 0;) {
    if (t.sizes[d] != 1 && t.strides[d] != stride) bad(at, "holds a non-contiguous tensor (fsdp-cpp reads DCP's contiguous items)");
    stride *= t.sizes[d];
  }
  const int64_t numel = stride;
  if (t.offset != 0 || t.storage_numel != numel) {
    bad(at, "holds a view of a larger storage (fsdp-cpp reads items whose tensor is its whole storage, as DCP writes them)");
  }
  const std::string record = "data/" + t.storage;
  if (t.storage.empty() || t.storage.find('/') != std::string::npos || !zip.has(record)) bad(at, "has no record " + record);
  Chunk c;
  c.file = storage.file;
  c.nbytes = numel * static_cast<int64_t>(c10::elementSize(t.dtype));
  const int64_t rec = zip.record_offset(record);
  if (rec < 0 || rec > storage.length || c.nbytes > storage.length - rec) bad(at, "its data record lies outside the item");
  c.offset = storage.offset + rec;
  c.offsets = offsets;
  c.sizes = sizes;
  c.crc = zip.record_crc(record);
  return c;
}

// A chunk's raw bytes inside its item: a torch.save zip of one tensor that
// is its whole storage (as DCP writes it), contiguous, of the chunk's size.
Chunk locate_chunk(const DcpItem& item, const DcpItem::Piece& piece, const std::string& dir) {
  const std::string path = (fs::path(dir) / piece.storage.file).string();
  FullReader zip(path, piece.storage.offset, piece.storage.length);
  const std::string at = zip.where() + " (a chunk of '" + item.key + "')";
  pickle::check_byte_order(zip);
  const pickle::Pickle p = pickle::parse(zip.read("data.pkl"), at);
  if (p.root().kind != K::kTensor) bad(at, "holds " + pickle::describe(p.root()) + ", not a tensor");
  const pickle::TensorRef& t = p.root().tensor();
  if (t.dtype != item.dtype) {
    bad(at, std::string("holds a tensor of dtype ") + c10::toString(t.dtype) + ", the metadata says " +
                c10::toString(item.dtype));
  }
  return chunk_in(zip, t, piece.storage, piece.offsets, piece.sizes, at);
}

// An entry's value from a Python value: int, float, bool, str.
void set_value(EntryRecord& e, const Value& v, const std::string& at) {
  switch (v.kind) {
    case K::kInt: e.type = EntryType::kInt; e.value = v.integer; return;
    case K::kFloat: e.type = EntryType::kFloat; e.value = v.floating; return;
    case K::kBool: e.type = EntryType::kBool; e.value = v.boolean; return;
    case K::kString: e.type = EntryType::kStr; e.value = v.text; return;
    default:
      bad(at, "is " + pickle::describe(v) + "; fsdp-cpp reads values that are ints, floats, bools, strings or tensors");
  }
}

// A parameter group's option into fsdp-cpp's numbers: floats, ints, bools
// (0 / 1), tuples of them (betas -> betas.0, betas.1); None is left out.
void set_option(ParamGroup& g, const std::string& name, const Value& v, const std::string& at) {
  switch (v.kind) {
    case K::kNone: return;
    case K::kFloat: g.options[name] = v.floating; return;
    case K::kInt: g.options[name] = static_cast<double>(v.integer); return;
    case K::kBool: g.options[name] = v.boolean ? 1.0 : 0.0; return;
    case K::kTuple:
      for (size_t i = 0; i < v.items.size(); ++i) set_option(g, name + "." + std::to_string(i), *v.items[i], at);
      return;
    default: bad(at, "is " + pickle::describe(v) + ", not a number, bool, None or tuple of numbers");
  }
}

// Lightning's meta.pt (`zip`, the file `storage`): a torch.save'd dict of
// values, nested dicts as dotted names; a tensor value is indexed as one
// chunk inside meta.pt.
void add_meta_values(const Value& v, const std::string& prefix, Index& ix, const FullReader& zip,
                     const DcpStorage& storage) {
  const std::string& where = storage.file;
  for (const auto& [k, x] : v.entries) {
    if (k->kind != K::kString) bad(where, "has the key " + pickle::describe(*k) + "; values are named by strings");
    const std::string name = prefix.empty() ? k->text : prefix + "." + k->text;
    if (x->kind == K::kDict) {
      add_meta_values(*x, name, ix, zip, storage);
      continue;
    }
    EntryRecord e;
    e.name = name;
    if (x->kind == K::kTensor) {
      const pickle::TensorRef& t = x->tensor();
      TensorEntry te;
      te.dtype = t.dtype;
      te.shape = t.sizes;
      te.chunks.push_back(chunk_in(zip, t, storage, std::vector<int64_t>(t.sizes.size(), 0), t.sizes,
                                   zip.where() + ": value '" + name + "'"));
      e.type = EntryType::kTensor;
      ix.tensor_order.push_back(name);
      ix.tensors[name] = std::move(te);
    } else {
      set_value(e, *x, zip.where() + ": value '" + name + "'");
    }
    ix.entries.push_back(std::move(e));
  }
}

}  // namespace

Index dcp_index(const DcpMetadata& md, const std::string& dir) {
  Index ix;
  ix.kind = Index::Kind::kSharded;
  ix.save_id = md.save_id;
  const std::string where = (fs::path(dir) / kDcpMetadataFile).string();
  // Top-level names: optimizers have "state" / "param_groups" below them.
  std::map<std::string, EntryType> kinds;
  std::vector<std::string> order;
  for (const auto& it : md.items) {
    const std::string& top = it.path[0];
    if (!kinds.count(top)) order.push_back(top);
    const bool optim = it.path.size() >= 3 && (it.path[1] == "state" || it.path[1] == "param_groups");
    auto& k = kinds.emplace(top, it.path.size() == 1 ? EntryType::kTensor : EntryType::kModel).first->second;
    if (optim) k = EntryType::kOptimizer;
  }
  std::map<std::string, EntryRecord> entries;
  std::set<std::string> files;
  for (const auto& it : md.items) {
    const std::string& top = it.path[0];
    const std::string at = where + " (key '" + it.key + "')";
    const EntryType kind = kinds.at(top);
    auto value_bytes = [&]() {
      FullReader zip((fs::path(dir) / it.bytes.file).string(), it.bytes.offset, it.bytes.length);
      files.insert(it.bytes.file);
      auto parsed = std::make_shared<pickle::Pickle>(pickle::parse(zip.read("data.pkl"), zip.where()));
      return parsed;
    };
    std::string tensor_key;
    if (kind == EntryType::kOptimizer) {
      EntryRecord& e = entries[top];
      e.name = top;
      e.type = EntryType::kOptimizer;
      if (it.path[1] == "param_groups") {
        if (!it.is_bytes || it.path.size() != 4) bad(at, "a parameter group's option must be a bytes item <name>.param_groups.<i>.<option>");
        const std::string& gi = it.path[2];
        if (gi.empty() || gi.size() > 4 || gi.find_first_not_of("0123456789") != std::string::npos) {
          bad(at, "a parameter group's index must be a small int");
        }
        const int64_t g = std::stoll(gi);
        if (e.param_groups.size() <= static_cast<size_t>(g)) e.param_groups.resize(static_cast<size_t>(g) + 1);
        const auto v = value_bytes();
        auto& group = e.param_groups[static_cast<size_t>(g)];
        if (it.path[3] == "params") {
          if (v->root().kind != K::kList) bad(at, "params is " + pickle::describe(v->root()) + ", not a list of names");
          for (const Value* n : v->root().items) group.params.push_back(str_of(*n, "a parameter name", at));
        } else {
          set_option(group, it.path[3], v->root(), at);
        }
        continue;
      }
      if (it.is_bytes || it.path[1] != "state" || it.path.size() < 4) {
        bad(at, "an optimizer's state must be tensors <name>.state.<parameter>.<field>");
      }
      const std::string key = it.path[2] + "." + join(it.path, 3);
      e.keys.push_back(key);
      tensor_key = top + "/" + key;
    } else if (kind == EntryType::kModel && !it.is_bytes) {
      EntryRecord& e = entries[top];
      e.name = top;
      e.type = EntryType::kModel;
      const std::string key = join(it.path, 1);
      e.keys.push_back(key);
      tensor_key = top + "/" + key;
    } else {
      // A value: a top-level item, or a nested one named by its dotted path.
      EntryRecord e;
      e.name = join(it.path, 0);
      if (it.is_bytes) {
        set_value(e, value_bytes()->root(), at);
      } else {
        e.type = EntryType::kTensor;
        tensor_key = e.name;
      }
      entries[e.name] = e;
      if (std::find(order.begin(), order.end(), e.name) == order.end()) order.push_back(e.name);
    }
    if (tensor_key.empty()) continue;
    TensorEntry t;
    t.dtype = it.dtype;
    t.shape = it.shape;
    for (const auto& piece : it.chunks) {
      t.chunks.push_back(locate_chunk(it, piece, dir));
      files.insert(piece.storage.file);
    }
    ix.tensor_order.push_back(tensor_key);
    ix.tensors[tensor_key] = std::move(t);
  }
  for (const auto& name : order) {
    auto e = entries.find(name);
    if (e != entries.end()) ix.entries.push_back(e->second);
  }
  ix.files.assign(files.begin(), files.end());
  ix.world_size = std::max<int>(1, static_cast<int>(ix.files.size()));
  return ix;
}

std::optional<Index> lightning_meta(const std::string& dir) {
  const std::string meta = (fs::path(dir) / kLightningMetaFile).string();
  const int64_t meta_size = file_size(meta);
  if (meta_size < 0) return std::nullopt;
  FullReader zip(meta);
  pickle::check_byte_order(zip);
  const pickle::Pickle p = pickle::parse(zip.read("data.pkl"), meta);
  if (p.root().kind != K::kDict) bad(meta, "holds " + pickle::describe(p.root()) + ", not a dict of values");
  Index ix;
  ix.kind = Index::Kind::kSharded;
  add_meta_values(p.root(), "", ix, zip, DcpStorage{kLightningMetaFile, 0, meta_size});
  if (!ix.tensors.empty()) ix.files.push_back(kLightningMetaFile);
  return ix;
}

}  // namespace fsdp::formats
