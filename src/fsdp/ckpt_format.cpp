#include "ckpt_format.h"

#include <caffe2/serialize/inline_container.h>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <random>
#include <regex>
#include <sstream>

#include "fsdp/error.h"
#include "torch_pickle.h"

namespace fsdp::detail::ckpt {

using Json = nlohmann::ordered_json;

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (n > 0) {
    const uInt step = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    c = ::crc32(c, p, step);
    p += step;
    n -= step;
  }
  return static_cast<uint32_t>(c);
}

namespace {

// Touches ever more memory until the kernel's OOM killer ends the process
// (the tests run it under a memory cgroup's limit); gives up after 4 GiB.
[[noreturn]] void exhaust_memory() {
  constexpr size_t kBlock = size_t{64} << 20, kMax = size_t{4} << 30, kPage = 4096;
  for (size_t total = 0; total < kMax; total += kBlock) {
    auto* p = static_cast<volatile char*>(std::malloc(kBlock));  // never freed: the point is to hold it
    if (p == nullptr) break;
    for (size_t i = 0; i < kBlock; i += kPage) p[i] = 1;
  }
  std::fprintf(stderr, "fault injection: no out-of-memory kill after touching 4 GiB\n");
  std::_Exit(99);
}

}  // namespace

void crash_point(const char* point, int rank) {
  static const char* spec = std::getenv("FSDP_CKPT_TEST_CRASH");
  if (spec == nullptr) return;
  // A fault happens once: a worker restarted by fsdp-run --max-restarts runs on.
  static const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");
  if (restarts != nullptr && std::string(restarts) != "0") return;
  static std::map<std::string, int> hits;
  const std::string here = std::string(point) + ":" + std::to_string(rank);
  const std::string hit = here + ":" + std::to_string(++hits[here]);
  if (spec == hit) ::raise(SIGKILL);
  if (spec == hit + ":oom") exhaust_memory();
}

namespace {

const std::vector<std::pair<at::ScalarType, const char*>>& dtype_names() {
  static const std::vector<std::pair<at::ScalarType, const char*>> names = {
      {at::kFloat, "float32"}, {at::kDouble, "float64"}, {at::kHalf, "float16"}, {at::kBFloat16, "bfloat16"},
      {at::kLong, "int64"},    {at::kInt, "int32"},      {at::kShort, "int16"},  {at::kChar, "int8"},
      {at::kByte, "uint8"},    {at::kBool, "bool"}};
  return names;
}

constexpr int64_t kMaxDims = 16;
constexpr int64_t kMaxDim = int64_t{1} << 40;
constexpr int64_t kMaxNumel = int64_t{1} << 48;

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw ConfigError("checkpoint: " + where + ": " + what);
}

std::string errno_text(int err) {
  std::string s = std::strerror(err);
  if (err == ENOSPC) s += " (the disk is full)";
  return s;
}

}  // namespace

std::string dtype_name(at::ScalarType dtype) {
  for (const auto& [t, n] : dtype_names()) {
    if (t == dtype) return n;
  }
  throw ConfigError(std::string("checkpoint: tensors of dtype ") + c10::toString(dtype) +
                    " cannot be saved (expected float32/64, float16, bfloat16, int8/16/32/64, uint8 or bool)");
}

at::ScalarType parse_dtype(const std::string& name, const std::string& where) {
  for (const auto& [t, n] : dtype_names()) {
    if (name == n) return t;
  }
  bad(where, "unknown dtype '" + name + "'");
}

// ---------------------------------------------------------------------------
// Index <-> JSON.

std::string to_json(const Index& index) {
  Json j;
  j["format"] = "fsdp-cpp";
  j["kind"] = index.kind;
  j["version"] = index.version;
  j["world_size"] = index.world_size;
  j["save_id"] = index.save_id;
  if (index.kind == "sharded") j["files"] = index.files;
  Json entries = Json::array();
  for (const auto& e : index.entries) {
    Json x;
    x["name"] = e.name;
    x["type"] = e.type;
    if (e.type == "model" || e.type == "optimizer") x["keys"] = e.keys;
    if (e.type == "optimizer") x["param_groups"] = Json::parse(e.param_groups);
    if (e.type == "str") x["value"] = e.value;
    if (e.type == "int" || e.type == "float" || e.type == "bool") x["value"] = Json::parse(e.value);
    entries.push_back(std::move(x));
  }
  j["entries"] = std::move(entries);
  Json tensors = Json::object();
  for (const auto& key : index.tensor_order) {
    const auto& t = index.tensors.at(key);
    Json x;
    x["dtype"] = dtype_name(t.dtype);
    x["shape"] = t.shape;
    Json chunks = Json::array();
    for (const auto& c : t.chunks) {
      chunks.push_back(Json{{"file", c.file},
                            {"offset", c.offset},
                            {"nbytes", c.nbytes},
                            {"offsets", c.offsets},
                            {"sizes", c.sizes},
                            {"crc32", c.crc}});
    }
    x["chunks"] = std::move(chunks);
    tensors[key] = std::move(x);
  }
  j["tensors"] = std::move(tensors);
  return j.dump(1);
}

