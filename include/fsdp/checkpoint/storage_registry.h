// fsdp/checkpoint/storage_registry.h — which format a checkpoint path holds:
// the registry of storage formats that load_checkpoint(path, ...),
// open_checkpoint_storage and the tools (inspect, verify, convert,
// consolidate, export) detect, as torch.distributed.checkpoint asks each
// StorageReader whether a checkpoint id is its own.
//
// Every open asks every registered format whether the path is its own
// (StorageFormat::claims), then opens it with the one that claims it. The
// built-in formats, asked first, in this order:
//
//   "dcp"           a directory with .metadata: fsdp-cpp's sharded save,
//                   PyTorch's dcp.save, Lightning's sharded save (meta.pt)
//   "fsdp-sharded"  a directory with fsdp-cpp's earlier index.json (no .metadata)
//   "hf"            a Hugging Face model directory (fsdp/checkpoint/hf_storage.h)
//   "safetensors"   a safetensors file (by content; loading a module, also
//                   any file named *.safetensors): opens only where a
//                   module's weights are loaded (DetectOptions::module_state)
//   "full-pickle"   a torch.save zip: fsdp-cpp's full file, a full
//                   checkpoint PyTorch or Lightning wrote, or (module_state)
//                   a module's state dict
//
// No two built-in formats claim the same path. A path no format claims is
// "not a valid checkpoint" (ConfigError: "The path '<path>' does not point
// to a valid checkpoint. ...", saying what is there: an interrupted sharded
// save, a directory without an index, a file that is not a zip); a path
// several claim is ConfigError "checkpoint: <path> is claimed by several
// storage formats: 'a' and 'b'...". A format of one's own plugs in as:
//
//   class MyFormat : public fsdp::StorageFormat {
//     std::string name() const override { return "my-format"; }
//     bool claims(const std::string& path, const fsdp::DetectOptions&) const override {
//       return std::filesystem::exists(std::filesystem::path(path) / "MY_INDEX");
//     }
//     std::unique_ptr<fsdp::StorageReader> open(const std::string& path,
//                                              const fsdp::DetectOptions&) const override {
//       return std::make_unique<MyStorage>(path);
//     }
//   };
//   fsdp::register_storage_format(std::make_shared<MyFormat>());
//   fsdp::load_checkpoint(dir, state, *world);  // opens dir with MyStorage
//
// Every call here is [local]: no collectives. Each rank detects and opens
// on its own; load_checkpoint agrees the outcome across ranks.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "fsdp/checkpoint/storage.h"

namespace fsdp {

// What the caller will load from the storage it opens.
struct DetectOptions {
  // true where one module's weights are loaded (load_checkpoint(path,
  // module)): files that hold only a module's state dict
  // (torch.save(model.state_dict()), a safetensors file) open too, their
  // tensors as the one model entry "model". false (default) for a
  // checkpoint's state (load_checkpoint(path, state), the tools,
  // open_checkpoint_storage(path)).
  bool module_state = false;
};

// A checkpoint format: how to recognise a path of it, and how to open it.
// Implementations must be safe to call from several threads at once (ranks
// as threads open the same path together) and hold no per-open state.
class StorageFormat {
 public:
  virtual ~StorageFormat() = default;
  // The format's name, unique in the registry, as messages name it.
  virtual std::string name() const = 0;
  // [local] Whether `path` holds a checkpoint of this format. Cheap: a
  // stat, a few bytes or an index's directory read; no tensor bytes. Every
  // format is asked on every open, so answer only for paths this format
  // reads: false for anything else, never an exception for them. May throw
  // ConfigError when the path is recognisably of this format but must not
  // be read (e.g. its index is a link to a device): that error is the open's.
  virtual bool claims(const std::string& path, const DetectOptions& options) const = 0;
  // [local, I/O: the index and headers, no tensor bytes] Opens `path`,
  // which claims() accepted. ConfigError naming the damage, or when the
  // format cannot give what `options` asks (a module's weights alone where
  // a checkpoint's state is loaded).
  virtual std::unique_ptr<StorageReader> open(const std::string& path, const DetectOptions& options) const = 0;
};

// [local, thread-safe] Adds `format` to the registry, asked after the
// built-in formats and those registered before it. ConfigError when it is
// null or its name is already registered.
void register_storage_format(std::shared_ptr<const StorageFormat> format);

// [local, thread-safe] Removes the format registered as `name`; false when
// there is none. The built-in formats cannot be removed (ConfigError).
bool unregister_storage_format(const std::string& name);

// [local, thread-safe] The registered formats' names, in the order they are asked.
std::vector<std::string> storage_format_names();

// [local] The one format that claims `path`. ConfigError "does not point to
// a valid checkpoint" when none does, "is claimed by several storage
// formats" when several do, or a format's own refusal (StorageFormat::claims).
std::shared_ptr<const StorageFormat> detect_storage_format(const std::string& path,
                                                           const DetectOptions& options = {});

// [local] The storage of `path`, opened by the one format that claims it
// (detect_storage_format, then StorageFormat::open). open_checkpoint_storage(path)
// (fsdp/checkpoint/storage.h) is this with the default options.
std::unique_ptr<StorageReader> open_checkpoint_storage(const std::string& path, const DetectOptions& options);

}  // namespace fsdp
