#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "fsdp/error.h"
#include "fsdp/launch/launcher.h"

extern char** environ;

namespace fsdp::launch {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void sys_fail(const std::string& what) {
  throw Error("fsdp-run: " + what + ": " + std::strerror(errno));
}

// Writes all of data to fd. Returns 0, or the errno of the write that failed
// (callers writing to the console ignore it: nowhere to report a broken stdout).
int write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

void say(const std::string& msg) {
  std::string line = "fsdp-run: " + msg + "\n";
  write_all(STDERR_FILENO, line.data(), line.size());
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "killed by signal " + signal_name(WTERMSIG(status)) + " (" + std::to_string(WTERMSIG(status)) + ")";
  }
  return "status " + std::to_string(status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

int pick_free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) sys_fail("socket() to pick a free port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    sys_fail("bind() to pick a free port");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Creates path and its parents. Returns "" or the directory that could not
// be made (errno says why).
std::string make_dirs(const std::string& path) {
  std::string cur;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!cur.empty() && ::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return cur;
    }
    if (i < path.size()) cur += path[i];
  }
  return "";
}

// One output stream of a worker: a pipe, split into lines.
struct Stream {
  int fd = -1;
  int dest = STDOUT_FILENO;
  std::string partial;
};

struct Worker {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  Stream streams[2];
  int log_fd = -1;       // --log-dir's file; -1: none, or closed after a write error
  std::string log_path;
};

class Group {
 public:
  Group(const LaunchOptions& o, int attempt, int port, int sigfd) : o_(o), attempt_(attempt), port_(port), sigfd_(sigfd) {}
  ~Group() {
    for (auto& w : workers_) {
      for (auto& s : w.streams) {
        if (s.fd >= 0) ::close(s.fd);
      }
      if (w.log_fd >= 0) ::close(w.log_fd);
    }
  }

  void start();
  // Supervises until every worker ended. Returns the signal that interrupted
  // the launcher (0 if none).
  int supervise();
  const Worker* failure() const { return failed_ < 0 ? nullptr : &workers_[static_cast<size_t>(failed_)]; }

 private:
  std::vector<std::string> worker_env(const Worker& w) const;
  void emit(Worker& w, Stream& s, const char* data, size_t n, bool flush);
  void read_stream(Worker& w, Stream& s);
  void reap();
  void signal_all(int sig);
  void begin_stop(int sig);
  void drain();

  const LaunchOptions& o_;
  int attempt_;
  int port_;
  int sigfd_;
  std::vector<Worker> workers_;
  int failed_ = -1;
  int interrupted_ = 0;
  bool stopping_ = false;
  Clock::time_point kill_at_;
};

