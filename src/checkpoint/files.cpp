// Checkpoint files: crash-safe writes (temporary name, sync, rename),
// bound-checked reads of data files and zip records, chunks checked against
// their checksums.
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <sstream>

#include "dcp.h"
#include "format.h"
#include "fsdp/error.h"

namespace fsdp::detail::checkpoint {

namespace {

std::string errno_text(int err) {
  std::string s = std::strerror(err);
  if (err == ENOSPC) s += " (the disk is full)";
  return s;
}

}  // namespace

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

namespace {

namespace fs = std::filesystem;

const char* file_kind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a directory";
  return "not a regular file";
}

bool is_hex(std::string_view s, size_t max) {
  if (s.empty() || s.size() > max) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool is_digits(std::string_view s) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The names only fsdp-cpp's sharded writer gives: "__<rank>_<save id>.distcp",
// "data-<save id>-<rank>.bin" (the earlier layout), and "<X>.tmp-<save id>"
// of any of these or of the fixed names.
bool is_generated_name(std::string_view name);

bool is_fixed_name(std::string_view name) {
  return name == kDcpMetadataFile || name == kDcpIndexFile || name == kLightningMetaFile || name == kIndexFile;
}

bool is_data_name(std::string_view name) {
  if (name.rfind("__", 0) == 0 && ends_with(name, ".distcp")) {  // __<rank>_<save id>.distcp
    const std::string_view mid = name.substr(2, name.size() - 2 - 7);
    const auto us = mid.find('_');
    return us != std::string_view::npos && is_digits(mid.substr(0, us)) && is_save_id(std::string(mid.substr(us + 1)));
  }
  if (name.rfind("data-", 0) == 0 && ends_with(name, ".bin")) {  // data-<save id>-<rank>.bin
    const std::string_view mid = name.substr(5, name.size() - 5 - 4);
    const auto dash = mid.rfind('-');
    return dash != std::string_view::npos && is_digits(mid.substr(dash + 1)) && is_save_id(std::string(mid.substr(0, dash)));
  }
  return false;
}

bool is_generated_name(std::string_view name) {
  if (is_data_name(name)) return true;
  const auto tmp = name.rfind(".tmp-");
  if (tmp == std::string_view::npos || !is_save_id(std::string(name.substr(tmp + 5)))) return false;
  const std::string_view base = name.substr(0, tmp);
  return is_fixed_name(base) || is_data_name(base);
}

// Whether `dir` holds an index fsdp-cpp wrote (fsdp_index.json or the
// earlier layout's index.json, a regular file that parse_index accepts);
// `why`: what is wrong with the one there, if any.
bool holds_own_index(const std::string& dir, std::string& why) {
  for (const char* name : {kDcpIndexFile, kIndexFile}) {
    const std::string p = (fs::path(dir) / name).string();
    if (entry_kind(p) != "a regular file") continue;
    try {
      parse_index(read_range(p, 0, file_size(p)), p);
      return true;
    } catch (const std::exception& e) {
      if (why.empty()) why = e.what();
    }
  }
  return false;
}

}  // namespace

std::string entry_kind(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return "";
  return file_kind(st.st_mode);
}

void check_file_destination(const std::string& path, const std::string& caller) {
  const std::string kind = entry_kind(path);
  if (kind.empty() || kind == "a regular file") return;
  throw ConfigError(caller + ": " + path + " is " + kind +
                    ", not a regular file: a writer replaces only a regular file (or writes where nothing is), and " +
                    (kind == "a symbolic link" ? "never follows nor replaces a symbolic link"
                                               : "never replaces anything else") +
                    "; remove it or write elsewhere");
}

bool is_save_id(const std::string& s) {
  const auto dash = s.find('-');
  return dash != std::string::npos && is_hex(std::string_view(s).substr(0, dash), 16) &&
         is_hex(std::string_view(s).substr(dash + 1), 8);
}

std::vector<std::string> foreign_entries(const std::string& dir) {
  std::vector<std::string> foreign;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return foreign;
  std::string why;
  const bool own_index = holds_own_index(dir, why);
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const std::string kind = entry_kind(e.path().string());
    const bool regular = kind == "a regular file";
    if (regular && (is_generated_name(name) || (own_index && is_fixed_name(name)))) continue;
    foreign.push_back(e.path().string() + (regular ? "" : " (" + kind + ")"));
  }
  if (ec) foreign.push_back(dir + " (cannot be listed: " + ec.message() + ")");
  std::sort(foreign.begin(), foreign.end());
  if (!own_index && !why.empty()) {
    for (auto& f : foreign) {
      if (is_fixed_name(fs::path(f).filename().string())) f += " (no index of fsdp-cpp's beside it: " + why + ")";
    }
  }
  return foreign;
}

