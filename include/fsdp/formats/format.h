// fsdp/formats/format.h — the on-disk pieces of checkpoints: the index's
// typed records and their one encoding (to_json, parse_index, the pieces a
// sharded save exchanges), checksums, crash-safe files, the full format's
// PyTorch zip, and readers that bound-check everything. Part of the formats
// module: FSDP-free, usable alone (namespace fsdp::formats); the formats are
// described in docs/checkpoint-format.md. Calls are [local]; those that read
// or write files say so, and throw ConfigError (damaged input) or Error (I/O
// failures while writing) naming the file.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>


namespace fsdp::formats::pickle {
class Writer;
}

namespace caffe2::serialize {
class PyTorchStreamReader;
}

namespace fsdp::formats {

constexpr int kVersion = 1;           // the format version this build writes and the newest it reads
constexpr const char* kIndexFile = "index.json";         // sharded: the commit marker
constexpr const char* kFullIndexRecord = "fsdp/index.json";  // full: inside the zip

uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);

// "float32", "bfloat16", "int64", ... (ConfigError naming `where` for others).
std::string dtype_name(at::ScalarType dtype);
at::ScalarType parse_dtype(const std::string& name, const std::string& where);

// A data file's name as the formats allow it: a plain name inside the
// checkpoint directory (no '/', not starting with '.').
bool safe_file_name(const std::string& name);

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

// The kinds of entries of the user's state, and their names in the index.
enum class EntryType { kModel, kOptimizer, kInt, kFloat, kBool, kStr, kTensor };
const char* entry_type_name(EntryType type);  // "model", "optimizer", "int", "float", "bool", "str", "tensor"

// An optimizer's parameter group: its parameters' names and its options.
struct ParamGroup {
  std::vector<std::string> params;
  std::map<std::string, double> options;
};

// One entry of the user's state.
struct EntryRecord {
  std::string name;
  EntryType type = EntryType::kTensor;
  std::vector<std::string> keys;         // model / optimizer: the state keys, in order
  std::vector<ParamGroup> param_groups;  // optimizer
  std::string optimizer_class;           // optimizer: "AdamW", ... (index field "class"; absent in indexes of earlier fsdp-cpp versions)
  std::variant<int64_t, double, bool, std::string> value;  // int, float, bool, str (by type)

  bool is_state_dict() const { return type == EntryType::kModel || type == EntryType::kOptimizer; }
};

// A scalar entry's value as text: its JSON in the index (a float that is not
// finite is the JSON string "nan", "inf" or "-inf", quotes included), a
// string entry's value as it is.
std::string value_text(const EntryRecord& entry);

struct Index {
  enum class Kind { kFull, kSharded } kind = Kind::kFull;  // "full", "sharded"
  int version = kVersion;
  int world_size = 1;
  std::string save_id;
  std::vector<std::string> files;  // sharded: the data files
  // A DCP save's fsdp_index.json: the CRC-32 of its .metadata file's bytes.
  bool has_metadata_crc = false;
  uint32_t metadata_crc = 0;
  // Read from an index whose own checksum (field "checksum") matched; false
  // for indexes of earlier fsdp-cpp versions, and for indexes built from DCP's
  // .metadata or a Python pickle.
  bool checksummed = false;
  std::vector<EntryRecord> entries;
  std::vector<std::string> tensor_order;
  std::map<std::string, TensorEntry> tensors;  // by "<entry>/<key>" (a tensor value: "<name>")
};

// A piece of a tensor as the ranks of a sharded save exchange it: the
// tensor's key, dtype and shape, and the chunk that holds the piece (its
// file, offset and checksum once written).
struct PieceRecord {
  std::string key;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  Chunk chunk;
  int64_t item_offset = 0, item_length = 0;  // the DCP item (a torch.save zip) that holds the chunk's bytes
};
std::string encode_pieces(const std::vector<PieceRecord>& pieces);
// ConfigError naming `where` when the text is not pieces that fit their shapes.
std::vector<PieceRecord> decode_pieces(const std::string& text, const std::string& where);
// Adds a piece's chunk to `index`, and its tensor on the tensor's first piece.
void add_piece(Index& index, const PieceRecord& piece);

// The index's JSON: every record above is encoded here and decoded by
// parse_index, nowhere else (docs/checkpoint-format.md). Its last field,
// "checksum", is "crc32:<hex>" of the compact JSON of all the others.
std::string to_json(const Index& index);
// Parses and validates everything: first the checksum (when present: indexes
// of earlier fsdp-cpp versions have none) and that every field is known,
// then types, sizes, boxes inside shapes, bytes that match dtype x sizes,
// file names inside the checkpoint, the version, and that the entries'
// keys and the tensors match one to one.
// ConfigError naming `where` (the file) and the offending field otherwise.
// ConfigError naming `where` (the file) when the JSON text is beyond its
// memory budget or nests deeper than kJsonMaxDepth (parse_json_bounded).
Index parse_index(const std::string& text, const std::string& where);

// ---- Bounded JSON (the index, safetensors headers) ----

// The memory a JSON text of n bytes may take once parsed (nlohmann's DOM):
// kJsonBudgetSlack + kJsonBudgetPerByte * n. A real index or safetensors
// header takes 6 to 10 bytes of DOM per byte of text (an fsdp-train
// fsdp_index.json: 5.8 as written, 8.7 compact); the densest JSON possible
// (`[{},{},...]`, a container every 3 bytes) takes about 32, and is refused.
constexpr size_t kJsonBudgetSlack = size_t{1} << 20;  // 1 MiB: any small header
constexpr size_t kJsonBudgetPerByte = 20;
constexpr size_t json_budget(size_t n) { return kJsonBudgetSlack + kJsonBudgetPerByte * n; }
constexpr int kJsonMaxDepth = 64;  // an index nests 5 deep, a safetensors header 3

