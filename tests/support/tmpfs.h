// Test helper: a small tmpfs mounted for one test, to make a disk that fills
// up. Needs root (CI runs as root); a test skips when mounted() is false.
// POSIX only; no LibTorch.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace fsdp::testing {

// Mounts a tmpfs at `dir` (created if missing) with mount's -o `options`,
// e.g. "size=64k" or "size=64k,nr_inodes=5", and unmounts it (umount -l) at
// destruction, also when the test fails or throws. Declare it after the
// TempDir that holds `dir`, so that it is unmounted before that is removed.
class SmallTmpfs {
 public:
  SmallTmpfs(const std::string& dir, const std::string& options) : dir_(dir) {
    if (::geteuid() != 0) {
      why_ = "mounting a tmpfs needs root";
      return;
    }
    ::mkdir(dir.c_str(), 0755);
    mounted_ = std::system(("mount -t tmpfs -o " + options + " tmpfs '" + dir + "' 2>/dev/null").c_str()) == 0;
    if (!mounted_) why_ = "cannot mount a tmpfs at " + dir + " (mount -t tmpfs -o " + options + " failed)";
  }
  ~SmallTmpfs() {
    if (mounted_) std::system(("umount -l '" + dir_ + "'").c_str());
  }
  SmallTmpfs(const SmallTmpfs&) = delete;
  SmallTmpfs& operator=(const SmallTmpfs&) = delete;

  bool mounted() const { return mounted_; }
  const std::string& why_not() const { return why_; }  // the reason to skip when not mounted
  const std::string& path() const { return dir_; }

  // Writes the file `name` (one inode) until the disk is full, unbuffered
  // and down to the last byte (no page is left for a file to grow into);
  // returns its path. Removing it frees the space again.
  std::string fill(const std::string& name = "filler") const {
    const std::string path = dir_ + "/" + name;
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return path;
    const std::string block(4096, 'x');
    while (::write(fd, block.data(), block.size()) > 0) {
    }
    while (::write(fd, "x", 1) > 0) {
    }
    ::close(fd);
    return path;
  }

 private:
  std::string dir_;
  bool mounted_ = false;
  std::string why_;
};

}  // namespace fsdp::testing
