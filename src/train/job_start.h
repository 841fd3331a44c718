// src/train/job_start.h — how a training job of fsdp-train starts, before its
// first step: in its run directory (the lock, the run's identity:
// fsdp/run/), on its data (every rank reads the same text), and from the
// checkpoint a resume continues (fsdp/run/resume.h, with fsdp-train's
// checks of it). Each call is a collective over the strategy's group.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <torch/optim/optimizer.h>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/run/resume.h"
#include "fsdp/run/run_directory.h"
#include "fsdp/run/run_identity.h"
#include "fsdp/run/run_lock.h"
#include "fsdp/strategy/strategy_base.h"
#include "fsdp/train/batches.h"
#include "fsdp/train/train_config.h"
#include "metrics.h"  // StepMetrics::Resize
#include "step.h"     // Model

namespace fsdp::train {

using run::ResumePoint;
using run::RunDirectory;
using run::RunIdentity;
using run::RunLock;

// What a checkpoint of the run holds at `step` (the steps done); what a
// resume loads. A save adds the sample stream's position ("samples") and
// the world size ("world"); a resume finds them among the values it did not
// ask for (ResumePoint::values), absent in checkpoints from before them.
CheckpointState run_state(const Model& model, torch::optim::Optimizer& opt, int64_t step);

// [collective] Starts the job in the run directory: agrees whether it
// continues the run (then sets c.resume, clears c.overwrite), takes the
// lock on rank 0 (held in `lock` until train() returns: one job per run
// directory), and returns the run's identity (run::begin_run).
// Continuing is any rank's --resume, or a restart of the job that wrote
// run.json, which rank 0 proves (job_token: the launcher's restart count
// alone proves nothing, and torchrun restarts the nodes of an elastic job
// with different counts). A restart repeats the command line: it continues
// the run even with --overwrite, and takes the run's own newest checkpoint
// over --resume-from's.
RunIdentity begin_job(const Strategy& strategy, const RunDirectory& run, TrainConfig& c,
                      std::optional<RunLock>& lock);

// The run's batches and what a checkpoint keeps of its text.
struct RunData {
  std::optional<BatchSampler> batches;
  std::string fingerprint;  // Corpus::fingerprint: into each checkpoint; a resume compares it
  std::string format;       // DataLayout::format: into each checkpoint; a resume compares it
  bool evaluates = false;   // a held-out loss is computed
};

// [collective] Reads the run's text on every rank (a file one rank cannot
// map stops every rank with its error, not a hang) and says so when it is
// too short to hold any text out. Token ids at or beyond `vocab_size` (the
// model's vocabulary) stop the run at the first batch that holds one.
void read_data(const Strategy& strategy, const TrainConfig& c, int64_t vocab_size, RunData& d);

// Where this job starts: the step done, the sample stream's position, the
// checkpoint it resumed from (empty path: none), and the resize, if the
// world changed since that checkpoint.
struct Start {
  int64_t step = 0, position = 0;
  ResumePoint from;
  std::optional<StepMetrics::Resize> resized;
};

// [collective] With --resume or --resume-from: loads the checkpoint the run
// continues from into `model` and `opt` and checks its values against `c`
// (the same values, and so the same error, on every rank): its model's
// shape, the flags it overrides (printed), its position, and that --data
// did not change under it.
Start resume_job(const Strategy& strategy, const RunDirectory& run, const TrainConfig& c,
                 const RunIdentity& identity, Model& model, torch::optim::Optimizer& opt, const RunData& data);

}  // namespace fsdp::train
