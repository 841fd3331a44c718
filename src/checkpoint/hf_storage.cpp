// A Hugging Face model directory as a StorageReader (fsdp/checkpoint/hf_storage.h):
// model.safetensors.index.json's weight_map (or model.safetensors alone),
// every tensor as chunks of rows read from its memory-mapped file.
#include "fsdp/checkpoint/hf_storage.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fcntl.h>
#include <sys/stat.h>
#include <set>
#include <unistd.h>

#include "fsdp/error.h"
#include "fsdp/formats/format.h"
#include "fsdp/formats/safetensors.h"

namespace fsdp {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

bool exists_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// Whether anything is at `p` (a dangling link too).
bool exists_entry(const fs::path& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

// "" for a regular file (or a link to one); else what the entry is, for
// messages: "a FIFO (named pipe)", "a directory", "a symbolic link to a
// character device (/dev/zero)", "a dangling symbolic link", ...
std::string not_regular(const fs::path& p) {
  struct stat st {};
  auto kind = [](mode_t m) -> std::string {
    if (S_ISFIFO(m)) return "a FIFO (named pipe)";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISDIR(m)) return "a directory";
    return "not a regular file";
  };
  if (::stat(p.c_str(), &st) == 0) {
    if (S_ISREG(st.st_mode)) return "";
    struct stat l {};
    if (::lstat(p.c_str(), &l) == 0 && S_ISLNK(l.st_mode)) {
      std::error_code ec;
      const fs::path target = fs::read_symlink(p, ec);
      return "a symbolic link to " + kind(st.st_mode) + (ec ? std::string() : " (" + target.string() + ")");
    }
    return kind(st.st_mode);
  }
  return exists_entry(p) ? "a dangling symbolic link" : "";
}

// ConfigError naming `p` and what it is unless it is a regular file.
void require_regular(const fs::path& p, const std::string& what) {
  const std::string kind = not_regular(p);
  if (!kind.empty()) {
    throw ConfigError(p.string() + " is " + kind + ", not a regular file: " + what +
                      " is a regular file; refusing to read it");
  }
}

// A name from a file as JSON writes it: quoted, NUL and control bytes
// escaped (a message must not be cut at a NUL).
std::string quoted(const std::string& s) { return json(s).dump(); }

}  // namespace

bool is_hf_model_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  const fs::path d(dir);
  if (exists_file(d / "index.json") || exists_file(d / ".metadata")) return false;  // fsdp-cpp's or DCP's
  // Anything under the names (a FIFO, a directory, a link to a device):
  // HfStorageReader then says what it is, instead of "not a model directory".
  return exists_entry(d / kIndexName) || exists_entry(d / kSingleName);
}

struct HfStorageReader::Mapping {
  std::string path;
  const char* data = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (data) munmap(const_cast<char*>(data), size);
  }
};