std::vector<std::string> Group::worker_env(const Worker& w) const {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  const int world = o_.nnodes * o_.nproc_per_node;
  env["RANK"] = std::to_string(w.rank);
  env["WORLD_SIZE"] = std::to_string(world);
  env["LOCAL_RANK"] = std::to_string(w.local_rank);
  env["LOCAL_WORLD_SIZE"] = std::to_string(o_.nproc_per_node);
  env["GROUP_RANK"] = std::to_string(o_.node_rank);
  env["GROUP_WORLD_SIZE"] = std::to_string(o_.nnodes);
  env["ROLE_RANK"] = std::to_string(w.rank);
  env["ROLE_WORLD_SIZE"] = std::to_string(world);
  env["ROLE_NAME"] = "default";
  env["MASTER_ADDR"] = o_.master_addr;
  env["MASTER_PORT"] = std::to_string(port_);
  env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(attempt_);
  env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(o_.max_restarts);
  const std::string threads = std::to_string(std::max(1, available_cores() / o_.nproc_per_node));
  for (const char* var : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}) {
    if (env[var].empty()) env[var] = threads;  // a value the user set is kept
  }
  const std::string lib = allocator_library(o_.allocator);
  if (!lib.empty()) env["LD_PRELOAD"] = env["LD_PRELOAD"].empty() ? lib : lib + ":" + env["LD_PRELOAD"];
  std::vector<std::string> out;
  for (auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

void Group::start() {
  // A log directory or file that cannot be made fails the first attempt
  // (nothing has run yet: the user fixes --log-dir); on a restart it only
  // costs that attempt its log files, not the job.
  auto log_failure = [&](const std::string& what) {
    if (attempt_ == 0) sys_fail(what);
    say(what + ": " + std::strerror(errno) + "; restart " + std::to_string(attempt_) +
        " goes on with its output on the console only");
  };
  std::string log_dir;
  if (!o_.log_dir.empty()) {
    log_dir = o_.log_dir + "/attempt_" + std::to_string(attempt_);
    if (const std::string bad = make_dirs(log_dir); !bad.empty()) {
      log_failure("cannot create log directory '" + bad + "'");
      log_dir.clear();
    }
  }
  const pid_t launcher = ::getpid();
  workers_.resize(static_cast<size_t>(o_.nproc_per_node));
  for (int lr = 0; lr < o_.nproc_per_node; ++lr) {
    Worker& w = workers_[static_cast<size_t>(lr)];
    w.local_rank = lr;
    w.rank = o_.node_rank * o_.nproc_per_node + lr;
    if (!log_dir.empty()) {
      w.log_path = log_dir + "/rank_" + std::to_string(w.rank) + ".log";
      w.log_fd = ::open(w.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (w.log_fd < 0) log_failure("cannot open log file '" + w.log_path + "'");
    }
    int pipes[2][2];
    for (auto& p : pipes) {
      if (::pipe2(p, O_CLOEXEC) != 0) sys_fail("pipe2()");
    }
    // Everything the child needs is prepared before fork().
    std::vector<std::string> env = worker_env(w);
    std::vector<char*> envp, argv;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<std::string> cmd = o_.command;
    for (auto& a : cmd) argv.push_back(a.data());
    argv.push_back(nullptr);

    pid_t pid = ::fork();
    if (pid < 0) sys_fail("fork()");
    if (pid == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher) _exit(125);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE}) ::signal(sig, SIG_DFL);
      ::dup2(pipes[0][1], STDOUT_FILENO);
      ::dup2(pipes[1][1], STDERR_FILENO);
      ::execvpe(argv[0], argv.data(), envp.data());
      std::string msg = "fsdp-run: cannot execute '" + cmd[0] + "': " + std::strerror(errno) + "\n";
      write_all(STDERR_FILENO, msg.data(), msg.size());
      _exit(127);
    }
    ::setpgid(pid, pid);  // also in the parent, so that no signal races the child's own call
    w.pid = pid;
    w.running = true;
    for (int k = 0; k < 2; ++k) {
      ::close(pipes[k][1]);
      w.streams[k].fd = pipes[k][0];
      w.streams[k].dest = k == 0 ? STDOUT_FILENO : STDERR_FILENO;
      ::fcntl(w.streams[k].fd, F_SETFL, O_NONBLOCK);
    }
  }
}

void Group::emit(Worker& w, Stream& s, const char* data, size_t n, bool flush) {
  if (w.log_fd >= 0) {
    // A log that cannot be written (a full disk) must not cost the job or
    // the console its output: said once, then the file is left as it is.
    if (const int err = write_all(w.log_fd, data, n); err != 0) {
      say("cannot write the log file '" + w.log_path + "': " + std::strerror(err) + "; rank " +
          std::to_string(w.rank) + "'s output still goes to the console, and no more of it to that file");
      ::close(w.log_fd);
      w.log_fd = -1;
    }
  }
  if (!o_.rank_prefix) {
    write_all(s.dest, data, n);
    return;
  }
  s.partial.append(data, n);
  const std::string prefix = "[rank" + std::to_string(w.rank) + "]: ";
  size_t start = 0;
  for (size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string line = prefix + s.partial.substr(start, nl - start + 1);
    write_all(s.dest, line.data(), line.size());
  }
  s.partial.erase(0, start);
  if (flush && !s.partial.empty()) {
    std::string line = prefix + s.partial + "\n";
    write_all(s.dest, line.data(), line.size());
    s.partial.clear();
  }
}

void Group::read_stream(Worker& w, Stream& s) {
  char buf[65536];
  while (s.fd >= 0) {
    ssize_t r = ::read(s.fd, buf, sizeof(buf));
    if (r > 0) {
      emit(w, s, buf, static_cast<size_t>(r), false);
      continue;
    }
    if (r < 0 && (errno == EINTR)) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    emit(w, s, "", 0, true);  // EOF or error: flush the last partial line
    ::close(s.fd);
    s.fd = -1;
  }
}

void Group::signal_all(int sig) {
  for (auto& w : workers_) {
    if (w.running) ::kill(-w.pid, sig);
  }
}

void Group::begin_stop(int sig) {
  if (stopping_) return;
  stopping_ = true;
  signal_all(sig);
  kill_at_ = Clock::now() + o_.stop_grace;
}

void Group::reap() {
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (size_t i = 0; i < workers_.size(); ++i) {
      Worker& w = workers_[i];
      if (w.pid != pid || !w.running) continue;
      w.running = false;
      w.status = status;
      ::kill(-w.pid, SIGKILL);  // whatever the worker left in its process group
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && !stopping_ && failed_ < 0) {
        failed_ = static_cast<int>(i);
        say("worker rank " + std::to_string(w.rank) + " (local rank " + std::to_string(w.local_rank) + ", pid " +
            std::to_string(w.pid) + ") failed: " + describe_status(status) + "; stopping the other workers");
        begin_stop(SIGTERM);
      }
    }
  }
}

