// fsdp/run/run_start.h — starting a job in a run directory: the run's
// identity in run.json (read, and written by begin_run), what proves that
// this process belongs to the job that wrote it (job_token), and the
// decision begin_run makes: continue the run, start over (--overwrite), or
// refuse a directory that holds another run.
#pragma once

#include <optional>
#include <string>

#include "fsdp/strategy/strategy_base.h"
#include "fsdp/run/run_directory.h"
#include "fsdp/run/run_identity.h"

namespace fsdp::run {

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


// [local] Whether run.json records the job `job` (job_token(), not
// empty): this process is a worker of that job started again, which
// continues the run. False when run.json is absent or unreadable
// (begin() names it).
bool records_job(const RunDirectory& directory, const std::string& job);

// How a job starts in its run directory: fsdp-train's --resume /
// --resume-from (`continues`), --overwrite, and the digest of its
// configuration (RunIdentity::digest).
struct RunStart {
  bool continues = false;
  bool overwrite = false;
  std::string digest;
};

// [collective; call it with rank 0 holding RunLock] The identity of the
// run about to train, the same on every rank. Rank 0 decides:
// - start.continues: the directory's run continues
//   (a directory without run.json gets a new id, written there);
// - start.overwrite: removes what fsdp-train wrote there
//   (remove_own_files), names on stdout what it kept, and starts a new
//   run;
// - otherwise a new run, and ConfigError if the directory already holds
//   one (holds_run), saying what --resume and --overwrite would do.
// `job`: job_token() on rank 0, recorded in run.json.
RunIdentity begin_run(const RunDirectory& directory, const Strategy& strategy, const RunStart& start,
                      const std::string& job = "");

}  // namespace fsdp::run