void refuse_foreign_entries(const std::string& dir, const std::string& caller) {
  const auto foreign = foreign_entries(dir);
  if (foreign.empty()) return;
  std::string list;
  const size_t shown = std::min<size_t>(foreign.size(), 10);
  for (size_t i = 0; i < shown; ++i) list += (i ? ", " : "") + foreign[i];
  if (foreign.size() > shown) list += " and " + std::to_string(foreign.size() - shown) + " more";
  throw ConfigError(caller + ": " + dir + " holds files that fsdp-cpp did not write (" + list +
                    "): a sharded checkpoint is written only into an empty directory or over a checkpoint fsdp-cpp "
                    "wrote, and never removes what is not its own; move them or write elsewhere");
}

void remove_unreferenced_own_files(const std::string& dir, const std::vector<std::string>& keep) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!is_generated_name(name) || std::find(keep.begin(), keep.end(), name) != keep.end()) continue;
    if (entry_kind(e.path().string()) == "a regular file") fs::remove(e.path(), ec);
  }
}

std::vector<std::string> remove_own_directory(const std::string& dir) {
  std::vector<std::string> left;
  std::string why;
  const bool own_index = holds_own_index(dir, why);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool regular = entry_kind(e.path().string()) == "a regular file";
    if (regular && (is_generated_name(name) || (own_index && is_fixed_name(name)))) {
      fs::remove(e.path(), ec);
    } else {
      left.push_back(e.path().string());
    }
  }
  if (left.empty()) fs::remove(dir, ec);  // only if empty (a file that appeared meanwhile keeps it)
  return left;
}

AtomicFile::AtomicFile(std::string final_path) : final_(std::move(final_path)) {
  check_file_destination(final_, "checkpoint");
  tmp_ = final_ + ".tmp-" + new_save_id();
  // O_EXCL: a new file, never an existing one nor a symbolic link's target.
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
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
  // Again just before the rename: what appeared at the final name while the
  // file was written (a symbolic link, a device) is refused, not replaced.
  check_file_destination(final_, "checkpoint");
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

namespace {

// Opens `path` for reading, refusing by name what is not a regular file.
// O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused
// here); it changes nothing for a regular file. `st`: its fstat.
int open_regular(const std::string& path, struct stat& st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    throw ConfigError("checkpoint: cannot open " + path + ": " + std::strerror(err) +
                      (err == ENOENT ? " (a data file of the checkpoint is missing)" : ""));
  }
  st = {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const mode_t mode = st.st_mode;
    ::close(fd);
    throw ConfigError("checkpoint: " + path + " is " + file_kind(mode) +
                      ", not a regular file: a checkpoint's files are regular files; refusing to read it");
  }
  return fd;
}

}  // namespace

void read_into(const std::string& path, int64_t offset, int64_t nbytes, void* dst) {
  struct stat st {};
  const int fd = open_regular(path, st);
  if (offset < 0 || nbytes < 0 || nbytes > static_cast<int64_t>(st.st_size) ||
      offset > static_cast<int64_t>(st.st_size) - nbytes) {
    ::close(fd);
    throw ConfigError("checkpoint: " + path + " is truncated: it has " + std::to_string(st.st_size) +
                      " bytes, the index needs bytes [" + std::to_string(offset) + ", " +
                      std::to_string(offset + nbytes) + ")");
  }
  char* out = static_cast<char*>(dst);
  int64_t done = 0;
  while (done < nbytes) {
    const ssize_t r = ::pread(fd, out + done, static_cast<size_t>(nbytes - done), offset + done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int err = errno;
      ::close(fd);
      throw ConfigError("checkpoint: reading " + path + " failed: " + (r == 0 ? "unexpected end" : std::strerror(err)));
    }
    done += r;
  }
  ::close(fd);
}

