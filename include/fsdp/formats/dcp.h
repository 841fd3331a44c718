// fsdp/formats/dcp.h — torch.distributed.checkpoint (DCP) directories
// (docs/checkpoint-format.md, docs/python-formats.md §1-§3): their
// `.metadata` parsed into typed records, and the index of chunks built from
// it, so that the loader, verify and consolidate read a DCP checkpoint as
// they read fsdp-cpp's own. Part of the formats module (FSDP-free).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/formats/format.h"

namespace fsdp::formats {

constexpr const char* kDcpMetadataFile = ".metadata";  // DCP's commit marker
constexpr const char* kLightningMetaFile = "meta.pt";   // Lightning's values (torch.save of a dict)
constexpr const char* kDcpIndexFile = "fsdp_index.json";  // fsdp-cpp's index of a DCP save (its CRC-32s)

// Where an item's bytes are: _StorageInfo(relative_path, offset, length).
struct DcpStorage {
  std::string file;
  int64_t offset = 0, length = 0;
};

// One flattened key of the checkpoint: a tensor (with its chunks) or a
// bytes item (a torch.save'd Python value).
struct DcpItem {
  std::string key;                // "model.emb.weight", "optimizer.param_groups.0.lr", ...
  std::vector<std::string> path;  // planner_data: ("optimizer", "param_groups", "0", "lr")
  std::vector<bool> path_is_int;  // per element of path: an int in Python (a list index)
  bool is_bytes = false;
  at::ScalarType dtype = at::kFloat;  // tensor
  std::vector<int64_t> shape;         // tensor
  struct Piece {
    std::vector<int64_t> offsets, sizes;
    DcpStorage storage;
  };
  std::vector<Piece> chunks;  // tensor
  DcpStorage bytes;           // bytes item
};

struct DcpMetadata {
  std::vector<DcpItem> items;  // in the metadata's order
  std::string save_id;         // storage_meta.save_id ("" if none)
};

// Parses a `.metadata` (any pickle protocol 2-5; only DCP's classes, nothing
// run) and checks it: sizes, chunk boxes inside shapes, a storage entry for
// every chunk and bytes item, plain file names. ConfigError naming `where`.
DcpMetadata parse_dcp_metadata(const std::string& bytes, const std::string& where);

// The index of the DCP checkpoint in `dir` described by `md`: each chunk's
// raw tensor bytes located inside its item (a torch.save zip) with the
// zip's CRC-32; bytes items unpickled into entries: model state dicts,
// optimizers (state tensors keyed name.state.param.field, group options
// keyed name.param_groups.i.option), values. Reads each item's zip
// directory and pickle (small), not the tensor data. (Lightning's meta.pt
// beside it: lightning_meta.) ConfigError naming the file and item otherwise.
Index dcp_index(const DcpMetadata& md, const std::string& dir);

// Lightning's `meta.pt` in `dir` as an index of its values (Lightning's
// fabric.load reads every value that is not a model or an optimizer from
// it): a torch.save'd dict, nested dicts as dotted names; a tensor value is
// one chunk inside meta.pt (and meta.pt is then in `files`). nullopt when
// `dir` has no meta.pt. Reads its zip directory and pickle, not tensor data.
// ConfigError naming meta.pt when it is not a dict of values.
std::optional<Index> lightning_meta(const std::string& dir);

// ---- Writing ----

// An item appended to a data file: where it is, and where its storage
// record data/0 (a tensor item's raw bytes) starts, in bytes into the file.
struct WrittenItem {
  DcpStorage storage;
  int64_t data_offset = -1;
};

// A data record's bytes.
struct RecordBytes {
  const void* data;
  int64_t n;
};

// Appends to `file` (named `file_name` in the directory) a standalone
// torch.save archive: records data.pkl (`pkl`), .format_version,
// .storage_alignment, byteorder and data/0, data/1, ... holding `records`
// (stored, 64-byte aligned). data_offset: where data/0 starts (-1 without
// records). Errors as AtomicFile's.
WrittenItem write_torch_save(AtomicFile& file, const std::string& file_name, const std::string& pkl,
                             const std::vector<RecordBytes>& records);

// A DCP item, as write_torch_save: with `data`, one record data/0 of `n` bytes.
WrittenItem write_dcp_item(AtomicFile& file, const std::string& file_name, const std::string& pkl, const void* data,
                           int64_t n);

// The `.metadata` of `md`: a protocol-2 pickle of DCP's Metadata that
// Python's pickle.load reads (docs/python-formats.md §2): every item with its
// planner_data path, every chunk's and bytes item's _StorageInfo,
// storage_meta with md.save_id, version "1.0.0". parse_dcp_metadata reads it
// back.
std::string dcp_metadata_bytes(const DcpMetadata& md);

// The DCP key and planner path of a tensor of the index ("<entry>/<key>"
// of a model or optimizer, "<name>" of a tensor value), in the layout of
// PyTorch's get_state_dict: "<model>.<key>", "<optimizer>.state.<param>.<field>",
// "<name>".
void set_dcp_key(const std::vector<EntryRecord>& entries, const std::string& tensor_key, DcpItem& item);

// A param group's options, each with the writer of its Python value (a
// float, a bool, a tuple, None), in the order PyTorch's optimizer of class
// `kind` holds them, "params" not included.
using PickleValue = std::function<void(pickle::Writer&)>;
using GroupOptions = std::function<std::vector<std::pair<std::string, PickleValue>>(
    const std::string& kind, const std::map<std::string, double>& options)>;

// The bytes items of `entries`, each with its pickle (what torch.save writes
// as data.pkl): scalar values ("<name>", a dotted name nested as
// "a.b" -> ("a", "b")), and every optimizer's parameter groups
// ("<optimizer>.param_groups.<i>.<option>", betas as a tuple, flags as bools,
// params as the list of names). `group_options` gives each group's options
// as Python values, in the optimizer class's order (the caller knows the
// optimizer classes; this module does not).
std::vector<std::pair<DcpItem, std::string>> dcp_bytes_items(const std::vector<EntryRecord>& entries,
                                                             const GroupOptions& group_options);

// Lightning's meta.pt pickle: the values as a dict, dotted names nested
// (Lightning's fabric.load reads every value that is not a model or an
// optimizer from it). Tensor values are those of `tensors` (by name; a
// tensor value missing there is left out): each references the record
// data/<i> of its position in `records`, which this fills with their CPU,
// contiguous copies for write_torch_save.
std::string lightning_meta_pickle(const std::vector<EntryRecord>& entries,
                                  const std::map<std::string, at::Tensor>& tensors, std::vector<at::Tensor>& records);

}  // namespace fsdp::formats
