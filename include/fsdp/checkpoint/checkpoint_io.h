// fsdp/checkpoint/checkpoint_io.h — checkpoints on disk: a model, its optimizers and the
// user's values, saved full (one file) or sharded (a directory), loadable at
// any world size, committed atomically, verified on load.
//
//   fsdp::CheckpointState state;
//   state.model("model", model.ptr()).optimizer("optimizer", optimizer).value("step", int64_t{step});
//   fsdp::save_checkpoint("ckpt/step-100", state, *world, {fsdp::CheckpointFormat::kSharded});
//   ...
//   auto extra = fsdp::load_checkpoint("ckpt/step-100", state, *world);  // fills model, optimizer, "step"
//
// FULL: one file, written by rank 0 while the model is gathered unit by unit
// (rank 0's extra memory: about one unit). The file is PyTorch's own zip
// format: `torch.load(path)` (weights_only too) gives a dict
// {entry: state dict / optimizer state dict / value}.
// SHARDED: a directory in torch.distributed.checkpoint's (DCP) layout; every
// rank writes its own pieces in parallel, no gather; `.metadata`, written by
// rank 0 after every rank has synced its file, describes every piece and is
// the commit marker (beside it fsdp_index.json with the CRC-32s, and meta.pt
// for Lightning). PyTorch's dcp.load reads it at any world size; DCP
// directories PyTorch or Lightning wrote load here, as does fsdp-cpp's
// earlier sharded layout (index.json and raw data files).
// Either loads into any world size and layout, or into an unwrapped model.
// Every piece carries a CRC-32 checked on load. docs/checkpoint-format.md
// describes both formats field by field.
//
// Crash safety: nothing is written under the final name before it is
// complete and synced (temporary file + rename; sharded: new data files next
// to the old ones, .metadata replaced by rename, old files removed after).
// An interrupted save leaves the previous checkpoint loadable. A checkpoint
// of the other format at the path (a sharded directory under a full save, a
// file under a sharded one) is replaced, as Lightning does, but crash-safely:
// the new checkpoint is saved complete at "<path>.fsdp-new-<id>", swapped
// with the old one in one step (renameat2 RENAME_EXCHANGE, Linux 3.15+ on
// local file systems; elsewhere the save fails saying so, the old checkpoint
// intact), and the old one is removed only then.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "fsdp/distributed/process_group.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace fsdp {

enum class CheckpointFormat { kFull, kSharded };

// "full", "sharded" (Lightning's state_dict_type names).
const char* to_string(CheckpointFormat format);
// Parses those names (case-insensitive). Throws ConfigError "Unknown <what>:
// <name>" listing them otherwise (`what`: what the name is for, e.g.
// "state_dict_type" or a command-line option).
CheckpointFormat parse_checkpoint_format(const std::string& name, const std::string& what = "checkpoint format");

// A user value kept in a checkpoint.
using CheckpointValue = std::variant<int64_t, double, bool, std::string, at::Tensor>;

// What to save or load: named models, optimizers and values (Lightning's
// `state` dict). Models and optimizers are referenced, not copied.
class CheckpointState {
 public:
  CheckpointState& model(const std::string& name, std::shared_ptr<torch::nn::Module> module);
  CheckpointState& optimizer(const std::string& name, torch::optim::Optimizer& optimizer);
  CheckpointState& value(const std::string& name, CheckpointValue value);

  bool has_value(const std::string& name) const { return values_.count(name) > 0; }
  // ConfigError naming the entry if absent.
  const CheckpointValue& value(const std::string& name) const;
  // The value as T (int64_t, double, bool, std::string, at::Tensor); ConfigError if it is another type.
  template <class T>
  const T& get(const std::string& name) const {
    const auto& v = value(name);
    if (!std::holds_alternative<T>(v)) throw_wrong_type(name);
    return std::get<T>(v);
  }

