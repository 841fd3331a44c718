// src/train/run_record.h — what a checkpoint records of the run that wrote
// it, made from the run settings' table (fsdp/train/run_settings.h): the
// recorded rows' values ("config.<record>"), the configuration digest, and
// on resume the flags that differ from them. Values and text only.
#pragma once

#include <string>
#include <vector>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/train/train_config.h"
#include "fsdp/run/run_identity.h"

namespace fsdp::train {

using run::config_name;  // what a checkpoint records (fsdp/run/run_identity.h)
using run::RunIdentity;
using run::run_id_of;

// 16 hex digits (FNV-1a, 64 bits) over the recorded settings in their
// digest places: the model shape, the schedule (lr, min_lr, warm-up,
// steps), batch, seed, data, precision, sharding, checkpoint format and
// mesh, as "<label> <value>" joined by spaces (numbers with 17 digits).
// The same configuration gives the same digest in every version.
std::string config_digest(const TrainConfig& config);

// The recorded settings of `run` and its identity (run.id, run.digest) as
// values of `state` under "config.", so that a checkpoint says what it
// holds and whose it is, and a resume can say which flags it overrides.
void put_config(CheckpointState& state, const TrainConfig& run, const RunIdentity& identity);

// The flags of `config` that differ from the run settings saved in a
// checkpoint, among the settings that may change on resume ("--lr 0.003 ->
// 0.03", "--precision 32-true -> bf16-mixed"), in digest order; settings a
// checkpoint does not record give none. A resume honours each: the
// weights and optimizer state load into any sharding, format, mesh or
// precision, and the data only feeds the steps to come.
std::vector<std::string> overridden_flags(const CheckpointInfo& info, const TrainConfig& config);

// The first tensor in which a Llama of `was` (a checkpoint's) and one of
// `now` (the run's: config.json and LoRA settings) differ, by key and shape
// in transformers' order ("the checkpoint holds 'k' [2, 3] where the run's
// model has 'k' [2, 4]"); "" when their tensors agree.
std::string llama_shape_change(const models::LlamaConfig& was, const models::LlamaConfig& now);

// The settings that may not change on resume (the model's shape) and
// differ: " dim 64 (checkpoint) vs 32;" each, "" when none does.
std::string fixed_setting_changes(const CheckpointInfo& info, const TrainConfig& config);

}  // namespace fsdp::train
