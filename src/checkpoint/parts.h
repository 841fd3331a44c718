// src/checkpoint/parts.h — what the parts of the checkpoint_files module
// share (docs/architecture.md): the state's walk (state.cpp), the two
// writers (full_writer.cpp, sharded_writer.cpp), pending async
// saves (checkpoint_io.cpp) and the loader's source (loader.cpp, used by
// tools.cpp). Private to the module.
#pragma once

#include <functional>
#include <future>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "format.h"
#include "safetensors.h"
#include "fsdp/state_dict/state_dict.h"
#include "fsdp/dist/rank_errors.h"
#include "torch_pickle.h"

namespace caffe2::serialize {
class PyTorchStreamWriter;
}

namespace fsdp {
class CheckpointState;     // fsdp/checkpoint/checkpoint_io.h, which the module's .cpp files include
struct CheckpointOptions;
}  // namespace fsdp

namespace fsdp::detail {

// The module's files agree failures across ranks (fsdp/dist/rank_errors.h)
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
std::vector<checkpoint::EntryRecord> visit_state(const CheckpointState& state,
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
  void finish(std::vector<checkpoint::EntryRecord> entries);
  const Failure& error() const { return error_; }

 private:
  void keep_first_error(const Failure& e);
  Failure error_;
  std::unique_ptr<checkpoint::AtomicFile> file_;
  std::unique_ptr<caffe2::serialize::PyTorchStreamWriter> zip_;
  checkpoint::Index ix_;
  std::map<std::string, std::string> record_of_;
  int next_ = 0;
};

// [collective] A full save at `path` (gathered unit by unit; rank 0 writes),
// or, with options.async_save, its start (rank 0 copies the state and
// writes it in the background; set_pending_save).
void save_full(const std::string& path, const CheckpointState& state,
               const std::shared_ptr<torch::nn::Module>& fsdp_model, dist::ProcessGroup& group,
               const CheckpointOptions& options);

// ---- The sharded format (sharded_writer.cpp) ----

// [collective] A sharded save at `path` (every rank writes its pieces, rank 0
// the index), or, with options.async_save, its start (the writes run in the
// background; set_pending_save).
void save_sharded(const std::string& path, const CheckpointState& state,
                  const std::shared_ptr<torch::nn::Module>& fsdp_model, dist::ProcessGroup& group,
                  const CheckpointOptions& options);

struct Source;
// [local] Writes the checkpoint `src` as a sharded (DCP) checkpoint at
// `path`, one tensor in memory at a time, each tensor one chunk.
void copy_to_sharded(const Source& src, const std::string& path);

// ---- Reading (loader.cpp) ----

// An opened checkpoint: its index and where its bytes are.
struct Source {
  std::string path;
  std::string where;  // the index file, for messages
  checkpoint::Index ix;
  std::unique_ptr<checkpoint::FullReader> full;  // full format (and raw)
  std::string dir;                         // sharded format
  bool raw = false;  // a module state dict from torch.save (open_source's accept_raw): `full` only, no index
  // A full checkpoint that PyTorch or Lightning wrote (no fsdp-cpp index):
  // `ix` is built from its pickle (index_pickled); its tensors are views of
  // the zip's storage records, without chunks or checksums.
  std::map<std::string, pickle::TensorRef> pickled;  // by tensor key
  std::set<std::string> numbered;  // optimizer entries keyed by PyTorch's parameter ids (0, 1, ...), not names
  std::unique_ptr<checkpoint::SafetensorsHeader> safetensors;  // a safetensors file (accept_raw): its header, no index

  const checkpoint::EntryRecord* entry(const std::string& name) const;  // null if absent
  // The checkpoint's one model entry; ConfigError (starting with `caller`)
  // if it holds none or several.
  const checkpoint::EntryRecord& the_model(const std::string& caller) const;
  // ConfigError if the index has no tensor `key`.
  const checkpoint::TensorEntry& tensor(const std::string& key) const;
  // Copies into `targets` (boxes of the tensor `key`) what the checkpoint
  // holds of them, reading only the chunks that overlap; returns the
  // elements copied.
  int64_t fill(const std::string& key, std::vector<Shard>& targets) const;
  // The whole tensor `key`; ConfigError if its chunks do not cover it.
  at::Tensor read_whole(const std::string& key) const;
};

// The entries of the pickle of `s.full` (a torch.save'd dict: Lightning's or
// FSDP's full checkpoint, or {"model": model.state_dict(), "optimizer":
// optimizer.state_dict(), ...}) into s.ix and s.pickled (pickled.cpp).
// A dict of tensors is a model, a dict with "state" and "param_groups" an
// optimizer, a number, bool, string or tensor a value; other dicts nest
// ("a.b" for {"a": {"b": ...}}); anything else is left out. ConfigError
// naming the file when the pickle is not a dict or is malformed.
void index_pickled(Source& s);

// Opens `path` (either format; ConfigError "does not point to a valid
// checkpoint" or naming the damage). accept_raw: a PyTorch zip file without
// fsdp-cpp's index whose pickle may be a module's state dict opens as a raw
// source, and a safetensors file (by content, or any file named
// *.safetensors) as one with its header; PyTorch's legacy format and
// TorchScript archives are named as such. Without accept_raw a safetensors
// file is "not a valid checkpoint", saying how it loads.
std::unique_ptr<Source> open_source(const std::string& path, bool accept_raw = false);

}  // namespace fsdp::detail
