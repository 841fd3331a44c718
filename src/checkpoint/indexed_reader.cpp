// What the built-in readers share (readers.h): the index's lookups, reading
// a chunk the index places, a tensor whole, and verify_checkpoint's checks
// of every tensor.
#include <ATen/ATen.h>

#include <algorithm>

#include "fsdp/error.h"
#include "loading.h"
#include "readers.h"

namespace fsdp::detail {

void not_a_checkpoint(const std::string& path, const std::string& why) {
  throw ConfigError("The path '" + path + "' does not point to a valid checkpoint. Make sure the path points to either "
                    "a directory with FSDP checkpoint shards, or a single file with a full checkpoint." +
                    (why.empty() ? "" : " (" + why + ")"));
}

std::string read_small(const std::string& path) {
  const int64_t size = formats::file_size(path);
  if (size > (int64_t{1} << 30)) throw ConfigError("checkpoint: " + path + " is implausibly large");
  return formats::read_range(path, 0, size);
}

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

at::Tensor read_whole(const StorageReader& reader, const std::string& key) {
  const auto& t = find_tensor(reader, key);
  TensorRead read{"", key, true, {BoxRead{StorageBox{std::vector<int64_t>(t.shape.size(), 0), t.shape}, {}}}};
  const size_t n = reader.chunks(key).size();
  for (size_t c = 0; c < n; ++c) read.boxes[0].chunks.push_back(c);
  return apply_read(reader, read)[0];
}

std::vector<StorageBox> IndexedReader::chunks(const std::string& key) const {
  if (stored_whole(key)) {  // a tensor written whole by another tool: one box, the shape
    const auto& t = find_tensor(*this, key);
    return {StorageBox{std::vector<int64_t>(t.shape.size(), 0), t.shape}};
  }
  return StorageReader::chunks(key);
}

at::Tensor IndexedReader::read_indexed_chunk(const std::string& key, size_t chunk, const formats::FullReader* zip,
                                             const std::string& dir) const {
  const auto& t = find_tensor(*this, key);
  const formats::Chunk& c = t.chunks.at(chunk);
  auto bytes = std::make_shared<std::string>(formats::read_chunk(c, key, zip, dir));
  return at::from_blob(
      bytes->data(), c.sizes, [bytes](void*) {}, at::TensorOptions().dtype(t.dtype));
}

void IndexedReader::verify(std::vector<std::string>& problems) const { verify_tensors(*this, problems); }

void verify_tensors(const IndexedReader& reader, std::vector<std::string>& problems) {
  const formats::Index& ix = reader.index();
  for (const auto& key : ix.tensor_order) {
    const auto& t = ix.tensors.at(key);
    int64_t covered = 0;
    if (reader.stored_whole(key)) {  // written by another tool: no checksums of its own; read it
      try {
        reader.read_chunk(key, 0);
      } catch (const std::exception& e) {
        problems.push_back(e.what());
      }
      continue;
    }
    for (size_t i = 0; i < t.chunks.size(); ++i) {
      try {
        reader.read_chunk(key, i);
        covered += t.chunks[i].nbytes;
      } catch (const std::exception& e) {
        problems.push_back(e.what());
      }
    }
    int64_t want = static_cast<int64_t>(c10::elementSize(t.dtype));
    for (auto d : t.shape) want *= d;
    bool overlap = false;
    for (size_t i = 0; i < t.chunks.size() && !overlap; ++i) {
      for (size_t j = i + 1; j < t.chunks.size() && !overlap; ++j) {
        bool meet = true;
        for (size_t d = 0; d < t.shape.size(); ++d) {
          const auto &a = t.chunks[i], &b = t.chunks[j];
          meet &= std::max(a.offsets[d], b.offsets[d]) < std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
        }
        overlap = meet && t.chunks[i].nbytes > 0 && t.chunks[j].nbytes > 0;
      }
    }
    if (overlap) problems.push_back("tensor '" + key + "': two of its chunks overlap");
    if (covered != want && problems.empty()) problems.push_back("tensor '" + key + "': its chunks do not cover it exactly");
  }
}

void add_module_entry(formats::Index& ix) {
  ix.entries.emplace_back();
  ix.entries.back().name = "model";
  ix.entries.back().type = formats::EntryType::kModel;
}

void add_module_tensor(formats::Index& ix, const std::string& key, at::ScalarType dtype,
                       const std::vector<int64_t>& shape) {
  const std::string tkey = ix.entries.back().name + "/" + key;
  ix.entries.back().keys.push_back(key);
  ix.tensor_order.push_back(tkey);
  ix.tensors[tkey] = formats::TensorEntry{dtype, shape, {}};
}

}  // namespace fsdp::detail
