// fsdp/train/train_config.h — what a run of fsdp-train is told: TrainConfig
// (one field per flag of `fsdp-train`), the model presets, the checks made
// before training, and the learning-rate schedule. Values and local checks:
// nothing here communicates. The trainer that runs a TrainConfig is
// fsdp/train/gpt_trainer.h.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/models/gpt.h"
#include "fsdp/models/llama.h"
#include "fsdp/strategy/engine.h"
#include "fsdp/train/model_spec.h"  // ModelSpec: the model a run trains
#include "fsdp/strategy/strategy.h"

namespace fsdp::train {

// What a step whose loss is not finite does (a diverged run: NaN or inf;
// without a gradient scaler also a gradient norm that is not finite). The
// decision is the same on every rank (the loss is the mean over the ranks,
// the norm the global one). Either way the step's metrics line records
// "nonfinite": true, and the weights are not updated by it.
enum class NonfiniteLoss {
  // Stop the run with an Error naming the step and the value, before the
  // optimizer step: the weights of the last checkpoint are intact, and
  // --resume (with a lower --lr) continues from there.
  kStop,
  // Skip the optimizer step, as a GradScaler skips a step with inf
  // gradients, and go on ("skipped": true in metrics.jsonl).
  kSkip,
};
std::string to_string(NonfiniteLoss policy);      // "stop", "skip"
NonfiniteLoss parse_nonfinite_loss(const std::string& name);  // ConfigError naming the choices

struct TrainConfig {
  std::string preset = "default";  // tiny, default, 100m
  models::GPTConfig model;          // the GPT's, filled from the preset (flags may override); context: any model's
  // --model: which model the run trains. "gpt": the preset's byte-level GPT
  // (fsdp/models/gpt.h). "llama": a Llama-family decoder
  // (fsdp/models/llama.h) built from `model_config` (--config, a Hugging
  // Face config.json) and initialised from the seed. "hf:DIR": the Hugging
  // Face model directory DIR: its config.json, and its weights, loaded into
  // the sharded model with each rank reading only its shards' byte ranges
  // (fsdp/hf/hf_model.h); a resume loads the checkpoint instead. The model
  // a run trains is model_spec(config) (fsdp/train/model_spec.h): a GPT of
  // `model`, or a Llama. With a Llama, the model's sizes come from its
  // config.json (the preset and --dim, --layers, --heads, --vocab do not
  // apply: `model` keeps what they say), each decoder
  // layer is the unit (and the activation-checkpointed block), and --data
  // must hold token ids of its tokenizer (`fsdp-train prepare`).
  std::string model_source = "gpt";
  std::string model_config;  // --config: with --model llama
  // --lora-rank, --lora-alpha, --lora-targets: LoRA adapters on a Llama's
  // projections (models::LoraConfig; rank 0: full fine-tuning). The base is
  // frozen and costs no gradient or optimizer memory: --engine fsdp2 only.
  models::LoraConfig lora;
  // A Llama run's config.json as train() read it once at its start (set by
  // train(), not a flag): llama_config, model_sizes and the run's record use
  // it, so a config.json edited or removed during a run changes nothing the
  // run records, and every rank records what it built. Null: read the file.
  std::shared_ptr<const models::LlamaConfig> llama_as_read;
  // --save-hf DIR: at the end of the run, after its last checkpoint, the
  // model as a Hugging Face directory that transformers loads (export_hf:
  // config.json, generation_config.json, the tokenizer's files of an hf:
  // source, safetensors in its dtype as loaded), or with LoRA the adapters
  // as PEFT's (save_peft_adapter). DIR must not exist; a run refuses to
  // start otherwise. Empty: none.
  std::string save_hf;
  int64_t steps = 200;
  int64_t batch = 8;                // sequences per rank per step
  // AdamW (betas 0.9, 0.95) with nanoGPT's schedule: linear warm-up to lr
  // over the first warmup_steps steps, then cosine decay to min_lr at
  // `steps`. On --resume these settings apply from the resumed step on (an
  // override of the run's earlier values, which the trainer reports).
  double lr = 3e-3;
  int64_t warmup_steps = -1;  // -1: a fifth of `steps`; other negatives are refused
  double min_lr = -1;         // -1: lr / 10; other negatives are refused
  NonfiniteLoss on_nonfinite_loss = NonfiniteLoss::kStop;
  std::string out = "runs/latest";  // run directory: metrics.jsonl, train.log, checkpoints/ (not / or $HOME)
  std::string data;                 // data file, memory-mapped (empty: the generated corpus)
  // How `data` holds its tokens (fsdp/train/batches.h): "text" (its bytes),
  // "uint16" or "uint32" (raw little-endian ids, nanoGPT's .bin), "auto"
  // (llm.c's format when the file starts with its magic, read by its header;
  // anything else text). Ids at or beyond model.vocab_size (--vocab, 256 by
  // default: bytes) stop the run at the first batch that holds one.
  std::string data_format = "auto";
  int64_t save_every = 0;           // 0: only at the end
  int keep = 2;                     // checkpoints kept
  // One run per directory (docs/reliability.md). A run that starts fresh
  // into a directory that already holds a run is refused unless it says
  // what to do: resume = continue the directory's run from its newest
  // checkpoint that verifies (a damaged one is set aside, loudly; another
  // run's checkpoint is never taken); overwrite = start over, removing what
  // fsdp-train wrote there (RunDirectory::begin: its own files and the
  // checkpoints of the directory's run; anything else stays, named); resume_from = continue from that checkpoint
  // (any run's). With resume too (as after an fsdp-run restart, which sets
  // resume), resume_from is taken only while the directory has no
  // checkpoint of its own run yet.
  bool resume = false;
  std::string resume_from;
  bool overwrite = false;
  // A resume from a checkpoint whose --data was the same path refuses
  // (ConfigError) when the file's contents changed since (its size and
  // sampled pages: Corpus::fingerprint, kept in each checkpoint as
  // "data_fingerprint"); allow_data_change (--allow-data-change) accepts it
  // on purpose and says so.
  bool allow_data_change = false;
  // A --model hf:DIR run whose --data records the tokenizer `prepare` used
  // (its fingerprint in llm.c's header) refuses (ConfigError) a file
  // prepared with another tokenizer than DIR's, naming what differs;
  // allow_tokenizer_change (--allow-tokenizer-change) accepts it on purpose
  // and says so.
  bool allow_tokenizer_change = false;
  // The strategy the run trains under, with the strategy's own defaults
  // (fsdp/strategy/strategy.h, whose FSDP settings default to FSDPOptions'):
  // --state-dict-type, --sharding-strategy, --precision, --cpu-offload,
  // --seed (the data's and the initialisation's), --activation-checkpointing
  // (activation_checkpointing_module_types<GPTBlock>), --mesh R,S
  // (HYBRID_SHARD on device_mesh(R, S)), --[no-]forward-prefetch,
  // --backward-prefetch, --no-limit-all-gathers. The trainer adds what it
  // owns: the GPT block as the unit, the world group, the loggers.
  FSDPStrategyOptions strategy;
  // --engine: fsdp1 (FullyShardedDataParallel, the default) or fsdp2
  // (fully_shard on each block, then the root: fsdp/fsdp2/fully_shard.h).
  // The run trains under make_strategy(engine, strategy)
  // (fsdp/strategy/engine.h): with fsdp2 the strategy's fully_shard form
  // (ModelParallelStrategy): FULL_SHARD reshards after forward, SHARD_GRAD_OP
  // does not, HYBRID_SHARD (--mesh) shards on a 2-D mesh; bf16-mixed computes
  // in bfloat16 and reduces in float32 (torch's MixedPrecisionPolicy).
  // NO_SHARD and the other precisions have no fully_shard form here: refused. The
  // checkpoints of both engines load into either, so a --resume may switch.
  Engine engine = Engine::kFsdp1;
  // Built sharded (EmptyInitGuard): each block gets its memory when FSDP
  // shards it, with the values an eager build from `seed` has. false: the
  // whole model is built on every rank first.
  bool empty_init = true;
  int64_t log_every = 10;
  // Held-out loss every N steps (and at the end); 0: never. None either,
  // said once, when the text is too short to hold any out
  // (min_bytes_to_hold_out).
  int64_t eval_every = 50;
  // Which loggers get the run's metrics (comma-separated): "tensorboard"
  // (event files in `out`, for `tensorboard --logdir`), "csv"
  // (out/csv/version_N/metrics.csv and hparams.yaml, a version per job),
  // "jsonl" (out/metrics.jsonl, every step; the loss curve and the run's
  // record of resizes and gaps come from it). TensorBoard and CSV get the
  // scalars (StepMetrics::scalars) every log_every steps, at held-out
  // evaluations and at the last step, and the configuration as
  // hyperparameters (TensorBoard's HPARAMS view keeps a run's first job's;
  // a resume lists the flags it changes in train.log).
  std::string loggers = "tensorboard,jsonl";
  // "A:B": record steps A to B with LibTorch's profiler (Kineto), a Chrome
  // trace per rank in out/profile/rank_<r>.pt.trace.json (fsdp/observability/profiler.h);
  // a later job of the run (a resume) keeps that and writes
  // rank_<r>.<n>.pt.trace.json, the first free n. A trace that cannot be
  // written is a warning. Empty: no profiling.
  std::string profile_steps;
};

// Which of TrainConfig::loggers are on; ConfigError naming an unknown one.
struct LoggerChoice {
  bool tensorboard = false, csv = false, jsonl = false;
};
LoggerChoice chosen_loggers(const std::string& names);

// The model of a Llama run (--model llama or hf:DIR): its config.json
// (models::read_llama_config: errors name the file and key; or
// config.llama_as_read once train() read it) with the run's LoRA settings;
// ConfigError for a GPT run.
models::LlamaConfig llama_config(const TrainConfig& config);

// Whether `config` trains a Llama (--model llama or hf:DIR).
bool trains_llama(const TrainConfig& config);

// The DIR of --model hf:DIR; "" for the other models.
std::string hf_directory(const TrainConfig& config);

// Deprecated (kept for one release): model_spec (fsdp/train/model_spec.h)
// gives the model a run trains without changing its config, and the run
// settings print and record a Llama's own sizes (model_sizes). [local;
// reads config.json] As model_spec; for a Llama run also sets config.model's
// vocab, dim, layers and heads to its config.json's and returns its
// llama_config. Nothing for a GPT run.
std::optional<models::LlamaConfig> resolve_model(TrainConfig& config);

// The model sizes of a preset: "tiny" (tests), "default" (a couple of minutes
// on 2 CPU cores), "100m" (~100 M parameters). ConfigError for others.
models::GPTConfig preset(const std::string& name);

// Checks what can be checked before training: heads divide dim, the data
// file exists, is not empty, its format (--data-format; llm.c's header)
// holds and its tokens hold a sample, the run directory is writable, numbers are
// positive, overwrite is not combined with resume, resume_from exists and
// (with overwrite) lies outside the run directory. ConfigError naming the
// setting otherwise.
void validate(const TrainConfig& config);

// validate's checks that write nothing (all but the run directory's
// creation and write test), with the same errors: what
// `fsdp-train --print-config` checks before it prints. First each run
// setting's own check (its row's, fsdp/train/run_settings.h, in the table's
// order), then each of cross_setting_rules.
void validate_settings(const TrainConfig& config);

// A rule between settings: one setting's value limits another's ("--min-lr
// at most --lr"). `name` says which settings; `check` throws ConfigError
// naming the flags (and reads the files they name: --data, --save-hf).
struct CrossSettingRule {
  const char* name;
  void (*check)(const TrainConfig& config);
};
// The rules between settings, in the order validate_settings checks them;
// model_spec checks the first four (the model's) before it reads a
// config.json.
const std::vector<CrossSettingRule>& cross_setting_rules();

// `config` as one JSON object (`fsdp-train --print-config`): the run's
// settings, the model's sizes, and under "strategy" the strategy's and its
// FSDP options' settings, each by its flag's or option's name: each row of
// the run settings' table (fsdp/train/run_settings.h), in its order.
std::string config_json(const TrainConfig& config);

// --mesh "R,S" as (R, S): HYBRID_SHARD's replicate and shard sizes, both
// positive. ConfigError naming --mesh otherwise.
std::pair<int, int> parse_mesh(const std::string& mesh);
// The strategy's device mesh as --mesh writes it, "R,S" ("" when unset).
std::string mesh_name(const FSDPStrategyOptions& strategy);
// Whether the strategy checkpoints activations (an activation checkpointing
// policy is set).
bool activation_checkpointing(const FSDPStrategyOptions& strategy);

// The warm-up steps of `config` (its warmup_steps, or a fifth of its steps)
// and its final learning rate (its min_lr, or a tenth of its lr).
int64_t warmup_steps(const TrainConfig& config);
double min_learning_rate(const TrainConfig& config);

// The learning rate of 0-based `step` under `config`'s schedule.
double learning_rate(const TrainConfig& config, int64_t step);

// [local] The model configuration a checkpoint written by train() records
// (config.model.*: vocab, context, dim, layers, heads; `info` from
// inspect_checkpoint(path)), checked before anything is built from it: each
// an int from 1 to 2^31, heads dividing dim, and the model entry's tensors
// exactly those the configuration implies (models::gpt_state_shapes), same
// keys and shapes. ConfigError naming `path` and the first disagreement, or
// saying the checkpoint was not written by fsdp-train. generate, resume and
// `fsdp-ckpt verify` (for fsdp-train's checkpoints) check through it.
// A checkpoint of a Llama run is a ConfigError here, naming it
// (checkpoint_model takes both).
models::GPTConfig checkpoint_model_config(const CheckpointInfo& info, const std::string& path);

// The model a checkpoint written by train() holds.
struct CheckpointModel {
  std::string source = "gpt";  // its run's --model ("gpt" in checkpoints from before --model)
  models::GPTConfig gpt;       // the GPT's sizes (source "gpt")
  // A Llama run's model: the config.json the checkpoint records
  // ("config.model.llama") with its run's LoRA settings.
  std::optional<models::LlamaConfig> llama;
};

// [local] As checkpoint_model_config, for either kind: a Llama's recorded
// config.json is parsed (models::parse_llama_config's errors, naming the
// checkpoint and the value) with its LoRA settings (config.model.lora_*, checked
// as models::check_lora), and the model entry's tensors must be exactly
// those of llama_state_shapes and llama_adapter_shapes (a missing, extra or
// misshapen one named). generate, resume and `fsdp-ckpt verify` check
// through it.
CheckpointModel checkpoint_model(const CheckpointInfo& info, const std::string& path);

}  // namespace fsdp::train
