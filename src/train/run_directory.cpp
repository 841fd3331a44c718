#include "run_directory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "fsdp/train/train_config.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <iostream>
#include <random>
#include <regex>
#include <sstream>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "fsdp/error.h"
#include "fsdp/dist/rank_errors.h"

namespace fsdp::train {

namespace fs = std::filesystem;

namespace {

// The time now in UTC: "2026-12-01T10:00:00Z", or compact "20261201T100000Z"
// (for file names).
std::string utc_now(bool compact = false) {
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

}  // namespace

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

std::string config_digest(const TrainConfig& c) {
  std::ostringstream os;
  os << std::setprecision(17) << "vocab " << c.model.vocab_size << " context " << c.model.context << " dim "
     << c.model.dim << " layers " << c.model.layers << " heads " << c.model.heads << " lr " << c.lr << " min_lr "
     << min_learning_rate(c) << " warmup " << warmup_steps(c) << " steps " << c.steps << " batch " << c.batch
     << " seed " << c.strategy.seed() << " data " << c.data << " precision " << c.strategy.precision() << " sharding "
     << to_string(c.strategy.sharding_strategy()) << " format " << to_string(c.strategy.state_dict_type()) << " mesh "
     << mesh_name(c.strategy);
  uint64_t h = 1469598103934665603ull;  // FNV-1a, 64 bits
  for (unsigned char ch : os.str()) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  std::ostringstream hex;
  hex << std::hex << std::setw(16) << std::setfill('0') << h;
  return hex.str();
}

RunDirectory::RunDirectory(std::string root) : root_(std::move(root)) {}

std::string RunDirectory::metrics_path() const { return (fs::path(root_) / "metrics.jsonl").string(); }

std::string RunDirectory::log_path() const { return (fs::path(root_) / "train.log").string(); }

std::string RunDirectory::checkpoint_path(int64_t step) const {
  std::ostringstream name;
  name << "step-" << std::setw(8) << std::setfill('0') << step;
  return (fs::path(root_) / "checkpoints" / name.str()).string();
}

std::string RunDirectory::identity_path() const { return (fs::path(root_) / "run.json").string(); }

std::string RunDirectory::lock_path() const { return (fs::path(root_) / ".lock").string(); }

namespace {

using Json = nlohmann::json;

// run.json; "legacy_checkpoints" when a --resume adopted a directory written
// before fsdp-train recorded run identities (RunIdentity::legacy).
void write_identity(const std::string& path, const RunIdentity& id) {
  Json j;
  j["run_id"] = id.id;
  j["config_digest"] = id.digest;
  j["started"] = utc_now();
  j["host"] = host_name();
  j["pid"] = static_cast<int64_t>(::getpid());
  if (id.legacy) j["legacy_checkpoints"] = true;
  if (!id.job.empty()) j["job"] = id.job;
  const std::string tmp = path + ".tmp";
  const std::string text = j.dump(1) + "\n";
  const std::string root = fs::path(path).parent_path().string();
  const int fd = open_own_file(root, tmp, O_WRONLY | O_CREAT | O_TRUNC, "the run's identity (run.json's temporary)");
  bool ok = fd >= 0;
  int err = ok ? 0 : errno;
  for (size_t done = 0; ok && done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : ENOSPC;
      ok = false;
    } else {
      done += static_cast<size_t>(n);
    }
  }
  if (fd >= 0) ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    throw Error("--out: cannot write " + tmp + ": " + std::strerror(err));
  }
  fs::rename(tmp, path);  // whole or not at all; a link at `path` would be replaced, never followed
}

std::string new_run_id() {
  std::random_device rd;
  std::ostringstream os;
  os << utc_now(true) << "-" << std::hex << std::setw(8) << std::setfill('0') << rd();
  return os.str();
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

}  // namespace

std::optional<RunIdentity> RunDirectory::identity() const {
  const std::string path = identity_path();
  std::error_code ec;
  const auto st = fs::symlink_status(path, ec);
  if (!fs::exists(st)) return std::nullopt;
  refuse_link(root_, path, "the run's identity (run.json)");
  if (!fs::is_regular_file(st)) throw ConfigError(path + " is not a regular file; refusing to read it");
  std::ifstream in(path);
  try {
    const Json j = Json::parse(in);
    RunIdentity id;
    id.id = j.at("run_id").get<std::string>();
    id.digest = j.at("config_digest").get<std::string>();
    id.legacy = j.value("legacy_checkpoints", false);
    id.job = j.value("job", std::string());
    if (id.id.empty()) throw std::invalid_argument("empty run_id");
    return id;
  } catch (const std::exception& e) {
    throw ConfigError("--out " + root_ + ": " + path + " is not the run identity fsdp-train writes (" + e.what() +
                      "): expected a JSON object with \"run_id\" and \"config_digest\" strings; --overwrite "
                      "starts a new run there");
  }
}

namespace {

// The value of the environment variable `name`, if set.
std::optional<std::string> env_var(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::optional<std::string>(v) : std::nullopt;
}

// The start time of process `pid` (field 22 of /proc/<pid>/stat, in clock
// ticks since boot): with the pid, who a process is (a pid is reused).
std::string start_time_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = stat.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return "";
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 22) return field;
  }
  return "";
}

}  // namespace

