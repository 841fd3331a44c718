// fsdp/checkpoint/storage.h — the seam of load_checkpoint: where a checkpoint's
// bytes come from (a StorageReader), and which pieces of which saved chunks
// each rank reads (a LoadPlan). A load runs in three steps:
//
//   1. storage: a StorageReader describes what is saved (entries, and each
//      tensor's dtype, shape and chunks) and reads one chunk on request;
//   2. plan: from that description and the model's local boxes (the shards
//      this rank holds), the default plan lists, per tensor and local box,
//      the saved chunks that overlap it; a LoadPlanner may inspect, record
//      or change it;
//   3. apply: the planned chunks are read and copied into the model, its
//      optimizers and the values, entry by entry.
//
// The built-in storage (open_checkpoint_storage) reads every format
// load_checkpoint reads, one reader per format behind a registry that
// detects which one a path holds (fsdp/checkpoint/storage_registry.h,
// where a format of one's own registers). Another storage (memory, an object store, another
// file format) implements StorageReader and loads with the overloads below,
// without touching the planner or the apply step:
//
//   class MyStorage : public fsdp::StorageReader { ... };
//   MyStorage storage(...);
//   fsdp::load_checkpoint(storage, state, *world);
//
// and a custom plan goes in as a LoadPlanner:
//
//   auto planner = [](const fsdp::StorageReader&, fsdp::LoadPlan plan) {
//     std::cout << plan.to_string();  // or drop reads: what is not planned is not loaded
//     return plan;
//   };
//   fsdp::load_checkpoint(storage, state, *world, /*strict=*/true, planner);
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/formats/format.h"

namespace fsdp {

// A box of a tensor, in the tensor's global coordinates.
struct StorageBox {
  std::vector<int64_t> offsets, sizes;
};

// Where a load reads a checkpoint from. Tensor keys are "<entry>/<state
// key>" for a model's tensors, "<entry>/<param>.<field>" for an optimizer's
// state, and "<entry>" for a tensor value (formats::Index's keys). A reader
// is used by one load at a time; its calls are [local].
class StorageReader {
 public:
  virtual ~StorageReader() = default;
  // What the storage holds: the entries in order (models with their state
  // keys, optimizers with their param groups, values) and every tensor's
  // dtype, shape and chunks. Called often: return a stored index (no I/O).
  virtual const formats::Index& index() const = 0;
  // The storage as messages name it (a file, a directory's index).
  virtual std::string location() const = 0;
  // The boxes in which tensor `key` is stored, each read whole by
  // read_chunk. Default: the boxes of index()'s chunks of `key`.
  virtual std::vector<StorageBox> chunks(const std::string& key) const;
  // The elements of chunk number `chunk` (an index into chunks(key)) of
  // tensor `key`: a CPU tensor of the tensor's dtype and the chunk's sizes.
  // Costs one read of the chunk's bytes. ConfigError naming the storage for
  // damaged or missing bytes.
  virtual at::Tensor read_chunk(const std::string& key, size_t chunk) const = 0;
  // Whether optimizer entry `entry` keys its state and param groups by
  // PyTorch's parameter ids (0, 1, ...; torch.save of optimizer.state_dict())
  // rather than by parameter names. Default: false.
  virtual bool keyed_by_ids(const std::string& entry) const;
};

// One local box of a saved tensor that a load fills, and the saved chunks
// (indices into StorageReader::chunks) that overlap it: those are read.
struct BoxRead {
  StorageBox box;
  std::vector<size_t> chunks;
};

// What a rank reads of one saved tensor.
struct TensorRead {
  std::string entry;   // the entry it belongs to (a model, an optimizer, a value)
  std::string key;     // the saved tensor's key
  bool whole = false;  // read whole (a value, optimizer state not shaped like its parameter): one box, the shape
  std::vector<BoxRead> boxes;  // a model's or optimizer's tensor: this rank's boxes of it, in its shards' order
};

// What one rank reads in a load, tensor by tensor. A tensor the plan leaves
// out is not loaded: strict loading reports it as missing.
struct LoadPlan {
  std::vector<TensorRead> reads;
  // One line per tensor read: its key, and each box with the chunks read for it.
  std::string to_string() const;
};

// [local] Given the storage and the default plan, returns the plan to apply.
// Called once per load, on every rank, before anything is read. A planner
// may drop reads, or drop chunks from a box (elements no chunk covers fail
// the load, as a missing shard does), but boxes must stay those of the
// default plan.
using LoadPlanner = std::function<LoadPlan(const StorageReader& reader, LoadPlan plan)>;

// [local] The storage of the checkpoint at `path`, opened by the format that
// claims it (fsdp/checkpoint/storage_registry.h): every format
// load_checkpoint(path, state, ...) reads, a Hugging Face model directory
// (fsdp/checkpoint/hf_storage.h), and formats users registered.
// ConfigError as load_checkpoint's for a path that holds no checkpoint or
// a damaged index, or that several formats claim.
std::unique_ptr<StorageReader> open_checkpoint_storage(const std::string& path);

// [collective over `group`] load_checkpoint(path, state, group, strict)
// reading from `reader` (every rank its own reader of the same checkpoint),
// with `planner` (unset: the default plan) choosing what is read. Returns
// the values the storage holds beyond those requested. Errors are agreed
// across ranks, as load_checkpoint's.
std::map<std::string, CheckpointValue> load_checkpoint(const StorageReader& reader, CheckpointState& state,
                                                       dist::ProcessGroup& group, bool strict = true,
                                                       const LoadPlanner& planner = nullptr);

// [collective over `group`] load_checkpoint(path, module, group, strict)
// reading the single model entry of `reader`, with `planner` (unset: the
// default plan) choosing what is read.
void load_checkpoint(const StorageReader& reader, const std::shared_ptr<torch::nn::Module>& module,
                     dist::ProcessGroup& group, bool strict = true, const LoadPlanner& planner = nullptr);

}  // namespace fsdp
