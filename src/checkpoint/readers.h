// src/checkpoint/readers.h — the built-in storage readers of load_checkpoint,
// one class per on-disk format (fsdp/checkpoint/storage_registry.h lists the
// formats and how each is detected):
//
//   DcpReader          a DCP directory (.metadata): fsdp-cpp's, PyTorch's,
//                      Lightning's with meta.pt            (dcp_reader.cpp)
//   ShardedDirReader   fsdp-cpp's earlier sharded layout (index.json and
//                      data-*.bin files)                   (sharded_reader.cpp)
//   FullPickleReader   a torch.save zip: fsdp-cpp's full file (its index
//                      record), a full checkpoint PyTorch or Lightning wrote,
//                      or a module's state dict            (full_pickle_reader.cpp,
//                                                           pickled.cpp)
//   SafetensorsFileReader  one safetensors file             (safetensors_reader.cpp)
//   HfStorageReader    a Hugging Face model directory (public: fsdp/checkpoint/hf_storage.h)
//
// Each opens its format (reads the index or headers, no tensor bytes) and
// reads chunks on request. Private to the checkpoint module.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "fsdp/checkpoint/storage.h"
#include "fsdp/formats/format.h"
#include "fsdp/formats/safetensors.h"
#include "fsdp/formats/torch_pickle.h"

namespace fsdp::detail {

// What the built-in readers share: the path, the index (built when opened),
// and verify_checkpoint's checks.
class IndexedReader : public StorageReader {
 public:
  const formats::Index& index() const override { return ix_; }
  std::string location() const override { return where_; }
  // A tensor stored whole (one box, its shape) when stored_whole(key).
  std::vector<StorageBox> chunks(const std::string& key) const override;

  const std::string& path() const { return path_; }
  // Whether tensor `key` was written whole by another tool (PyTorch, a
  // safetensors writer): no chunks of fsdp-cpp's in the index, one box.
  virtual bool stored_whole(const std::string&) const { return false; }
  // [local, reads every byte] verify_checkpoint's problems with the format's
  // records and tensors (verify_tensors, and what the format adds).
  virtual void verify(std::vector<std::string>& problems) const;

 protected:
  // Chunk `chunk` of `key` from the index's chunks: in `zip` (a full file)
  // or in the data files of `dir`.
  at::Tensor read_indexed_chunk(const std::string& key, size_t chunk, const formats::FullReader* zip,
                                const std::string& dir) const;

  std::string path_;
  std::string where_;  // the index file, for messages
  formats::Index ix_;
};

// [local, reads every byte] Every tensor of `reader` read, chunk by chunk,
// its checksums checked; chunks that overlap or do not cover their tensor.
void verify_tensors(const IndexedReader& reader, std::vector<std::string>& problems);

// ConfigError "The path '<path>' does not point to a valid checkpoint. ..."
// with `why` in parentheses when given.
[[noreturn]] void not_a_checkpoint(const std::string& path, const std::string& why = "");
// A small file (an index, .metadata) whole; ConfigError when over 1 GiB.
std::string read_small(const std::string& path);

class DcpReader : public IndexedReader {
 public:
  // Opens the DCP directory `dir`: fsdp-cpp's own index when it belongs to
  // this save (same save id), else the index built from .metadata; then
  // Lightning's meta.pt against it. ConfigError naming the damage.
  explicit DcpReader(const std::string& dir);
  at::Tensor read_chunk(const std::string& key, size_t chunk) const override;
  // verify_tensors, then every item's other records against the zip's
  // CRC-32s and fsdp-cpp's index against .metadata.
  void verify(std::vector<std::string>& problems) const override;
  // Whether `dir` is a DCP directory (a regular .metadata). ConfigError
  // when a name the sharded formats read is there but is not a regular file.
  static bool claims(const std::string& dir);

 private:
  void check_lightning_meta(bool built);
};

class ShardedDirReader : public IndexedReader {
 public:
  // Opens fsdp-cpp's earlier sharded layout at `dir` (index.json of kind "sharded").
  explicit ShardedDirReader(const std::string& dir);
  at::Tensor read_chunk(const std::string& key, size_t chunk) const override;
  // Whether `dir` is of this layout (a regular index.json, no .metadata).
  static bool claims(const std::string& dir);
};

// ConfigError when `dir` holds the data files of a sharded save but no
// index (an interrupted save), naming it. For a directory no format claims.
void refuse_incomplete_sharded(const std::string& dir);

class FullPickleReader : public IndexedReader {
 public:
  // Opens the zip `path`. module_state (DetectOptions): a zip without
  // fsdp-cpp's index is a module's state dict (its tensors: the one model
  // entry "model"); otherwise a checkpoint's dict (index_pickled).
  FullPickleReader(const std::string& path, bool module_state);
  ~FullPickleReader() override;
  at::Tensor read_chunk(const std::string& key, size_t chunk) const override;
  bool keyed_by_ids(const std::string& entry) const override { return numbered_.count(entry) > 0; }
  bool stored_whole(const std::string& key) const override { return pickled_.count(key) > 0; }
  // Every record against the zip's CRC-32, then verify_tensors.
  void verify(std::vector<std::string>& problems) const override;
  // Whether `path` is a regular file that opens as a zip.
  static bool claims(const std::string& path);

 private:
  void index_pickled();
  void index_raw();

  std::unique_ptr<formats::FullReader> full_;
  bool raw_ = false;  // a module's state dict: keys are "model/<module key>"
  // Tensors PyTorch or Lightning wrote (no fsdp-cpp index): views of the
  // zip's storage records, by tensor key, without chunks or checksums.
  std::map<std::string, formats::pickle::TensorRef> pickled_;
  std::set<std::string> numbered_;  // optimizer entries keyed by PyTorch's parameter ids (0, 1, ...)
};

class SafetensorsFileReader : public IndexedReader {
 public:
  // Reads the header of `path`; its tensors are the one model entry "model".
  explicit SafetensorsFileReader(const std::string& path);
  at::Tensor read_chunk(const std::string& key, size_t chunk) const override;
  bool stored_whole(const std::string&) const override { return true; }
  // Whether `path` is a regular file that looks like safetensors, or (with
  // module_state) any file named *.safetensors.
  static bool claims(const std::string& path, bool module_state);

 private:
  formats::SafetensorsHeader header_;
  std::map<std::string, size_t> at_;  // tensor key -> its place in header_.tensors
};

// A module's state dict as an index (FullPickleReader, SafetensorsFileReader):
// one model entry, "model", then its tensors in order, each without chunks.
void add_module_entry(formats::Index& ix);
void add_module_tensor(formats::Index& ix, const std::string& key, at::ScalarType dtype,
                       const std::vector<int64_t>& shape);

}  // namespace fsdp::detail