std::string job_token() {
  const auto run_id = env_var("TORCHELASTIC_RUN_ID"), restarts = env_var("TORCHELASTIC_RESTART_COUNT"),
             max_restarts = env_var("TORCHELASTIC_MAX_RESTARTS"), agent_store = env_var("TORCHELASTIC_USE_AGENT_STORE");
  auto addr = env_var("MASTER_ADDR"), port = env_var("MASTER_PORT");
  if (!restarts || !max_restarts) return "";
  if (run_id) {
    // The store that lives as long as the job: the agent's (MASTER_ADDR:
    // MASTER_PORT), or, when the agents keep it from the workers
    // (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, the elastic setup of
    // docs/launching.md), the c10d rendezvous' own at the agent's
    // --rdzv-endpoint (the parent's command line; torchrun's port 29400 if
    // it names none).
    std::optional<std::string> host = addr, port_text = port;
    if (agent_store != std::optional<std::string>("True")) {
      host.reset();
      std::ifstream in("/proc/" + std::to_string(::getppid()) + "/cmdline");
      std::vector<std::string> args;
      for (std::string a; std::getline(in, a, '\0');) args.push_back(a);
      for (size_t i = 0; i < args.size(); ++i) {
        std::string endpoint;
        for (const char* flag : {"--rdzv-endpoint", "--rdzv_endpoint"}) {
          const std::string f = flag;
          if (args[i] == f && i + 1 < args.size()) endpoint = args[i + 1];
          if (args[i].rfind(f + "=", 0) == 0) endpoint = args[i].substr(f.size() + 1);
        }
        if (endpoint.empty()) continue;
        const auto colon = endpoint.rfind(':');
        host = colon == std::string::npos ? endpoint : endpoint.substr(0, colon);
        port_text = colon == std::string::npos ? std::string("29400") : endpoint.substr(colon + 1);
        if (host->size() > 2 && host->front() == '[' && host->back() == ']') host = host->substr(1, host->size() - 2);
      }
    }
    if (!host || !port_text) return "";
    addr = host;
    port = port_text;
    int p = 0;
    const auto [ptr, ec] = std::from_chars(port->data(), port->data() + port->size(), p);
    if (ec != std::errc() || ptr != port->data() + port->size() || p < 1 || p > 65535) return "";
    try {
      c10d::TCPStoreOptions so;
      so.port = static_cast<std::uint16_t>(p);
      so.isServer = false;
      so.waitWorkers = false;
      so.timeout = std::chrono::seconds(60);
      c10d::TCPStore store(*addr, so);
      const std::string key = "fsdp-train/job";
      if (!store.check({key})) {
        const std::string fresh = new_run_id();
        store.set(key, std::vector<uint8_t>(fresh.begin(), fresh.end()));
      }
      const auto v = store.get(key);
      return "torchrun " + std::string(v.begin(), v.end());
    } catch (const std::exception& e) {
      std::cerr << "fsdp-train: WARNING: cannot reach torchrun's agent store at " << *addr << ":" << *port << " ("
                << e.what() << "): this start cannot be told from a new job; a restart of it will not resume"
                << std::endl;
      return "";
    }
  }
  // fsdp-run: this process's parent, if it is fsdp-run.
  const pid_t parent = ::getppid();
  std::ifstream comm("/proc/" + std::to_string(parent) + "/comm");
  std::string name;
  std::getline(comm, name);
  const std::string started = start_time_of(parent);
  if (name != "fsdp-run" || started.empty()) return "";
  return "fsdp-run " + host_name() + " " + std::to_string(parent) + " " + started;
}

bool RunDirectory::records_job(const std::string& job) const {
  if (job.empty()) return false;
  try {
    const auto had = identity();
    return had && had->job == job;
  } catch (const ConfigError&) {  // begin() names a damaged run.json
    return false;
  }
}

bool RunDirectory::holds_run() const {
  std::error_code ec;
  for (const char* name : {"run.json", "metrics.jsonl", "train.log", "loss.svg", "csv", "profile"}) {
    if (fs::exists(fs::path(root_) / name, ec)) return true;
  }
  if (fs::is_directory(root_, ec)) {
    for (const auto& e : fs::directory_iterator(root_, ec)) {
      if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) return true;
    }
  }
  const fs::path dir = fs::path(root_) / "checkpoints";
  return fs::is_directory(dir, ec) && !fs::is_empty(dir, ec);
}

namespace {

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

}  // namespace

