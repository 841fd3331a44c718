// src/train/job_outputs.h — what a training job writes besides its
// checkpoints, on rank 0: metrics.jsonl, the progress line and train.log,
// the loggers and the profile of --profile-steps (loss.svg at the end is
// gpt_trainer.cpp's finish).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/observability/loggers.h"
#include "fsdp/observability/profiler.h"
#include "fsdp/run/run_directory.h"
#include "fsdp/strategy/strategy_base.h"
#include "fsdp/train/train_config.h"
#include "job_start.h"  // Start
#include "metrics.h"
#include "progress.h"

namespace fsdp::train {

// Where the job's records go (rank 0's; empty elsewhere).
struct Outputs {
  std::optional<MetricsWriter> metrics;  // metrics.jsonl
  std::optional<Progress> progress;      // the progress line and train.log
  std::vector<std::shared_ptr<Logger>> loggers;
  bool jsonl = false;  // the loss curve is drawn from metrics.jsonl
};

// [collective] Rank 0 opens the metrics (on resume, those after the
// checkpoint's step go), the log and the loggers into `out`, and gives the
// loggers the hyperparameters; its error reaches every rank.
void open_outputs(const Strategy& strategy, const RunDirectory& run, const TrainConfig& c, int64_t start,
                  Outputs& out);

// Says on rank 0 (train.log and stdout) that the world changed since the
// checkpoint the job resumed from, and how much time that cost.
void note_resize(const Strategy& strategy, Start& at, Outputs& out);

// --profile-steps: a profile of this job's share of the steps A:B, a
// Chrome trace per rank (an earlier job's trace is kept beside it).
class StepProfiler {
 public:
  StepProfiler(const Strategy& strategy, const TrainConfig& c, int64_t start);
  // Before 0-based `step`: a profile starts at its first step (or the first this job does).
  void before(int64_t step);
  // [collective while profiling] After 1-based step `done`: the profile
  // ends at its last step (or the run's). A trace that cannot be written
  // is a warning (Profiler::stop).
  void after(int64_t done, bool last);

 private:
  const Strategy& strategy_;
  std::string out_, trace_path_;
  int64_t start_;
  StepRange range_;
  Profiler profiler_;
};

}  // namespace fsdp::train
