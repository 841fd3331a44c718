// A sharded save through a StorageWriter (fsdp/checkpoint/storage_writer.h),
// in three steps: plan [collective: who writes which piece], write [local:
// the writer's write_data], commit [collective: rank 0's finish, the commit
// point]. An async save runs the write in the background and commits at
// wait_for_checkpoint. The built-in writer, DCP's, is sharded_writer.cpp.
#include <ATen/ATen.h>

#include <set>
#include <tuple>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/checkpoint/storage_writer.h"
#include "fsdp/error.h"
#include "fsdp/formats/dcp.h"
#include "parts.h"

namespace fsdp::detail {

namespace {

std::string saving(const std::string& where) { return "save_checkpoint: saving " + where; }

// The record of an item, as the ranks exchange them (formats::encode_pieces).
formats::PieceRecord record_of(const WriteItem& item) {
  formats::PieceRecord r{item.key, item.dtype, item.shape, {}};
  r.chunk.offsets = item.box.offsets;
  r.chunk.sizes = item.box.sizes;
  r.chunk.nbytes = static_cast<int64_t>(item.tensor.numel() * static_cast<int64_t>(c10::elementSize(item.dtype)));
  return r;
}

WriteItem make_item(const std::string& key, at::ScalarType dtype, std::vector<int64_t> shape,
                    std::vector<int64_t> offsets, const at::Tensor& tensor) {
  return WriteItem{key, dtype, std::move(shape), StorageBox{std::move(offsets), tensor.sizes().vec()}, tensor};
}

// This rank's pieces of the state: views of its shards, no gather. Its
// failure goes to `error`, for the agreement that follows.
std::vector<WriteItem> local_items(SavePlan& plan, const CheckpointState& state,
                                   const std::shared_ptr<torch::nn::Module>& fsdp_model,
                                   const CheckpointOptions& options, Failure& error) {
  std::vector<WriteItem> items;
  auto put = [&](const std::string& key, const StateValue& v) {
    if (std::holds_alternative<at::Tensor>(v)) {
      const auto& t = std::get<at::Tensor>(v);
      items.push_back(make_item(key, t.scalar_type(), t.sizes().vec(), std::vector<int64_t>(t.sizes().size(), 0), t));
      return;
    }
    const auto& st = std::get<ShardedTensor>(v);
    for (const auto& s : st.local_shards) items.push_back(make_item(key, st.dtype, st.global_shape, s.offsets, s.tensor));
  };
  error = capture([&] { plan.entries = visit_state(state, fsdp_model, StateDictType::kSharded, options, put); });
  return items;
}

// [collective: all_gather] Who writes what: a box held by several ranks
// (replicas, tensors every rank has) is written by the lowest one. copy: a
// snapshot of each owned piece (async: training goes on).
void claim_items(SavePlan& plan, std::vector<WriteItem> items, Failure error, dist::ProcessGroup& group,
                 const std::string& where, bool copy) {
  std::vector<formats::PieceRecord> mine;
  for (const auto& p : items) mine.push_back(record_of(p));
  const std::string payload = formats::encode_pieces(mine);
  // Pieces the others could not decode fail here, on every rank alike.
  if (error.empty()) error = capture([&] { formats::decode_pieces(payload, "this rank's pieces"); });
  const auto everyone = gather_agreed(group, payload, error, saving(where));
  using Box = std::tuple<std::string, std::vector<int64_t>, std::vector<int64_t>>;
  std::set<Box> taken;  // the boxes of lower ranks
  for (int r = 0; r < group.rank(); ++r) {
    const std::string of = "rank " + std::to_string(r) + "'s pieces";
    for (const auto& x : formats::decode_pieces(everyone[static_cast<size_t>(r)], of)) {
      taken.insert(Box{x.key, x.chunk.offsets, x.chunk.sizes});
    }
  }
  for (auto& p : items) {
    if (!taken.insert(Box{p.key, p.box.offsets, p.box.sizes}).second) continue;
    if (copy) p.tensor = p.tensor.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
    plan.items.push_back(std::move(p));
  }
}

// A save in flight: the plan, and the write's outcome.
struct Job {
  std::shared_ptr<StorageWriter> writer;
  std::string where;
  SavePlan plan;
  std::string written;  // write_data's result
  Failure write_failure;
};

// [collective] The plan of a save: the destination prepared (rank 0), a
// save id agreed, this rank's pieces claimed.
void stage(Job& job, const CheckpointState& state, const std::shared_ptr<torch::nn::Module>& fsdp_model,
           dist::ProcessGroup& group, const CheckpointOptions& options) {
  Failure error;
  if (group.rank() == 0) error = capture([&] { job.writer->prepare(); });
  agree(group, error, "save_checkpoint: creating " + job.where);
  job.plan.rank = group.rank();
  job.plan.world_size = group.size();
  job.plan.save_id = group.broadcast_bytes(formats::new_save_id(), 0);
  auto items = local_items(job.plan, state, fsdp_model, options, error);
  claim_items(job.plan, std::move(items), error, group, job.where, /*copy=*/options.async_save());
}

void write_data(Job& job) {
  job.write_failure = capture([&] { job.written = job.writer->write_data(job.plan); });
}

// [collective] Every rank's write result to rank 0, which commits; on any
// failure, every rank aborts what it wrote and throws. (A rank 0 that dies
// after the commit fails the broadcast: the data, referenced by the new
// checkpoint, stays.)
void commit(const Job& job, dist::ProcessGroup& group) {
  Failure failed;
  const auto written = gather_outcomes(group, job.written, job.write_failure, failed);
  if (group.rank() == 0 && failed.empty()) failed = capture([&] { job.writer->finish(job.plan, written); });
  failed = failure_from(group, 0, failed);
  if (failed.empty()) return;
  job.writer->abort(job.plan);  // never referenced by a committed checkpoint
  rethrow(failed, "save_checkpoint: saving " + job.where + " failed (the previous checkpoint there is intact): ");
}

void save_with(std::shared_ptr<StorageWriter> writer, const CheckpointState& state,
               const std::shared_ptr<torch::nn::Module>& fsdp_model, dist::ProcessGroup& group,
               const CheckpointOptions& options) {
  auto job = std::make_shared<Job>();
  job->where = writer->location();
  job->writer = std::move(writer);
  stage(*job, state, fsdp_model, group, options);
  if (!options.async_save()) {
    write_data(*job);
    commit(*job, group);
    return;
  }
  PendingSave pending;
  pending.write = std::async(std::launch::async, [job] { write_data(*job); });
  pending.commit = [job, g = &group] { commit(*job, *g); };
  set_pending_save(group, std::move(pending));
}

}  // namespace

void save_sharded(const std::string& path, const CheckpointState& state,
                  const std::shared_ptr<torch::nn::Module>& fsdp_model, dist::ProcessGroup& group,
                  const CheckpointOptions& options) {
  save_with(make_dcp_writer(path), state, fsdp_model, group, options);
}

}  // namespace fsdp::detail

namespace fsdp {

void save_checkpoint(std::shared_ptr<StorageWriter> writer, const CheckpointState& state, dist::ProcessGroup& group,
                     const CheckpointOptions& options) {
  if (!writer) throw ConfigError("save_checkpoint: the storage writer is null");
  auto model = detail::the_fsdp_model(state, "save").second;
  wait_for_checkpoint(group);  // one save at a time
  detail::save_with(std::move(writer), state, model, group, options);
}

}  // namespace fsdp
