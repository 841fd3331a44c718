// Checkpoint files read: bound-checked reads of data files and zip records
// (FullReader), chunks checked against their checksums. Regular files only:
// a FIFO or device is refused by name, never opened for a blocking read.
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/error.h"
#include "fsdp/formats/dcp.h"
#include "fsdp/formats/format.h"
#include "fsdp/formats/regular_file.h"
#include "file_kind.h"

namespace fsdp::formats {

int64_t file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.st_size);
}

namespace {

// Opens `path` for reading, refusing by name what is not a regular file.
// O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused
// here); it changes nothing for a regular file. `st`: its fstat. `what`
// (null: a checkpoint's data file) names the file in errors.
int open_regular(const std::string& path, struct stat& st, const char* what = nullptr) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    if (what) {
      throw ConfigError(path + ": cannot be opened: " + std::strerror(err) + " (" + what + " was expected there)");
    }
    throw ConfigError("checkpoint: cannot open " + path + ": " + std::strerror(err) +
                      (err == ENOENT ? " (a data file of the checkpoint is missing)" : ""));
  }
  st = {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const mode_t mode = st.st_mode;
    ::close(fd);
    if (what) {
      throw ConfigError(path + " is " + file_kind(mode) + ", not a regular file: " + what +
                        " is a regular file; refusing to read it");
    }
    throw ConfigError("checkpoint: " + path + " is " + file_kind(mode) +
                      ", not a regular file: a checkpoint's files are regular files; refusing to read it");
  }
  return fd;
}

}  // namespace

std::string read_regular_file(const std::string& path, int64_t max_bytes, const std::string& what) {
  struct stat st {};
  const int fd = open_regular(path, st, what.c_str());
  if (static_cast<int64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    throw ConfigError(path + ": " + std::to_string(st.st_size) + " bytes; " + what + " is expected under " +
                      std::to_string(max_bytes >> 20) + " MiB");
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t r = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int err = errno;
      ::close(fd);
      throw ConfigError(path + ": reading it failed: " + (r == 0 ? "unexpected end (changed while read?)" : std::strerror(err)));
    }
    done += static_cast<size_t>(r);
  }
  ::close(fd);
  return out;
}

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


}  // namespace fsdp::formats
