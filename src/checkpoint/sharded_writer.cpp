// The sharded format's writer: a DCP checkpoint (docs/checkpoint-format.md)
// as a StorageWriter (fsdp/checkpoint/storage_writer.h; sharded_save.cpp
// plans and drives it): write_data writes this rank's data file of DCP
// items, finish (rank 0) meta.pt, fsdp-cpp's index and last .metadata, the
// commit point. copy_to_sharded writes a whole checkpoint with it.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "fsdp/formats/dcp.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/checkpoint/storage_writer.h"
#include "loading.h"
#include "parts.h"
#include "fsdp/fault_points/fault_points.h"
#include "fsdp/error.h"
#include "fsdp/formats/pickle_writer.h"
#include "fsdp/formats/torch_pickle.h"

namespace fsdp::detail {

namespace fs = std::filesystem;

namespace {

// What a data file's writing leaves for the commit.
struct Written {
  std::string file_name;
  std::vector<formats::PieceRecord> pieces;      // with where their bytes are
  std::vector<formats::DcpItem> bytes_items;     // rank 0: the values and parameter groups
};

// DCP's name is __<rank>_0.distcp; the save id keeps the previous save's
// files intact until the commit (DCP's reader opens the names .metadata lists).
std::string data_file_name(const std::string& save_id, int rank) {
  return "__" + std::to_string(rank) + "_" + save_id + ".distcp";
}

// [local] Refuses a destination that a sharded writer may not write into:
// anything but a directory (the directory itself may be a symbolic link to
// one, as an output directory may), or a directory holding files fsdp-cpp
// did not write under a name the checkpoint takes (issue 37 item 2: they
// would be replaced or read as the checkpoint's). Other files stay beside
// the checkpoint, as Lightning's sharded save keeps them (issue 50 item 21).
void check_sharded_destination(const std::string& path, const std::string& caller) {
  const std::string kind = formats::entry_kind(path);
  std::error_code ec;
  if (kind == "a symbolic link" && !fs::is_directory(path, ec)) {
    throw ConfigError(caller + ": " + path + " is a symbolic link to something that is not a directory: a sharded " +
                      "checkpoint is a directory, and a writer never follows nor replaces such a link; remove it or " +
                      "write elsewhere");
  }
  if (!kind.empty() && kind != "a directory" && kind != "a symbolic link") {
    throw ConfigError(caller + ": " + path + " is " + kind + ", not a directory: a sharded checkpoint is a directory; " +
                      "remove it or write elsewhere");
  }
  formats::refuse_colliding_entries(path, caller);
}

// Appends a piece to the data file as a DCP item; its record (with where
// its bytes are) goes to `out`.
void write_piece(const WriteItem& item, const at::Tensor& tensor, formats::AtomicFile& file, Written& out) {
  const at::Tensor t = tensor.detach().cpu().contiguous();
  formats::PieceRecord r{item.key, item.dtype, item.shape, {}};
  formats::Chunk& c = r.chunk;
  c.offsets = item.box.offsets;
  c.sizes = item.box.sizes;
  c.file = out.file_name;
  c.nbytes = static_cast<int64_t>(t.numel() * t.element_size());
  c.crc = formats::crc32(t.data_ptr(), static_cast<size_t>(c.nbytes));
  formats::pickle::Writer pkl;
  pkl.tensor("0", formats::pickle::storage_class(t.scalar_type()), t.sizes().vec());
  const formats::WrittenItem written = formats::write_dcp_item(file, out.file_name, pkl.finish(), t.data_ptr(), c.nbytes);
  c.offset = written.data_offset;
  r.item_offset = written.storage.offset;
  r.item_length = written.storage.length;
  out.pieces.push_back(std::move(r));
}

// Rank 0's bytes items (values, parameter groups), first in its file as DCP puts them.
void write_bytes_items(const SavePlan& plan, formats::AtomicFile& file, Written& out) {
  if (plan.rank != 0) return;
  for (auto& [item, pkl] : formats::dcp_bytes_items(plan.entries, python_group_options)) {
    item.bytes = formats::write_dcp_item(file, out.file_name, pkl, nullptr, 0).storage;
    out.bytes_items.push_back(std::move(item));
  }
}

// The tensor of an item: its own, or (copy_to_sharded) read when written.
using Fetch = std::function<at::Tensor(const WriteItem&)>;

// [local] Writes this rank's data file, synced before the index can name it.
Written write_data_file(const std::string& dir, const SavePlan& plan, const Fetch& fetch) {
  Written out;
  out.file_name = data_file_name(plan.save_id, plan.rank);
  formats::AtomicFile file((fs::path(dir) / out.file_name).string());
  write_bytes_items(plan, file, out);
  for (const WriteItem& item : plan.items) {  // one tensor in memory at a time
    write_piece(item, fetch(item), file, out);
    if (out.pieces.size() == 1) fault_point("sharded-mid-data", plan.rank);
  }
  file.commit();
  return out;
}

// Every rank's written pieces, decoded.
std::vector<std::vector<formats::PieceRecord>> pieces_of(const std::vector<std::string>& written) {
  std::vector<std::vector<formats::PieceRecord>> out;
  for (size_t r = 0; r < written.size(); ++r) {
    out.push_back(formats::decode_pieces(written[r], "rank " + std::to_string(r) + "'s pieces"));
  }
  return out;
}

// The index of every rank's written pieces.
formats::Index index_of(const SavePlan& plan, const std::vector<std::vector<formats::PieceRecord>>& written) {
  formats::Index ix;
  ix.kind = formats::Index::Kind::kSharded;
  ix.world_size = plan.world_size;
  ix.save_id = plan.save_id;
  ix.entries = plan.entries;
  for (int r = 0; r < plan.world_size; ++r) ix.files.push_back(data_file_name(plan.save_id, r));
  for (const auto& pieces : written) {
    for (const auto& p : pieces) formats::add_piece(ix, p);
  }
  return ix;
}

// DCP's Metadata of the index: every tensor's chunks with their items, and
// the bytes items rank 0 wrote.
formats::DcpMetadata metadata_of(const SavePlan& plan, const std::vector<formats::DcpItem>& bytes_items,
                                 const formats::Index& ix,
                                 const std::vector<std::vector<formats::PieceRecord>>& written) {
  std::map<std::string, formats::DcpItem> tensors;
  for (const auto& pieces : written) {
    for (const auto& p : pieces) {
      formats::DcpItem& it = tensors[p.key];
      it.dtype = p.dtype;
      it.shape = p.shape;
      it.chunks.push_back({p.chunk.offsets, p.chunk.sizes, {p.chunk.file, p.item_offset, p.item_length}});
    }
  }
  formats::DcpMetadata md;
  md.save_id = plan.save_id;
  md.items = bytes_items;
  for (const auto& key : ix.tensor_order) {
    formats::DcpItem it = std::move(tensors.at(key));
    formats::set_dcp_key(ix.entries, key, it);
    md.items.push_back(std::move(it));
  }
  return md;
}

void write_file(const std::string& path, const std::string& bytes) {
  formats::AtomicFile f(path);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

// Writes meta.pt (under its temporary name), fsdp-cpp's index and last
// .metadata: the commit point (the new .metadata replaces the old one
// atomically); then renames meta.pt into place, and removes the previous
// save's data files, no longer referenced, earlier layouts' files and the
// temporaries of saves that were killed. meta.pt is renamed only after the
// commit because readers hold it against .metadata (Lightning reads its
// values from meta.pt): a save killed before its commit leaves the previous
// save's meta.pt, which agrees with the previous .metadata, in place. (A kill
// in the instant between the two renames leaves the new .metadata with the
// old meta.pt: the values disagree, and readers refuse it by name.)
// `values`: the tensor values, which rank 0 holds (it claims every replicated piece).
void commit_index(const std::string& path, const formats::Index& ix, const formats::DcpMetadata& md,
                  const std::map<std::string, at::Tensor>& values) {
  const fs::path dir(path);
  formats::AtomicFile meta((dir / formats::kLightningMetaFile).string());
  {
    std::vector<at::Tensor> tensors;
    const std::string pkl = formats::lightning_meta_pickle(ix.entries, values, tensors);
    std::vector<formats::RecordBytes> records;
    for (const auto& t : tensors) records.push_back({t.data_ptr(), static_cast<int64_t>(t.numel() * t.element_size())});
    formats::write_torch_save(meta, formats::kLightningMetaFile, pkl, records);
  }
  const std::string metadata = formats::dcp_metadata_bytes(md);
  formats::Index own = ix;  // fsdp_index.json also checks .metadata
  own.has_metadata_crc = true;
  own.metadata_crc = formats::crc32(metadata.data(), metadata.size());
  write_file((dir / formats::kDcpIndexFile).string(), formats::to_json(own));
  formats::AtomicFile commit((dir / formats::kDcpMetadataFile).string());
  commit.write(metadata.data(), metadata.size());
  fault_point("sharded-before-index", 0);
  commit.commit();
  meta.commit();
  fault_point("sharded-after-index", 0);
  // Only what this writer can prove it wrote goes (issue 37 item 2): data
  // files and temporaries whose names carry a save id, and the earlier
  // layout's index.json if it is fsdp-cpp's index. A user's data-train.bin,
  // index.json or __notes.distcp stays (a save refuses such a directory
  // before it writes, check_sharded_destination).
  formats::remove_unreferenced_own_files(path, ix.files);
  const std::string legacy = (dir / formats::kIndexFile).string();
  if (formats::entry_kind(legacy) == "a regular file") {
    try {
      formats::parse_index(formats::read_range(legacy, 0, formats::file_size(legacy)), legacy);
      fs::remove(legacy);
    } catch (const std::exception&) {
      // Not fsdp-cpp's index (it appeared after the save began): not ours to remove.
    }
  }
}

// [local] Rank 0's commit of the written pieces (`written`: every rank's
// encoded records): fsdp-cpp's index, .metadata and meta.pt, with the
// tensor values `fetch` gives (rank 0 holds them: it claims every
// replicated piece).
void commit_written(const std::string& dir, const SavePlan& plan, const std::vector<formats::DcpItem>& bytes_items,
                    const std::vector<std::string>& written, const Fetch& fetch) {
  const auto pieces = pieces_of(written);
  const formats::Index ix = index_of(plan, pieces);
  std::map<std::string, at::Tensor> values;
  for (const auto& e : ix.entries) {
    if (e.type != formats::EntryType::kTensor) continue;
    for (const auto& item : plan.items) {
      if (item.key == e.name) values[e.name] = fetch(item);
    }
  }
  commit_index(dir, ix, metadata_of(plan, bytes_items, ix, pieces), values);
}

at::Tensor own_tensor(const WriteItem& item) { return item.tensor; }

// The built-in StorageWriter: a DCP directory.
class DcpWriter : public StorageWriter {
 public:
  DcpWriter(std::string path, std::string caller) : path_(std::move(path)), caller_(std::move(caller)) {}
  std::string location() const override { return path_; }
  void prepare() override {
    check_sharded_destination(path_, caller_);
    fs::create_directories(path_);
  }
  std::string write_data(const SavePlan& plan) override {
    written_ = write_data_file(path_, plan, own_tensor);
    return formats::encode_pieces(written_.pieces);
  }
  void finish(const SavePlan& plan, const std::vector<std::string>& results) override {
    commit_written(path_, plan, written_.bytes_items, results, own_tensor);
  }
  void abort(const SavePlan& plan) noexcept override {
    std::error_code ec;
    fs::remove(fs::path(path_) / data_file_name(plan.save_id, plan.rank), ec);
  }

 private:
  std::string path_, caller_;
  Written written_;  // this rank's, between write_data and finish
};

}  // namespace

void copy_to_sharded(const StorageReader& src, const std::string& path) {
  check_sharded_destination(path, "convert");
  fs::create_directories(path);
  SavePlan plan;
  plan.save_id = formats::new_save_id();
  plan.entries = src.index().entries;
  for (const auto& key : src.index().tensor_order) {  // each tensor one chunk, read when written
    const auto& t = find_tensor(src, key);
    plan.items.push_back(WriteItem{key, t.dtype, t.shape, StorageBox{std::vector<int64_t>(t.shape.size(), 0), t.shape}, {}});
  }
  const Fetch read = [&](const WriteItem& item) { return read_whole(src, item.key); };
  const Written written = write_data_file(path, plan, read);
  commit_written(path, plan, written.bytes_items, {formats::encode_pieces(written.pieces)}, read);
}

}  // namespace fsdp::detail

namespace fsdp {

std::shared_ptr<StorageWriter> make_dcp_writer(const std::string& path) {
  return std::make_shared<detail::DcpWriter>(path, "save_checkpoint");
}

}  // namespace fsdp