void Group::drain() {
  // Output still buffered in the pipes after every worker ended.
  for (auto& w : workers_) {
    for (auto& s : w.streams) {
      if (s.fd >= 0) {
        read_stream(w, s);
        emit(w, s, "", 0, true);
        if (s.fd >= 0) ::close(s.fd);
        s.fd = -1;
      }
    }
  }
}

int Group::supervise() {
  for (;;) {
    bool any_running = false;
    for (auto& w : workers_) any_running |= w.running;
    if (!any_running) break;

    std::vector<pollfd> fds;
    std::vector<std::pair<Worker*, Stream*>> owners;
    fds.push_back({sigfd_, POLLIN, 0});
    owners.push_back({nullptr, nullptr});
    for (auto& w : workers_) {
      for (auto& s : w.streams) {
        if (s.fd >= 0) {
          fds.push_back({s.fd, POLLIN, 0});
          owners.push_back({&w, &s});
        }
      }
    }
    int timeout_ms = -1;
    if (stopping_) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(kill_at_ - Clock::now()).count();
      timeout_ms = static_cast<int>(std::max<long long>(0, left));
    }
    int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) sys_fail("poll()");
    if (stopping_ && Clock::now() >= kill_at_) signal_all(SIGKILL);
    if (n <= 0) continue;
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) read_stream(*owners[i].first, *owners[i].second);
    }
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo info{};
      while (::read(sigfd_, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
        const int sig = static_cast<int>(info.ssi_signo);
        if (sig == SIGCHLD) continue;  // reaped below
        if (interrupted_ != 0) {
          say("received " + signal_name(sig) + " again: killing the workers");
          signal_all(SIGKILL);
        } else {
          interrupted_ = sig;
          say("received " + signal_name(sig) + ": stopping the workers");
          begin_stop(sig);
        }
      }
    }
    reap();
  }
  drain();
  return interrupted_;
}

// Owns the launcher's signals while it runs: they arrive through a signalfd.
class SignalScope {
 public:
  SignalScope() {
    sigemptyset(&set_);
    for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&set_, sig);
    if (::sigprocmask(SIG_BLOCK, &set_, &old_) != 0) sys_fail("sigprocmask()");
    fd_ = ::signalfd(-1, &set_, SFD_NONBLOCK | SFD_CLOEXEC);
    if (fd_ < 0) sys_fail("signalfd()");
    old_pipe_ = ::signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the launcher
  }
  ~SignalScope() {
    ::signal(SIGPIPE, old_pipe_);
    ::close(fd_);
    ::sigprocmask(SIG_SETMASK, &old_, nullptr);
  }
  int fd() const { return fd_; }

 private:
  sigset_t set_, old_;
  int fd_ = -1;
  sighandler_t old_pipe_ = SIG_DFL;
};

}  // namespace

int launch(const LaunchOptions& o) {
  if (o.command.empty()) throw ConfigError("fsdp-run: no program given");
  if (const std::string lib = allocator_library(o.allocator); !lib.empty()) {
    // The loader would only warn and run the workers with glibc's malloc.
    // (dlopen may refuse an allocator for other reasons, e.g. jemalloc's
    // static TLS, which preloading does not hit: only a missing file counts.)
    void* handle = dlopen(lib.c_str(), RTLD_LAZY | RTLD_LOCAL);
    const char* why = handle == nullptr ? dlerror() : nullptr;
    if (handle != nullptr) dlclose(handle);
    if (why != nullptr && std::strstr(why, "cannot open shared object file") != nullptr) {
      throw ConfigError("fsdp-run: --allocator " + o.allocator + ": " + lib +
                        " is not installed (Debian: libjemalloc2, libtcmalloc-minimal4 or libmimalloc2.0)");
    }
  }
  SignalScope signals;
  for (int attempt = 0;; ++attempt) {
    const int port = o.master_port != 0 ? o.master_port : pick_free_port();
    Group group(o, attempt, port, signals.fd());
    group.start();
    const int interrupted = group.supervise();
    if (interrupted != 0) return 128 + interrupted;
    const Worker* failed = group.failure();
    if (failed == nullptr) return 0;
    if (attempt < o.max_restarts) {
      say("restarting the worker group (restart " + std::to_string(attempt + 1) + " of " +
          std::to_string(o.max_restarts) + ")");
      continue;
    }
    say("worker rank " + std::to_string(failed->rank) + " failed with " + describe_status(failed->status) +
        (o.max_restarts > 0 ? " after " + std::to_string(o.max_restarts) + " restart(s)" : std::string()) +
        "; exiting with " + std::to_string(exit_code_of(failed->status)));
    return exit_code_of(failed->status);
  }
}

}  // namespace fsdp::launch
