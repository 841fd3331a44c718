// src/train/run_directory.h — fsdp-train's run directory (--out): where its
// files lie, its checkpoints (checkpoints/step-NNNNNNNN, the newest K of the
// run kept), the lock that keeps a second job out (.lock), the run's
// identity (run.json, and config.run.id in each checkpoint), what a
// checkpoint records of the run, and where a resumed run continues.
//
// One job per directory: rank 0 holds RunLock for the job's lifetime, so
// nothing else writes there meanwhile; that is also what lets a save remove
// the temporary files of killed saves (no other writer is alive).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/models/gpt.h"
#include "fsdp/strategy/strategy.h"
#include "fsdp/train/train_config.h"

namespace fsdp::train {

// An exclusive lock on a run directory, held from construction to
// destruction: flock(2) on <root>/.lock, a file that names its holder
// ("host <name> pid <pid> since <UTC time>"). The kernel releases the lock
// when the holding process ends, however it ends (a restart by fsdp-run
// takes it again); the file itself stays. flock works across machines on
// NFS (Linux maps it to NFS byte-range locks). fsdp-train takes it on rank 0
// only: every job writing a run directory has a rank 0, so a second job's
// rank 0 fails. Move-only.
class RunLock {
 public:
  // ConfigError naming the directory and the holder's host and pid when
  // another process (or another RunLock of this one) holds it; Error when
  // the lock file cannot be opened.
  explicit RunLock(const std::string& root);
  ~RunLock();
  RunLock(RunLock&& other) noexcept;
  RunLock& operator=(RunLock&&) = delete;
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

// Who a run is: a random id given when the run starts (kept across resumes
// and restarts), and a digest of the configuration it started with
// (config_digest). In <root>/run.json and in each checkpoint
// (config.run.id, config.run.digest).
struct RunIdentity {
  std::string id;
  std::string digest;  // of the configuration of this job (a resume may change flags)
  // The directory was written before run identities (a --resume adopted
  // it: run.json's "legacy_checkpoints"); its checkpoints without a run id
  // count as the run's.
  bool legacy = false;
  // The job that writes it (job_token(); run.json's "job"), empty when its
  // launcher gives no proof of one. A worker that the same job starts again
  // continues the run (RunDirectory::records_job).
  std::string job;
};

// [local; rank 0] What proves that this process belongs to the job that
// started it, across that job's restarts and in no other job; "" when
// nothing does. A restart repeats the command line, so only this tells a
// restart (which continues the run, --overwrite or not) from a new job
// (which starts over with --overwrite), and the launcher's run id does
// not: torchrun's is "none" for every job of the static rendezvous
// (--master-port, --rdzv-backend static), and a user may reuse --rdzv-id.
// - torchrun (its whole environment: TORCHELASTIC_RUN_ID,
//   TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, MASTER_ADDR,
//   MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=True): a random token kept in
//   the agent's store (key "fsdp-train/job"), set by the job's first start
//   and read by its restarts: the store lives as long as the job's agents,
//   and a new job's agent serves a new, empty one. "torchrun <token>".
// - fsdp-run (TORCHELASTIC_RESTART_COUNT and TORCHELASTIC_MAX_RESTARTS
//   without TORCHELASTIC_RUN_ID): the fsdp-run process that restarts its
//   workers, the parent of this one (its pid and start time on this host).
//   "fsdp-run <host> <pid> <start>".
// A leaked TORCHELASTIC_RESTART_COUNT without the rest proves nothing.
std::string job_token();

// 16 hex digits over the settings that make a run what it is: the model
// shape, the schedule (lr, min_lr, warm-up, steps), batch, seed, data,
// precision, sharding, checkpoint format and mesh.
std::string config_digest(const TrainConfig& config);

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

class RunDirectory {
 public:
  explicit RunDirectory(std::string root);

  std::string metrics_path() const;                 // <root>/metrics.jsonl
  std::string log_path() const;                     // <root>/train.log
  std::string checkpoint_path(int64_t step) const;  // <root>/checkpoints/step-<step, 8 digits>
  std::string identity_path() const;                // <root>/run.json
  std::string lock_path() const;                    // <root>/.lock

  // [local] The run recorded in run.json; none when there is no run.json.
  // ConfigError naming the file when it is not what begin() writes.
  std::optional<RunIdentity> identity() const;

  // [local] Whether run.json records the job `job` (job_token(), not
  // empty): this process is a worker of that job started again, which
  // continues the run. False when run.json is absent or unreadable
  // (begin() names it).
  bool records_job(const std::string& job) const;

  // [local] Whether the directory holds a run: run.json, metrics.jsonl,
  // train.log, loss.svg, event files, csv/, profile/, or anything in
  // checkpoints/ (other files, such as
  // a --data file kept there, and .lock do not count).
  bool holds_run() const;

  // [collective; call it with rank 0 holding RunLock] The identity of the
  // run about to train, the same on every rank. Rank 0 decides:
  // - config.resume or config.resume_from: the directory's run continues
  //   (a directory without run.json gets a new id, written there);
  // - config.overwrite: removes what fsdp-train wrote there
  //   (remove_own_files), names on stdout what it kept, and starts a new
  //   run;
  // - otherwise a new run, and ConfigError if the directory already holds
  //   one (holds_run), saying what --resume and --overwrite would do.
  // `job`: job_token() on rank 0, recorded in run.json.
  RunIdentity begin(const FSDPStrategy& strategy, const TrainConfig& config, const std::string& job = "") const;

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
  // (every save_every, and the last) need: checkpoints/ a directory that
  // can be written, and no step-NNNNNNNN name of a save taken by a symbolic
  // link or by something that is not a checkpoint (a user's directory or
  // file there would be written into, or break the save at its step).
  // ConfigError naming the path and the step.
  void check_saves(const TrainConfig& config, int64_t start) const;

