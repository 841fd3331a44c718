// src/train/run_directory.h — fsdp-train's run directory (--out): where its
// files lie, its checkpoints (checkpoints/step-NNNNNNNN, the newest K kept),
// what a checkpoint records of the run, and where a resumed run continues.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/checkpoint_io.h"
#include "fsdp/models/gpt.h"
#include "fsdp/strategy.h"
#include "fsdp/train/gpt_trainer.h"

namespace fsdp::train {

class RunDirectory {
 public:
  explicit RunDirectory(std::string root);

  std::string metrics_path() const;                 // <root>/metrics.jsonl
  std::string log_path() const;                     // <root>/train.log
  std::string checkpoint_path(int64_t step) const;  // <root>/checkpoints/step-<step, 8 digits>

  // [local] The checkpoints in <root>/checkpoints, newest first (by the step
  // in the name); none when the folder does not exist.
  std::vector<std::pair<int64_t, std::string>> checkpoints() const;

  // [local] Where a run of `config` resumes: the newest checkpoint that
  // inspect_checkpoint reads (damaged or incomplete ones are skipped, named
  // on stderr), "" when there is none. Prints the flags of `config` that
  // differ from that checkpoint's run (overridden_flags) on stdout.
  // ConfigError when its model has another shape than config.model, naming
  // each difference.
  std::string resume_checkpoint(const TrainConfig& config) const;

  // [collective] Rank 0 chooses resume_checkpoint(config); every rank loads
  // it into `state` (strategy.load_checkpoint). Returns its path, "" when
  // there is none (state untouched). Rank 0's error is thrown on every rank,
  // with its kind.
  std::string resume(const FSDPStrategy& strategy, const TrainConfig& config, CheckpointState& state) const;

  // [collective] Saves `state` as checkpoint_path(step), then rank 0 removes
  // all but the newest `keep` checkpoints. Every rank returns after both.
  void save(const FSDPStrategy& strategy, const CheckpointState& state, int64_t step, int keep) const;

 private:
  std::string root_;
};

// The model shape and the run settings (lr, min_lr, warmup_steps, steps,
// batch, seed) of `run` as values of `state`, so that a checkpoint says what
// it holds and a resume can say which flags it overrides.
void put_config(CheckpointState& state, const TrainConfig& run);

// The model shape a checkpoint written by train() records; ConfigError
// naming `path` when it lacks one (not written by fsdp-train).
models::GPTConfig config_of(const CheckpointInfo& info, const std::string& path);

// The flags of `config` that differ from the run settings saved in a
// checkpoint ("--lr 0.003 -> 0.03"); checkpoints without them give none.
std::vector<std::string> overridden_flags(const CheckpointInfo& info, const TrainConfig& config);

}  // namespace fsdp::train
