// A DCP directory as a storage (readers.h, DcpReader): fsdp-cpp's sharded
// save, PyTorch's dcp.save, Lightning's sharded save with meta.pt.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <tuple>

#include "fsdp/error.h"
#include "fsdp/formats/dcp.h"
#include "loading.h"
#include "readers.h"

namespace fsdp::detail {

namespace fs = std::filesystem;

namespace {

// Lightning's meta.pt of a DCP directory, read as an index of its own.
class MetaReader : public IndexedReader {
 public:
  MetaReader(const std::string& dir, formats::Index ix) : dir_(dir) {
    path_ = dir;
    where_ = (fs::path(dir) / formats::kLightningMetaFile).string();
    ix_ = std::move(ix);
  }
  at::Tensor read_chunk(const std::string& key, size_t chunk) const override {
    return read_indexed_chunk(key, chunk, nullptr, dir_);
  }

 private:
  std::string dir_;
};

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
std::string tensor_difference(const StorageReader& a, const StorageReader& b, const std::string& name) {
  const formats::TensorEntry &x = find_tensor(a, name), &y = find_tensor(b, name);
  if (x.dtype != y.dtype || x.shape != y.shape) {
    return std::string("a tensor of dtype ") + c10::toString(x.dtype) + " and shape " +
           c10::str(c10::IntArrayRef(x.shape)) + " in " + a.location() + ", of dtype " + c10::toString(y.dtype) +
           " and shape " + c10::str(c10::IntArrayRef(y.shape)) + " in " + b.location();
  }
  const at::Tensor u = read_whole(a, name).contiguous(), v = read_whole(b, name).contiguous();
  const size_t n = static_cast<size_t>(u.numel()) * u.element_size();
  if (n == 0 || std::memcmp(u.data_ptr(), v.data_ptr(), n) == 0) return "";
  return "tensors of the same dtype and shape but different elements in " + a.location() + " and " + b.location();
}

// ConfigError when a name the sharded formats read is in `dir` but is not a regular file.
void refuse_irregular_markers(const std::string& dir) {
  std::error_code ec;
  for (const char* name : {formats::kDcpMetadataFile, formats::kIndexFile, formats::kDcpIndexFile}) {
    const fs::path p = fs::path(dir) / name;
    if (fs::exists(fs::symlink_status(p, ec)) && !fs::is_regular_file(p, ec)) {
      throw ConfigError("checkpoint: " + p.string() + " is not a regular file; refusing to read it");
    }
  }
}

bool same_chunks(std::vector<formats::Chunk> a, std::vector<formats::Chunk> b) {
  auto key = [](const formats::Chunk& c) { return std::tie(c.file, c.offset, c.nbytes, c.offsets, c.sizes, c.crc); };
  auto less = [&](const formats::Chunk& x, const formats::Chunk& y) { return key(x) < key(y); };
  std::sort(a.begin(), a.end(), less);
  std::sort(b.begin(), b.end(), less);
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [&](const auto& x, const auto& y) {
           return key(x) == key(y);
         });
}

}  // namespace

bool DcpReader::claims(const std::string& dir) {
  refuse_irregular_markers(dir);
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / formats::kDcpMetadataFile, ec);
}

bool ShardedDirReader::claims(const std::string& dir) {
  refuse_irregular_markers(dir);
  std::error_code ec;
  return !fs::is_regular_file(fs::path(dir) / formats::kDcpMetadataFile, ec) &&
         fs::is_regular_file(fs::path(dir) / formats::kIndexFile, ec);
}

void refuse_incomplete_sharded(const std::string& dir) {
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    const std::string name = f.path().filename().string();
    const bool distcp = name.find(".distcp") != std::string::npos;
    if (name.rfind("data-", 0) == 0 || name.rfind("index.json.tmp", 0) == 0 || distcp) {
      throw ConfigError("checkpoint: " + dir + " holds an incomplete sharded checkpoint: it has data files but no " +
                        (distcp ? ".metadata" : "index.json") +
                        " (the save was interrupted before its commit); load an earlier checkpoint");
    }
  }
}