std::string read_range(const std::string& path, int64_t offset, int64_t nbytes) {
  std::string out(static_cast<size_t>(std::max<int64_t>(nbytes, 0)), '\0');
  read_into(path, offset, nbytes, out.data());
  return out;
}

namespace {

// The byte range of a file as the stream a PyTorchStreamReader reads.
class RangeAdapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  RangeAdapter(std::string path, int64_t offset, int64_t length)
      : path_(std::move(path)), offset_(offset), length_(length) {}
  size_t size() const override { return static_cast<size_t>(length_); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* = "") const override {
    if (pos >= static_cast<uint64_t>(length_)) return 0;
    n = std::min<size_t>(n, static_cast<size_t>(static_cast<uint64_t>(length_) - pos));
    read_into(path_, offset_ + static_cast<int64_t>(pos), static_cast<int64_t>(n), buf);
    return n;
  }

 private:
  std::string path_;
  int64_t offset_, length_;
};

uint64_t le_at(const std::string& b, size_t at, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(b[at + i])) << (8 * i);
  return v;
}

}  // namespace

FullReader::FullReader(const std::string& path) : path_(path), where_(path) {
  // Read through read_into (RangeAdapter), which refuses what is not a
  // regular file: a FIFO would block LibTorch's own open forever.
  struct stat st {};
  ::close(open_regular(path, st));
  const auto size = static_cast<int64_t>(st.st_size);
  try {
    reader_ = std::make_unique<caffe2::serialize::PyTorchStreamReader>(std::make_shared<RangeAdapter>(path, 0, size));
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    throw ConfigError("checkpoint: " + path + " is not a readable full checkpoint (a PyTorch zip file): " + what);
  }
}

FullReader::FullReader(const std::string& path, int64_t offset, int64_t length)
    : path_(path), offset_(offset), length_(length) {
  where_ = path + " (bytes [" + std::to_string(offset) + ", " + std::to_string(offset + length) + "))";
  const int64_t size = file_size(path);
  if (size < 0) throw ConfigError("checkpoint: " + path + " is missing (a data file of the checkpoint)");
  if (offset < 0 || length < 22 || offset > size || length > size - offset) {
    throw ConfigError("checkpoint: " + where_ + " lies outside the file of " + std::to_string(size) +
                      " bytes, or is too short for a zip: the file is truncated or the metadata is wrong");
  }
  try {
    reader_ = std::make_unique<caffe2::serialize::PyTorchStreamReader>(
        std::make_shared<RangeAdapter>(path, offset, length));
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    throw ConfigError("checkpoint: " + where_ + " is not a readable torch.save archive (a PyTorch zip): " + what);
  }
}

int64_t FullReader::record_offset(const std::string& record) const {
  try {
    return static_cast<int64_t>(reader_->getRecordOffset(record));
  } catch (const std::exception& e) {
    std::string what = e.what();
    throw ConfigError("checkpoint: " + where_ + ": cannot find record '" + record + "': " + what.substr(0, what.find('\n')));
  }
}

std::vector<std::string> FullReader::records() const {
  try {
    return reader_->getAllRecords();
  } catch (const std::exception& e) {
    std::string what = e.what();
    throw ConfigError("checkpoint: " + where_ + ": cannot list its records: " + what.substr(0, what.find('\n')));
  }
}

uint32_t FullReader::record_crc(const std::string& record) const {
  if (!crcs_) crcs_ = std::make_unique<std::map<std::string, uint32_t>>(read_crcs());
  const auto it = crcs_->find(record);
  if (it == crcs_->end()) {
    throw ConfigError("checkpoint: " + where_ + ": the zip's central directory has no entry for record '" + record + "'");
  }
  return it->second;
}