HfStorageReader::HfStorageReader(const std::string& dir, int64_t chunk_bytes) : dir_(dir), chunk_bytes_(chunk_bytes) {
  if (chunk_bytes_ <= 0) throw ConfigError("HfStorageReader: chunk_bytes must be positive");
  const fs::path d(dir);
  std::vector<std::pair<std::string, std::string>> order;  // (tensor, file)
  if (exists_entry(d / kIndexName)) {
    const std::string path = (d / kIndexName).string();
    where_ = path;
    require_regular(path, "a model's index");
    const int64_t size = formats::file_size(path);
    if (size > int64_t{100} << 20) {
      throw ConfigError(path + ": " + std::to_string(size) + " bytes; an index is expected under 100 MiB");
    }
    const std::string text = formats::read_range(path, 0, size);
    formats::check_json_budget(text, path, "the index");
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      throw ConfigError(path + ": not valid JSON (" + e.what() + ")");
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      throw ConfigError(path + ": key \"weight_map\": expected an object mapping tensor names to safetensors files");
    }
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it->is_string()) {
        throw ConfigError(path + ": key " + quoted("weight_map." + it.key()) + ": expected a file name, got " + it->dump());
      }
      const std::string file = it->get<std::string>();
      if (!formats::safe_file_name(file)) {
        throw ConfigError(path + ": key " + quoted("weight_map." + it.key()) + ": " + quoted(file) +
                          " is not a file name inside the directory");
      }
      order.emplace_back(it.key(), file);
    }
  } else if (exists_entry(d / kSingleName)) {
    where_ = (d / kSingleName).string();
    require_regular(where_, "a model's weights file");
  } else {
    throw ConfigError(dir + ": not a Hugging Face model directory (expected " + kIndexName + " or " + kSingleName + ")");
  }
  auto header_of = [&](const std::string& file, const std::string& why) -> const formats::SafetensorsHeader& {
    auto& h = headers_[file];
    if (!h) {
      const fs::path p = d / file;
      if (!exists_entry(p)) {
        throw ConfigError(where_ + ": " + why + " names " + quoted(file) + ", which is missing from " + dir);
      }
      if (const std::string kind = not_regular(p); !kind.empty()) {
        throw ConfigError(where_ + ": " + why + " names " + quoted(file) + ": " + p.string() + " is " + kind +
                          ", not a regular file: a model's weights are regular files; refusing to read it");
      }
      h = std::make_unique<formats::SafetensorsHeader>(formats::read_safetensors_header(p.string()));
    }
    return *h;
  };
  if (order.empty() && where_ != (d / kIndexName).string()) {
    for (const auto& t : header_of(kSingleName, "the directory").tensors) order.emplace_back(t.name, kSingleName);
  }
  index_.entries.emplace_back();
  auto& entry = index_.entries.back();
  entry.name = "model";
  entry.type = formats::EntryType::kModel;
  for (const auto& entry_of_order : order) {
    const std::string& name = entry_of_order.first;
    const std::string& file = entry_of_order.second;
    const auto& h = header_of(file, "key " + quoted("weight_map." + name));
    auto t = std::find_if(h.tensors.begin(), h.tensors.end(), [&](const auto& x) { return x.name == name; });
    if (t == h.tensors.end()) {
      throw ConfigError(where_ + ": key " + quoted("weight_map." + name) + " names " + quoted(file) +
                        ", which holds no tensor " + quoted(name));
    }
    if (t->dtype != at::kFloat && t->dtype != at::kBFloat16 && t->dtype != at::kHalf) {
      throw ConfigError((d / file).string() + ": tensor " + quoted(name) + " is " + formats::safetensors_dtype_name(t->dtype) +
                        "; expected F32, BF16 or F16");
    }
    file_of_[name] = file;
    formats::TensorEntry te{t->dtype, t->shape, {}};
    const int64_t elem = static_cast<int64_t>(at::elementSize(t->dtype));
    const int64_t rows = t->shape.empty() ? 1 : t->shape[0];
    int64_t row_elems = 1;
    for (size_t i = 1; i < t->shape.size(); ++i) row_elems *= t->shape[i];
    const int64_t row_bytes = row_elems * elem;
    const int64_t per_chunk = row_bytes == 0 ? std::max<int64_t>(rows, 1) : std::max<int64_t>(1, chunk_bytes_ / row_bytes);
    for (int64_t r = 0; r < rows || (r == 0 && rows == 0); r += per_chunk) {
      formats::Chunk c;
      c.file = file;
      const int64_t n = std::min(per_chunk, rows - r);
      c.offset = h.data_start + t->begin + r * row_bytes;
      c.nbytes = t->shape.empty() ? elem : n * row_bytes;
      if (!t->shape.empty()) {
        c.offsets.assign(t->shape.size(), 0);
        c.offsets[0] = r;
        c.sizes = t->shape;
        c.sizes[0] = n;
      }
      te.chunks.push_back(std::move(c));
      if (rows == 0) break;
    }
    entry.keys.push_back(name);
    const std::string key = "model/" + name;
    index_.tensor_order.push_back(key);
    index_.tensors[key] = std::move(te);
  }
}

HfStorageReader::~HfStorageReader() = default;

const HfStorageReader::Mapping& HfStorageReader::map_file(const std::string& file) const {
  auto& m = maps_[file];
  if (m) return *m;
  const std::string path = (fs::path(dir_) / file).string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw ConfigError(path + ": cannot be opened (" + std::strerror(errno) + ")");
  const off_t size = ::lseek(fd, 0, SEEK_END);
  void* p = size > 0 ? ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) throw ConfigError(path + ": cannot be memory-mapped (" + std::strerror(err) + ")");
  m = std::make_unique<Mapping>();
  m->path = path;
  m->data = static_cast<const char*>(p);
  m->size = static_cast<size_t>(size);
  return *m;
}

at::Tensor HfStorageReader::read_chunk(const std::string& key, size_t chunk) const {
  auto it = index_.tensors.find(key);
  if (it == index_.tensors.end() || chunk >= it->second.chunks.size()) {
    throw ConfigError(where_ + ": no chunk " + std::to_string(chunk) + " of tensor '" + key + "'");
  }
  const auto& t = it->second;
  const auto& c = t.chunks[chunk];
  const Mapping& m = map_file(c.file);
  if (c.offset < 0 || static_cast<size_t>(c.offset + c.nbytes) > m.size) {
    throw ConfigError(m.path + ": tensor '" + key.substr(6) + "' lies past the end of the file (changed since it was opened?)");
  }
  void* buf = std::malloc(static_cast<size_t>(std::max<int64_t>(c.nbytes, 1)));
  if (!buf) throw Error("HfStorageReader: cannot allocate " + std::to_string(c.nbytes) + " bytes");
  std::memcpy(buf, m.data + c.offset, static_cast<size_t>(c.nbytes));
  // The mapped pages are not needed again by this load: let them go from
  // this process's resident memory (the page cache keeps them).
  const long page = ::sysconf(_SC_PAGESIZE);
  const uintptr_t lo = reinterpret_cast<uintptr_t>(m.data + c.offset) & ~static_cast<uintptr_t>(page - 1);
  const uintptr_t hi = reinterpret_cast<uintptr_t>(m.data + c.offset + c.nbytes);
  ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
  bytes_read_ += c.nbytes;
  const int64_t live = (*live_ += c.nbytes);
  peak_live_ = std::max(peak_live_, live);
  auto counter = live_;
  const int64_t nbytes = c.nbytes;
  std::vector<int64_t> sizes = c.sizes.empty() ? t.shape : c.sizes;
  return at::from_blob(
      buf, sizes,
      [counter, nbytes](void* p) {
        std::free(p);
        *counter -= nbytes;
      },
      at::TensorOptions().dtype(t.dtype));
}

}  // namespace fsdp