namespace {

bool safe_file_name(const std::string& f) {
  static const std::regex ok("[A-Za-z0-9_][A-Za-z0-9._-]{0,200}");
  return std::regex_match(f, ok);
}

int64_t int_field(const Json& j, const char* name, const std::string& where, int64_t lo, int64_t hi) {
  if (!j.contains(name) || !j.at(name).is_number_integer()) bad(where, std::string("field '") + name + "' must be an integer");
  const int64_t v = j.at(name).get<int64_t>();
  if (v < lo || v > hi) {
    bad(where, std::string("field '") + name + "' = " + std::to_string(v) + " is out of range [" + std::to_string(lo) +
                   ", " + std::to_string(hi) + "]");
  }
  return v;
}

std::string str_field(const Json& j, const char* name, const std::string& where) {
  if (!j.contains(name) || !j.at(name).is_string()) bad(where, std::string("field '") + name + "' must be a string");
  return j.at(name).get<std::string>();
}

std::vector<int64_t> int_list(const Json& j, const char* name, const std::string& where, int64_t max_value) {
  if (!j.contains(name) || !j.at(name).is_array()) bad(where, std::string("field '") + name + "' must be a list");
  const Json& a = j.at(name);
  if (static_cast<int64_t>(a.size()) > kMaxDims) bad(where, std::string("field '") + name + "' has too many dimensions");
  std::vector<int64_t> out;
  for (const auto& x : a) {
    if (!x.is_number_integer()) bad(where, std::string("field '") + name + "' must hold integers");
    const int64_t v = x.get<int64_t>();
    if (v < 0 || v > max_value) bad(where, std::string("field '") + name + "' holds " + std::to_string(v) + ", out of range");
    out.push_back(v);
  }
  return out;
}

std::vector<std::string> str_list(const Json& j, const char* name, const std::string& where) {
  if (!j.contains(name) || !j.at(name).is_array()) bad(where, std::string("field '") + name + "' must be a list");
  std::vector<std::string> out;
  for (const auto& x : j.at(name)) {
    if (!x.is_string()) bad(where, std::string("field '") + name + "' must hold strings");
    out.push_back(x.get<std::string>());
  }
  return out;
}

int64_t checked_numel(const std::vector<int64_t>& shape, const std::string& where) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d != 0 && n > kMaxNumel / d) bad(where, "the shape's element count is too large");
    n *= d;
  }
  return n;
}

}  // namespace

