// fsdp/run/run_lock.h — the lock that keeps a second fsdp-train job out of
// a run directory (<root>/.lock). Local: flock(2), no communication.
#pragma once

#include <string>

namespace fsdp::run {

// An exclusive lock on a run directory, held from construction to
// destruction: flock(2) on <root>/.lock, a file that names its holder
// ("host <name> pid <pid> since <UTC time>"). The kernel releases the lock
// when the holding process ends, however it ends (a restart by fsdp-run
// takes it again); the file itself stays. flock works across machines on
// NFS (Linux maps it to NFS byte-range locks). fsdp-train takes it on rank 0
// only: every job writing a run directory has a rank 0, so a second job's
// rank 0 fails. Move-only.
class RunLock {
 public:
  // ConfigError naming the directory and the holder's host and pid when
  // another process (or another RunLock of this one) holds it; Error when
  // the lock file cannot be opened.
  explicit RunLock(const std::string& root);
  ~RunLock();
  RunLock(RunLock&& other) noexcept;
  RunLock& operator=(RunLock&&) = delete;
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace fsdp::run
