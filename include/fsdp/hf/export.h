// fsdp/hf/export.h — a checkpoint's model as a Hugging Face model directory
// that transformers' AutoModelForCausalLM.from_pretrained loads with no
// missing or unexpected keys (docs/models.md, "Weights out").
#pragma once

#include <cstdint>
#include <string>

#include "fsdp/models/llama.h"

namespace fsdp::hf {

struct ExportOptions {
  // The model's config (written as config.json, the dtype set to the
  // exported one).
  models::LlamaConfig config;
  // A directory whose generation_config.json and tokenizer files
  // (tokenizer.json, tokenizer_config.json, special_tokens_map.json,
  // tokenizer.model) are copied when present; empty: none copied, and a
  // generation_config.json made from the config's bos/eos ids.
  std::string source_dir;
  // The safetensors files' cap, as save_pretrained's max_shard_size: a
  // tensor larger than it gets a file of its own. One file: model.safetensors
  // and no index; several: model-0000i-of-0000n.safetensors and
  // model.safetensors.index.json.
  int64_t max_shard_bytes = int64_t{50} * 1000 * 1000 * 1000;  // transformers' "50GB"
  // "float32", "bfloat16", "float16"; empty: each tensor's dtype as saved.
  std::string dtype;
};

// A model with LoRA adapters (options.config.lora, as an fsdp-train
// checkpoint of a LoRA run records it) is exported merged: each targeted
// projection's weight is written as W + B A * alpha / rank, computed in
// float32 as peft's merge_and_unload does, and the adapters are not
// written; adapters missing or of another shape are a ConfigError naming
// them.
//
// [local] Writes the model of the checkpoint `checkpoint` (any format
// load_checkpoint reads, its single model entry, or a Hugging Face
// directory) as a Hugging Face directory `out_dir`: config.json,
// generation_config.json, the tokenizer's files, the weights in size-capped
// safetensors files and their index. One tensor in memory at a time. The
// model's keys are checked against `options.config` first (by key, as
// check_weights). Crash-safe and writing only its own files: everything is
// written into a new sibling directory, synced, then renamed to `out_dir`;
// ConfigError if `out_dir` exists, or is (or is inside) the checkpoint or
// the source directory.
void export_hf(const std::string& checkpoint, const std::string& out_dir, const ExportOptions& options);

// Parses a size as save_pretrained's max_shard_size does: an integer of
// bytes or a number with a unit (KB, MB, GB: powers of 1000; KiB, MiB, GiB:
// of 1024). ConfigError naming `what` otherwise.
int64_t parse_shard_size(const std::string& text, const std::string& what);

}  // namespace fsdp::hf
