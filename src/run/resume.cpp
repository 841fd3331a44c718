// Where a resumed run continues (fsdp/run/resume.h).
#include "fsdp/run/resume.h"

#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "fsdp/distributed/rank_errors.h"
#include "fsdp/error.h"
#include "out_dir.h"
#include "fsdp/run/run_directory.h"

namespace fsdp::run {

namespace fs = std::filesystem;

namespace {

// Up to 3 problems of verify_checkpoint, "; "-joined.
std::string problems_text(const std::vector<std::string>& problems) {
  std::string out;
  for (size_t i = 0; i < problems.size() && i < 3; ++i) out += (i ? "; " : "") + problems[i];
  if (problems.size() > 3) out += "; and " + std::to_string(problems.size() - 3) + " more";
  return out;
}

}  // namespace

std::string resume_checkpoint(const RunDirectory& directory, const ResumeRequest& c, const RunIdentity& run,
                              std::vector<std::string>* set_aside) {
  auto explicit_checkpoint = [&]() -> std::string {
    const std::string& path = c.resume_from;
    CheckpointInfo info;
    try {
      info = inspect_checkpoint(path);
      c.readable(path, info);  // checked before anything is compared
    } catch (const ConfigError& e) {
      throw ConfigError("--resume-from " + path + " is not a checkpoint fsdp-train can resume: " + e.what());
    }
    if (const auto problems = verify_checkpoint(path); !problems.empty()) {
      throw ConfigError("--resume-from " + path + " is damaged: " + problems_text(problems) +
                        ": expected a checkpoint whose every checksum matches");
    }
    c.resumable(path, info);
    return path;
  };
  if (!c.resume && !c.resume_from.empty()) return explicit_checkpoint();
  for (const auto& [step, path] : directory.checkpoints()) {
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
    try {
      c.readable(path, info);  // checked before anything is compared
    } catch (const ConfigError& e) {
      std::cerr << "fsdp-train: skipping " << path << ": " << e.what() << std::endl;
      continue;
    }
    c.resumable(path, info);
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

ResumePoint resume_run(const RunDirectory& directory, const Strategy& strategy, const ResumeRequest& c,
                       const RunIdentity& run, CheckpointState& state) {
  ResumePoint point;
  const auto failure = dist::capture([&] {
    if (strategy.global_rank() == 0) point.path = resume_checkpoint(directory, c, run, &point.set_aside);
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

ResumedPosition resumed_position(const std::string& path, const std::map<std::string, CheckpointValue>& values,
                                 int64_t step, int64_t steps, int64_t batch, int world_now) {
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
  if (step < 0 || step > steps) {
    throw out_of_range("step", std::to_string(step),
                       "0 to --steps " + std::to_string(steps) +
                           (step > steps ? " (pass --steps " + std::to_string(step) + " or more to go on from it)" : ""));
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
    if (batch > 0 && step > kMax / batch / w) {
      throw out_of_range("step", std::to_string(step), "a step whose samples (step x batch x world) fit in 64 bits");
    }
    p.samples = step * batch * w;
  }
  // The steps still to do must not run the position past 64 bits.
  const int64_t per_step = batch * world_now;
  if (steps > step && (kMax - p.samples) / per_step < steps - step) {
    throw out_of_range("samples", std::to_string(p.samples),
                       "a position that " + std::to_string(steps - step) + " more steps of " + std::to_string(per_step) +
                           " samples (--batch x world) take no further than 2^63 - 1");
  }
  return p;
}

}  // namespace fsdp::run