  struct Entry {
    enum Kind { kModel, kOptimizer, kValue } kind;
    std::string name;
  };
  const std::vector<Entry>& entries() const { return entries_; }
  const std::map<std::string, std::shared_ptr<torch::nn::Module>>& models() const { return models_; }
  const std::map<std::string, torch::optim::Optimizer*>& optimizers() const { return optimizers_; }
  const std::map<std::string, CheckpointValue>& values() const { return values_; }
  std::map<std::string, CheckpointValue>& mutable_values() { return values_; }

 private:
  void add(Entry::Kind kind, const std::string& name);
  [[noreturn]] void throw_wrong_type(const std::string& name) const;
  std::vector<Entry> entries_;
  std::map<std::string, std::shared_ptr<torch::nn::Module>> models_;
  std::map<std::string, torch::optim::Optimizer*> optimizers_;
  std::map<std::string, CheckpointValue> values_;
};

// How save_checkpoint saves, with chainable setters in LibTorch's TORCH_ARG
// idiom (`name(value)` sets and returns *this, `name()` reads):
//   fsdp::CheckpointOptions(fsdp::CheckpointFormat::kFull).async_save(true)
struct CheckpointOptions {
  /* implicit */ CheckpointOptions(CheckpointFormat format = CheckpointFormat::kSharded) : format_(format) {}
  // Full (one file) or sharded (a directory, the default).
  TORCH_ARG(CheckpointFormat, format);
  // Keeps only the keys for which it returns true: (entry name, key in that
  // entry's state dict; "" for a value). Works for both formats. Unset (the
  // default): every key.
  TORCH_ARG(std::function<bool(const std::string& entry, const std::string& key)>, filter);
  // Stage the state in memory (sharded: each rank's pieces; full: rank 0's
  // gathered copy of everything) and write it in the background while
  // training goes on. The save commits at wait_for_checkpoint (which the
  // next save or load calls); until then the previous checkpoint at the
  // path is the one that loads. Default false.
  TORCH_ARG(bool, async_save) = false;
};

// [collective over `group` (the whole world): every rank calls it with the
// same path and the same state] Saves `state` at `path`. The state must hold
// exactly one model with FSDP units (optimizers belong to it; other models
// are saved whole, from rank 0). ConfigError, with Lightning's words, for no
// FSDP model or several, or a full save onto a directory that is not a
// checkpoint, or an async save that would replace a checkpoint of the other
// format; Error naming the file for I/O failures (a full disk included),
// with the previous checkpoint at `path` left intact.
void save_checkpoint(const std::string& path, const CheckpointState& state, dist::ProcessGroup& group,
                     const CheckpointOptions& options = {});

// [collective over `group` when an async save is pending, a no-op otherwise]
// Waits for the pending async save of `group` to finish writing and commits
// it; throws its error. Call it on every rank at the same point (end of
// training), like the save itself.
void wait_for_checkpoint(dist::ProcessGroup& group);

// [local] True while an async save of `group` awaits wait_for_checkpoint.
bool checkpoint_pending(const dist::ProcessGroup& group);

// [collective over `group`] Loads the checkpoint at `path` (either format,
// any world size at save) into `state`'s models and optimizers and fills the
// values `state` names. strict: every requested key must be in the
// checkpoint (ConfigError listing the missing ones) and no model key may be
// left over. Returns the values the checkpoint holds beyond those requested.
// ConfigError naming the file and tensor for damaged files (bad checksum,
// truncation, a missing shard, a path outside the directory, a version from
// the future); "does not point to a valid checkpoint" for anything else.
std::map<std::string, CheckpointValue> load_checkpoint(const std::string& path, CheckpointState& state,
                                                       dist::ProcessGroup& group, bool strict = true);

