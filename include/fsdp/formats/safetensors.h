// fsdp/formats/safetensors.h — Hugging Face's safetensors format
// (https://github.com/huggingface/safetensors): its reader and writer, for
// load_checkpoint(path, module) and export_safetensors, or for any program.
// Part of the formats module (FSDP-free); docs/checkpoint-format.md,
// "Safetensors".
//
// A file: an 8-byte little-endian u64 N, N bytes of UTF-8 JSON
//   {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<value>"}}   (optional, strings only)
// then the data buffer: each tensor's bytes, little-endian, C order, at
// [begin, end) of the buffer. The reader accepts what the safetensors
// package's own reader (Rust, 0.8) accepts and refuses, with a ConfigError
// naming the file and the field, what it refuses: a header over 100 MB or
// past the end of the file, invalid UTF-8 or JSON, a header that is not an
// object, fields missing or of the wrong type (a shape that is not a list of
// non-negative integers, offsets that are not two, metadata that is not
// strings), an unknown dtype, a size that overflows, offsets that leave
// holes or overlap (sorted by offset, each tensor starts where the last one
// ended, the first at 0), bytes that do not match dtype x shape, and a
// buffer that does not end at the end of the file. Also refused: a key
// given twice, BOOL bytes other than 0/1, and dtypes LibTorch 1.13 lacks
// (F8_*, U16/32/64, C64, ...), by name. Fields it ignores are ignored.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp::formats {

class AtomicFile;

constexpr int64_t kSafetensorsMaxHeader = 100'000'000;  // the Rust reader's limit

// "F32", "BF16", ... for the dtypes both sides know: F64 F32 F16 BF16 I64 I32
// I16 I8 U8 BOOL. ConfigError for others.
const char* safetensors_dtype_name(at::ScalarType dtype);

// One tensor of a file: its bytes are [begin, end) of the data buffer.
struct SafetensorsTensor {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;
};

struct SafetensorsHeader {
  int64_t data_start = 0;                  // 8 + N: where the buffer starts in the file
  std::vector<SafetensorsTensor> tensors;  // in the order of their bytes
  std::map<std::string, std::string> metadata;
};

// True if `head` (a file's first bytes; 9 suffice) is how a safetensors file
// of `file_size` bytes starts: a header length of at most 100 MB that fits in
// the file, then '{' (JSON whitespace before it allowed). Cheap: no parsing.
// A PyTorch zip ("PK...") or pickle never looks like one.
bool looks_like_safetensors(std::string_view head, int64_t file_size);

// Parses and validates a header. `head`: the file's first bytes, at least
// 8 + N of them (fewer: ConfigError, the file is truncated); `file_size`: the
// whole file's. ConfigError naming `where` and the offence otherwise.
// Cost: linear in N.
SafetensorsHeader parse_safetensors(std::string_view head, int64_t file_size, const std::string& where);

// Reads and parses the header of the file `path` (reads 8 + N bytes).
// ConfigError if `path` is not a regular file (a directory, a FIFO: refused
// before it is opened) or the header is bad, as parse_safetensors.
SafetensorsHeader read_safetensors_header(const std::string& path);

// The tensor `t` of the file `path` whose header is `h`: a new CPU tensor of
// its dtype and shape (memory: its bytes; one read). ConfigError naming the
// file if it has changed since (too short) or, for BOOL, holds a byte other
// than 0 or 1.
at::Tensor read_safetensors_tensor(const std::string& path, const SafetensorsHeader& h, const SafetensorsTensor& t);

// The same from a buffer in memory (the whole file's bytes, as
// parse_safetensors got them; the fuzzer's path). A copy.
at::Tensor safetensors_tensor_from(std::string_view file, const SafetensorsHeader& h, const SafetensorsTensor& t);

// Writes a safetensors file crash-safely (AtomicFile: nothing under `path`
// until commit). The tensors are laid out as the safetensors package's
// save_file lays them out (by element size, largest first, then by name:
// every tensor's bytes aligned to its element size), and the header is
// written at construction; then write() takes each tensor's values, in
// layout() order, one at a time (memory: nothing but the caller's tensor).
// ConfigError for a dtype safetensors lacks, a name given twice, a metadata
// key "__metadata__"; Error naming the file for write failures.
class SafetensorsWriter {
 public:
  // `tensors`: name, dtype and shape of each (begin/end are computed).
  SafetensorsWriter(const std::string& path, std::vector<SafetensorsTensor> tensors,
                    const std::map<std::string, std::string>& metadata);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  const std::vector<SafetensorsTensor>& layout() const { return layout_; }
  // The next tensor of layout(): any device, layout and strides; its dtype
  // and shape must be the planned ones (ConfigError otherwise).
  void write(const at::Tensor& tensor);
  // After every tensor: sync and rename into place.
  void commit();

 private:
  std::string path_;
  std::vector<SafetensorsTensor> layout_;
  size_t next_ = 0;
  std::unique_ptr<AtomicFile> file_;
};

}  // namespace fsdp::formats
