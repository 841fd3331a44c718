// Checkpoint files: crash-safe writes (temporary name, sync, rename),
// bound-checked reads of data files and zip records, chunks checked against
// their checksums.
#include <caffe2/serialize/inline_container.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <sstream>

#include "ckpt_format.h"
#include "fsdp/error.h"

namespace fsdp::detail::ckpt {

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

void read_into(const std::string& path, int64_t offset, int64_t nbytes, void* dst) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw ConfigError("checkpoint: cannot open " + path + ": " + std::strerror(err) +
                      (err == ENOENT ? " (a data file of the checkpoint is missing)" : ""));
  }
  struct stat st {};
  ::fstat(fd, &st);
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

}  // namespace fsdp::detail::ckpt