Index parse_index(const std::string& text, const std::string& where) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const std::exception& e) {
    bad(where, std::string("the index is not valid JSON (") + e.what() + ")");
  }
  try {
    if (!j.is_object() || !j.contains("format") || j["format"] != "fsdp-cpp") {
      bad(where, "not an fsdp-cpp checkpoint index (no \"format\": \"fsdp-cpp\")");
    }
    Index ix;
    ix.version = static_cast<int>(int_field(j, "version", where, 1, 1 << 30));
    if (ix.version > kVersion) {
      bad(where, "written by a newer fsdp-cpp (format version " + std::to_string(ix.version) +
                     "; this build reads versions up to " + std::to_string(kVersion) + ")");
    }
    ix.kind = str_field(j, "kind", where);
    if (ix.kind != "full" && ix.kind != "sharded") bad(where, "field 'kind' must be \"full\" or \"sharded\"");
    ix.world_size = static_cast<int>(int_field(j, "world_size", where, 1, 1 << 20));
    ix.save_id = str_field(j, "save_id", where);
    if (ix.kind == "sharded") {
      ix.files = str_list(j, "files", where);
      for (const auto& f : ix.files) {
        if (!safe_file_name(f)) bad(where, "data file name '" + f + "' is not a plain file name inside the checkpoint");
      }
    }
    if (!j.contains("entries") || !j["entries"].is_array()) bad(where, "field 'entries' must be a list");
    for (const auto& x : j["entries"]) {
      if (!x.is_object()) bad(where, "an entry must be an object");
      EntryRecord e;
      e.name = str_field(x, "name", where);
      e.type = str_field(x, "type", where);
      const std::string ew = where + ", entry '" + e.name + "'";
      if (e.type == "model" || e.type == "optimizer") {
        e.keys = str_list(x, "keys", ew);
        if (e.type == "optimizer") {
          if (!x.contains("param_groups") || !x["param_groups"].is_array()) bad(ew, "field 'param_groups' must be a list");
          for (const auto& g : x["param_groups"]) {
            if (!g.is_object()) bad(ew, "a parameter group must be an object");
            str_list(g, "params", ew);
            if (!g.contains("options") || !g["options"].is_object()) bad(ew, "a parameter group needs 'options'");
            for (const auto& [k, v] : g["options"].items()) {
              if (!v.is_number()) bad(ew, "option '" + k + "' must be a number");
            }
          }
          e.param_groups = x["param_groups"].dump();
        }
      } else if (e.type == "str") {
        e.value = str_field(x, "value", ew);
      } else if (e.type == "int") {
        if (!x.contains("value") || !x["value"].is_number_integer()) bad(ew, "'value' must be an integer");
        e.value = x["value"].dump();
      } else if (e.type == "float") {
        if (!x.contains("value") || !(x["value"].is_number() || x["value"].is_string())) bad(ew, "'value' must be a number");
        e.value = x["value"].dump();
      } else if (e.type == "bool") {
        if (!x.contains("value") || !x["value"].is_boolean()) bad(ew, "'value' must be true or false");
        e.value = x["value"].dump();
      } else if (e.type != "tensor") {
        bad(ew, "unknown entry type '" + e.type + "'");
      }
      ix.entries.push_back(std::move(e));
    }
    if (!j.contains("tensors") || !j["tensors"].is_object()) bad(where, "field 'tensors' must be an object");
    static const std::regex record("data/[0-9]{1,12}");
    for (const auto& [key, x] : j["tensors"].items()) {
      const std::string tw = where + ", tensor '" + key + "'";
      if (!x.is_object()) bad(tw, "must be an object");
      TensorEntry t;
      t.dtype = parse_dtype(str_field(x, "dtype", tw), tw);
      t.shape = int_list(x, "shape", tw, kMaxDim);
      checked_numel(t.shape, tw);
      const int64_t item = static_cast<int64_t>(c10::elementSize(t.dtype));
      if (!x.contains("chunks") || !x["chunks"].is_array()) bad(tw, "field 'chunks' must be a list");
      if (x["chunks"].size() > 1000000) bad(tw, "too many chunks");
      for (const auto& c : x["chunks"]) {
        if (!c.is_object()) bad(tw, "a chunk must be an object");
        Chunk ch;
        ch.file = str_field(c, "file", tw);
        if (ix.kind == "sharded") {
          if (std::find(ix.files.begin(), ix.files.end(), ch.file) == ix.files.end()) {
            bad(tw, "chunk file '" + ch.file + "' is not one of the checkpoint's data files");
          }
        } else if (!std::regex_match(ch.file, record)) {
          bad(tw, "chunk record '" + ch.file + "' is not a data record of the checkpoint");
        }
        ch.offset = int_field(c, "offset", tw, 0, int64_t{1} << 56);
        ch.nbytes = int_field(c, "nbytes", tw, 0, int64_t{1} << 56);
        ch.offsets = int_list(c, "offsets", tw, kMaxDim);
        ch.sizes = int_list(c, "sizes", tw, kMaxDim);
        ch.crc = static_cast<uint32_t>(int_field(c, "crc32", tw, 0, 0xffffffffLL));
        if (ch.offsets.size() != t.shape.size() || ch.sizes.size() != t.shape.size()) {
          bad(tw, "a chunk's offsets and sizes must have one value per dimension of the shape");
        }
        for (size_t d = 0; d < t.shape.size(); ++d) {
          if (ch.offsets[d] + ch.sizes[d] > t.shape[d]) bad(tw, "a chunk lies outside the tensor's shape");
        }
        if (checked_numel(ch.sizes, tw) * item != ch.nbytes) {
          bad(tw, "a chunk of " + std::to_string(ch.nbytes) + " bytes does not match its sizes x dtype (" +
                      std::to_string(checked_numel(ch.sizes, tw) * item) + " bytes)");
        }
        t.chunks.push_back(std::move(ch));
      }
      ix.tensor_order.push_back(key);
      ix.tensors.emplace(key, std::move(t));
    }
    return ix;
  } catch (const nlohmann::json::exception& e) {
    bad(where, std::string("malformed index (") + e.what() + ")");
  }
}

