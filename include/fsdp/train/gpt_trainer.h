// fsdp/train/gpt_trainer.h — the GPT trainer behind `fsdp-train`: a byte-level
// GPT trained through FSDPStrategy on a text file (or a generated corpus),
// with deterministic batches, metrics, periodic checkpoints that keep the
// last K, resume from the newest complete one, and text generation from a
// checkpoint.
#pragma once

#include <cstdint>
#include <string>

#include "fsdp/dist/process_group.h"
#include "fsdp/models/gpt.h"

namespace fsdp::train {

struct TrainConfig {
  std::string preset = "default";  // tiny, default, 100m
  models::GPTConfig model;          // filled from the preset (flags may override)
  int64_t steps = 200;
  int64_t batch = 8;                // sequences per rank per step
  double lr = 3e-3;
  std::string out = "runs/latest";  // run directory: metrics.jsonl, train.log, checkpoints/
  std::string data;                 // text file (empty: the generated corpus)
  int64_t save_every = 0;           // 0: only at the end
  int keep = 2;                     // checkpoints kept
  bool resume = false;              // continue from the newest complete checkpoint in out/checkpoints
  std::string state_dict_type = "sharded";
  std::string sharding_strategy = "FULL_SHARD";
  std::string precision = "32-true";
  bool activation_checkpointing = false;
  bool cpu_offload = false;
  uint64_t seed = 0;
  // Built sharded (EmptyInitGuard): each block gets its memory when FSDP
  // shards it, with the values an eager build from `seed` has. false: the
  // whole model is built on every rank first.
  bool empty_init = true;
  int64_t log_every = 10;
  int64_t eval_every = 50;          // held-out loss every N steps (and at the end); 0: never
  std::string mesh;                 // "R,S": HYBRID_SHARD's (replicate, shard) sizes
  bool forward_prefetch = true;  // as FSDPOptions (on; PyTorch: off)
  std::string backward_prefetch = "pre";  // pre, post, none
  bool limit_all_gathers = true;
};

// The model sizes of a preset: "tiny" (tests), "default" (a couple of minutes
// on 2 CPU cores), "100m" (~100 M parameters). ConfigError for others.
models::GPTConfig preset(const std::string& name);

// Checks what can be checked before training: heads divide dim, the data
// file exists and is not empty, the run directory is writable, numbers are
// positive. ConfigError naming the setting otherwise.
void validate(const TrainConfig& config);

// The generated corpus: deterministic English-like text (no file needed).
std::string generated_corpus(size_t bytes = 1 << 20);

// Writes `out/loss.svg`: the training loss (and held-out loss) per step, from
// out/metrics.jsonl. Returns the path.
std::string write_loss_curve(const std::string& out);

// [collective over `world`] Trains; returns the last step's mean loss. Rank 0
// prints a progress line (updated in place on a terminal), appends plain
// lines to out/train.log and one JSON object per step to out/metrics.jsonl,
// and draws out/loss.svg at the end.
double train(const TrainConfig& config, const dist::ProcessGroupPtr& world);

// [collective over `world`] Loads the model of a checkpoint written by
// train() (either format) and continues `prompt` by `tokens` bytes (top-k
// sampling from `seed`); every rank returns the same text.
std::string generate(const std::string& checkpoint, const std::string& prompt, int64_t tokens, uint64_t seed,
                     const dist::ProcessGroupPtr& world);

}  // namespace fsdp::train