void RunDirectory::check_own_names() const {
  std::error_code ec;
  const fs::path root(root_);
  const std::pair<const char*, const char*> files[] = {
      {"run.json", "the run's identity (run.json)"},
      {"run.json.tmp", "the run's identity (run.json's temporary)"},
      {"metrics.jsonl", "the metrics of each step (metrics.jsonl)"},
      {"train.log", "its log (train.log)"},
      {"loss.svg", "the loss curve (loss.svg)"},
      {".write-test", "the probe that the directory can be written (.write-test)"}};
  for (const auto& [name, what] : files) {
    const std::string p = (root / name).string();
    refuse_link(root_, p, what);
    const auto st = fs::symlink_status(p, ec);
    if (fs::exists(st) && !fs::is_regular_file(st)) {
      throw ConfigError("--out " + root_ + ": " + p + " is " + kind_of(st) + " where fsdp-train writes " + what +
                        ": expected a regular file or nothing there; move it away, or pass another --out");
    }
  }
  const std::pair<const char*, const char*> dirs[] = {{"checkpoints", "the run's checkpoints (checkpoints/)"},
                                                      {"csv", "the CSV logger's files (csv/)"},
                                                      {"profile", "the profiler's traces (profile/)"}};
  for (const auto& [name, what] : dirs) {
    const std::string p = (root / name).string();
    refuse_link(root_, p, what);
    const auto st = fs::symlink_status(p, ec);
    if (!fs::exists(st)) continue;
    if (!fs::is_directory(st)) {
      throw ConfigError("--out " + root_ + ": " + p + " is " + kind_of(st) + " where fsdp-train keeps " + what +
                        ": expected a directory or nothing there; move it away, or pass another --out");
    }
    check_writable_dir(root_, p, what);
  }
  // Beneath csv/ and profile/: the folders and files the loggers write.
  for (const char* name : {"csv", "profile"}) {
    const fs::path dir = root / name;
    if (!fs::is_directory(fs::symlink_status(dir, ec))) continue;
    for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
      refuse_link(root_, e.path().string(), std::string("the loggers' files (") + name + "/)");
    }
  }
}

void RunDirectory::check_saves(const TrainConfig& c, int64_t start) const {
  std::error_code ec;
  const fs::path dir = fs::path(root_) / "checkpoints";
  refuse_link(root_, dir.string(), "the run's checkpoints (checkpoints/)");
  const auto st = fs::symlink_status(dir, ec);
  if (!fs::exists(st)) {
    check_writable_dir(root_, root_, "the run's checkpoints (checkpoints/)");
    return;
  }
  if (!fs::is_directory(st)) {
    throw ConfigError("--out " + root_ + ": " + dir.string() + " is " + kind_of(st) +
                      " where fsdp-train keeps the run's checkpoints: every save would fail (the first at step " +
                      std::to_string(c.save_every > 0 ? std::min(c.steps, (start / c.save_every + 1) * c.save_every)
                                                      : c.steps) +
                      "): expected a directory or nothing there; move it away, or pass another --out");
  }
  check_writable_dir(root_, dir.string(), "the run's checkpoints (checkpoints/)");
  for (const auto& [step, path] : checkpoints()) {
    const bool saved_here = step > start && step <= c.steps && (step == c.steps || (c.save_every > 0 && step % c.save_every == 0));
    if (!saved_here || path != checkpoint_path(step)) continue;
    refuse_link(root_, path, "the checkpoint of step " + std::to_string(step));
    bool checkpoint = true;
    try {
      inspect_checkpoint(path);
    } catch (const std::exception&) {
      checkpoint = killed_save(path);  // a killed save's: the save replaces it
    }
    if (!checkpoint) {
      throw ConfigError("--out " + root_ + ": " + path + " is in the way of the save at step " + std::to_string(step) +
                        ": it is not a checkpoint (nor what a killed save leaves), and fsdp-train writes none over "
                        "what is not its own: move it away, or pass another --out");
    }
  }
}

RunIdentity RunDirectory::begin(const FSDPStrategy& strategy, const TrainConfig& c, const std::string& job) const {
  RunIdentity id;
  const auto failure = dist::capture([&] {
    if (strategy.global_rank() != 0) return;
    check_own_names();
    id = RunIdentity{new_run_id(), config_digest(c)};
    id.job = job;
    std::optional<RunIdentity> had;
    try {
      had = identity();
    } catch (const ConfigError&) {
      if (!c.overwrite) throw;  // --overwrite replaces a damaged run.json (its checkpoints stay, named)
    }
    if (c.resume || !c.resume_from.empty()) {
      if (had) {
        id.id = had->id;  // the same run; its checkpoints record the configuration that wrote them
        id.legacy = had->legacy;
        if (!id.job.empty() && had->job != id.job) write_identity(identity_path(), id);  // now this job's
      } else {
        id.legacy = !checkpoints().empty();  // a directory from before run identities: its checkpoints are the run's
        write_identity(identity_path(), id);
      }
      return;
    }
    if (c.overwrite) {
      const auto kept = remove_own_files(had);
      if (!kept.empty()) {
        std::string list;
        for (size_t i = 0; i < kept.size(); ++i) list += (i ? ", " : "") + kept[i];
        std::cout << "fsdp-train: --overwrite kept what fsdp-train did not write (or cannot tell as its run's) in "
                  << root_ << ": " << list << std::endl;
      }
    } else if (holds_run()) {
      const auto all = checkpoints();
      std::string what = had ? "run " + had->id : std::string("a run");
      what += all.empty() ? ", no checkpoint" : ", newest checkpoint " + all.front().second;
      throw ConfigError("--out " + root_ + " already holds " + what +
                        ": expected an empty run directory for a new run; pass --resume to continue that run, "
                        "--overwrite to start over (it removes that run's run.json, metrics.jsonl, train.log, "
                        "loss.svg, event files, csv/ and profile/ files and checkpoints there, nothing else), or another --out");
    }
    write_identity(identity_path(), id);
  });
  const std::string payload = id.id + "\n" + id.digest + "\n" + (id.legacy ? "1" : "0");
  const std::string agreed = strategy.broadcast(dist::outcome(payload, failure), 0);
  if (dist::outcome_failed(agreed)) dist::rethrow(dist::outcome_failure(agreed));
  std::istringstream in(dist::outcome_payload(agreed));
  std::string flag;
  std::getline(in, id.id);
  std::getline(in, id.digest);
  std::getline(in, flag);
  id.legacy = flag == "1";
  return id;
}

