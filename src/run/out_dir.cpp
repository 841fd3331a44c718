// The files beneath --out (src/run/out_dir.h).
#include "out_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <regex>
#include <string>

#include "fsdp/error.h"

namespace fsdp::run {

namespace fs = std::filesystem;

// The time now in UTC: "2026-12-01T10:00:00Z", or compact "20261201T100000Z"
// (for file names).
std::string utc_now(bool compact) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, compact ? "%Y%m%dT%H%M%SZ" : "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

// ConfigError when `path` is a symbolic link: nothing beneath --out is
// followed. `what`: what fsdp-train writes there.
void refuse_link(const std::string& root, const std::string& path, const std::string& what) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return;
  std::error_code ec;
  const fs::path target = fs::read_symlink(path, ec);
  throw ConfigError("--out " + root + ": " + path + " is a symbolic link" +
                    (ec ? std::string() : " (to " + target.string() + ")") + " where fsdp-train writes " + what +
                    "; it follows no link beneath --out, and wrote nothing through this one: expected no link there "
                    "(remove it; --out itself may be a link), or pass another --out");
}

// open(2) of one of fsdp-train's files with O_NOFOLLOW: a symbolic link
// there is refused (ConfigError naming it and `what`); -1 and errno for
// any other failure.
int open_own_file(const std::string& root, const std::string& path, int flags, const std::string& what) {
  const int fd = ::open(path.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP) refuse_link(root, path, what);
    errno = err;
  }
  return fd;
}


// A sharded checkpoint directory that a killed save left before its commit:
// no commit file in it (.metadata, written last; index.json in the layout
// before issue 18).
bool incomplete(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return false;
  for (const char* index : {".metadata", "index.json"}) {
    if (fs::exists(fs::path(path) / index, ec)) return false;
  }
  return true;
}


// ConfigError unless the directory `dir` (a folder fsdp-train writes into)
// can be written: created files and folders in it, and entered.
void check_writable_dir(const std::string& root, const std::string& dir, const std::string& what) {
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    const int err = errno;
    throw ConfigError("--out " + root + ": " + dir + ", where fsdp-train writes " + what + ", cannot be written (" +
                      std::strerror(err) + "): expected a directory this user may write; fix its permissions, or "
                      "pass another --out");
  }
}

// "a directory", "a FIFO (named pipe)", ... for `st`.
std::string kind_of(fs::file_status st) {
  switch (st.type()) {
    case fs::file_type::regular: return "a regular file";
    case fs::file_type::directory: return "a directory";
    case fs::file_type::symlink: return "a symbolic link";
    case fs::file_type::fifo: return "a FIFO (named pipe)";
    case fs::file_type::socket: return "a socket";
    case fs::file_type::block:
    case fs::file_type::character: return "a device";
    default: return "not a regular file";
  }
}

// The files a sharded save writes into its step-NNNNNNNN directory before
// its commit (src/checkpoint/sharded_writer.cpp; the save id is
// new_save_id's "<hex>-<hex>"): the data files __<rank>_<id>.distcp
// (data-<rank>-<id>.bin before issue 18) and the temporaries of those and of
// the commit files.
bool sharded_save_file(const std::string& name) {
  static const std::regex own(
      "__[0-9]+_[0-9a-f]+-[0-9a-f]+\\.distcp(\\.tmp-[0-9a-f]+-[0-9a-f]+)?|"
      "data-[0-9]+-[0-9a-f]+(-[0-9a-f]+)?\\.bin(\\.tmp-[0-9a-f]+-[0-9a-f]+)?|"  // the layout before issue 18
      "(\\.metadata|fsdp_index\\.json|meta\\.pt|index\\.json)\\.tmp-[0-9a-f]+-[0-9a-f]+");
  return std::regex_match(name, own);
}

// Whether `path` is what a killed sharded save of fsdp-train's leaves: a
// directory (not a link) with no commit file, holding only regular files
// of the names that save writes (or nothing). What it cannot prove its own
// (a user's checkpoints/step-00000001/notes.txt) is not.
bool killed_save(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(path, ec)) || !incomplete(path)) return false;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    if (!fs::is_regular_file(fs::symlink_status(e.path(), ec)) || !sharded_save_file(e.path().filename().string())) {
      return false;
    }
  }
  return !ec;
}


}  // namespace fsdp::run
