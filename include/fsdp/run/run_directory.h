// fsdp/run/run_directory.h — fsdp-train's run directory (--out): where its
// files lie, its checkpoints (checkpoints/step-NNNNNNNN, the newest K of the
// run kept), and what is checked before anything is written there. The run
// module (fsdp/run/) has a unit per concept: the lock that keeps a second
// job out (run_lock.h), the run's identity (run_identity.h, and config.run.id
// in each checkpoint), the job's start (run_start.h: run.json, begin_run,
// records_job), where a resumed run continues (resume.h: resume_checkpoint,
// resume_run), and the rotation of its checkpoints (rotation.h:
// save_and_rotate, remove_own_files, remove_dead_temporaries). What a
// checkpoint records of the run's settings is the trainer's
// (src/train/run_record.h), which this module never sees.
//
// One job per directory: rank 0 holds RunLock for the job's lifetime, so
// nothing else writes there meanwhile; that is also what lets a save remove
// the temporary files of killed saves (no other writer is alive).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>


namespace fsdp::run {

class RunDirectory {
 public:
  explicit RunDirectory(std::string root);

  const std::string& root() const { return root_; }  // --out

  std::string metrics_path() const;                 // <root>/metrics.jsonl
  std::string log_path() const;                     // <root>/train.log
  std::string checkpoint_path(int64_t step) const;  // <root>/checkpoints/step-<step, 8 digits>
  std::string identity_path() const;                // <root>/run.json
  std::string lock_path() const;                    // <root>/.lock

  // [local] Whether the directory holds a run: run.json, metrics.jsonl,
  // train.log, loss.svg, event files, csv/, profile/, or anything in
  // checkpoints/ (other files, such as
  // a --data file kept there, and .lock do not count).
  bool holds_run() const;

  // [local; rank 0, before anything is written there] ConfigError when a
  // name that fsdp-train writes under the directory is taken by something
  // it must not write through or into: a symbolic link (--out itself may be
  // one; nothing beneath it is followed, and no link's target is touched),
  // a directory or FIFO where a file of ours belongs (run.json, its
  // temporary, metrics.jsonl, train.log, loss.svg), a file where a
  // directory of ours belongs (checkpoints, csv, profile), or a directory
  // the run cannot write into. The error names the path and what belongs
  // there.
  void check_own_names() const;

  // [local; rank 0, before step 1] What the saves of steps start+1..steps
  // (every save_every, and the last, `steps`) need: checkpoints/ a directory that
  // can be written, and no step-NNNNNNNN name of a save taken by a symbolic
  // link or by something that is not a checkpoint (a user's directory or
  // file there would be written into, or break the save at its step).
  // ConfigError naming the path and the step.
  void check_saves(int64_t steps, int64_t save_every, int64_t start) const;

  // [local] The checkpoints in <root>/checkpoints, newest first (by the step
  // in the name); none when the folder does not exist.
  std::vector<std::pair<int64_t, std::string>> checkpoints() const;


 private:
  std::string root_;
};

}  // namespace fsdp::run
