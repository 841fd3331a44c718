// src/fsdp/ckpt_format.h — the on-disk pieces of checkpoints: the index,
// checksums, crash-safe files, the full format's PyTorch zip and pickle, and
// readers that bound-check everything. Private to the library; the formats
// are described in docs/checkpoint-format.md.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace caffe2::serialize {
class PyTorchStreamReader;
}

namespace fsdp::detail::ckpt {

constexpr int kVersion = 1;           // the format version this build writes and the newest it reads
constexpr const char* kIndexFile = "index.json";         // sharded: the commit marker
constexpr const char* kFullIndexRecord = "fsdp/index.json";  // full: inside the zip

uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);

// Fault injection for the crash tests: when the environment variable
// FSDP_CKPT_TEST_CRASH is "<point>:<rank>:<n>" and this is the n-th time
// this rank reaches that point, the process kills itself with SIGKILL;
// with "<point>:<rank>:<n>:oom" it touches ever more memory instead, until
// the kernel's OOM killer ends it (run it under a memory limit: it gives up
// with exit status 99 after 4 GiB). Either happens once: not in a worker
// that fsdp-run restarted (TORCHELASTIC_RESTART_COUNT above 0). Points:
// full-after-first-record, full-before-commit, sharded-mid-data,
// sharded-before-index, sharded-after-index, and fsdp-train's train-step
// (at the start of each step).
void crash_point(const char* point, int rank);

// "float32", "bfloat16", "int64", ... (ConfigError naming `where` for others).
std::string dtype_name(at::ScalarType dtype);
at::ScalarType parse_dtype(const std::string& name, const std::string& where);

// A box of a tensor stored in a file (sharded: a data file of the directory)
// or a record (full: "data/<n>" in the zip), as raw little-endian bytes.
struct Chunk {
  std::string file;
  int64_t offset = 0;  // bytes into the file (0 for a record)
  int64_t nbytes = 0;
  std::vector<int64_t> offsets, sizes;
  uint32_t crc = 0;
};

struct TensorEntry {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  std::vector<Chunk> chunks;
};

// One entry of the user's state.
struct EntryRecord {
  std::string name;
  std::string type;               // "model", "optimizer", "int", "float", "bool", "str", "tensor"
  std::vector<std::string> keys;  // model / optimizer: the state keys, in order
  std::string value;              // scalars as JSON text (int, float, bool) or the string itself
  std::string param_groups;       // optimizer: JSON array [{"params": [...], "options": {...}}]
};

struct Index {
  std::string kind;  // "full" or "sharded"
  int version = kVersion;
  int world_size = 1;
  std::string save_id;
  std::vector<std::string> files;  // sharded: the data files
  std::vector<EntryRecord> entries;
  std::vector<std::string> tensor_order;
  std::map<std::string, TensorEntry> tensors;  // by "<entry>/<key>" (a tensor value: "<name>")
};

std::string to_json(const Index& index);
// Parses and validates everything (types, sizes, boxes inside shapes, bytes
// that match dtype x sizes, file names inside the checkpoint, the version).
// ConfigError naming `where` (the file) and the offending field otherwise.
Index parse_index(const std::string& text, const std::string& where);

// A new file written under a temporary name, synced, then renamed to its
// final name by commit(). Destroyed uncommitted: the temporary is removed.
// Write errors (a full disk) are Errors naming the file and the reason.
class AtomicFile {
 public:
  explicit AtomicFile(std::string final_path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t n);
  int64_t size() const { return size_; }
  // fsync, rename over the final name, fsync the directory.
  void commit();
  const std::string& path() const { return final_; }

 private:
  std::string final_, tmp_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// Syncs a directory's entries (after a rename or a new file).
void sync_dir(const std::string& dir);
std::string dirname_of(const std::string& path);
std::string new_save_id();

// Reads whole zip records of a full checkpoint.
class FullReader {
 public:
  explicit FullReader(const std::string& path);  // ConfigError if not a readable zip
  ~FullReader();
  bool has(const std::string& record) const;
  std::string read(const std::string& record) const;  // ConfigError naming the file on failure
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader_;
};

// Reads ranges of a sharded checkpoint's data files, bound-checked.
std::string read_range(const std::string& path, int64_t offset, int64_t nbytes);
int64_t file_size(const std::string& path);  // -1 if absent

// The bytes of a chunk, checked against its size and checksum. `source`:
// the full reader, or null for a sharded directory `dir`.
std::string read_chunk(const Chunk& chunk, const std::string& key, const FullReader* full, const std::string& dir);

// The pickle (protocol 2) that makes a full checkpoint a torch.load-able
// dict: {entry: {key: tensor} | value}, optimizers as PyTorch's
// {"state": {param: {field: tensor}}, "param_groups": [...]}.
std::string full_pickle(const Index& index, const std::map<std::string, std::string>& record_of);

}  // namespace fsdp::detail::ckpt
