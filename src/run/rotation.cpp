// The rotation of a run's checkpoints: saving, pruning to the newest K,
// and removing what a killed save or --overwrite leaves
// (fsdp/run/rotation.h: save_and_rotate, remove_own_files, remove_dead_temporaries).
#include "fsdp/run/rotation.h"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <regex>
#include <string>
#include <vector>

#include "fsdp/error.h"
#include "out_dir.h"

namespace fsdp::run {

namespace fs = std::filesystem;

std::vector<std::string> remove_dead_temporaries(const RunDirectory& directory) {
  std::vector<std::string> removed;
  const fs::path dir = fs::path(directory.root()) / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return removed;
  // Every writer names its temporary "<final name>.tmp-<save id>"
  // (src/formats/files/files.cpp, AtomicFile); none is alive: the caller holds
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

std::vector<std::string> remove_own_files(const RunDirectory& directory, const std::optional<RunIdentity>& had) {
  std::vector<std::string> kept;
  std::error_code ec;
  // run.json first: a restart after a kill in between never takes the old run for its own.
  for (const char* name : {"run.json", "metrics.jsonl", "train.log", "loss.svg"}) {
    const fs::path p = fs::path(directory.root()) / name;
    const auto st = fs::symlink_status(p, ec);
    if (!fs::exists(st)) continue;
    if (fs::is_regular_file(st)) {
      fs::remove(p);
    } else {
      kept.push_back(p.string() + " (not a regular file)");
    }
  }
  const fs::path dir = fs::path(directory.root()) / "checkpoints";
  if (fs::is_directory(dir, ec) && !fs::is_symlink(dir, ec)) {
    remove_dead_temporaries(directory);  // the writer's own temporaries (step-*.tmp-*)
    // Which run is the directory's: run.json's; without one, the checkpoints
    // that record no run id (written before run identities) are its.
    RunIdentity run;
    run.legacy = true;
    if (had) run = *had;
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
  for (const auto& e : fs::directory_iterator(directory.root())) {
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
      fs::path(directory.root()) / "csv", [](const std::string& n) { return n == "metrics.csv" || n == "hparams.yaml"; }, 1,
      remove_tree_of);
  remove_tree_of(
      fs::path(directory.root()) / "profile",
      [](const std::string& n) {
        return n.rfind("rank_", 0) == 0 && n.size() > 14 && n.compare(n.size() - 14, 14, ".pt.trace.json") == 0;
      },
      0, remove_tree_of);
  // The rest of the directory was never fsdp-train's.
  for (const auto& e : fs::directory_iterator(directory.root())) {
    const std::string name = e.path().filename().string();
    if (name == "csv" || name == "profile") continue;  // named above, file by file
    if (name != "checkpoints" && name != ".lock" && name != ".write-test") kept.push_back(e.path().string());
  }
  std::sort(kept.begin(), kept.end());
  kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
  return kept;
}

void save_and_rotate(const RunDirectory& directory, const Strategy& strategy, const CheckpointState& state,
                     int64_t step, int keep, const RunIdentity& run) {
  const std::string path = directory.checkpoint_path(step);
  if (strategy.global_rank() == 0) {
    fs::create_directories(fs::path(path).parent_path());
    for (const auto& dead : remove_dead_temporaries(directory)) {
      std::cerr << "fsdp-train: removed " << dead << ", left by a save that was killed" << std::endl;
    }
  }
  strategy.barrier();
  strategy.save_checkpoint(path, state);
  if (strategy.global_rank() == 0) {
    int kept = 0;
    for (const auto& [s, p] : directory.checkpoints()) {
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

}  // namespace fsdp::run
