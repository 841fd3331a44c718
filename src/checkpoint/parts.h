// src/checkpoint/parts.h — what the parts of the checkpoint module share
// (docs/architecture.md): the state's walk (state.cpp), the two writers
// (full_writer.cpp, sharded_writer.cpp), pending async saves
// (checkpoint_io.cpp). The loader's parts share loading.h. Private to the
// module.
#pragma once

#include <functional>
#include <future>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/formats/dcp.h"
#include "fsdp/formats/format.h"
#include "fsdp/formats/safetensors.h"
#include "fsdp/state_dict/state_dict.h"
#include "fsdp/distributed/rank_errors.h"
#include "fsdp/formats/torch_pickle.h"

namespace caffe2::serialize {
class PyTorchStreamWriter;
}


namespace fsdp {
class StorageReader;       // fsdp/checkpoint/storage.h
class CheckpointState;     // fsdp/checkpoint/checkpoint_io.h, which the module's .cpp files include
struct CheckpointOptions;
}  // namespace fsdp

namespace fsdp::detail {

// The module's files agree failures across ranks (fsdp/distributed/rank_errors.h)
// unqualified.
using dist::agree;
using dist::agree_from;
using dist::capture;
using dist::Failure;
using dist::failure_from;
using dist::gather_agreed;
using dist::gather_outcomes;
using dist::rethrow;

// ---- The state (state.cpp) ----

// FSDP units (FSDP1) or modules that fully_shard sharded (FSDP2).
bool has_fsdp_units(const std::shared_ptr<torch::nn::Module>& model);

// Lightning's rule: exactly one model with FSDP units (optimizers belong to
// it); ConfigError in Lightning's words otherwise. verb: "save" or "load".
std::pair<std::string, std::shared_ptr<torch::nn::Module>> the_fsdp_model(const CheckpointState& state,
                                                                          const char* verb);

// Receives each tensor of the state: "<entry>/<key>" (a tensor value: its name).
using Put = std::function<void(const std::string& tensor_key, const StateValue& value)>;

// [collective: FULL gathers every unit, on every rank alike] The entries of
// `state` in order, as state dicts of `type`, each tensor handed to `put`
// as it comes (no copies); options.filter applied.
std::vector<formats::EntryRecord> visit_state(const CheckpointState& state,
                                           const std::shared_ptr<torch::nn::Module>& fsdp_model, StateDictType type,
                                           const CheckpointOptions& options, const Put& put);

// ---- Pending async saves (checkpoint_io.cpp) ----

// An async save: `write` runs in the background and keeps its own outcome;
// `commit` [collective] agrees on it and commits, at wait_for_checkpoint,
// which every rank calls at the same point.
struct PendingSave {
  std::future<void> write;
  std::function<void()> commit;
};
void set_pending_save(dist::ProcessGroup& group, PendingSave save);

// ---- The full format (full_writer.cpp) ----

// Writes a full checkpoint file: tensor records as they come (streaming),
// then the pickle, the index and the zip directory; commits by rename. The
// first error is kept (error()) and everything after it is skipped;
// destroyed uncommitted, the temporary file is removed.
class FullFileWriter {
 public:
  FullFileWriter(const std::string& path, int world_size);
  ~FullFileWriter();
  void add(const std::string& key, const at::Tensor& tensor);
  void finish(std::vector<formats::EntryRecord> entries);
  const Failure& error() const { return error_; }

 private:
  void keep_first_error(const Failure& e);
  Failure error_;
  std::unique_ptr<formats::AtomicFile> file_;
  std::unique_ptr<caffe2::serialize::PyTorchStreamWriter> zip_;
  formats::Index ix_;
  std::map<std::string, std::string> record_of_;
  int next_ = 0;
};

// [collective] A full save at `path` (gathered unit by unit; rank 0 writes),
// or, with options.async_save, its start (rank 0 copies the state and
// writes it in the background; set_pending_save).
void save_full(const std::string& path, const CheckpointState& state,
               const std::shared_ptr<torch::nn::Module>& fsdp_model, dist::ProcessGroup& group,
               const CheckpointOptions& options);

// ---- PyTorch's pickles of a full checkpoint (full_pickle.cpp) ----

// A param group's options as PyTorch's optimizer of class `kind` holds
// them (optimizer_kinds.h's python_options: torch 2.15's keys, in its order,
// "params" not included), each with the writer of its Python value; for a
// class fsdp-cpp does not know (checkpoints without one), the stored numbers.
// A formats::GroupOptions.
std::vector<std::pair<std::string, formats::PickleValue>> python_group_options(
    const std::string& kind, const std::map<std::string, double>& options);

// The pickle (protocol 2) that makes a full checkpoint a torch.load-able
// dict: {entry: {key: tensor} | value}, optimizers as PyTorch's
// {"state": {param: {field: tensor}}, "param_groups": [...]}.
std::string full_pickle(const formats::Index& index, const std::map<std::string, std::string>& record_of);

// ---- The sharded format (sharded_writer.cpp) ----

// [collective] A sharded save at `path` (every rank writes its pieces, rank 0
// the index), or, with options.async_save, its start (the writes run in the
// background; set_pending_save).
void save_sharded(const std::string& path, const CheckpointState& state,
                  const std::shared_ptr<torch::nn::Module>& fsdp_model, dist::ProcessGroup& group,
                  const CheckpointOptions& options);

// [local] Writes the checkpoint `src` (any storage) as a sharded (DCP) checkpoint at
// `path`, one tensor in memory at a time, each tensor one chunk.
void copy_to_sharded(const StorageReader& src, const std::string& path);

}  // namespace fsdp::detail