// A counting pass over `text` (nlohmann's SAX interface: nothing is built,
// O(depth) memory, O(text.size()) time) that charges each value, key and
// container what the DOM will take for it (json_budget's estimate) and
// returns the total. ConfigError naming `where`, `what` ("the index", "the
// header"), the byte offset, the budget and that the JSON expands beyond what
// its size allows; or naming the depth. Invalid JSON is left to the parse
// that follows (which names the error); parse before building the DOM.
size_t check_json_budget(std::string_view text, const std::string& where, const char* what);

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
  const std::string& temp_path() const { return tmp_; }  // where the bytes are until commit()

 private:
  std::string final_, tmp_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// Syncs a directory's entries (after a rename or a new file).
void sync_dir(const std::string& dir);
std::string dirname_of(const std::string& path);
std::string new_save_id();

// ---- What a writer may replace or remove ----
// A writer replaces only what it was told to write (a regular file or
// nothing at the path), and removes only files it can prove it wrote.
// Nothing beneath an output directory is followed: a symbolic link where
// one of the writer's files belongs is refused by name, never replaced.

// What the entry at `path` is, without following a symbolic link: "" if
// absent, "a regular file", "a directory", "a symbolic link", "a FIFO
// (named pipe)", "a character device", ...
std::string entry_kind(const std::string& path);

// ConfigError "<caller>: <path> is <kind>, not a regular file: ..." unless
// nothing is at `path` or it is a regular file (never a symbolic link).
void check_file_destination(const std::string& path, const std::string& caller);

// Whether `s` is a save id as new_save_id() writes them ("<hex>-<hex>").
bool is_save_id(const std::string& s);

// The entries of the directory `dir` that a sharded writer cannot prove
// it wrote, each named with its path (and its kind when it is not a
// regular file): an entry is the writer's only as a regular file with a
// name only fsdp-cpp gives (a data file or temporary with a save id in its
// name, "__<rank>_<save id>.distcp", "data-<save id>-<rank>.bin",
// "<one of these or of the names below>.tmp-<save id>"), or as .metadata,
// fsdp_index.json, meta.pt or index.json beside an fsdp_index.json or
// index.json that is fsdp-cpp's index (parse_index accepts it). Empty when
// `dir` holds none, or is absent.
std::vector<std::string> foreign_entries(const std::string& dir);

// ConfigError starting with `caller` that names foreign_entries(dir), if any
// (a full save that would replace a sharded checkpoint's directory).
void refuse_foreign_entries(const std::string& dir, const std::string& caller);

// The foreign_entries of `dir` whose names a sharded checkpoint writes or
// reads: .metadata, fsdp_index.json, meta.pt, index.json, and any *.distcp
// (as Lightning's sharded save, a sharded writer writes beside every other
// file of a directory and keeps it; these it would overwrite, or read as
// its own).
std::vector<std::string> colliding_entries(const std::string& dir);

// ConfigError starting with `caller` that names colliding_entries(dir), if any.
void refuse_colliding_entries(const std::string& dir, const std::string& caller);

// Removes the sharded writer's data files and temporaries in `dir` (the
// names above with a save id, regular files only) that `keep` does not list.
void remove_unreferenced_own_files(const std::string& dir, const std::vector<std::string>& keep);

// Removes a directory that holds a checkpoint fsdp-cpp wrote: its own
// files (as foreign_entries tells them), then the directory if that left
// it empty. Returns what it left (foreign entries), empty if it removed it.
std::vector<std::string> remove_own_directory(const std::string& dir);

// Reads whole zip records of a full checkpoint, or of a zip that is the
// byte range [offset, offset + length) of a file (an item of a DCP data file,
// a standalone torch.save archive).
class FullReader {
 public:
  explicit FullReader(const std::string& path);  // ConfigError if not a readable zip
  // ConfigError if the range is outside the file or not a readable zip.
  FullReader(const std::string& path, int64_t offset, int64_t length);
  ~FullReader();
  bool has(const std::string& record) const;
  // The record's bytes, checked against the CRC-32 the zip's central
  // directory records for it. ConfigError naming the file on failure.
  std::string read(const std::string& record) const;
  // Where a record's (stored) bytes start, in bytes from the start of the zip.
  int64_t record_offset(const std::string& record) const;
  // The CRC-32 the zip's central directory records for a record (reads the
  // directory, not the record). ConfigError if the directory is malformed.
  uint32_t record_crc(const std::string& record) const;
  std::vector<std::string> records() const;  // every record's name (without the archive folder)
  const std::string& path() const { return path_; }
  const std::string& where() const { return where_; }  // the file, with the range if any

 private:
  std::map<std::string, uint32_t> read_crcs() const;  // every record's CRC-32, from the central directory

  std::string path_, where_;
  int64_t offset_ = 0, length_ = -1;
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader_;
  mutable std::unique_ptr<std::map<std::string, uint32_t>> crcs_;  // read_crcs(), on first use
};

// Reads ranges of a sharded checkpoint's data files, bound-checked.
std::string read_range(const std::string& path, int64_t offset, int64_t nbytes);
// The same into `dst` (nbytes of room). ConfigError naming the file if it
// cannot be opened or lacks the range.
void read_into(const std::string& path, int64_t offset, int64_t nbytes, void* dst);
int64_t file_size(const std::string& path);  // -1 if absent

// The bytes of a chunk, checked against its size and checksum. `source`:
// the full reader, or null for a sharded directory `dir`.
std::string read_chunk(const Chunk& chunk, const std::string& key, const FullReader* full, const std::string& dir);

}  // namespace fsdp::formats
