// fsdp/train/model_spec.h — the model a run of fsdp-train trains, resolved
// from its settings (fsdp/train/train_config.h): a GPT of the preset's and
// the flags' sizes, or a Llama-family decoder of its config.json. One of
// the two (std::variant): a Llama's spec holds no GPT sizes, and the
// trainer builds either by std::visit. Local: model_spec reads config.json
// (and an hf: directory's weight headers); nothing here communicates.
#pragma once

#include <cstdint>
#include <string>
#include <variant>

#include "fsdp/models/gpt.h"
#include "fsdp/models/llama.h"

namespace fsdp::train {

struct TrainConfig;

// --model gpt: the byte-level GPT of --preset, with --vocab, --context,
// --dim, --layers and --heads (TrainConfig::model).
struct GptSpec {
  models::GPTConfig config;
};

// --model llama or hf:DIR: a Llama-family decoder of its config.json, with
// the run's LoRA settings. --preset, --vocab, --dim, --layers and --heads do
// not apply to it; the run's --context is the length of the sequences it
// trains on.
struct LlamaSpec {
  // DIR of --model hf:DIR (its weights are loaded into the sharded model);
  // "" for --model llama (drawn from --seed).
  std::string hf_directory;
  models::LlamaConfig config;  // config.json's, with the run's LoRA settings
};

using ModelSpec = std::variant<GptSpec, LlamaSpec>;

// [local; reads config.json] The model `config` trains. ConfigError for
// --model, --config and LoRA flags that do not fit together (the model's
// cross_setting_rules), for config.json's errors (naming the file and key),
// for an hf: directory whose weights do not match its config.json (headers
// only), and for a model this machine's memory cannot hold; rank 0 (RANK
// unset or 0) prints LoRA's warnings on stderr.
ModelSpec model_spec(const TrainConfig& config);

// The sizes of the model `config` trains, as the run settings record,
// print and digest them: the GPT's (config.model), or a Llama's
// config.json's vocabulary, width, layers and heads, with the run's
// context. [local; a Llama's reads config.json, without the checks of
// model_spec]
struct ModelSizes {
  int64_t vocab = 0, context = 0, dim = 0, layers = 0, heads = 0;
};
ModelSizes model_sizes(const TrainConfig& config);

}  // namespace fsdp::train