// ---------------------------------------------------------------------------
// Files.

std::string dirname_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some filesystems refuse directory fds
  ::fsync(fd);
  ::close(fd);
}

std::string new_save_id() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  std::random_device rd;
  std::ostringstream os;
  os << std::hex << std::chrono::duration_cast<std::chrono::milliseconds>(now).count() << "-" << (rd() & 0xffffff);
  return os.str();
}

AtomicFile::AtomicFile(std::string final_path) : final_(std::move(final_path)) {
  tmp_ = final_ + ".tmp-" + new_save_id();
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int err = errno;
    throw Error("checkpoint: cannot create " + tmp_ + ": " + errno_text(err));
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      throw Error("checkpoint: writing " + final_ + " failed: " + errno_text(err));
    }
    p += w;
    n -= static_cast<size_t>(w);
    size_ += w;
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) {
    const int err = errno;
    throw Error("checkpoint: syncing " + final_ + " failed: " + errno_text(err));
  }
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_.c_str(), final_.c_str()) != 0) {
    const int err = errno;
    throw Error("checkpoint: renaming " + tmp_ + " to " + final_ + " failed: " + errno_text(err));
  }
  tmp_.clear();
  sync_dir(dirname_of(final_));
}

int64_t file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.st_size);
}

std::string read_range(const std::string& path, int64_t offset, int64_t nbytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw ConfigError("checkpoint: cannot open " + path + ": " + std::strerror(err) +
                      (err == ENOENT ? " (a data file of the checkpoint is missing)" : ""));
  }
  struct stat st {};
  ::fstat(fd, &st);
  if (offset + nbytes > static_cast<int64_t>(st.st_size)) {
    ::close(fd);
    throw ConfigError("checkpoint: " + path + " is truncated: it has " + std::to_string(st.st_size) +
                      " bytes, the index needs bytes [" + std::to_string(offset) + ", " +
                      std::to_string(offset + nbytes) + ")");
  }
  std::string out(static_cast<size_t>(nbytes), '\0');
  int64_t done = 0;
  while (done < nbytes) {
    const ssize_t r = ::pread(fd, out.data() + done, static_cast<size_t>(nbytes - done), offset + done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int err = errno;
      ::close(fd);
      throw ConfigError("checkpoint: reading " + path + " failed: " + (r == 0 ? "unexpected end" : std::strerror(err)));
    }
    done += r;
  }
  ::close(fd);
  return out;
}

FullReader::FullReader(const std::string& path) : path_(path) {
  try {
    reader_ = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    throw ConfigError("checkpoint: " + path + " is not a readable full checkpoint (a PyTorch zip file): " + what);
  }
}

FullReader::~FullReader() = default;

bool FullReader::has(const std::string& record) const {
  try {
    return reader_->hasRecord(record);
  } catch (const std::exception&) {
    return false;
  }
}

std::string FullReader::read(const std::string& record) const {
  try {
    auto [data, size] = reader_->getRecord(record);
    return std::string(static_cast<const char*>(data.get()), size);
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    throw ConfigError("checkpoint: " + path_ + ": cannot read record '" + record + "': " + what);
  }
}

std::string read_chunk(const Chunk& chunk, const std::string& key, const FullReader* full, const std::string& dir) {
  std::string bytes;
  std::string file;
  if (full) {
    file = full->path() + " (record " + chunk.file + ")";
    bytes = full->read(chunk.file);
    if (static_cast<int64_t>(bytes.size()) != chunk.nbytes) {
      throw ConfigError("checkpoint: " + file + " holds " + std::to_string(bytes.size()) + " bytes for tensor '" + key +
                        "', the index says " + std::to_string(chunk.nbytes));
    }
  } else {
    file = dir + "/" + chunk.file;
    bytes = read_range(file, chunk.offset, chunk.nbytes);
  }
  if (crc32(bytes.data(), bytes.size()) != chunk.crc) {
    throw ConfigError("checkpoint: checksum mismatch in " + file + " for tensor '" + key + "' (bytes [" +
                      std::to_string(chunk.offset) + ", " + std::to_string(chunk.offset + chunk.nbytes) +
                      ")): the file is damaged");
  }
  return bytes;
}

// ---------------------------------------------------------------------------
// The pickle of a full checkpoint.