std::vector<std::pair<int64_t, std::string>> RunDirectory::checkpoints() const {
  std::vector<std::pair<int64_t, std::string>> out;
  const fs::path dir = fs::path(root_) / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() != 13 || name.rfind("step-", 0) != 0) continue;
    try {
      out.emplace_back(std::stoll(name.substr(5)), e.path().string());
    } catch (const std::exception&) {
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

namespace {

// "--resume: <path> holds a model of another shape: dim 64 (checkpoint) vs 32;", or "" for the same shape.
std::string shape_mismatch(const models::GPTConfig& saved, const models::GPTConfig& wanted, const std::string& path) {
  std::string diff;
  auto cmp = [&](const char* what, int64_t a, int64_t b) {
    if (a != b) diff += std::string(" ") + what + " " + std::to_string(a) + " (checkpoint) vs " + std::to_string(b) + ";";
  };
  cmp("context", saved.context, wanted.context);
  cmp("dim", saved.dim, wanted.dim);
  cmp("layers", saved.layers, wanted.layers);
  cmp("heads", saved.heads, wanted.heads);
  return diff.empty() ? diff : "--resume: " + path + " holds a model of another shape:" + diff;
}

// The name a checkpoint keeps a run setting under: "config.<key>", or
// "<key>" in checkpoints before the config nesting; "" when it has none.
std::string config_name(const CheckpointInfo& info, const std::string& key) {
  for (const std::string& name : {"config." + key, key}) {
    if (info.values.count(name)) return name;
  }
  return "";
}

// Whether a checkpoint whose run id is `id` belongs to `run`.
bool belongs_to(const std::string& id, const RunIdentity& run) { return id == run.id || (id.empty() && run.legacy); }

// Checks that the checkpoint `path` (described by `info`, whose model
// configuration is `saved`) holds a model of config.model's shape
// (ConfigError listing each difference otherwise) and prints the flags of `c`
// that differ from its run's.
void check_resumable(const std::string& path, const CheckpointInfo& info, const models::GPTConfig& saved,
                     const TrainConfig& c) {
  if (const std::string mismatch = shape_mismatch(saved, c.model, path); !mismatch.empty()) {
    throw ConfigError(mismatch);
  }
  const auto over = overridden_flags(info, c);
  if (!over.empty()) {
    std::string msg = "fsdp-train: --resume: these flags differ from the checkpoint's run and apply from its step on:";
    for (size_t i = 0; i < over.size(); ++i) msg += (i ? "; " : " ") + over[i];
    std::cout << msg << std::endl;
  }
}

// Up to 3 problems of verify_checkpoint, "; "-joined.
std::string problems_text(const std::vector<std::string>& problems) {
  std::string out;
  for (size_t i = 0; i < problems.size() && i < 3; ++i) out += (i ? "; " : "") + problems[i];
  if (problems.size() > 3) out += "; and " + std::to_string(problems.size() - 3) + " more";
  return out;
}

}  // namespace

std::string RunDirectory::resume_checkpoint(const TrainConfig& c, const RunIdentity& run,
                                            std::vector<std::string>* set_aside) const {
  auto explicit_checkpoint = [&]() -> std::string {
    const std::string& path = c.resume_from;
    CheckpointInfo info;
    models::GPTConfig saved;
    try {
      info = inspect_checkpoint(path);
      saved = checkpoint_model_config(info, path);
    } catch (const ConfigError& e) {
      throw ConfigError("--resume-from " + path + " is not a checkpoint fsdp-train can resume: " + e.what());
    }
    if (const auto problems = verify_checkpoint(path); !problems.empty()) {
      throw ConfigError("--resume-from " + path + " is damaged: " + problems_text(problems) +
                        ": expected a checkpoint whose every checksum matches");
    }
    check_resumable(path, info, saved, c);
    return path;
  };
  if (!c.resume && !c.resume_from.empty()) return explicit_checkpoint();
  for (const auto& [step, path] : checkpoints()) {
    CheckpointInfo info;
    std::vector<std::string> problems;
    try {
      info = inspect_checkpoint(path);
    } catch (const ConfigError& e) {
      if (incomplete(path)) {
        std::cerr << "fsdp-train: skipping incomplete checkpoint " << path << " (a save that did not finish)"
                  << std::endl;
        continue;
      }
      problems.push_back(e.what());
    }
    if (problems.empty()) {
      const std::string id = run_id_of(info);
      if (!belongs_to(id, run)) {
        std::cerr << "fsdp-train: not resuming " << path << ": it belongs to "
                  << (id.empty() ? std::string("a run that recorded no run id") : "run " + id)
                  << ", not to this directory's run " << run.id << " (--resume-from it to continue from it)"
                  << std::endl;
        continue;
      }
      problems = verify_checkpoint(path);
    }
    if (!problems.empty()) {
      const std::string aside = path + ".damaged-" + utc_now(true);
      fs::rename(path, aside);
      std::cerr << "fsdp-train: WARNING: checkpoint " << path << " is damaged (" << problems_text(problems)
                << "); moved it aside to " << aside << ", resuming from the newest checkpoint that verifies"
                << std::endl;
      if (set_aside) set_aside->push_back(aside);
      continue;
    }
    models::GPTConfig saved;
    try {
      saved = checkpoint_model_config(info, path);
    } catch (const ConfigError& e) {
      std::cerr << "fsdp-train: skipping " << path << ": " << e.what() << std::endl;
      continue;
    }
    check_resumable(path, info, saved, c);
    return path;
  }
  if (!c.resume_from.empty()) return explicit_checkpoint();
  return "";
}

namespace {

// The newest modification time of `path` and (a directory) its entries:
// when a checkpoint was committed. Now, if none can be read.
std::chrono::system_clock::time_point newest_modification(const std::string& path) {
  timespec newest{};
  auto consider = [&](const std::string& p) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) return;
    if (st.st_mtim.tv_sec > newest.tv_sec || (st.st_mtim.tv_sec == newest.tv_sec && st.st_mtim.tv_nsec > newest.tv_nsec)) {
      newest = st.st_mtim;
    }
  };
  consider(path);
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec)) consider(e.path().string());
  }
  if (newest.tv_sec == 0) return std::chrono::system_clock::now();
  return std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::seconds(newest.tv_sec) + std::chrono::nanoseconds(newest.tv_nsec)));
}

}  // namespace

