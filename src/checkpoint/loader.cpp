// Loading checkpoints of either format, at any world size, and module
// state dicts that torch.save wrote.
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>

#include "dcp.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "parts.h"
#include "fsdp/error.h"
#include "fsdp/state_dict/optim_state_dict.h"
#include "../state_dict/model_index.h"
#include "../state_dict/optim_state_dict_visit.h"
#include "../state_dict/optimizer_kinds.h"
#include "../state_dict/shard_geometry.h"
#include "../state_dict/state_dict_visit.h"
#include "torch_pickle.h"

namespace fsdp {

namespace detail {

namespace fs = std::filesystem;

const checkpoint::EntryRecord* Source::entry(const std::string& name) const {
  for (const auto& e : ix.entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

const checkpoint::TensorEntry& Source::tensor(const std::string& key) const {
  auto it = ix.tensors.find(key);
  if (it == ix.tensors.end()) {
    throw ConfigError("checkpoint: " + where + ": the index lists '" + key + "' in an entry but has no tensor for it");
  }
  return it->second;
}

int64_t Source::fill(const std::string& key, std::vector<Shard>& targets) const {
  const auto& t = tensor(key);
  int64_t covered = 0;
  if (auto p = pickled.find(key); p != pickled.end()) {  // written by PyTorch: a view of a storage record
    const at::Tensor whole = pickle::read_tensor(*full, p->second, "tensor '" + key + "'");
    for (auto& target : targets) {
      covered += copy_overlap(target.tensor, target.offsets, {Shard{std::vector<int64_t>(t.shape.size(), 0), whole}});
    }
    return covered;
  }
  for (const auto& c : t.chunks) {
    bool needed = false;
    for (const auto& target : targets) {
      bool overlap = true;
      for (size_t d = 0; d < c.offsets.size(); ++d) {
        overlap &= std::max(c.offsets[d], target.offsets[d]) <
                   std::min(c.offsets[d] + c.sizes[d], target.offsets[d] + target.tensor.size(static_cast<int64_t>(d)));
      }
      needed |= overlap;
    }
    if (!needed) continue;
    std::string bytes = checkpoint::read_chunk(c, key, full.get(), dir);
    at::Tensor src = at::from_blob(bytes.data(), c.sizes, at::TensorOptions().dtype(t.dtype));
    for (auto& target : targets) covered += copy_overlap(target.tensor, target.offsets, {Shard{c.offsets, src}});
  }
  return covered;
}

const checkpoint::EntryRecord& Source::the_model(const std::string& caller) const {
  const checkpoint::EntryRecord* model = nullptr;
  for (const auto& e : ix.entries) {
    if (e.type != checkpoint::EntryType::kModel) continue;
    if (model) {
      throw ConfigError(caller + ": " + path + " holds several models; load it with a CheckpointState naming one");
    }
    model = &e;
  }
  if (!model) throw ConfigError(caller + ": " + path + " holds no model");
  return *model;
}

at::Tensor Source::read_whole(const std::string& key) const {
  const auto& t = tensor(key);
  std::vector<Shard> target{Shard{std::vector<int64_t>(t.shape.size(), 0), at::empty(t.shape, at::TensorOptions().dtype(t.dtype))}};
  if (fill(key, target) != target[0].tensor.numel()) {
    throw ConfigError("checkpoint: " + where + ": the chunks of tensor '" + key +
                      "' do not cover it (a shard is missing from the index)");
  }
  return target[0].tensor;
}

namespace {

[[noreturn]] void not_a_checkpoint(const std::string& path, const std::string& why = "") {
  throw ConfigError("The path '" + path + "' does not point to a valid checkpoint. Make sure the path points to either "
                    "a directory with FSDP checkpoint shards, or a single file with a full checkpoint." +
                    (why.empty() ? "" : " (" + why + ")"));
}

std::string read_small(const std::string& path) {
  const int64_t size = checkpoint::file_size(path);
  if (size > (int64_t{1} << 30)) throw ConfigError("checkpoint: " + path + " is implausibly large");
  return checkpoint::read_range(path, 0, size);
}

bool same_value(const checkpoint::EntryRecord& a, const checkpoint::EntryRecord& b) {
  if (a.type != b.type) return false;
  if (a.type == checkpoint::EntryType::kFloat) {
    const double x = std::get<double>(a.value), y = std::get<double>(b.value);
    return x == y || (std::isnan(x) && std::isnan(y));
  }
  return a.value == b.value;
}

std::string value_in(const checkpoint::EntryRecord& e) {
  if (e.type == checkpoint::EntryType::kTensor) return "a tensor";
  if (e.type == checkpoint::EntryType::kStr) return "the string '" + checkpoint::value_text(e).substr(0, 60) + "'";
  return std::string("the ") + checkpoint::entry_type_name(e.type) + " " + checkpoint::value_text(e);
}

// A tensor value of `a` and `b` (the same name): dtype, shape and bytes.
std::string tensor_difference(const Source& a, const Source& b, const std::string& name) {
  const checkpoint::TensorEntry &x = a.tensor(name), &y = b.tensor(name);
  if (x.dtype != y.dtype || x.shape != y.shape) {
    return std::string("a tensor of dtype ") + c10::toString(x.dtype) + " and shape " + shape_str(x.shape) +
           " in " + a.where + ", of dtype " + c10::toString(y.dtype) + " and shape " + shape_str(y.shape) +
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
  std::optional<checkpoint::Index> meta = checkpoint::lightning_meta(s.dir);
  if (!meta) return;
  Source m;
  m.path = s.path;
  m.dir = s.dir;
  m.where = (fs::path(s.dir) / checkpoint::kLightningMetaFile).string();
  m.ix = std::move(*meta);
  for (const auto& e : m.ix.entries) {
    const checkpoint::EntryRecord* own = s.entry(e.name);
    if (!own) {
      if (!built) continue;
      s.ix.entries.push_back(e);
      if (e.type == checkpoint::EntryType::kTensor) {
        s.ix.tensor_order.push_back(e.name);
        s.ix.tensors[e.name] = m.ix.tensors.at(e.name);
        if (std::find(s.ix.files.begin(), s.ix.files.end(), checkpoint::kLightningMetaFile) == s.ix.files.end()) {
          s.ix.files.push_back(checkpoint::kLightningMetaFile);
        }
      }
      continue;
    }
    if (own->is_state_dict()) continue;  // a model or optimizer, not a value
    std::string difference;
    if (own->type == checkpoint::EntryType::kTensor && e.type == checkpoint::EntryType::kTensor) {
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
  const std::string metadata = (fs::path(s.path) / checkpoint::kDcpMetadataFile).string();
  const std::string metadata_bytes = read_small(metadata);
  const checkpoint::DcpMetadata md = checkpoint::parse_dcp_metadata(metadata_bytes, metadata);
  const std::string own = (fs::path(s.path) / checkpoint::kDcpIndexFile).string();
  s.dir = s.path;
  if (checkpoint::file_size(own) >= 0) {
    checkpoint::Index ix = checkpoint::parse_index(read_small(own), own);
    if (ix.kind == checkpoint::Index::Kind::kSharded && !md.save_id.empty() && ix.save_id == md.save_id) {
      const uint32_t crc = checkpoint::crc32(metadata_bytes.data(), metadata_bytes.size());
      if (ix.has_metadata_crc && ix.metadata_crc != crc) {
        throw ConfigError("checkpoint: checksum mismatch in " + metadata + ": " + checkpoint::kDcpIndexFile +
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
                          checkpoint::kDcpIndexFile + ") but its save id is '" + md.save_id + "': the file is damaged");
      }
    }
  }
  s.where = metadata;
  s.ix = checkpoint::dcp_index(md, s.path);
  check_lightning_meta(s, /*built=*/true);
}

// A directory: a DCP checkpoint (.metadata), or fsdp-cpp's earlier layout
// (index.json of kind "sharded" and data-*.bin files).
void open_sharded(Source& s) {
  std::error_code ec;
  for (const char* name : {checkpoint::kDcpMetadataFile, checkpoint::kIndexFile, checkpoint::kDcpIndexFile}) {
    const fs::path p = fs::path(s.path) / name;
    if (fs::exists(fs::symlink_status(p, ec)) && !fs::is_regular_file(p, ec)) {
      throw ConfigError("checkpoint: " + p.string() + " is not a regular file; refusing to read it");
    }
  }
  if (fs::is_regular_file(fs::path(s.path) / checkpoint::kDcpMetadataFile, ec)) return open_dcp(s);
  const fs::path index = fs::path(s.path) / checkpoint::kIndexFile;
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
  s.ix = checkpoint::parse_index(read_small(s.where), s.where);
  if (s.ix.kind != checkpoint::Index::Kind::kSharded) {
    throw ConfigError("checkpoint: " + s.where + ": a directory's index must be of kind \"sharded\"");
  }
  s.dir = s.path;
}

// A file: PyTorch's zip, with fsdp-cpp's index (of kind "full") or, with
// accept_raw, a module's state dict; with accept_raw, a safetensors file.
void open_file(Source& s, bool accept_raw) {
  const std::string& path = s.path;
  const int64_t size = checkpoint::file_size(path);
  const std::string head = checkpoint::read_range(path, 0, std::min<int64_t>(size, 64));
  // By content (a name ending in .safetensors gets the safetensors reader's
  // errors when its content is not right).
  if (checkpoint::looks_like_safetensors(head, size) || (accept_raw && fs::path(path).extension() == ".safetensors")) {
    if (!accept_raw) {
      not_a_checkpoint(path, "a safetensors file, which holds a model's weights only: it loads with "
                             "load_checkpoint(path, module)");
    }
    s.safetensors = std::make_unique<checkpoint::SafetensorsHeader>(checkpoint::read_safetensors_header(path));
    s.where = path;
    return;
  }
  try {
    s.full = std::make_unique<checkpoint::FullReader>(path);
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
  if (accept_raw && !s.full->has(checkpoint::kFullIndexRecord) && s.full->has("data.pkl")) {
    if (s.full->has("constants.pkl")) {
      throw ConfigError("load_checkpoint: " + path + " is a TorchScript archive (torch.jit.save, or torch::save of a "
                        "module), not a state dict: load it with torch::load(module, path), or save "
                        "model.state_dict() with torch.save");
    }
    s.raw = true;
    s.where = path + " (record data.pkl)";
    return;
  }
  if (!s.full->has(checkpoint::kFullIndexRecord)) {
    if (!s.full->has("data.pkl") || s.full->has("constants.pkl")) {
      not_a_checkpoint(path, "a zip file that is neither a checkpoint nor a torch.save file");
    }
    s.where = path + " (record data.pkl)";
    index_pickled(s);  // written by PyTorch or Lightning
    return;
  }
  s.where = path + " (record " + checkpoint::kFullIndexRecord + ")";
  s.ix = checkpoint::parse_index(s.full->read(checkpoint::kFullIndexRecord), s.where);
  if (s.ix.kind != checkpoint::Index::Kind::kFull) {
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

namespace {

// The boxes this rank holds of every key of `model`'s state (SHARDED view),
// with the key's global shape.
struct LocalBoxes {
  std::string key;
  std::vector<int64_t> shape;
  std::vector<Shard> boxes;
};
std::vector<LocalBoxes> local_boxes(const std::shared_ptr<torch::nn::Module>& model) {
  std::vector<LocalBoxes> out;
  StateDictTypeGuard guard(model, StateDictType::kSharded);
  visit_state_dict(model, "", [&](const std::string& key, StateValue v) {
    if (std::holds_alternative<at::Tensor>(v)) {
      const auto& t = std::get<at::Tensor>(v);
      out.push_back({key, t.sizes().vec(), {Shard{std::vector<int64_t>(static_cast<size_t>(t.dim()), 0), t}}});
    } else {
      const auto& st = std::get<ShardedTensor>(v);
      out.push_back({key, st.global_shape, st.local_shards});
    }
  });
  return out;
}

// Pieces of `key` for `boxes` (fresh tensors of the checkpoint's dtype), read from the source.
ShardedTensor read_pieces(const Source& src, const std::string& key, const std::vector<Shard>& boxes) {
  const auto& t = src.tensor(key);
  ShardedTensor st{t.shape, t.dtype, {}};
  for (const auto& b : boxes) st.local_shards.push_back(Shard{b.offsets, at::empty(b.tensor.sizes(), at::TensorOptions().dtype(t.dtype))});
  int64_t need = 0;
  for (const auto& s : st.local_shards) need += s.tensor.numel();
  if (src.fill(key, st.local_shards) != need) {
    throw ConfigError("checkpoint: " + src.where + ": tensor '" + key +
                      "' lacks elements this rank needs (a shard is missing from the index)");
  }
  return st;
}

void load_model(const Source& src, const std::string& entry, const std::shared_ptr<torch::nn::Module>& model,
                bool strict) {
  const checkpoint::EntryRecord* rec = src.entry(entry);
  StateDict sd;
  std::set<std::string> wanted;
  for (auto& [key, shape, boxes] : local_boxes(model)) {
    wanted.insert(key);
    const std::string tkey = entry + "/" + key;
    if (!src.ix.tensors.count(tkey)) continue;  // missing: load_state_dict reports it
    const auto& t = src.tensor(tkey);
    if (t.shape != shape) {
      sd.insert(key, ShardedTensor{t.shape, t.dtype, {}});  // reported as a size mismatch
      continue;
    }
    sd.insert(key, read_pieces(src, tkey, boxes));
  }
  if (rec) {
    for (const auto& k : rec->keys) {
      if (!wanted.count(k)) sd.insert(k, ShardedTensor{src.tensor(entry + "/" + k).shape, at::kFloat, {}});
    }
  }
  StateDictTypeGuard guard(model, StateDictType::kSharded);
  load_state_dict(model, sd, strict);
}

// The tensors of a raw source's pickle, by key and in order; ConfigError
// naming the file when it is not a module's state dict.
struct RawTensors {
  std::map<std::string, const pickle::TensorRef*> by_key;
  std::vector<std::string> order;
};
RawTensors raw_tensors(const checkpoint::FullReader& zip, const pickle::Value& root) {
  using Kind = pickle::Value::Kind;
  if (root.kind != Kind::kDict) {
    throw ConfigError("load_checkpoint: " + zip.path() + " holds " + pickle::describe(root) +
                      ", not a state dict (a dict from names to tensors, as torch.save(model.state_dict()) writes)");
  }
  RawTensors out;
  for (const auto& [k, v] : root.entries) {
    if (k->kind != Kind::kString) {
      throw ConfigError("load_checkpoint: " + zip.path() + " holds a dict with the key " + pickle::describe(*k) +
                        ": not a state dict (its keys are parameter and buffer names)");
    }
    if (v->kind != Kind::kTensor) {
      throw ConfigError("load_checkpoint: " + zip.path() + ": '" + k->text + "' is " + pickle::describe(*v) +
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

// A module's state dict in one file, tensor by tensor: each tensor's shape
// and dtype, in the file's order, and how to read one whole.
struct FlatTensors {
  struct Info {
    std::vector<int64_t> shape;
    at::ScalarType dtype = at::kFloat;
  };
  std::vector<std::pair<std::string, Info>> order;
  std::function<at::Tensor(const std::string& key)> read;
};

// The flat state dict `tensors` into `model`, wrapped or not, at any world
// size: one tensor in memory at a time, and only the tensors this rank's
// shards overlap.
void load_flat_model(const FlatTensors& tensors, const std::shared_ptr<torch::nn::Module>& model, bool strict) {
  std::map<std::string, const FlatTensors::Info*> by_key;
  for (const auto& [k, info] : tensors.order) by_key[k] = &info;
  StateDict sd;
  std::set<std::string> wanted;
  for (auto& [key, shape, boxes] : local_boxes(model)) {
    wanted.insert(key);
    auto it = by_key.find(key);
    if (it == by_key.end()) continue;  // missing: load_state_dict reports it
    const auto& info = *it->second;
    if (info.shape != shape) {
      sd.insert(key, ShardedTensor{info.shape, info.dtype, {}});  // reported as a size mismatch
      continue;
    }
    int64_t need = 0;
    for (const auto& b : boxes) need += b.tensor.numel();
    const at::Tensor whole = need > 0 ? tensors.read(key) : at::Tensor();
    ShardedTensor st{shape, info.dtype, {}};
    for (const auto& b : boxes) {
      Shard piece{b.offsets, at::empty(b.tensor.sizes(), at::TensorOptions().dtype(info.dtype))};
      if (need > 0) copy_overlap(piece.tensor, piece.offsets, {Shard{std::vector<int64_t>(shape.size(), 0), whole}});
      st.local_shards.push_back(std::move(piece));
    }
    sd.insert(key, std::move(st));
  }
  for (const auto& [k, info] : tensors.order) {
    if (!wanted.count(k)) sd.insert(k, ShardedTensor{info.shape, info.dtype, {}});
  }
  StateDictTypeGuard guard(model, StateDictType::kSharded);
  load_state_dict(model, sd, strict);
}

// PyTorch's parameter ids (optimizer.state_dict()) -> the names of the
// parameters they stand for: group by group, the i-th id of a group is the
// group's i-th parameter in the model's order (optimizer_param_names).
std::map<std::string, std::string> names_of_ids(const Source& src, const checkpoint::EntryRecord& rec,
                                                const std::shared_ptr<torch::nn::Module>& model,
                                                const torch::optim::Optimizer& optimizer) {
  const auto names = optimizer_param_names(model, optimizer);
  const std::string where = "checkpoint: " + src.where + ", optimizer '" + rec.name + "'";
  if (names.size() != rec.param_groups.size()) {
    throw ConfigError(where + " has " + std::to_string(rec.param_groups.size()) + " param groups, the optimizer " +
                      std::to_string(names.size()));
  }
  std::map<std::string, std::string> out;
  for (size_t g = 0; g < names.size(); ++g) {
    const auto& ids = rec.param_groups[g].params;
    if (ids.size() != names[g].size()) {
      throw ConfigError(where + ": param_groups[" + std::to_string(g) + "] numbers " + std::to_string(ids.size()) +
                        " parameters, the optimizer's group holds " + std::to_string(names[g].size()));
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!out.emplace(ids[i], names[g][i]).second) throw ConfigError(where + " lists parameter id " + ids[i] + " twice");
    }
  }
  return out;
}

// Lightning's load_raw: the state dict of a raw source (open_source's
// accept_raw: torch.save's pickle or safetensors) into `model`. Every rank
// parses the file's pickle or header.
void load_raw_model(const Source& src, const std::shared_ptr<torch::nn::Module>& model, bool strict) {
  FlatTensors flat;
  if (src.safetensors) {
    const checkpoint::SafetensorsHeader& h = *src.safetensors;
    std::map<std::string, const checkpoint::SafetensorsTensor*> by_key;
    for (const auto& t : h.tensors) {
      flat.order.push_back({t.name, {t.shape, t.dtype}});
      by_key[t.name] = &t;
    }
    flat.read = [&](const std::string& key) { return checkpoint::read_safetensors_tensor(src.path, h, *by_key.at(key)); };
    load_flat_model(flat, model, strict);
    return;
  }
  const checkpoint::FullReader& zip = *src.full;
  const auto parsed = pickle::parse(zip.read("data.pkl"), src.where);
  const RawTensors tensors = raw_tensors(zip, parsed.root());
  pickle::check_byte_order(zip);
  for (const auto& k : tensors.order) {
    const auto& ref = *tensors.by_key.at(k);
    flat.order.push_back({k, {ref.sizes, ref.dtype}});
  }
  flat.read = [&](const std::string& key) {
    return pickle::read_tensor(zip, *tensors.by_key.at(key), "tensor '" + key + "'");
  };
  load_flat_model(flat, model, strict);
}

void load_optimizer(const Source& src, const std::string& entry, const std::shared_ptr<torch::nn::Module>& model,
                    torch::optim::Optimizer& optimizer) {
  const checkpoint::EntryRecord* rec = src.entry(entry);
  std::map<std::string, LocalBoxes> boxes;
  for (auto& b : local_boxes(model)) boxes.emplace(b.key, std::move(b));
  // Keys by parameter name (PyTorch's ids translated).
  std::map<std::string, std::string> ids;
  if (src.numbered.count(entry)) ids = names_of_ids(src, *rec, model, optimizer);
  auto named = [&](const std::string& param) {
    auto it = ids.find(param);
    return it == ids.end() ? param : it->second;
  };
  OptimStateDict osd;
  for (const auto& stored : rec->keys) {
    const std::string tkey = entry + "/" + stored;
    const auto sep = stored.rfind('.');
    const std::string k = sep == std::string::npos ? stored : named(stored.substr(0, sep)) + stored.substr(sep);
    const auto& t = src.tensor(tkey);
    const auto dot = k.rfind('.');
    auto it = dot == std::string::npos ? boxes.end() : boxes.find(k.substr(0, dot));
    if (it == boxes.end()) {
      osd.state.insert(k, ShardedTensor{t.shape, t.dtype, {}});  // not a parameter: reported as unexpected
      continue;
    }
    // State shaped like its parameter: this rank's boxes of it; anything else (step): whole.
    if (t.shape == it->second.shape) {
      osd.state.insert(k, read_pieces(src, tkey, it->second.boxes));
    } else {
      osd.state.insert(k, src.read_whole(tkey));
    }
  }
  const std::string kind = kind_of(optimizer).name;
  for (const auto& g : rec->param_groups) {
    OptimParamGroup group{{}, libtorch_options(kind, g.options, "checkpoint: " + src.where + ", optimizer '" + entry + "'")};
    for (const auto& p : g.params) group.params.push_back(named(p));
    osd.param_groups.push_back(std::move(group));
  }
  load_optim_state_dict(model, optimizer, osd);
}

CheckpointValue read_value(const Source& src, const checkpoint::EntryRecord& e) {
  if (e.type == checkpoint::EntryType::kTensor) return src.read_whole(e.name);
  return std::visit([](const auto& v) { return CheckpointValue(v); }, e.value);
}

}  // namespace

}  // namespace detail


namespace {

// The model optimizers belong to: the FSDP model, or an unwrapped model
// when it is the only one (it loads as well; Lightning requires FSDP here).
std::shared_ptr<torch::nn::Module> model_of_optimizers(const CheckpointState& state) {
  bool has_fsdp = false;
  for (const auto& [n, m] : state.models()) has_fsdp |= detail::has_fsdp_units(m);
  if (has_fsdp || state.models().size() != 1) return detail::the_fsdp_model(state, "load").second;
  return state.models().begin()->second;
}

// Every entry `state` asks for has its kind in the checkpoint; strict: every one is there.
void check_entries(const detail::Source& src, const CheckpointState& state, bool strict) {
  using Kind = CheckpointState::Entry::Kind;
  std::vector<std::string> missing;
  for (const auto& e : state.entries()) {
    const detail::checkpoint::EntryRecord* rec = src.entry(e.name);
    if (!rec) {
      missing.push_back(e.name);
      continue;
    }
    const bool fits = e.kind == Kind::kModel       ? rec->type == detail::checkpoint::EntryType::kModel
                      : e.kind == Kind::kOptimizer ? rec->type == detail::checkpoint::EntryType::kOptimizer
                                                   : !rec->is_state_dict();
    if (!fits) {
      throw ConfigError("load_checkpoint: entry '" + e.name + "' is a " + detail::checkpoint::entry_type_name(rec->type) + " in " +
                        src.path + ", but the state asks for a " +
                        (e.kind == Kind::kModel ? "model" : e.kind == Kind::kOptimizer ? "optimizer" : "value"));
    }
  }
  if (strict && !missing.empty()) {
    throw ConfigError("The requested state contains a key '" + missing.front() +
                      "' that does not exist in the loaded checkpoint. To disable strict loading, set strict=False.");
  }
}

// Loads what `state` asks for that the checkpoint holds.
void load_entries(const detail::Source& src, CheckpointState& state, const std::shared_ptr<torch::nn::Module>& model,
                  bool strict) {
  for (const auto& e : state.entries()) {
    const detail::checkpoint::EntryRecord* rec = src.entry(e.name);
    if (!rec) continue;
    if (e.kind == CheckpointState::Entry::kModel) {
      detail::load_model(src, e.name, state.models().at(e.name), strict);
    } else if (e.kind == CheckpointState::Entry::kOptimizer) {
      detail::load_optimizer(src, e.name, model, *state.optimizers().at(e.name));
    } else {
      state.mutable_values()[e.name] = detail::read_value(src, *rec);
    }
  }
}

// The values the checkpoint holds beyond those `state` asks for.
std::map<std::string, CheckpointValue> leftover_values(const detail::Source& src, const CheckpointState& state) {
  std::map<std::string, CheckpointValue> leftovers;
  for (const auto& rec : src.ix.entries) {
    if (rec.is_state_dict()) continue;
    bool requested = false;
    for (const auto& e : state.entries()) requested |= e.name == rec.name;
    if (!requested) leftovers[rec.name] = detail::read_value(src, rec);
  }
  return leftovers;
}

}  // namespace

std::map<std::string, CheckpointValue> load_checkpoint(const std::string& path, CheckpointState& state,
                                                       dist::ProcessGroup& group, bool strict) {
  wait_for_checkpoint(group);
  if (state.entries().empty()) {
    throw ConfigError("Got load_checkpoint(..., state) with an empty state, but a state with at least a model "
                      "instance to reload is required. Pass it in like so: load_checkpoint(path, "
                      "fsdp::CheckpointState().model(\"model\", model.ptr()), group)");
  }
  const auto model = model_of_optimizers(state);
  std::map<std::string, CheckpointValue> leftovers;
  const dist::Failure error = dist::capture([&] {
    auto src = detail::open_source(path);
    check_entries(*src, state, strict);
    load_entries(*src, state, model, strict);
    leftovers = leftover_values(*src, state);
  });
  dist::agree(group, error, "load_checkpoint of " + path);
  return leftovers;
}

void load_checkpoint(const std::string& path, const std::shared_ptr<torch::nn::Module>& module,
                     dist::ProcessGroup& group, bool strict) {
  if (!module) throw ConfigError("load_checkpoint: the module is null");
  wait_for_checkpoint(group);
  const dist::Failure error = dist::capture([&] {
    auto src = detail::open_source(path, /*accept_raw=*/true);
    if (src->raw || src->safetensors) {
      detail::load_raw_model(*src, module, strict);
      return;
    }
    detail::load_model(*src, src->the_model("load_checkpoint").name, module, strict);
  });
  dist::agree(group, error, "load_checkpoint of " + path);
}

}  // namespace fsdp
