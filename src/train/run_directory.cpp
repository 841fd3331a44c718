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
#include <map>
#include <iostream>
#include <random>
#include <sstream>

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

}  // namespace

RunLock::RunLock(const std::string& root) {
  const std::string path = (fs::path(root) / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int err = errno;
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
  if (!id.job.empty()) j["torchelastic_run_id"] = id.job;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(1) << "\n";
    if (!out.flush()) throw Error("--out: cannot write " + tmp);
  }
  fs::rename(tmp, path);  // whole or not at all
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
  if (!fs::exists(path, ec)) return std::nullopt;
  if (!fs::is_regular_file(path, ec)) throw ConfigError(path + " is not a regular file; refusing to read it");
  std::ifstream in(path);
  try {
    const Json j = Json::parse(in);
    RunIdentity id;
    id.id = j.at("run_id").get<std::string>();
    id.digest = j.at("config_digest").get<std::string>();
    id.legacy = j.value("legacy_checkpoints", false);
    id.job = j.value("torchelastic_run_id", std::string());
    if (id.id.empty()) throw std::invalid_argument("empty run_id");
    return id;
  } catch (const std::exception& e) {
    throw ConfigError("--out " + root_ + ": " + path + " is not the run identity fsdp-train writes (" + e.what() +
                      "): expected a JSON object with \"run_id\" and \"config_digest\" strings; --overwrite "
                      "starts a new run there");
  }
}

std::string torchrun_job() {
  const char* job = std::getenv("TORCHELASTIC_RUN_ID");
  return job != nullptr ? job : "";
}

bool RunDirectory::records_torchrun_job() const {
  if (torchrun_job().empty()) return false;
  try {
    const auto had = identity();
    return had && had->job == torchrun_job();
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

RunIdentity RunDirectory::begin(const FSDPStrategy& strategy, const TrainConfig& c) const {
  RunIdentity id;
  const auto failure = dist::capture([&] {
    if (strategy.global_rank() != 0) return;
    id = RunIdentity{new_run_id(), config_digest(c)};
    id.job = torchrun_job();
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
  // (src/checkpoint/files.cpp, AtomicFile); none is alive: the caller holds the lock.
  auto temporary = [](const fs::path& p) { return p.filename().string().find(".tmp-") != std::string::npos; };
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0) continue;
    if (temporary(e.path())) {
      fs::remove_all(e.path());
      removed.push_back(e.path().string());
    } else if (e.is_directory(ec)) {
      for (const auto& f : fs::directory_iterator(e.path())) {
        if (temporary(f.path()) && !f.is_directory(ec)) {
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
        if (s < step && incomplete(p)) fs::remove_all(p);  // a killed save of this job's run (the lock)
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

std::vector<std::string> overridden_flags(const CheckpointInfo& info, const TrainConfig& c) {
  std::vector<std::string> out;
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
  check("run.warmup_steps", "--warmup-steps", static_cast<double>(warmup_steps(c)));
  check("run.steps", "--steps", static_cast<double>(c.steps));
  check("run.batch", "--batch", static_cast<double>(c.batch));
  check("run.seed", "--seed", static_cast<double>(c.strategy.seed()));
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