ResumePoint RunDirectory::resume(const FSDPStrategy& strategy, const TrainConfig& c, const RunIdentity& run,
                                 CheckpointState& state) const {
  ResumePoint point;
  const auto failure = dist::capture([&] {
    if (strategy.global_rank() == 0) point.path = resume_checkpoint(c, run, &point.set_aside);
  });
  // [collective] One broadcast: rank 0's choice, or its failure.
  const std::string agreed = strategy.broadcast(dist::outcome(point.path, failure), 0);
  if (dist::outcome_failed(agreed)) dist::rethrow(dist::outcome_failure(agreed));
  point.path = dist::outcome_payload(agreed);
  if (point.path.empty()) return point;
  if (strategy.global_rank() == 0) point.committed_at = newest_modification(point.path);
  point.values = strategy.load_checkpoint(point.path, state);
  return point;
}

std::vector<std::string> RunDirectory::remove_dead_temporaries() const {
  std::vector<std::string> removed;
  const fs::path dir = fs::path(root_) / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return removed;
  // Every writer names its temporary "<final name>.tmp-<save id>"
  // (src/checkpoint/files.cpp, AtomicFile); none is alive: the caller holds
  // the lock. Only regular files of exactly the names a save gives its
  // temporaries go (a user's step-00000001/notes.tmp-1.txt stays).
  static const std::regex full_temporary("step-[0-9]{8}\\.tmp-[0-9a-f]+-[0-9a-f]+");
  auto regular = [&](const fs::path& p) { return fs::is_regular_file(fs::symlink_status(p, ec)); };
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0) continue;
    if (std::regex_match(name, full_temporary) && regular(e.path())) {
      fs::remove(e.path());
      removed.push_back(e.path().string());
    } else if (fs::is_directory(fs::symlink_status(e.path(), ec))) {
      for (const auto& f : fs::directory_iterator(e.path())) {
        const std::string file = f.path().filename().string();
        if (file.find(".tmp-") != std::string::npos && sharded_save_file(file) && regular(f.path())) {
          fs::remove(f.path());
          removed.push_back(f.path().string());
        }
      }
    }
  }
  return removed;
}

