// Running a hostile case in a forked child whose address space is capped
// (RLIMIT_AS), so that a check that failed could not take the machine's
// memory, and a crash is reported instead of ending the test binary.
#pragma once

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <new>
#include <string>

#include "fsdp/error.h"

namespace fsdp::testing {

inline constexpr long long kCapBytes = 2LL << 30;  // what a hostile case may map beyond what its process holds

// Runs `f` in a forked child whose address space is capped at what it
// holds plus kCapBytes. Returns "ok", "ConfigError: <what>", "<other
// exception>: <what>" or "signal N" (a crash, an abort).
inline std::string in_capped_child(const std::function<void()>& f) {
  int p[2];
  if (pipe(p) != 0) return "pipe failed";
  const pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    long long vm_pages = 0;
    std::ifstream("/proc/self/statm") >> vm_pages;
    rlimit r{};
    r.rlim_cur = r.rlim_max = static_cast<rlim_t>(vm_pages * sysconf(_SC_PAGE_SIZE) + kCapBytes);
    setrlimit(RLIMIT_AS, &r);
    std::string out = "ok";
    try {
      f();
    } catch (const ConfigError& e) {
      out = std::string("ConfigError: ") + e.what();
    } catch (const std::bad_alloc& e) {
      out = std::string("bad_alloc: ") + e.what();
    } catch (const std::exception& e) {
      out = std::string("exception: ") + e.what();
    }
    (void)!write(p[1], out.data(), out.size());
    _exit(0);
  }
  close(p[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(p[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(p[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status)) + " " + out;
  return out;
}

}  // namespace fsdp::testing
