// fsdp/checkpoint/hf_storage.h — a Hugging Face model directory as a
// checkpoint storage (fsdp/checkpoint/storage.h): the weights that
// transformers' save_pretrained writes, read where they lie, each rank only
// the byte ranges its shards overlap.
//
// A directory is a Hugging Face model when it holds `model.safetensors.index.
// json` (a sharded save: its "weight_map" names, per tensor, the safetensors
// file that holds it) or `model.safetensors`. Its one model entry, "model",
// holds the tensors under transformers' state-dict names
// ("model.layers.0.self_attn.q_proj.weight"), so load_checkpoint(dir, module)
// loads them into a module of the same names, wrapped by either engine or
// not, at any world size.
//
// READS. Each tensor is presented as chunks of whole rows (dimension 0) of at
// most `chunk_bytes` (one row when a row is larger): a rank's shard of rows,
// or of a flat parameter, overlaps a few consecutive chunks, and the load
// reads only those, from the file memory-mapped, one chunk at a time. So a
// rank reads its shards plus at most two partial chunks per tensor, and
// holds, beyond its shards, one chunk at a time (the bounded read buffer);
// bytes_read() and peak_buffer_bytes() count both. The dtype on disk (F32,
// BF16, F16) is converted to the model's by the load.
//
// Errors (ConfigError naming the file and the key): an index that is not
// JSON or has no "weight_map" object, a weight_map entry naming a file that
// is missing or outside the directory, or a tensor its file does not hold;
// a safetensors header that lies (fsdp/formats/safetensors.h's checks); a
// tensor held by two files; a dtype other than F32, BF16, F16.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/checkpoint/storage.h"

namespace fsdp {

namespace formats {
struct SafetensorsHeader;
}

// True when `dir` is a directory holding model.safetensors.index.json or
// model.safetensors (and no fsdp-cpp or DCP index).
bool is_hf_model_dir(const std::string& dir);

class HfStorageReader : public StorageReader {
 public:
  static constexpr int64_t kDefaultChunkBytes = 4 << 20;
  // [local] Opens `dir`: reads the index (if any) and every safetensors
  // header (8 + N bytes each). No tensor bytes are read.
  explicit HfStorageReader(const std::string& dir, int64_t chunk_bytes = kDefaultChunkBytes);
  ~HfStorageReader() override;

  const formats::Index& index() const override { return index_; }
  std::string location() const override { return where_; }
  // Reads rows [chunk * rows_per_chunk, ...) of `key` from its memory-mapped
  // file: one copy of the chunk's bytes.
  at::Tensor read_chunk(const std::string& key, size_t chunk) const override;

  // The file that holds each tensor (by state-dict name), in the order of
  // the index.
  const std::map<std::string, std::string>& files() const { return file_of_; }
  // Bytes of tensor data read so far, and the most bytes that chunks read by
  // this reader held at once (alive as tensors).
  int64_t bytes_read() const { return bytes_read_; }
  int64_t peak_buffer_bytes() const { return peak_live_; }

 private:
  struct Mapping;
  const Mapping& map_file(const std::string& file) const;

  std::string dir_, where_;
  int64_t chunk_bytes_;
  formats::Index index_;
  std::map<std::string, std::string> file_of_;  // tensor name -> file name in dir_
  std::map<std::string, std::unique_ptr<formats::SafetensorsHeader>> headers_;  // by file name
  mutable std::map<std::string, std::unique_ptr<Mapping>> maps_;
  mutable int64_t bytes_read_ = 0;
  mutable std::shared_ptr<std::atomic<int64_t>> live_ = std::make_shared<std::atomic<int64_t>>(0);
  mutable int64_t peak_live_ = 0;
};

}  // namespace fsdp
