// Checkpoint files written: crash-safe writes (temporary name, sync,
// rename), and what a writer may replace or remove. Reading them:
// readers.cpp.
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

#include "fsdp/formats/dcp.h"
#include "fsdp/formats/format.h"
#include "fsdp/error.h"
#include "file_kind.h"

namespace fsdp::formats {

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

std::string new_save_id() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  std::random_device rd;
  std::ostringstream os;
  os << std::hex << std::chrono::duration_cast<std::chrono::milliseconds>(now).count() << "-" << (rd() & 0xffffff);
  return os.str();
}

namespace {

namespace fs = std::filesystem;

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
                    "): a full checkpoint replaces a sharded checkpoint's directory only when nothing else is in it, "
                    "and never removes what is not its own; move them or write elsewhere");
}

std::vector<std::string> colliding_entries(const std::string& dir) {
  std::vector<std::string> colliding;
  for (const auto& f : foreign_entries(dir)) {
    // foreign_entries names "<dir>/<name>" or "<dir>/<name> (<kind>...)".
    std::string name = f.substr(dir.size() + 1);
    if (const auto paren = name.find(" ("); paren != std::string::npos) name.resize(paren);
    if (is_fixed_name(name) || ends_with(name, ".distcp")) colliding.push_back(f);
  }
  return colliding;
}

void refuse_colliding_entries(const std::string& dir, const std::string& caller) {
  const auto colliding = colliding_entries(dir);
  if (colliding.empty()) return;
  std::string list;
  const size_t shown = std::min<size_t>(colliding.size(), 10);
  for (size_t i = 0; i < shown; ++i) list += (i ? ", " : "") + colliding[i];
  if (colliding.size() > shown) list += " and " + std::to_string(colliding.size() - shown) + " more";
  throw ConfigError(caller + ": " + dir + " holds files that fsdp-cpp did not write under the names a sharded " +
                    "checkpoint takes (" + list + "): the checkpoint would overwrite them or be read with them (" +
                    kDcpMetadataFile + ", " + kDcpIndexFile + ", " + kLightningMetaFile + ", " + kIndexFile +
                    ", *.distcp); other files are kept beside a checkpoint, never these: move them or write elsewhere");
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

}  // namespace fsdp::formats
