// The built-in storage of load_checkpoint (fsdp/checkpoint/storage.h): a
// checkpoint of any format opened as a Source, one per on-disk layout —
// fsdp-cpp's full file and earlier sharded directory, DCP directories
// (fsdp-cpp's, PyTorch's, Lightning's with meta.pt), full checkpoints that
// PyTorch or Lightning wrote (pickled.cpp), and a module's state dict in a
// torch.save file or a safetensors file (raw sources).
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/checkpoint/hf_storage.h"
#include "fsdp/error.h"
#include "fsdp/formats/dcp.h"
#include "fsdp/formats/torch_pickle.h"
#include "loading.h"
#include "parts.h"

namespace fsdp {

std::vector<StorageBox> StorageReader::chunks(const std::string& key) const {
  std::vector<StorageBox> out;
  auto it = index().tensors.find(key);
  if (it == index().tensors.end()) return out;
  for (const auto& c : it->second.chunks) out.push_back({c.offsets, c.sizes});
  return out;
}

bool StorageReader::keyed_by_ids(const std::string&) const { return false; }

std::unique_ptr<StorageReader> open_checkpoint_storage(const std::string& path) {
  if (is_hf_model_dir(path)) return std::make_unique<HfStorageReader>(path);
  return detail::open_source(path);
}

namespace detail {

namespace fs = std::filesystem;

const formats::EntryRecord* find_entry(const StorageReader& reader, const std::string& name) {
  for (const auto& e : reader.index().entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

const formats::TensorEntry& find_tensor(const StorageReader& reader, const std::string& key) {
  auto it = reader.index().tensors.find(key);
  if (it == reader.index().tensors.end()) {
    throw ConfigError("checkpoint: " + reader.location() + ": the index lists '" + key +
                      "' in an entry but has no tensor for it");
  }
  return it->second;
}

const formats::EntryRecord* Source::entry(const std::string& name) const { return find_entry(*this, name); }

const formats::TensorEntry& Source::tensor(const std::string& key) const { return find_tensor(*this, key); }

std::vector<StorageBox> Source::chunks(const std::string& key) const {
  if (pickled.count(key) || safetensors) {  // a tensor written whole by PyTorch: one box, the shape
    const auto& t = tensor(key);
    return {StorageBox{std::vector<int64_t>(t.shape.size(), 0), t.shape}};
  }
  return StorageReader::chunks(key);
}

at::Tensor Source::read_chunk(const std::string& key, size_t chunk) const {
  if (auto p = pickled.find(key); p != pickled.end()) {  // written by PyTorch: a view of a storage record
    const std::string name = raw ? key.substr(key.find('/') + 1) : key;  // a raw source's keys are the module's
    return formats::pickle::read_tensor(*full, p->second, "tensor '" + name + "'");
  }
  if (safetensors) {
    return formats::read_safetensors_tensor(path, *safetensors, safetensors->tensors.at(safetensors_at.at(key)));
  }
  const auto& t = tensor(key);
  const formats::Chunk& c = t.chunks.at(chunk);
  auto bytes = std::make_shared<std::string>(formats::read_chunk(c, key, full.get(), dir));
  return at::from_blob(
      bytes->data(), c.sizes, [bytes](void*) {}, at::TensorOptions().dtype(t.dtype));
}

const formats::EntryRecord& the_model(const StorageReader& reader, const std::string& caller, const std::string& what) {
  const formats::EntryRecord* model = nullptr;
  for (const auto& e : reader.index().entries) {
    if (e.type != formats::EntryType::kModel) continue;
    if (model) {
      throw ConfigError(caller + ": " + what + " holds several models; load it with a CheckpointState naming one");
    }
    model = &e;
  }
  if (!model) throw ConfigError(caller + ": " + what + " holds no model");
  return *model;
}

const formats::EntryRecord& Source::the_model(const std::string& caller) const { return detail::the_model(*this, caller, path); }

at::Tensor Source::read_whole(const std::string& key) const {
  const auto& t = tensor(key);
  TensorRead read{"", key, true, {BoxRead{StorageBox{std::vector<int64_t>(t.shape.size(), 0), t.shape}, {}}}};
  const size_t n = chunks(key).size();
  for (size_t c = 0; c < n; ++c) read.boxes[0].chunks.push_back(c);
  return apply_read(*this, read)[0];
}

namespace {

[[noreturn]] void not_a_checkpoint(const std::string& path, const std::string& why = "") {
  throw ConfigError("The path '" + path + "' does not point to a valid checkpoint. Make sure the path points to either "
                    "a directory with FSDP checkpoint shards, or a single file with a full checkpoint." +
                    (why.empty() ? "" : " (" + why + ")"));
}

std::string read_small(const std::string& path) {
  const int64_t size = formats::file_size(path);
  if (size > (int64_t{1} << 30)) throw ConfigError("checkpoint: " + path + " is implausibly large");
  return formats::read_range(path, 0, size);
}

bool same_value(const formats::EntryRecord& a, const formats::EntryRecord& b) {
  if (a.type != b.type) return false;
  if (a.type == formats::EntryType::kFloat) {
    const double x = std::get<double>(a.value), y = std::get<double>(b.value);
    return x == y || (std::isnan(x) && std::isnan(y));
  }
  return a.value == b.value;
}

std::string value_in(const formats::EntryRecord& e) {
  if (e.type == formats::EntryType::kTensor) return "a tensor";
  if (e.type == formats::EntryType::kStr) return "the string '" + formats::value_text(e).substr(0, 60) + "'";
  return std::string("the ") + formats::entry_type_name(e.type) + " " + formats::value_text(e);
}

// A tensor value of `a` and `b` (the same name): dtype, shape and bytes.
std::string tensor_difference(const Source& a, const Source& b, const std::string& name) {
  const formats::TensorEntry &x = a.tensor(name), &y = b.tensor(name);
  if (x.dtype != y.dtype || x.shape != y.shape) {
    return std::string("a tensor of dtype ") + c10::toString(x.dtype) + " and shape " + c10::str(c10::IntArrayRef(x.shape)) +
           " in " + a.where + ", of dtype " + c10::toString(y.dtype) + " and shape " + c10::str(c10::IntArrayRef(y.shape)) +
           " in " + b.where;
  }
  const at::Tensor u = a.read_whole(name).contiguous(), v = b.read_whole(name).contiguous();
  const size_t n = static_cast<size_t>(u.numel()) * u.element_size();
  if (n == 0 || std::memcmp(u.data_ptr(), v.data_ptr(), n) == 0) return "";
  return "tensors of the same dtype and shape but different elements in " + a.where + " and " + b.where;
}

// Lightning's meta.pt beside .metadata (`s` is open): fabric.load reads the
// values from meta.pt, fsdp-cpp from its index, so every value both hold
// must agree (a meta.pt of another save, copied in, would give Lightning
// another step); ConfigError naming the first that differs. Values that
// only meta.pt holds join an index built from .metadata (`built`): Lightning
// keeps them there alone.
void check_lightning_meta(Source& s, bool built) {
  std::optional<formats::Index> meta = formats::lightning_meta(s.dir);
  if (!meta) return;
  Source m;
  m.path = s.path;
  m.dir = s.dir;
  m.where = (fs::path(s.dir) / formats::kLightningMetaFile).string();
  m.ix = std::move(*meta);
  for (const auto& e : m.ix.entries) {
    const formats::EntryRecord* own = s.entry(e.name);
    if (!own) {
      if (!built) continue;
      s.ix.entries.push_back(e);
      if (e.type == formats::EntryType::kTensor) {
        s.ix.tensor_order.push_back(e.name);
        s.ix.tensors[e.name] = m.ix.tensors.at(e.name);
        if (std::find(s.ix.files.begin(), s.ix.files.end(), formats::kLightningMetaFile) == s.ix.files.end()) {
          s.ix.files.push_back(formats::kLightningMetaFile);
        }
      }
      continue;
    }
    if (own->is_state_dict()) continue;  // a model or optimizer, not a value
    std::string difference;
    if (own->type == formats::EntryType::kTensor && e.type == formats::EntryType::kTensor) {
      difference = tensor_difference(s, m, e.name);
    } else if (!same_value(*own, e)) {
      difference = value_in(*own) + " in " + s.where + ", " + value_in(e) + " in " + m.where;
    }
    if (!difference.empty()) {
      throw ConfigError("checkpoint: " + m.where + " disagrees with " + s.where + " on the value '" + e.name +
                        "': " + difference + ". Lightning's fabric.load reads meta.pt, fsdp-cpp the index: the two "
                        "files come from different saves, so the checkpoint is damaged");
    }
  }
}

// A DCP directory (its .metadata): fsdp-cpp's own index when it belongs to
// this save (same save id), else the index built from .metadata; then
// Lightning's meta.pt against it (check_lightning_meta).
void open_dcp(Source& s) {
  const std::string metadata = (fs::path(s.path) / formats::kDcpMetadataFile).string();
  const std::string metadata_bytes = read_small(metadata);
  const formats::DcpMetadata md = formats::parse_dcp_metadata(metadata_bytes, metadata);
  const std::string own = (fs::path(s.path) / formats::kDcpIndexFile).string();
  s.dir = s.path;
  if (formats::file_size(own) >= 0) {
    formats::Index ix = formats::parse_index(read_small(own), own);
    if (ix.kind == formats::Index::Kind::kSharded && !md.save_id.empty() && ix.save_id == md.save_id) {
      const uint32_t crc = formats::crc32(metadata_bytes.data(), metadata_bytes.size());
      if (ix.has_metadata_crc && ix.metadata_crc != crc) {
        throw ConfigError("checkpoint: checksum mismatch in " + metadata + ": " + formats::kDcpIndexFile +
                          " records its CRC-32 as " + std::to_string(ix.metadata_crc) + ", its bytes have " +
                          std::to_string(crc) + " (the file is damaged; PyTorch would read wrong chunks from it)");
      }
      s.where = own;
      s.ix = std::move(ix);
      check_lightning_meta(s, /*built=*/false);
      return;
    }
    // Another save's index: legitimately, a save killed between writing it
    // and committing .metadata (which then names the previous save's files).
    // A .metadata naming this index's files under another save id is damaged.
    std::set<std::string> named;
    for (const auto& it : md.items) {
      if (it.is_bytes) named.insert(it.bytes.file);
      for (const auto& c : it.chunks) named.insert(c.storage.file);
    }
    for (const auto& f : ix.files) {
      if (named.count(f)) {
        throw ConfigError("checkpoint: " + metadata + " names the data file " + f + " of save " + ix.save_id + " (" +
                          formats::kDcpIndexFile + ") but its save id is '" + md.save_id + "': the file is damaged");
      }
    }
  }
  s.where = metadata;
  s.ix = formats::dcp_index(md, s.path);
  check_lightning_meta(s, /*built=*/true);
}

// A directory: a DCP checkpoint (.metadata), or fsdp-cpp's earlier layout
// (index.json of kind "sharded" and data-*.bin files).
void open_sharded(Source& s) {
  std::error_code ec;
  for (const char* name : {formats::kDcpMetadataFile, formats::kIndexFile, formats::kDcpIndexFile}) {
    const fs::path p = fs::path(s.path) / name;
    if (fs::exists(fs::symlink_status(p, ec)) && !fs::is_regular_file(p, ec)) {
      throw ConfigError("checkpoint: " + p.string() + " is not a regular file; refusing to read it");
    }
  }
  if (fs::is_regular_file(fs::path(s.path) / formats::kDcpMetadataFile, ec)) return open_dcp(s);
  const fs::path index = fs::path(s.path) / formats::kIndexFile;
  if (!fs::is_regular_file(index, ec)) {
    for (const auto& f : fs::directory_iterator(s.path, ec)) {
      const std::string name = f.path().filename().string();
      const bool distcp = name.find(".distcp") != std::string::npos;
      if (name.rfind("data-", 0) == 0 || name.rfind("index.json.tmp", 0) == 0 || distcp) {
        throw ConfigError("checkpoint: " + s.path + " holds an incomplete sharded checkpoint: it has data files but no " +
                          (distcp ? ".metadata" : "index.json") +
                          " (the save was interrupted before its commit); load an earlier checkpoint");
      }
    }
    not_a_checkpoint(s.path, "a directory without .metadata or index.json");
  }
  s.where = index.string();
  s.ix = formats::parse_index(read_small(s.where), s.where);
  if (s.ix.kind != formats::Index::Kind::kSharded) {
    throw ConfigError("checkpoint: " + s.where + ": a directory's index must be of kind \"sharded\"");
  }
  s.dir = s.path;
}

// The tensors of a raw source's pickle, by key and in order; ConfigError
// naming the file when it is not a module's state dict.
struct RawTensors {
  std::map<std::string, const formats::pickle::TensorRef*> by_key;
  std::vector<std::string> order;
};
RawTensors raw_tensors(const formats::FullReader& zip, const formats::pickle::Value& root) {
  using Kind = formats::pickle::Value::Kind;
  if (root.kind != Kind::kDict) {
    throw ConfigError("load_checkpoint: " + zip.path() + " holds " + formats::pickle::describe(root) +
                      ", not a state dict (a dict from names to tensors, as torch.save(model.state_dict()) writes)");
  }
  RawTensors out;
  for (const auto& [k, v] : root.entries) {
    if (k->kind != Kind::kString) {
      throw ConfigError("load_checkpoint: " + zip.path() + " holds a dict with the key " + formats::pickle::describe(*k) +
                        ": not a state dict (its keys are parameter and buffer names)");
    }
    if (v->kind != Kind::kTensor) {
      throw ConfigError("load_checkpoint: " + zip.path() + ": '" + k->text + "' is " + formats::pickle::describe(*v) +
                        ", not a tensor: the file is not a module's state dict" +
                        (v->kind == Kind::kDict ? " (a checkpoint holding one? Load it with a CheckpointState, or "
                                                  "save model.state_dict() alone)"
                                                : ""));
    }
    out.by_key[k->text] = &v->tensor();
    out.order.push_back(k->text);
  }
  return out;
}

// A raw source's index: its tensors as one model entry, "model", in the
// file's order, each without chunks (read whole).
void add_raw_model(Source& s) {
  s.ix.entries.emplace_back();
  s.ix.entries.back().name = "model";
  s.ix.entries.back().type = formats::EntryType::kModel;
}
void add_raw_tensor(Source& s, const std::string& key, at::ScalarType dtype, const std::vector<int64_t>& shape) {
  const std::string tkey = s.ix.entries.back().name + "/" + key;
  s.ix.entries.back().keys.push_back(key);
  s.ix.tensor_order.push_back(tkey);
  s.ix.tensors[tkey] = formats::TensorEntry{dtype, shape, {}};
}

// Lightning's load_raw: a torch.save'd module state dict (s.full) as a raw
// source. Parses the file's pickle.
void index_raw(Source& s) {
  const formats::FullReader& zip = *s.full;
  const auto parsed = formats::pickle::parse(zip.read("data.pkl"), s.where);
  const RawTensors tensors = raw_tensors(zip, parsed.root());
  formats::pickle::check_byte_order(zip);
  add_raw_model(s);
  for (const auto& k : tensors.order) {
    const auto& ref = *tensors.by_key.at(k);
    add_raw_tensor(s, k, ref.dtype, ref.sizes);
    s.pickled.emplace("model/" + k, ref);
  }
}

// A safetensors file's header (s.safetensors) as a raw source.
void index_safetensors(Source& s) {
  const auto& tensors = s.safetensors->tensors;
  add_raw_model(s);
  for (size_t i = 0; i < tensors.size(); ++i) {
    add_raw_tensor(s, tensors[i].name, tensors[i].dtype, tensors[i].shape);
    s.safetensors_at["model/" + tensors[i].name] = i;
  }
}

// A file: PyTorch's zip, with fsdp-cpp's index (of kind "full") or, with
// accept_raw, a module's state dict; with accept_raw, a safetensors file.
void open_file(Source& s, bool accept_raw) {
  const std::string& path = s.path;
  const int64_t size = formats::file_size(path);
  const std::string head = formats::read_range(path, 0, std::min<int64_t>(size, 64));
  // By content (a name ending in .safetensors gets the safetensors reader's
  // errors when its content is not right).
  if (formats::looks_like_safetensors(head, size) || (accept_raw && fs::path(path).extension() == ".safetensors")) {
    if (!accept_raw) {
      not_a_checkpoint(path, "a safetensors file, which holds a model's weights only: it loads with "
                             "load_checkpoint(path, module)");
    }
    s.safetensors = std::make_unique<formats::SafetensorsHeader>(formats::read_safetensors_header(path));
    s.where = path;
    index_safetensors(s);
    return;
  }
  try {
    s.full = std::make_unique<formats::FullReader>(path);
  } catch (const ConfigError& e) {
    // torch.save(..., _use_new_zipfile_serialization=False): a bare pickle
    // that starts with the legacy format's magic number (a LONG1 of 10 bytes).
    if (accept_raw && head.compare(0, 4, std::string("\x80\x02\x8a\x0a", 4)) == 0) {
      throw ConfigError("load_checkpoint: " + path + " is in PyTorch's legacy format (torch.save with "
                        "_use_new_zipfile_serialization=False), which fsdp-cpp does not read; save it again with "
                        "torch.save's default format");
    }
    not_a_checkpoint(path, e.what());
  }
  if (accept_raw && !s.full->has(formats::kFullIndexRecord) && s.full->has("data.pkl")) {
    if (s.full->has("constants.pkl")) {
      throw ConfigError("load_checkpoint: " + path + " is a TorchScript archive (torch.jit.save, or torch::save of a "
                        "module), not a state dict: load it with torch::load(module, path), or save "
                        "model.state_dict() with torch.save");
    }
    s.raw = true;
    s.where = path + " (record data.pkl)";
    index_raw(s);
    return;
  }
  if (!s.full->has(formats::kFullIndexRecord)) {
    if (!s.full->has("data.pkl") || s.full->has("constants.pkl")) {
      not_a_checkpoint(path, "a zip file that is neither a checkpoint nor a torch.save file");
    }
    s.where = path + " (record data.pkl)";
    index_pickled(s);  // written by PyTorch or Lightning
    return;
  }
  s.where = path + " (record " + formats::kFullIndexRecord + ")";
  s.ix = formats::parse_index(s.full->read(formats::kFullIndexRecord), s.where);
  if (s.ix.kind != formats::Index::Kind::kFull) {
    throw ConfigError("checkpoint: " + s.where + ": a file's index must be of kind \"full\"");
  }
}

}  // namespace

std::unique_ptr<Source> open_source(const std::string& path, bool accept_raw) {
  auto s = std::make_unique<Source>();
  s->path = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    open_sharded(*s);
  } else if (fs::is_regular_file(path, ec)) {
    open_file(*s, accept_raw);
  } else {
    not_a_checkpoint(path);
  }
  return s;
}

}  // namespace detail

}  // namespace fsdp
