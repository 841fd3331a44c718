// The sharded format's writer: a DCP checkpoint (docs/checkpoint-format.md),
// in three steps: stage [collective: who writes which piece], write [local:
// this rank's data file of DCP items], commit [collective: rank 0 writes
// meta.pt, fsdp-cpp's index and last .metadata, the commit point]. An async
// save runs the write in the background and commits at wait_for_checkpoint.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "fsdp/formats/dcp.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "loading.h"
#include "parts.h"
#include "fsdp/fault_points/fault_points.h"
#include "fsdp/error.h"
#include "fsdp/formats/pickle_writer.h"
#include "fsdp/formats/torch_pickle.h"

namespace fsdp::detail {

namespace fs = std::filesystem;

namespace {

// A piece this rank writes: its record (chunk filled in by the write) and its data.
struct Piece {
  formats::PieceRecord record;
  at::Tensor tensor;
};

struct ShardedJob {
  std::string path, save_id, file_name;
  int rank = 0, world = 1;
  std::vector<formats::EntryRecord> entries;
  std::vector<Piece> owned;  // the pieces this rank writes
  // The write's outcome: the written pieces' records, or its failure.
  std::vector<formats::PieceRecord> written;
  std::vector<formats::DcpItem> bytes_written;  // rank 0: the values and parameter groups
  Failure write_failure;
};

// DCP's name is __<rank>_0.distcp; the save id keeps the previous save's
// files intact until the commit (DCP's reader opens the names .metadata lists).
std::string data_file_name(const std::string& save_id, int rank) {
  return "__" + std::to_string(rank) + "_" + save_id + ".distcp";
}

std::string saving(const std::string& path) { return "save_checkpoint: saving " + path; }

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

Piece make_piece(const std::string& key, at::ScalarType dtype, std::vector<int64_t> shape, std::vector<int64_t> offsets,
                 const at::Tensor& tensor) {
  Piece p{{key, dtype, std::move(shape), {}}, tensor};
  p.record.chunk.offsets = std::move(offsets);
  p.record.chunk.sizes = tensor.sizes().vec();
  p.record.chunk.nbytes = static_cast<int64_t>(tensor.numel() * static_cast<int64_t>(c10::elementSize(dtype)));
  return p;
}

// This rank's pieces of the state: views of its shards, no gather. Its
// failure goes to `error`, for the agreement that follows.
std::vector<Piece> local_pieces(ShardedJob& job, const CheckpointState& state,
                                const std::shared_ptr<torch::nn::Module>& fsdp_model, const CheckpointOptions& options,
                                Failure& error) {
  std::vector<Piece> pieces;
  auto put = [&](const std::string& key, const StateValue& v) {
    if (std::holds_alternative<at::Tensor>(v)) {
      const auto& t = std::get<at::Tensor>(v);
      pieces.push_back(make_piece(key, t.scalar_type(), t.sizes().vec(), std::vector<int64_t>(t.sizes().size(), 0), t));
      return;
    }
    const auto& st = std::get<ShardedTensor>(v);
    for (const auto& s : st.local_shards) {
      pieces.push_back(make_piece(key, st.dtype, st.global_shape, s.offsets, s.tensor));
    }
  };
  error = capture([&] { job.entries = visit_state(state, fsdp_model, StateDictType::kSharded, options, put); });
  return pieces;
}

// [collective: all_gather] Who writes what: a box held by several ranks
// (replicas, tensors every rank has) is written by the lowest one. copy: a
// snapshot of each owned piece (async: training goes on).
void claim_pieces(ShardedJob& job, std::vector<Piece> pieces, Failure error, dist::ProcessGroup& group, bool copy) {
  std::vector<formats::PieceRecord> mine;
  for (const auto& p : pieces) mine.push_back(p.record);
  const std::string payload = formats::encode_pieces(mine);
  // Pieces the others could not decode fail here, on every rank alike.
  if (error.empty()) error = capture([&] { formats::decode_pieces(payload, "this rank's pieces"); });
  const auto everyone = gather_agreed(group, payload, error, saving(job.path));
  using Box = std::tuple<std::string, std::vector<int64_t>, std::vector<int64_t>>;
  auto box = [](const formats::PieceRecord& r) { return Box{r.key, r.chunk.offsets, r.chunk.sizes}; };
  std::set<Box> taken;  // the boxes of lower ranks
  for (int r = 0; r < group.rank(); ++r) {
    const std::string where = "rank " + std::to_string(r) + "'s pieces";
    for (const auto& x : formats::decode_pieces(everyone[static_cast<size_t>(r)], where)) taken.insert(box(x));
  }
  for (auto& p : pieces) {
    if (!taken.insert(box(p.record)).second) continue;
    if (copy) p.tensor = p.tensor.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
    job.owned.push_back(std::move(p));
  }
}

// [collective] The job of a save at `path`: the directory made, a save id
// agreed, this rank's pieces claimed.
ShardedJob stage(const std::string& path, const CheckpointState& state,
                 const std::shared_ptr<torch::nn::Module>& fsdp_model, dist::ProcessGroup& group,
                 const CheckpointOptions& options) {
  Failure error;  // (a file at `path` was replaced by save_checkpoint)
  if (group.rank() == 0) {
    error = capture([&] {
      check_sharded_destination(path, "save_checkpoint");
      fs::create_directories(path);
    });
  }
  agree(group, error, "save_checkpoint: creating " + path);
  ShardedJob job;
  job.path = path;
  job.rank = group.rank();
  job.world = group.size();
  job.save_id = group.broadcast_bytes(formats::new_save_id(), 0);
  job.file_name = data_file_name(job.save_id, job.rank);
  auto pieces = local_pieces(job, state, fsdp_model, options, error);
  claim_pieces(job, std::move(pieces), error, group, /*copy=*/options.async_save());
  return job;
}

// [local] Writes this rank's data file, synced before the index can name it;
// keeps the outcome in the job.
// Appends a piece to the data file as a DCP item; its record (with where
// its bytes are) goes to job.written.
void write_piece(ShardedJob& job, formats::AtomicFile& file, Piece& p) {
  const at::Tensor t = p.tensor.detach().cpu().contiguous();
  formats::Chunk& c = p.record.chunk;
  c.file = job.file_name;
  c.nbytes = static_cast<int64_t>(t.numel() * t.element_size());
  c.crc = formats::crc32(t.data_ptr(), static_cast<size_t>(c.nbytes));
  formats::pickle::Writer pkl;
  pkl.tensor("0", formats::pickle::storage_class(t.scalar_type()), t.sizes().vec());
  const formats::WrittenItem item = formats::write_dcp_item(file, job.file_name, pkl.finish(), t.data_ptr(), c.nbytes);
  c.offset = item.data_offset;
  p.record.item_offset = item.storage.offset;
  p.record.item_length = item.storage.length;
  job.written.push_back(p.record);
}

// Rank 0's bytes items (values, parameter groups), first in its file as DCP puts them.
void write_bytes_items(ShardedJob& job, formats::AtomicFile& file) {
  if (job.rank != 0) return;
  for (auto& [item, pkl] : formats::dcp_bytes_items(job.entries, python_group_options)) {
    item.bytes = formats::write_dcp_item(file, job.file_name, pkl, nullptr, 0).storage;
    job.bytes_written.push_back(std::move(item));
  }
}

void write_data(ShardedJob& job) {
  job.write_failure = capture([&] {
    formats::AtomicFile file((fs::path(job.path) / job.file_name).string());
    write_bytes_items(job, file);
    for (Piece& p : job.owned) {
      write_piece(job, file, p);
      if (job.written.size() == 1) fault_point("sharded-mid-data", job.rank);
    }
    file.commit();
  });
}

// The index of every rank's written pieces.
formats::Index index_of(const ShardedJob& job, const std::vector<std::string>& written) {
  formats::Index ix;
  ix.kind = formats::Index::Kind::kSharded;
  ix.world_size = job.world;
  ix.save_id = job.save_id;
  ix.entries = job.entries;
  for (int r = 0; r < job.world; ++r) ix.files.push_back(data_file_name(job.save_id, r));
  for (size_t r = 0; r < written.size(); ++r) {
    for (const auto& p : formats::decode_pieces(written[r], "rank " + std::to_string(r) + "'s pieces")) formats::add_piece(ix, p);
  }
  return ix;
}

// DCP's Metadata of the index: every tensor's chunks with their items, and
// the bytes items rank 0 wrote.
formats::DcpMetadata metadata_of(const ShardedJob& job, const formats::Index& ix, const std::vector<std::string>& written) {
  std::map<std::string, formats::DcpItem> tensors;
  for (size_t r = 0; r < written.size(); ++r) {
    for (const auto& p : formats::decode_pieces(written[r], "rank " + std::to_string(r) + "'s pieces")) {
      formats::DcpItem& it = tensors[p.key];
      it.dtype = p.dtype;
      it.shape = p.shape;
      it.chunks.push_back({p.chunk.offsets, p.chunk.sizes, {p.chunk.file, p.item_offset, p.item_length}});
    }
  }
  formats::DcpMetadata md;
  md.save_id = job.save_id;
  md.items = job.bytes_written;
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

// [collective] Every rank's written pieces to rank 0, which commits the
// index; on any failure, every rank removes its data file and throws. (A
// rank 0 that dies after the commit fails the broadcast: the data file,
// referenced by the new index, stays.)
void commit_save(const ShardedJob& job, dist::ProcessGroup& group) {
  Failure failed;
  const auto written = gather_outcomes(group, formats::encode_pieces(job.written), job.write_failure, failed);
  if (group.rank() == 0 && failed.empty()) {
    failed = capture([&] {
      const formats::Index ix = index_of(job, written);
      std::map<std::string, at::Tensor> values;
      for (const auto& e : ix.entries) {
        if (e.type != formats::EntryType::kTensor) continue;
        for (const auto& p : job.owned) {
          if (p.record.key == e.name) values[e.name] = p.tensor;
        }
      }
      commit_index(job.path, ix, metadata_of(job, ix, written), values);
    });
  }
  failed = failure_from(group, 0, failed);
  if (failed.empty()) return;
  std::error_code ec;
  fs::remove(fs::path(job.path) / job.file_name, ec);  // never referenced by an index
  rethrow(failed, "save_checkpoint: saving " + job.path + " failed (the previous checkpoint there is intact): ");
}

}  // namespace

void copy_to_sharded(const Source& src, const std::string& path) {
  check_sharded_destination(path, "convert");
  fs::create_directories(path);
  ShardedJob job;
  job.path = path;
  job.save_id = formats::new_save_id();
  job.file_name = data_file_name(job.save_id, 0);
  job.entries = src.ix.entries;
  {
    formats::AtomicFile file((fs::path(path) / job.file_name).string());
    write_bytes_items(job, file);
    for (const auto& key : src.ix.tensor_order) {  // one tensor in memory at a time
      const auto& t = src.tensor(key);
      Piece p = make_piece(key, t.dtype, t.shape, std::vector<int64_t>(t.shape.size(), 0), src.read_whole(key));
      write_piece(job, file, p);
    }
    file.commit();
  }
  const std::vector<std::string> written{formats::encode_pieces(job.written)};
  const formats::Index ix = index_of(job, written);
  std::map<std::string, at::Tensor> values;  // for meta.pt
  for (const auto& e : ix.entries) {
    if (e.type == formats::EntryType::kTensor) values[e.name] = src.read_whole(e.name);
  }
  commit_index(path, ix, metadata_of(job, ix, written), values);
}

void save_sharded(const std::string& path, const CheckpointState& state,
                  const std::shared_ptr<torch::nn::Module>& fsdp_model, dist::ProcessGroup& group,
                  const CheckpointOptions& options) {
  auto job = std::make_shared<ShardedJob>(stage(path, state, fsdp_model, group, options));
  if (!options.async_save()) {
    write_data(*job);
    commit_save(*job, group);
    return;
  }
  PendingSave pending;
  pending.write = std::async(std::launch::async, [job] { write_data(*job); });
  pending.commit = [job, g = &group] { commit_save(*job, *g); };
  set_pending_save(group, std::move(pending));
}

}  // namespace fsdp::detail