std::vector<std::string> RunDirectory::remove_own_files(const std::optional<RunIdentity>& had) const {
  std::vector<std::string> kept;
  std::error_code ec;
  // run.json first: a restart after a kill in between never takes the old run for its own.
  for (const char* name : {"run.json", "metrics.jsonl", "train.log", "loss.svg"}) {
    const fs::path p = fs::path(root_) / name;
    const auto st = fs::symlink_status(p, ec);
    if (!fs::exists(st)) continue;
    if (fs::is_regular_file(st)) {
      fs::remove(p);
    } else {
      kept.push_back(p.string() + " (not a regular file)");
    }
  }
  const fs::path dir = fs::path(root_) / "checkpoints";
  if (fs::is_directory(dir, ec) && !fs::is_symlink(dir, ec)) {
    remove_dead_temporaries();  // the writer's own temporaries (step-*.tmp-*)
    // Which run is the directory's: run.json's; without one, the checkpoints
    // that record no run id (written before run identities) are its.
    const RunIdentity run = had ? *had : RunIdentity{"", "", true};
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      bool own = false;
      if (name.rfind("step-", 0) == 0 && !fs::is_symlink(e.path(), ec)) {
        try {
          const CheckpointInfo info = inspect_checkpoint(e.path().string());
          const std::string id = run_id_of(info);
          // A checkpoint without a run id is fsdp-train's only if it records a GPT configuration.
          own = belongs_to(id, run) && (!id.empty() || !config_name(info, "model.dim").empty());
        } catch (const std::exception&) {
          // Unreadable: an incomplete save, damage, or not a checkpoint at all; kept.
        }
      }
      if (own) {
        fs::remove_all(e.path());
      } else {
        kept.push_back(e.path().string());
      }
    }
    if (fs::is_empty(dir, ec)) fs::remove(dir, ec);
  } else if (fs::exists(fs::symlink_status(dir, ec))) {
    kept.push_back(dir.string() + " (not a directory of its own)");
  }
  // Its loggers' files: TensorBoard event files in the directory, the CSV
  // logger's csv/version_N/{metrics.csv,hparams.yaml}, the profiler's
  // profile/rank_N.pt.trace.json (regular files of those names only).
  for (const auto& e : fs::directory_iterator(root_)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("events.out.tfevents.", 0) == 0 && fs::is_regular_file(fs::symlink_status(e.path(), ec))) {
      fs::remove(e.path(), ec);
    }
  }
  auto remove_tree_of = [&](const fs::path& dir, const auto& own_file, int depth, const auto& self) -> void {
    if (!fs::is_directory(fs::symlink_status(dir, ec))) return;
    for (const auto& e : fs::directory_iterator(dir)) {
      const auto st = fs::symlink_status(e.path(), ec);
      const std::string name = e.path().filename().string();
      if (depth > 0 && fs::is_directory(st) && name.rfind("version_", 0) == 0) {
        self(e.path(), own_file, depth - 1, self);
      } else if (fs::is_regular_file(st) && own_file(name)) {
        fs::remove(e.path(), ec);
      } else {
        kept.push_back(e.path().string());
      }
    }
    if (fs::is_empty(dir, ec)) fs::remove(dir, ec);
  };
  remove_tree_of(
      fs::path(root_) / "csv", [](const std::string& n) { return n == "metrics.csv" || n == "hparams.yaml"; }, 1,
      remove_tree_of);
  remove_tree_of(
      fs::path(root_) / "profile",
      [](const std::string& n) {
        return n.rfind("rank_", 0) == 0 && n.size() > 14 && n.compare(n.size() - 14, 14, ".pt.trace.json") == 0;
      },
      0, remove_tree_of);
  // The rest of the directory was never fsdp-train's.
  for (const auto& e : fs::directory_iterator(root_)) {
    const std::string name = e.path().filename().string();
    if (name == "csv" || name == "profile") continue;  // named above, file by file
    if (name != "checkpoints" && name != ".lock" && name != ".write-test") kept.push_back(e.path().string());
  }
  std::sort(kept.begin(), kept.end());
  kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
  return kept;
}

void RunDirectory::save(const FSDPStrategy& strategy, const CheckpointState& state, int64_t step, int keep,
                        const RunIdentity& run) const {
  const std::string path = checkpoint_path(step);
  if (strategy.global_rank() == 0) {
    fs::create_directories(fs::path(path).parent_path());
    for (const auto& dead : remove_dead_temporaries()) {
      std::cerr << "fsdp-train: removed " << dead << ", left by a save that was killed" << std::endl;
    }
  }
  strategy.barrier();
  strategy.save_checkpoint(path, state);
  if (strategy.global_rank() == 0) {
    int kept = 0;
    for (const auto& [s, p] : checkpoints()) {
      std::string id;
      try {
        id = run_id_of(inspect_checkpoint(p));
      } catch (const ConfigError&) {
        // A killed save of this job's run (the lock): only what it can prove
        // is a sharded save's; anything else there is a user's, and stays.
        if (s < step && killed_save(p)) fs::remove_all(p);
        continue;
      }
      if (belongs_to(id, run) && ++kept > keep) fs::remove_all(p);
    }
  }
  strategy.barrier();
}

