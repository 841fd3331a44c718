// The run directory's lock (fsdp/run/run_lock.h).
#include "fsdp/run/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>

#include "fsdp/error.h"
#include "out_dir.h"

namespace fsdp::run {

namespace fs = std::filesystem;

RunLock::RunLock(const std::string& root) {
  const std::string path = (fs::path(root) / ".lock").string();
  // O_NOFOLLOW: a symbolic link there is refused, its target never written.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int err = errno;
    if (err == ELOOP) refuse_link(root, path, "its lock file (.lock: the host and pid of the job that holds it)");
    throw Error("--out " + root + ": cannot open the lock file " + path + ": " + std::strerror(err));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[512] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK) throw Error("--out " + root + ": cannot lock " + path + ": " + std::strerror(err));
    throw ConfigError("--out " + root + " is in use by another fsdp-train job (" +
                      (holder.empty() ? std::string("its host and pid are not written yet") : holder) +
                      "; it holds the lock " + path +
                      "): expected a run directory that no other job writes; wait for that job to end, or pass "
                      "another --out");
  }
  std::ostringstream me;
  me << "host " << host_name() << " pid " << ::getpid() << " since " << utc_now() << "\n";
  const std::string text = me.str();
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    // The lock holds all the same; only the name of its holder is missing.
  }
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock; the file stays
}

RunLock::RunLock(RunLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

}  // namespace fsdp::run