// [collective over `group`] Loads only a model's weights (Lightning's
// load_checkpoint(path, module) and Fabric's load_raw), wrapped or not, at
// any world size: the single model entry of an fsdp-cpp checkpoint, a
// Hugging Face model directory (model.safetensors or its sharded index,
// fsdp/checkpoint/hf_storage.h: each rank reads only the rows its shards
// overlap), a safetensors file (Hugging Face's weights: recognized by its content, or by
// the name *.safetensors; its header validated as the safetensors package
// validates it, docs/checkpoint-format.md), or a module state dict that
// torch.save(model.state_dict()) (Python) or torch::pickle_save (LibTorch)
// wrote. A torch.save file is read as
// torch.load(weights_only=True) reads it: tensors, numbers, strings and
// containers only; a Python class or function in it is refused by name,
// before anything runs. Every rank parses the file and reads, one tensor at
// a time, the tensors its shards overlap (extra memory: the largest tensor).
// strict: missing, unexpected and mis-shaped keys are a ConfigError listing
// them (as PyTorch's load_state_dict); non-strict loads what matches. A
// tensor of another dtype is converted to the model's. Files of PyTorch's
// legacy format (_use_new_zipfile_serialization=False) and TorchScript
// archives are refused, saying so.
void load_checkpoint(const std::string& path, const std::shared_ptr<torch::nn::Module>& module,
                     dist::ProcessGroup& group, bool strict = true);

// [local] What `path` holds, for tools: its format, version, world size at
// save, values, and every tensor (key, dtype, shape, bytes).
struct CheckpointTensorInfo {
  std::string key;  // "<entry>/<state key>"
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t nbytes = 0;
  int chunks = 0;
};
struct CheckpointInfo {
  CheckpointFormat format = CheckpointFormat::kFull;
  int version = 0;
  int world_size = 0;
  std::map<std::string, std::string> values;       // name -> printable value
  std::map<std::string, std::string> value_types;  // name -> "int", "float", "bool", "str" or "tensor"
  std::vector<CheckpointTensorInfo> tensors;
};
CheckpointInfo inspect_checkpoint(const std::string& path);

// [local] Checks what loading checks, and reads everything: the index's own
// checksum (before anything in it is used), every zip record against its
// CRC-32 (full files, DCP items), every piece against its checksum and size,
// that each tensor's chunks cover it exactly without overlap, and for a DCP
// directory that fsdp_index.json and .metadata agree. Returns one line per
// damaged piece or file (empty: the checkpoint is sound, and loads). Files
// that are not regular files (FIFOs, devices) are refused, never opened for
// a blocking read.
std::vector<std::string> verify_checkpoint(const std::string& path);

// [local] Writes the sharded checkpoint `sharded_dir` as one full checkpoint
// file `out_file` (torch.load-able), one tensor in memory at a time.
void consolidate_checkpoint(const std::string& sharded_dir, const std::string& out_file);

// [local] Writes the weights of the checkpoint `path` (either format, its
// single model entry) as a safetensors file `out_file`, as Hugging Face's
// safetensors.torch.save_file would: keys are the model's state-dict keys,
// dtypes and shapes as saved, `__metadata__` {"format": "pt", "producer":
// "fsdp-cpp", "fsdp_entry": <the entry's name>}. One tensor in memory at a
// time (read from its chunks, written, dropped); crash-safe (nothing at
// `out_file` until it is complete and synced). ConfigError for a checkpoint
// with no model or several, a damaged checkpoint (as load_checkpoint), and
// an `out_file` that is the checkpoint, inside it, or a directory; Error
// naming the file for write failures. The file loads back with
// load_checkpoint(out_file, module) and with safetensors.torch.load_file.
void export_safetensors(const std::string& path, const std::string& out_file);

// [local] Writes the checkpoint at `src` (either format, fsdp-cpp's earlier
// sharded layout, or a DCP directory PyTorch or Lightning wrote) as a
// checkpoint of `format` at `dst`, one tensor in memory at a time (sharded:
// a DCP directory whose tensors are one chunk each). ConfigError if `dst` is
// `src` or inside it (symbolic links resolved), as export_safetensors does.
void convert_checkpoint(const std::string& src, const std::string& dst, CheckpointFormat format);

}  // namespace fsdp
