// fsdp/run/resume.h — where a resumed run continues: the checkpoint it
// takes (resume_checkpoint, resume_run) and the position of its sample
// stream, each value checked against the run's settings.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/strategy/strategy_base.h"
#include "fsdp/run/run_directory.h"
#include "fsdp/run/run_identity.h"

namespace fsdp::run {

// Where a resumed run continues (empty path: from scratch), the damaged
// checkpoints set aside on the way (rank 0 only), the checkpoint's values
// beyond those loaded (every rank), and when it was committed (rank 0 only:
// the newest modification time of its files).
struct ResumePoint {
  std::string path;
  std::vector<std::string> set_aside;
  std::map<std::string, CheckpointValue> values;
  std::chrono::system_clock::time_point committed_at;
};

// Where a resumed run continues, from the values its checkpoint records:
// the step done, the sample stream's position, and the world it was saved
// at (none in checkpoints from before it was kept).
struct ResumedPosition {
  int64_t step = 0;
  int64_t samples = 0;
  std::optional<int64_t> world;
};

// [local] The values of the checkpoint `path` that a resume continues from
// (`values`: ResumePoint::values; `step`: its "step"), each checked against
// the run's settings (`steps` to train, `batch` samples per rank per step)
// before anything trains: 0 <= step <= steps;
// 1 <= world <= 2^31 - 1; step <= samples <= step * 2^40 (every step takes
// at least one sample, and no step takes 2^40), and the samples of the
// steps still to do (batch x `world_now` each) fit in 64 bits. A value of
// another type is refused as well. ConfigError naming the checkpoint, the
// value and the range expected. A checkpoint without "samples" (from before
// they were kept) continues at step * batch * its world (or `world_now`).
ResumedPosition resumed_position(const std::string& path, const std::map<std::string, CheckpointValue>& values,
                                 int64_t step, int64_t steps, int64_t batch, int world_now);

// What a job asks to resume (fsdp-train's --resume and --resume-from), and
// how the program checks a candidate checkpoint.
struct ResumeRequest {
  bool resume = false;      // continue the directory's own run
  std::string resume_from;  // continue from this checkpoint (any run's)
  // ConfigError when the checkpoint `path` (`info`) is not one the program
  // can resume (its model configuration is not readable): a candidate of
  // the directory's is skipped, named; resume_from is refused.
  std::function<void(const std::string& path, const CheckpointInfo& info)> readable;
  // ConfigError when the run may not continue from `path` (another model
  // shape, naming each difference); may print the flags a resume
  // overrides. Called once, on the checkpoint chosen.
  std::function<void(const std::string& path, const CheckpointInfo& info)> resumable;
};


// [local] Where run `run` resumes under `request`: the newest of its own
// checkpoints in checkpoints/ that verifies (verify_checkpoint: every
// checksum). Checkpoints of another run (another config.run.id, or none
// in a directory with run.json) are never taken: each is named on stderr
// ("--resume-from it to continue it"). Incomplete ones (killed saves) are
// skipped, named. A damaged one (it fails inspection or verification) is
// named on stderr with its problems and renamed
// step-NNNNNNNN.damaged-<UTC time> (kept for a post-mortem; no longer a
// checkpoint to resume or prune), and the next older one is tried; its
// path goes to `set_aside`. With request.resume_from, that checkpoint when
// the directory has none of the run's own (a restart after the run's
// first checkpoint takes its own); it alone without request.resume. ""
// when there is none. ConfigError from request.resumable for the one
// chosen, or when request.resume_from is not a readable checkpoint.
std::string resume_checkpoint(const RunDirectory& directory, const ResumeRequest& request, const RunIdentity& run,
                              std::vector<std::string>* set_aside = nullptr);

// [collective] Rank 0 chooses resume_checkpoint(request, run); every rank
// loads it into `state` (strategy.load_checkpoint). Its path is empty when
// there is none (state untouched). Rank 0's error is thrown on every rank,
// with its kind.
ResumePoint resume_run(const RunDirectory& directory, const Strategy& strategy, const ResumeRequest& request,
                       const RunIdentity& run, CheckpointState& state);

}  // namespace fsdp::run