// Lightning's meta.pt beside .metadata: fabric.load reads the values from
// meta.pt, fsdp-cpp from its index, so every value both hold must agree (a
// meta.pt of another save, copied in, would give Lightning another step);
// ConfigError naming the first that differs. Values that only meta.pt holds
// join an index built from .metadata (`built`): Lightning keeps them there alone.
void DcpReader::check_lightning_meta(bool built) {
  std::optional<formats::Index> meta = formats::lightning_meta(path_);
  if (!meta) return;
  const MetaReader m(path_, std::move(*meta));
  for (const auto& e : m.index().entries) {
    const formats::EntryRecord* own = find_entry(*this, e.name);
    if (!own) {
      if (!built) continue;
      ix_.entries.push_back(e);
      if (e.type == formats::EntryType::kTensor) {
        ix_.tensor_order.push_back(e.name);
        ix_.tensors[e.name] = m.index().tensors.at(e.name);
        if (std::find(ix_.files.begin(), ix_.files.end(), formats::kLightningMetaFile) == ix_.files.end()) {
          ix_.files.push_back(formats::kLightningMetaFile);
        }
      }
      continue;
    }
    if (own->is_state_dict()) continue;  // a model or optimizer, not a value
    std::string difference;
    if (own->type == formats::EntryType::kTensor && e.type == formats::EntryType::kTensor) {
      difference = tensor_difference(*this, m, e.name);
    } else if (!same_value(*own, e)) {
      difference = value_in(*own) + " in " + where_ + ", " + value_in(e) + " in " + m.location();
    }
    if (!difference.empty()) {
      throw ConfigError("checkpoint: " + m.location() + " disagrees with " + where_ + " on the value '" + e.name +
                        "': " + difference + ". Lightning's fabric.load reads meta.pt, fsdp-cpp the index: the two "
                        "files come from different saves, so the checkpoint is damaged");
    }
  }
}

DcpReader::DcpReader(const std::string& dir) {
  path_ = dir;
  const std::string metadata = (fs::path(dir) / formats::kDcpMetadataFile).string();
  const std::string metadata_bytes = read_small(metadata);
  const formats::DcpMetadata md = formats::parse_dcp_metadata(metadata_bytes, metadata);
  const std::string own = (fs::path(dir) / formats::kDcpIndexFile).string();
  if (formats::file_size(own) >= 0) {
    formats::Index ix = formats::parse_index(read_small(own), own);
    if (ix.kind == formats::Index::Kind::kSharded && !md.save_id.empty() && ix.save_id == md.save_id) {
      const uint32_t crc = formats::crc32(metadata_bytes.data(), metadata_bytes.size());
      if (ix.has_metadata_crc && ix.metadata_crc != crc) {
        throw ConfigError("checkpoint: checksum mismatch in " + metadata + ": " + formats::kDcpIndexFile +
                          " records its CRC-32 as " + std::to_string(ix.metadata_crc) + ", its bytes have " +
                          std::to_string(crc) + " (the file is damaged; PyTorch would read wrong chunks from it)");
      }
      where_ = own;
      ix_ = std::move(ix);
      check_lightning_meta(/*built=*/false);
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
  where_ = metadata;
  ix_ = formats::dcp_index(md, dir);
  check_lightning_meta(/*built=*/true);
}

at::Tensor DcpReader::read_chunk(const std::string& key, size_t chunk) const {
  return read_indexed_chunk(key, chunk, nullptr, path_);
}

// verify_tensors, then a DCP directory beyond its tensor bytes: every item's
// other records against the zip's CRC-32s, and fsdp-cpp's index against
// .metadata (what Python reads).
void DcpReader::verify(std::vector<std::string>& problems) const {
  verify_tensors(*this, problems);
  try {
    const std::string metadata = (fs::path(path_) / formats::kDcpMetadataFile).string();
    const formats::DcpMetadata md =
        formats::parse_dcp_metadata(formats::read_range(metadata, 0, formats::file_size(metadata)), metadata);
    for (const auto& it : md.items) {
      std::vector<formats::DcpStorage> items;
      if (it.is_bytes) items.push_back(it.bytes);
      for (const auto& c : it.chunks) items.push_back(c.storage);
      for (const auto& s : items) {
        formats::FullReader zip((fs::path(path_) / s.file).string(), s.offset, s.length);
        for (const auto& record : zip.records()) {
          if (record.rfind("data/", 0) == 0) continue;  // tensor bytes: the chunks' checksums, above
          const std::string bytes = zip.read(record);
          if (formats::crc32(bytes.data(), bytes.size()) != zip.record_crc(record)) {
            problems.push_back("checksum mismatch in " + zip.where() + " (record " + record + " of '" + it.key +
                               "'): the file is damaged");
          }
        }
      }
    }
    const formats::Index built = formats::dcp_index(md, path_);
    if (where_ == metadata) return;  // the index is .metadata's own
    for (const auto& [key, t] : built.tensors) {
      auto own = ix_.tensors.find(key);
      if (own == ix_.tensors.end() || !same_chunks(own->second.chunks, t.chunks)) {
        problems.push_back(std::string(formats::kDcpMetadataFile) + " and " + formats::kDcpIndexFile +
                           " disagree on tensor '" + key + "'");
      }
    }
    if (built.tensors.size() != ix_.tensors.size()) {
      problems.push_back(std::string(formats::kDcpMetadataFile) + " and " + formats::kDcpIndexFile +
                         " list different tensors");
    }
  } catch (const std::exception& e) {
    problems.push_back(e.what());
  }
}

}  // namespace fsdp::detail
