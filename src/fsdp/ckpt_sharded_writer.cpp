// The sharded format's writer (docs/checkpoint-format.md), in three steps:
// stage [collective: who writes which piece], write [local: this rank's data
// file], commit [collective: rank 0 writes the index, the commit point]. An
// async save runs the write in the background and commits at
// wait_for_checkpoint.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <set>
#include <tuple>

#include "ckpt_parts.h"
#include "fault_points.h"
#include "fsdp/error.h"

namespace fsdp::detail {

namespace ck = ckpt;
namespace fs = std::filesystem;

namespace {

// A piece this rank writes: its record (chunk filled in by the write) and its data.
struct Piece {
  ck::PieceRecord record;
  at::Tensor tensor;
};

struct ShardedJob {
  std::string path, save_id, file_name;
  int rank = 0, world = 1;
  std::vector<ck::EntryRecord> entries;
  std::vector<Piece> owned;  // the pieces this rank writes
  // The write's outcome: the written pieces' records, or its failure.
  std::vector<ck::PieceRecord> written;
  Failure write_failure;
};

std::string data_file_name(const std::string& save_id, int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%05d", rank);
  return "data-" + save_id + "-" + buf + ".bin";
}

std::string saving(const std::string& path) { return "save_checkpoint: saving " + path; }

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
  std::vector<ck::PieceRecord> mine;
  for (const auto& p : pieces) mine.push_back(p.record);
  const std::string payload = ck::encode_pieces(mine);
  // Pieces the others could not decode fail here, on every rank alike.
  if (error.empty()) error = capture([&] { ck::decode_pieces(payload, "this rank's pieces"); });
  const auto everyone = gather_agreed(group, payload, error, saving(job.path));
  using Box = std::tuple<std::string, std::vector<int64_t>, std::vector<int64_t>>;
  auto box = [](const ck::PieceRecord& r) { return Box{r.key, r.chunk.offsets, r.chunk.sizes}; };
  std::set<Box> taken;  // the boxes of lower ranks
  for (int r = 0; r < group.rank(); ++r) {
    const std::string where = "rank " + std::to_string(r) + "'s pieces";
    for (const auto& x : ck::decode_pieces(everyone[static_cast<size_t>(r)], where)) taken.insert(box(x));
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
  if (group.rank() == 0) error = capture([&] { fs::create_directories(path); });
  agree(group, error, "save_checkpoint: creating " + path);
  ShardedJob job;
  job.path = path;
  job.rank = group.rank();
  job.world = group.size();
  job.save_id = group.broadcast_bytes(ck::new_save_id(), 0);
  job.file_name = data_file_name(job.save_id, job.rank);
  auto pieces = local_pieces(job, state, fsdp_model, options, error);
  claim_pieces(job, std::move(pieces), error, group, /*copy=*/options.async_save());
  return job;
}

// [local] Writes this rank's data file, synced before the index can name it;
// keeps the outcome in the job.
void write_data(ShardedJob& job) {
  job.write_failure = capture([&] {
    ck::AtomicFile file((fs::path(job.path) / job.file_name).string());
    for (Piece& p : job.owned) {
      const at::Tensor t = p.tensor.detach().cpu().contiguous();
      ck::Chunk& c = p.record.chunk;
      c.file = job.file_name;
      c.offset = file.size();
      c.nbytes = static_cast<int64_t>(t.numel() * t.element_size());
      c.crc = ck::crc32(t.data_ptr(), static_cast<size_t>(c.nbytes));
      job.written.push_back(p.record);
      file.write(t.data_ptr(), static_cast<size_t>(c.nbytes));
      if (job.written.size() == 1) fault_point("sharded-mid-data", job.rank);
    }
    file.commit();
  });
}

// The index of every rank's written pieces.
ck::Index index_of(const ShardedJob& job, const std::vector<std::string>& written) {
  ck::Index ix;
  ix.kind = ck::Index::Kind::kSharded;
  ix.world_size = job.world;
  ix.save_id = job.save_id;
  ix.entries = job.entries;
  for (int r = 0; r < job.world; ++r) ix.files.push_back(data_file_name(job.save_id, r));
  for (size_t r = 0; r < written.size(); ++r) {
    for (const auto& p : ck::decode_pieces(written[r], "rank " + std::to_string(r) + "'s pieces")) ck::add_piece(ix, p);
  }
  return ix;
}

// Writes the index: the commit point (the new index replaces the old one
// atomically); then removes the previous save's data files, no longer
// referenced, and the temporaries of saves that were killed.
void commit_index(const std::string& path, const ck::Index& ix) {
  const std::string text = ck::to_json(ix);
  ck::AtomicFile index((fs::path(path) / ck::kIndexFile).string());
  index.write(text.data(), text.size());
  fault_point("sharded-before-index", 0);
  index.commit();
  fault_point("sharded-after-index", 0);
  static const std::regex stale("data-.*\\.bin|data-.*\\.bin\\.tmp-.*|index\\.json\\.tmp-.*");
  for (const auto& f : fs::directory_iterator(path)) {
    const std::string name = f.path().filename().string();
    if (std::regex_match(name, stale) && std::find(ix.files.begin(), ix.files.end(), name) == ix.files.end()) {
      fs::remove(f.path());
    }
  }
}

// [collective] Every rank's written pieces to rank 0, which commits the
// index; on any failure, every rank removes its data file and throws. (A
// rank 0 that dies after the commit fails the broadcast: the data file,
// referenced by the new index, stays.)
void commit_save(const ShardedJob& job, dist::ProcessGroup& group) {
  Failure failed;
  const auto written = gather_outcomes(group, ck::encode_pieces(job.written), job.write_failure, failed);
  if (group.rank() == 0 && failed.empty()) failed = capture([&] { commit_index(job.path, index_of(job, written)); });
  failed = failure_from(group, 0, failed);
  if (failed.empty()) return;
  std::error_code ec;
  fs::remove(fs::path(job.path) / job.file_name, ec);  // never referenced by an index
  rethrow(failed, "save_checkpoint: saving " + job.path + " failed (the previous checkpoint there is intact): ");
}

}  // namespace

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
