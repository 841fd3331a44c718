// fsdp/checkpoint/storage_writer.h — the seam of a sharded save, as
// torch.distributed.checkpoint's StorageWriter: where a checkpoint's bytes
// go. A sharded save runs in three steps:
//
//   1. plan [collective]: every rank takes its shards of the state (the
//      SHARDED state dict: views, no gather), and the ranks agree who
//      writes which piece: a box that several ranks hold (replicas, values
//      every rank has) is written once, by the lowest rank holding it;
//   2. write [local, every rank]: StorageWriter::write_data writes this
//      rank's pieces and returns what the commit needs of them (where their
//      bytes went). In an async save it runs on a background thread;
//   3. commit [collective]: every rank's result goes to rank 0, whose
//      StorageWriter::finish commits the checkpoint atomically; on any
//      failure every rank's abort() removes what it wrote, and the error is
//      agreed across ranks.
//
// save_checkpoint(path, ...) with CheckpointFormat::kSharded is this save
// with the built-in DCP writer (make_dcp_writer): a directory of
// __<rank>_<save id>.distcp data files, meta.pt, fsdp_index.json and, last,
// .metadata (the commit point). A writer of one's own (an object store,
// memory) plugs in as:
//
//   class MyWriter : public fsdp::StorageWriter { ... };
//   fsdp::save_checkpoint(std::make_shared<MyWriter>(...), state, *world);
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/checkpoint/storage.h"
#include "fsdp/formats/format.h"

namespace fsdp {

// One piece of a tensor that a rank writes.
struct WriteItem {
  // The tensor's key, as StorageReader's: "<entry>/<state key>",
  // "<entry>/<param>.<field>" for an optimizer's state, "<entry>" for a
  // tensor value.
  std::string key;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;  // the tensor's global shape
  StorageBox box;              // where the piece lies in it (box.sizes are tensor's sizes)
  // The piece's elements. A view of the live state in a synchronous save
  // (write before training goes on); a CPU snapshot in an async one.
  at::Tensor tensor;
};

// What a save writes: the same entries on every rank, and this rank's pieces.
struct SavePlan {
  std::string save_id;  // new for each save, the same on every rank
  int rank = 0, world_size = 1;
  // What the checkpoint holds, in order: models with their state keys,
  // optimizers with their param groups, values (a tensor value's elements
  // are an item of rank 0's).
  std::vector<formats::EntryRecord> entries;
  // The pieces this rank writes. Across ranks, every box of every tensor is
  // written exactly once.
  std::vector<WriteItem> items;
};

// Where a sharded save writes. One writer serves one save at a time; each
// rank has its own writer of the same destination.
class StorageWriter {
 public:
  virtual ~StorageWriter() = default;
  // The destination as messages name it.
  virtual std::string location() const = 0;
  // [local, rank 0 only, before the plan] Makes the destination ready (a
  // directory created) or refuses it (ConfigError). Its outcome is agreed
  // across ranks: nothing is written when it fails. Default: nothing.
  virtual void prepare() {}
  // [local, every rank] Writes `plan.items` (and what else this rank owes
  // the format: the DCP writer's rank 0 writes the values) so that nothing
  // is visible to readers before finish(). Returns what finish() needs of
  // this rank's writes, as bytes. Costs a write of every item's bytes. May
  // run on a background thread (async save): it must not use the process
  // group. Its exception fails the save on every rank.
  virtual std::string write_data(const SavePlan& plan) = 0;
  // [local, rank 0 only, after every rank wrote] Commits the checkpoint
  // atomically from every rank's write_data result (`results[r]`: rank
  // r's): readers see the previous checkpoint before it returns, the new one
  // after. `plan` is rank 0's. Its exception fails the save on every rank.
  virtual void finish(const SavePlan& plan, const std::vector<std::string>& results) = 0;
  // [local, every rank, after a failed save] Removes what this rank's
  // write_data wrote that no committed checkpoint names. Must not throw.
  // Default: nothing.
  virtual void abort(const SavePlan&) noexcept {}
};

// [collective over `group`] A sharded save of `state` through `writer`
// (every rank passes its own writer of the same destination): plan, write,
// commit, as above. options.filter and options.async_save apply
// (options.format does not: the writer is the format). With async_save the
// write runs in the background and the commit happens at
// wait_for_checkpoint(group); the writer is kept alive until then. Errors
// are agreed across ranks (every rank throws the same), as save_checkpoint's.
void save_checkpoint(std::shared_ptr<StorageWriter> writer, const CheckpointState& state, dist::ProcessGroup& group,
                     const CheckpointOptions& options = {});

// [local] The built-in writer of a sharded checkpoint (DCP) at directory
// `path`, as save_checkpoint(path, ...) with CheckpointFormat::kSharded
// writes it (without its replacing a checkpoint of the full format there:
// prepare() refuses anything but a directory or a missing path).
std::shared_ptr<StorageWriter> make_dcp_writer(const std::string& path);

}  // namespace fsdp
