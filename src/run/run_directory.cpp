// The run directory's paths and the checks made before it is written
// (fsdp/run/run_directory.h).
#include "fsdp/run/run_directory.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <sstream>
#include <string>

#include "fsdp/checkpoint/checkpoint_io.h"  // inspect_checkpoint
#include "fsdp/error.h"
#include "out_dir.h"

namespace fsdp::run {

namespace fs = std::filesystem;

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

void RunDirectory::check_saves(int64_t steps, int64_t save_every, int64_t start) const {
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
                      std::to_string(save_every > 0 ? std::min(steps, (start / save_every + 1) * save_every) : steps) +
                      "): expected a directory or nothing there; move it away, or pass another --out");
  }
  check_writable_dir(root_, dir.string(), "the run's checkpoints (checkpoints/)");
  for (const auto& [step, path] : checkpoints()) {
    const bool saved_here = step > start && step <= steps && (step == steps || (save_every > 0 && step % save_every == 0));
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

}  // namespace fsdp::run
