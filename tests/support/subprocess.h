// Test helper: runs a program, captures its stdout and stderr (merged), and
// kills it if it outlives a deadline. POSIX only; no LibTorch.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace fsdp::testing {

struct RunResult {
  int status = 0;          // raw waitpid status
  std::string output;      // stdout and stderr, interleaved
  double seconds = 0;      // wall time until exit
  bool timed_out = false;  // killed by the deadline
  long max_rss_kb = 0;     // the process's peak resident set (wait4's ru_maxrss, KiB)
  double cpu_seconds = 0;  // its user and system CPU time (wait4's rusage)
  int exit_code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }
};

// Starts `argv` with `extra_env` ("NAME=value" set, "NAME" unset) applied, returns its pid and
// the read end of its output pipe.
inline pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env, int* out_fd) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(p[1], 1);
    dup2(p[1], 2);
    for (auto& kv : extra_env) {
      if (kv.find('=') == std::string::npos) unsetenv(kv.c_str());  // "NAME": unset it
      else putenv(const_cast<char*>(kv.c_str()));
    }
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(p[1]);
  *out_fd = p[0];
  return pid;
}

// Collects the output of a process started by spawn() until it exits (or
// `deadline`, then SIGKILL), and reaps it (wait4: its peak RSS too). `while_running` is called about
// every 50 ms with the pid and the output so far.
inline RunResult wait_program(pid_t pid, int fd, std::chrono::milliseconds deadline,
                              const std::function<void(pid_t, const std::string&)>& while_running = nullptr) {
  RunResult r;
  auto t0 = std::chrono::steady_clock::now();
  bool eof = false;
  while (!eof) {
    pollfd pfd{fd, POLLIN, 0};
    poll(&pfd, 1, 50);
    if (pfd.revents) {
      char buf[4096];
      ssize_t n = read(fd, buf, sizeof(buf));
      if (n > 0) r.output.append(buf, static_cast<size_t>(n));
      else eof = true;
    }
    if (while_running) while_running(pid, r.output);
    if (std::chrono::steady_clock::now() - t0 > deadline && !r.timed_out) {
      r.timed_out = true;
      kill(pid, SIGKILL);
    }
  }
  close(fd);
  rusage usage{};
  wait4(pid, &r.status, 0, &usage);
  r.max_rss_kb = usage.ru_maxrss;
  r.cpu_seconds = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                  static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// Runs to completion (or `deadline`, then SIGKILL); see wait_program.
inline RunResult run_program(const std::vector<std::string>& argv, std::chrono::milliseconds deadline,
                             const std::vector<std::string>& extra_env = {},
                             const std::function<void(pid_t, const std::string&)>& while_running = nullptr) {
  int fd = -1;
  pid_t pid = spawn(argv, extra_env, &fd);
  return wait_program(pid, fd, deadline, while_running);
}

// A fresh directory under /tmp, removed at destruction.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/fsdp-test-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The bytes of the file at `path` ("" when it cannot be read).
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Replaces the file at `path` with `bytes`.
inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The resident memory of process `pid` now (VmRSS, KiB; 0 when unknown).
inline long resident_kb(pid_t pid) {
  const std::string status = read_file("/proc/" + std::to_string(pid) + "/status");
  const auto at = status.find("VmRSS:");
  return at == std::string::npos ? 0 : std::atol(status.c_str() + at + 6);
}

// True while a process with this pid exists and is not a zombie.
inline bool process_alive(pid_t pid) {
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  auto close_paren = stat.rfind(')');
  if (stat.empty() || close_paren == std::string::npos || close_paren + 2 >= stat.size()) return false;
  return stat[close_paren + 2] != 'Z';
}

// Every process whose parent chain leads to this one, read from /proc.
inline std::vector<pid_t> descendants() {
  std::map<pid_t, std::vector<pid_t>> children;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file(entry.path().string() + "/stat");
    const auto close_paren = stat.rfind(')');
    if (close_paren == std::string::npos) continue;
    std::istringstream rest(stat.substr(close_paren + 2));
    char state = 0;
    long ppid = 0;
    if (rest >> state >> ppid) children[static_cast<pid_t>(ppid)].push_back(static_cast<pid_t>(std::stol(name)));
  }
  std::vector<pid_t> out;
  std::vector<pid_t> todo{getpid()};
  while (!todo.empty()) {
    const pid_t p = todo.back();
    todo.pop_back();
    for (pid_t c : children[p]) {
      out.push_back(c);
      todo.push_back(c);
    }
  }
  return out;
}

// For the life of the guard this process is the subreaper of everything it
// starts (PR_SET_CHILD_SUBREAPER): a process whose parent dies is handed to
// it, not to init. At the end every descendant still there is killed
// (SIGKILL) and reaped. For launchers whose workers leave the launcher's
// process group and can outlive it, as torchrun's and mpirun's do.
class ProcessTreeGuard {
 public:
  ProcessTreeGuard() { ::prctl(PR_SET_CHILD_SUBREAPER, 1); }
  ~ProcessTreeGuard() {
    for (int round = 0; round < 50; ++round) {
      const auto pids = descendants();
      if (pids.empty()) break;
      for (pid_t p : pids) ::kill(p, SIGKILL);
      for (pid_t p : pids) ::waitpid(p, nullptr, 0);  // ours: reaped once dead; others: ECHILD now, ours next round
      ::usleep(20000);
    }
    ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  }
  ProcessTreeGuard(const ProcessTreeGuard&) = delete;
  ProcessTreeGuard& operator=(const ProcessTreeGuard&) = delete;
};

}  // namespace fsdp::testing