void put_config(CheckpointState& s, const TrainConfig& run, const RunIdentity& identity) {
  const models::GPTConfig& c = run.model;
  auto put = [&](const std::string& key, CheckpointValue v) { s.value("config." + key, std::move(v)); };
  put("model.vocab", c.vocab_size);
  put("model.context", c.context);
  put("model.dim", c.dim);
  put("model.layers", c.layers);
  put("model.heads", c.heads);
  put("run.lr", run.lr);
  put("run.min_lr", min_learning_rate(run));
  put("run.warmup_steps", warmup_steps(run));
  put("run.steps", run.steps);
  put("run.batch", run.batch);
  put("run.seed", static_cast<int64_t>(run.strategy.seed()));
  put("run.data", run.data);
  put("run.precision", run.strategy.precision());
  put("run.sharding_strategy", to_string(run.strategy.sharding_strategy()));
  put("run.state_dict_type", to_string(run.strategy.state_dict_type()));
  put("run.mesh", mesh_name(run.strategy));
  put("run.id", identity.id);
  put("run.digest", identity.digest);
}

namespace {

// The value of a run setting (see config_name); null if absent.
const std::string* config_value(const CheckpointInfo& info, const std::string& key) {
  const std::string name = config_name(info, key);
  return name.empty() ? nullptr : &info.values.at(name);
}

}  // namespace

std::string run_id_of(const CheckpointInfo& info) {
  const std::string* v = config_value(info, "run.id");
  return v ? *v : "";
}

models::GPTConfig checkpoint_model_config(const CheckpointInfo& info, const std::string& path) {
  // The recorded numbers are checked (each an int, in range) and then held
  // against the tensors the checkpoint lists, before anything is built from
  // them: a damaged or hostile configuration is an error naming it, never an
  // allocation without bound.
  constexpr int64_t kMax = int64_t{1} << 31;
  auto get = [&](const char* key) -> int64_t {
    const std::string name = config_name(info, key);
    if (name.empty()) throw ConfigError(path + " was not written by fsdp-train: it has no 'config." + key + "'");
    const auto v = info.values.find(name);
    const auto t = info.value_types.find(name);
    const std::string type = t == info.value_types.end() ? "?" : t->second;
    if (type != "int") {
      throw ConfigError(path + ": its model configuration '" + name + "' is a " + type + " (" + v->second +
                        "); expected an int");
    }
    int64_t n = 0;
    const char* end = v->second.data() + v->second.size();
    const auto [ptr, ec] = std::from_chars(v->second.data(), end, n);
    if (ec != std::errc() || ptr != end || n < 1 || n > kMax) {
      throw ConfigError(path + ": its model configuration '" + name + "' = " + v->second + " is out of range; expected 1 to " +
                        std::to_string(kMax));
    }
    return n;
  };
  models::GPTConfig c;
  c.vocab_size = get("model.vocab");
  c.context = get("model.context");
  c.dim = get("model.dim");
  c.layers = get("model.layers");
  c.heads = get("model.heads");
  if (c.dim % c.heads != 0) {
    throw ConfigError(path + ": its model configuration has heads " + std::to_string(c.heads) +
                      " that do not divide dim " + std::to_string(c.dim));
  }
  // Against the model entry's tensors ("<entry>/<key>"; fsdp-train's entry is "model").
  std::map<std::string, std::vector<int64_t>> listed;
  for (const auto& t : info.tensors) {
    if (t.key.rfind("model/", 0) == 0) listed[t.key.substr(6)] = t.shape;
  }
  auto shape_text = [](const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
  };
  const std::string layers_text = "'config.model.layers' = " + std::to_string(c.layers);
  if (static_cast<size_t>(c.layers) > listed.size()) {  // before listing O(layers) keys
    throw ConfigError(path + ": its model configuration does not match its tensors: " + layers_text + ", but the model holds " +
                      std::to_string(listed.size()) + " tensors in all");
  }
  const auto want = models::gpt_state_shapes(c);
  for (const auto& [key, shape] : want) {
    const auto it = listed.find(key);
    if (it == listed.end()) {
      throw ConfigError(path + ": its model configuration does not match its tensors: it needs 'model/" + key +
                        "', which the checkpoint does not hold (" + layers_text + ")");
    }
    if (it->second != shape) {
      throw ConfigError(path + ": its model configuration does not match its tensors: 'model/" + key + "' is " +
                        shape_text(it->second) + ", the configuration (vocab " + std::to_string(c.vocab_size) +
                        ", context " + std::to_string(c.context) + ", dim " + std::to_string(c.dim) + ") needs " +
                        shape_text(shape));
    }
  }
  if (listed.size() != want.size()) {
    throw ConfigError(path + ": its model configuration does not match its tensors: the model holds " +
                      std::to_string(listed.size()) + " tensors, the configuration's (" + layers_text + ") has " +
                      std::to_string(want.size()));
  }
  return c;
}