namespace {

class Pickler {
 public:
  std::string out;
  Pickler() { out += "\x80\x02"; }
  void op(char c) { out += c; }
  void str(const std::string& s) {
    op('X');
    u32(static_cast<uint32_t>(s.size()));
    out += s;
  }
  void integer(int64_t v) {
    if (v >= INT32_MIN && v <= INT32_MAX) {
      op('J');
      u32(static_cast<uint32_t>(static_cast<int32_t>(v)));
    } else {
      op('\x8a');
      out += static_cast<char>(8);
      for (int i = 0; i < 8; ++i) out += static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
    }
  }
  void floating(double v) {
    op('G');
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    for (int i = 7; i >= 0; --i) out += static_cast<char>((bits >> (8 * i)) & 0xff);
  }
  void boolean(bool b) { op(b ? '\x88' : '\x89'); }
  void global(const char* module, const char* name) {
    op('c');
    out += module;
    out += '\n';
    out += name;
    out += '\n';
  }
  void tensor(const std::string& storage_key, at::ScalarType dtype, const std::vector<int64_t>& shape) {
    global("torch._utils", "_rebuild_tensor_v2");
    op('(');
    op('(');
    str("storage");
    global("torch", pickle::storage_class(dtype));
    str(storage_key);
    str("cpu");
    int64_t numel = 1;
    for (auto s : shape) numel *= s;
    integer(numel);
    op('t');
    op('Q');  // BINPERSID
    integer(0);
    op('(');
    for (auto s : shape) integer(s);
    op('t');
    op('(');
    int64_t stride = 1;
    std::vector<int64_t> strides(shape.size());
    for (size_t i = shape.size(); i-- > 0;) {
      strides[i] = stride;
      stride *= std::max<int64_t>(shape[i], 1);
    }
    for (auto s : strides) integer(s);
    op('t');
    boolean(false);
    global("collections", "OrderedDict");
    op(')');
    op('R');
    op('t');
    op('R');
  }

 private:
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
  }
};

}  // namespace

std::string full_pickle(const Index& index, const std::map<std::string, std::string>& record_of) {
  Pickler p;
  auto tensor = [&](const std::string& key) {
    const auto& t = index.tensors.at(key);
    const std::string& record = record_of.at(key);  // "data/<n>"
    p.tensor(record.substr(5), t.dtype, t.shape);
  };
  p.op('}');
  for (const auto& e : index.entries) {
    p.op('(');
    p.str(e.name);
    if (e.type == "model") {
      p.op('}');
      for (const auto& k : e.keys) {
        p.op('(');
        p.str(k);
        tensor(e.name + "/" + k);
        p.op('u');
      }
    } else if (e.type == "optimizer") {
      // {"state": {param: {field: tensor}}, "param_groups": [{"params": [...], option: value}]}
      p.op('}');
      p.op('(');
      p.str("state");
      p.op('}');
      // Keys grouped by parameter, in order of first appearance.
      std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>> params;
      for (const auto& k : e.keys) {
        const auto dot = k.rfind('.');
        const std::string param = k.substr(0, dot), field = k.substr(dot + 1);
        auto it = std::find_if(params.begin(), params.end(), [&](const auto& x) { return x.first == param; });
        if (it == params.end()) it = params.insert(params.end(), {param, {}});
        it->second.emplace_back(field, k);
      }
      for (const auto& [param, fields] : params) {
        p.op('(');
        p.str(param);
        p.op('}');
        p.op('(');
        for (const auto& [field, k] : fields) {
          p.str(field);
          tensor(e.name + "/" + k);
        }
        p.op('u');
        p.op('u');
      }
      p.str("param_groups");
      p.op(']');
      for (const auto& g : Json::parse(e.param_groups)) {
        p.op('(');
        p.op('}');
        p.op('(');
        p.str("params");
        p.op(']');
        for (const auto& name : g["params"]) {
          p.op('(');
          p.str(name.get<std::string>());
          p.op('e');
        }
        for (const auto& [k, v] : g["options"].items()) {
          p.str(k);
          p.floating(v.get<double>());
        }
        p.op('u');
        p.op('e');
      }
      p.op('u');
    } else if (e.type == "int") {
      p.integer(Json::parse(e.value).get<int64_t>());
    } else if (e.type == "float") {
      const Json v = Json::parse(e.value);
      p.floating(v.is_string() ? std::stod(v.get<std::string>()) : v.get<double>());
    } else if (e.type == "bool") {
      p.boolean(Json::parse(e.value).get<bool>());
    } else if (e.type == "str") {
      p.str(e.value);
    } else {
      tensor(e.name);
    }
    p.op('u');
  }
  p.op('.');
  return p.out;
}

}  // namespace fsdp::detail::ckpt
