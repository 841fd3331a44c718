// fsdp/run/run_identity.h — who a run is (RunIdentity: its id, kept
// across resumes, and the digest of its configuration), and which
// checkpoints are its own (run_id_of, config_name: what a checkpoint
// records of it). Values only; run_start.h reads and writes them
// (run.json).
#pragma once

#include <string>

#include "fsdp/checkpoint/checkpoint_io.h"  // CheckpointInfo

namespace fsdp::run {

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

// Whether a checkpoint whose run id is `id` (run_id_of) belongs to `run`:
// the same id, or none in a directory from before run identities.
inline bool belongs_to(const std::string& id, const RunIdentity& run) {
  return id == run.id || (id.empty() && run.legacy);
}

// The name a checkpoint keeps a recorded setting `key` under:
// "config.<key>", or "<key>" in checkpoints before the config nesting; ""
// when it has none.
std::string config_name(const CheckpointInfo& info, const std::string& key);

// The run id a checkpoint records (config.run.id); "" for a checkpoint
// written before fsdp-train recorded one.
std::string run_id_of(const CheckpointInfo& info);

}  // namespace fsdp::run