ResumedPosition resumed_position(const std::string& path, const std::map<std::string, CheckpointValue>& values,
                                 int64_t step, const TrainConfig& c, int world_now) {
  constexpr int64_t kMaxSamplesPerStep = int64_t{1} << 40;
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  auto out_of_range = [&](const std::string& name, const std::string& value, const std::string& expected) {
    return ConfigError("--resume: " + path + ": its '" + name + "' = " + value + " is out of range for this run: expected " +
                       expected + "; the checkpoint is damaged or was edited (--resume-from another checkpoint, or "
                       "--overwrite to start over)");
  };
  auto integer = [&](const char* name) -> std::optional<int64_t> {
    const auto it = values.find(name);
    if (it == values.end()) return std::nullopt;
    if (!std::holds_alternative<int64_t>(it->second)) {
      throw ConfigError("--resume: " + path + ": its '" + name + "' is not an integer: expected the " +
                        (std::string(name) == "world" ? "world size it was saved at" : "sample stream's position") +
                        " as an int; the checkpoint is damaged or was edited");
    }
    return std::get<int64_t>(it->second);
  };
  if (step < 0 || step > c.steps) {
    throw out_of_range("step", std::to_string(step),
                       "0 to --steps " + std::to_string(c.steps) +
                           (step > c.steps ? " (pass --steps " + std::to_string(step) + " or more to go on from it)" : ""));
  }
  ResumedPosition p;
  p.step = step;
  p.world = integer("world");
  if (p.world && (*p.world < 1 || *p.world > std::numeric_limits<int>::max())) {
    throw out_of_range("world", std::to_string(*p.world), "1 to " + std::to_string(std::numeric_limits<int>::max()));
  }
  const auto samples = integer("samples");
  if (samples) {
    const int64_t most = step > kMax / kMaxSamplesPerStep ? kMax : step * kMaxSamplesPerStep;
    if (*samples < step || *samples > most) {
      throw out_of_range("samples", std::to_string(*samples),
                         std::to_string(step) + " to " + std::to_string(most) + " at step " + std::to_string(step) +
                             " (each step takes at least 1 sample and fewer than 2^40)");
    }
    p.samples = *samples;
  } else {
    const int64_t w = p.world.value_or(world_now);
    if (c.batch > 0 && step > kMax / c.batch / w) {
      throw out_of_range("step", std::to_string(step), "a step whose samples (step x batch x world) fit in 64 bits");
    }
    p.samples = step * c.batch * w;
  }
  // The steps still to do must not run the position past 64 bits.
  const int64_t per_step = c.batch * world_now;
  if (c.steps > step && (kMax - p.samples) / per_step < c.steps - step) {
    throw out_of_range("samples", std::to_string(p.samples),
                       "a position that " + std::to_string(c.steps - step) + " more steps of " + std::to_string(per_step) +
                           " samples (--batch x world) take no further than 2^63 - 1");
  }
  return p;
}

std::vector<std::string> overridden_flags(const CheckpointInfo& info, const TrainConfig& c) {
  std::vector<std::string> out;
  // Integers compare, and print, exactly (a seed of 2^64 - 1 is saved as
  // the int64 -1: the same seed).
  auto check_int = [&](const char* key, const char* flag, uint64_t now) {
    const std::string* v = config_value(info, key);
    if (!v) return;
    int64_t saved = 0;
    const char* end = v->data() + v->size();
    const auto [ptr, ec] = std::from_chars(v->data(), end, saved);
    if (ec != std::errc() || ptr != end) {
      out.push_back(std::string(flag) + " " + *v + " -> " + std::to_string(now));
      return;
    }
    const bool is_seed = std::string(key) == "run.seed";
    const std::string was = is_seed ? std::to_string(static_cast<uint64_t>(saved)) : std::to_string(saved);
    const std::string is = is_seed ? std::to_string(now) : std::to_string(static_cast<int64_t>(now));
    if (was != is) out.push_back(std::string(flag) + " " + was + " -> " + is);
  };
  auto check = [&](const char* key, const char* flag, double now) {
    const std::string* v = config_value(info, key);
    if (!v) return;
    const double was = std::strtod(v->c_str(), nullptr);
    if (std::abs(was - now) > 1e-9 * std::max(1.0, std::abs(now))) {
      std::ostringstream os;
      os << flag << " " << was << " -> " << now;
      out.push_back(os.str());
    }
  };
  check("run.lr", "--lr", c.lr);
  check("run.min_lr", "--min-lr", min_learning_rate(c));
  check_int("run.warmup_steps", "--warmup-steps", static_cast<uint64_t>(warmup_steps(c)));
  check_int("run.steps", "--steps", static_cast<uint64_t>(c.steps));
  check_int("run.batch", "--batch", static_cast<uint64_t>(c.batch));
  check_int("run.seed", "--seed", c.strategy.seed());
  // Settings by name; an empty one is its default, said in words.
  auto check_text = [&](const char* key, const char* flag, const std::string& now, const char* empty) {
    const std::string* v = config_value(info, key);
    if (!v || *v == now) return;
    auto shown = [&](const std::string& x) { return x.empty() ? std::string(empty) : x; };
    out.push_back(std::string(flag) + " " + shown(*v) + " -> " + shown(now));
  };
  check_text("run.data", "--data", c.data, "(the generated corpus)");
  check_text("run.precision", "--precision", c.strategy.precision(), "");
  check_text("run.sharding_strategy", "--sharding-strategy", to_string(c.strategy.sharding_strategy()), "");
  check_text("run.state_dict_type", "--state-dict-type", to_string(c.strategy.state_dict_type()), "");
  check_text("run.mesh", "--mesh", mesh_name(c.strategy), "(none)");
  return out;
}

}  // namespace fsdp::train