  // [local] The checkpoints in <root>/checkpoints, newest first (by the step
  // in the name); none when the folder does not exist.
  std::vector<std::pair<int64_t, std::string>> checkpoints() const;

  // [local] Where run `run` of `config` resumes: the newest of its own
  // checkpoints in checkpoints/ that verifies (verify_checkpoint: every
  // checksum). Checkpoints of another run (another config.run.id, or none
  // in a directory with run.json) are never taken: each is named on stderr
  // ("--resume-from it to continue it"). Incomplete ones (killed saves) are
  // skipped, named. A damaged one (it fails inspection or verification) is
  // named on stderr with its problems and renamed
  // step-NNNNNNNN.damaged-<UTC time> (kept for a post-mortem; no longer a
  // checkpoint to resume or prune), and the next older one is tried; its
  // path goes to `set_aside`. With config.resume_from, that checkpoint when
  // the directory has none of the run's own (a restart after the run's
  // first checkpoint takes its own). "" when there is none. Prints the flags
  // of `config` that differ from the chosen checkpoint's run
  // (overridden_flags) on stdout. ConfigError when its model has another
  // shape than config.model, naming each difference, or when
  // config.resume_from is not a readable checkpoint.
  std::string resume_checkpoint(const TrainConfig& config, const RunIdentity& run,
                                std::vector<std::string>* set_aside = nullptr) const;

  // [collective] Rank 0 chooses resume_checkpoint(config, run); every rank
  // loads it into `state` (strategy.load_checkpoint). Its path is empty when
  // there is none (state untouched). Rank 0's error is thrown on every rank,
  // with its kind.
  ResumePoint resume(const FSDPStrategy& strategy, const TrainConfig& config, const RunIdentity& run,
                     CheckpointState& state) const;

  // [collective; rank 0 holding RunLock] Rank 0 first removes the
  // temporary files of killed saves (remove_dead_temporaries), then `state`
  // is saved as checkpoint_path(step), then rank 0 removes all but the
  // newest `keep` checkpoints of `run` (and incomplete ones older than
  // `step`); another run's checkpoints stay. Every rank returns after all.
  void save(const FSDPStrategy& strategy, const CheckpointState& state, int64_t step, int keep,
            const RunIdentity& run) const;

  // [local; only while holding RunLock] What --overwrite removes: run.json,
  // metrics.jsonl, train.log, loss.svg and the loggers' files
  // (events.out.tfevents.*, csv/version_N/{metrics.csv,hparams.yaml},
  // profile/rank_N.pt.trace.json) (regular files only), the
  // temporaries of killed saves, and the checkpoints in checkpoints/ that
  // inspect as the run's own (the run id of `had`, the directory's run.json;
  // without one, those written by fsdp-train before run identities, which
  // record none). Anything else stays: other runs' checkpoints, incomplete
  // or unreadable ones, files fsdp-train never writes (a user's
  // checkpoints/my_model/weights.bin). Returns the paths it kept, sorted.
  std::vector<std::string> remove_own_files(const std::optional<RunIdentity>& had) const;

  // [local; only while holding RunLock] Removes what killed saves left:
  // checkpoints/step-*.tmp-* (a full save's file) and *.tmp-* files inside
  // checkpoints/step-*/ (a sharded save's). No save of this job may be in
  // flight. Returns the paths removed.
  std::vector<std::string> remove_dead_temporaries() const;

 private:
  std::string root_;
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
// the run's settings before anything trains: 0 <= step <= config.steps;
// 1 <= world <= 2^31 - 1; step <= samples <= step * 2^40 (every step takes
// at least one sample, and no step takes 2^40), and the samples of the
// steps still to do (batch x `world_now` each) fit in 64 bits. A value of
// another type is refused as well. ConfigError naming the checkpoint, the
// value and the range expected. A checkpoint without "samples" (from before
// they were kept) continues at step * batch * its world (or `world_now`).
ResumedPosition resumed_position(const std::string& path, const std::map<std::string, CheckpointValue>& values,
                                 int64_t step, const TrainConfig& config, int world_now);

// The model shape, the run settings (lr, min_lr, warmup_steps, steps,
// batch, seed, data, precision, sharding_strategy, state_dict_type, mesh)
// of `run` and its identity (run.id, run.digest) as values of
// `state` under "config.", so that a checkpoint says what it holds and
// whose it is, and a resume can say which flags it overrides.
void put_config(CheckpointState& state, const TrainConfig& run, const RunIdentity& identity);

// The run id a checkpoint records (config.run.id); "" for a checkpoint
// written before fsdp-train recorded one.
std::string run_id_of(const CheckpointInfo& info);

// The flags of `config` that differ from the run settings saved in a
// checkpoint ("--lr 0.003 -> 0.03", "--precision 32-true -> bf16-mixed");
// settings a checkpoint does not record give none. A resume honours each:
// the weights and optimizer state load into any sharding, format, mesh or
// precision, and the data only feeds the steps to come.
std::vector<std::string> overridden_flags(const CheckpointInfo& info, const TrainConfig& config);

}  // namespace fsdp::train