std::map<std::string, uint32_t> FullReader::read_crcs() const {
  const int64_t length = length_ >= 0 ? length_ : file_size(path_);
  auto bad = [&](const std::string& why) {
    return ConfigError("checkpoint: " + where_ + ": the zip's central directory " + why);
  };
  // The end records: EOCD (22 bytes, no comment: PyTorch writes none), and
  // before it the zip64 locator (20) and zip64 EOCD (56) if present.
  const int64_t tail_n = std::min<int64_t>(length, 98);
  const std::string tail = read_range(path_, offset_ + length - tail_n, tail_n);
  const size_t eocd = tail.size() - 22;
  if (tail.size() < 22 || le_at(tail, eocd, 4) != 0x06054b50) throw bad("has no end record (no zip comment expected)");
  uint64_t cd_size = le_at(tail, eocd + 12, 4), cd_offset = le_at(tail, eocd + 16, 4);
  if (cd_offset == 0xffffffffu || cd_size == 0xffffffffu) {
    if (eocd < 76 || le_at(tail, eocd - 20, 4) != 0x07064b50 || le_at(tail, eocd - 76, 4) != 0x06064b50) {
      throw bad("has no zip64 end record where the end record needs one");
    }
    cd_size = le_at(tail, eocd - 76 + 40, 8);
    cd_offset = le_at(tail, eocd - 76 + 48, 8);
  }
  if (cd_offset > static_cast<uint64_t>(length) || cd_size > static_cast<uint64_t>(length) - cd_offset ||
      cd_size > (uint64_t{1} << 26)) {
    throw bad("lies outside the zip");
  }
  const std::string cd = read_range(path_, offset_ + static_cast<int64_t>(cd_offset), static_cast<int64_t>(cd_size));
  std::map<std::string, uint32_t> crcs;
  for (size_t at = 0; at + 46 <= cd.size();) {
    if (le_at(cd, at, 4) != 0x02014b50) throw bad("has a malformed entry");
    const size_t name_n = le_at(cd, at + 28, 2), extra_n = le_at(cd, at + 30, 2), comment_n = le_at(cd, at + 32, 2);
    if (at + 46 + name_n > cd.size()) throw bad("has a malformed entry");
    const std::string name = cd.substr(at + 46, name_n);
    const auto slash = name.find('/');
    if (slash != std::string::npos) crcs.emplace(name.substr(slash + 1), static_cast<uint32_t>(le_at(cd, at + 16, 4)));
    at += 46 + name_n + extra_n + comment_n;
  }
  return crcs;
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
  std::string bytes;
  try {
    auto [data, size] = reader_->getRecord(record);
    bytes.assign(static_cast<const char*>(data.get()), size);
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    throw ConfigError("checkpoint: " + path_ + ": cannot read record '" + record + "': " + what);
  }
  // LibTorch's zip reader does not check CRC-32s: every record read is checked here.
  const uint32_t want = record_crc(record), got = crc32(bytes.data(), bytes.size());
  if (want != got) {
    char text[64];
    std::snprintf(text, sizeof text, "the zip records CRC-32 %08x, its bytes have %08x", want, got);
    throw ConfigError("checkpoint: checksum mismatch in " + where_ + " (record " + record + "): " + text +
                      ": the file is damaged");
  }
  return bytes;
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
  // A record's bytes were checked against the zip's CRC-32 by read(): the
  // index's must be that one (the same CRC-32 of the same bytes).
  const uint32_t crc = full ? full->record_crc(chunk.file) : crc32(bytes.data(), bytes.size());
  if (crc != chunk.crc) {
    throw ConfigError("checkpoint: checksum mismatch in " + file + " for tensor '" + key + "' (bytes [" +
                      std::to_string(chunk.offset) + ", " + std::to_string(chunk.offset + chunk.nbytes) +
                      ")): the file is damaged");
  }
  return bytes;
}

}  // namespace fsdp::detail::checkpoint
