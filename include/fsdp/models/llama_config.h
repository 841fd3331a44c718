// fsdp/models/llama_config.h — the settings of a Llama-family model
// (fsdp/models/llama.h): LlamaConfig, what a model's config.json holds as
// transformers reads it (and, deprecated, the LoRA adapters a run adds:
// fsdp/peft/lora.h is their place now). Plain values; no LibTorch, no
// collectives. config.json is read and written by
// fsdp/models/llama_config_json.h, and a config's bytes are checked against
// memory by fsdp/models/llama_sizes.h; fsdp/models/llama.h includes both.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/peft/lora_config.h"  // LoraConfig, forwarded below for one release

namespace fsdp::models {

// LoRA moved to its own pass, fsdp/peft/lora.h (fsdp::peft::inject_lora on
// a built model). These names stay here for one release, forwarding to it.
using peft::LoraConfig;
using peft::lora_targets_text;
using peft::parse_lora_targets;
// The projections of the decoder LoRA can target.
const std::vector<std::string>& lora_target_names();
// peft::check_lora_config with the targets limited to lora_target_names():
// ConfigError naming the setting for a rank below 0, alpha not positive, an
// unknown or repeated target, or no targets with a rank.
void check_lora(const LoraConfig& lora);

// A model's config.json, as the model reads it (every default is
// transformers' for the architecture).
struct LlamaConfig {
  std::string architecture = "LlamaForCausalLM";  // or Qwen2ForCausalLM, MistralForCausalLM
  std::string model_type = "llama";               // "llama", "qwen2", "mistral"
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;
  int64_t head_dim = 128;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double initializer_range = 0.02;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v/o biases (Llama's attention_bias)
  bool qkv_bias = false;        // q/k/v biases only (Qwen2: always)
  bool mlp_bias = false;
  double attention_dropout = 0.0;
  // RoPE.
  std::string rope_type = "default";  // "default", "linear", "llama3"
  double rope_theta = 10000.0;
  double rope_factor = 1.0;  // linear, llama3
  double rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;  // llama3
  int64_t rope_original_max_position_embeddings = 0;               // llama3
  // The sliding window of each layer (0: full causal attention).
  std::vector<int64_t> layer_windows;
  std::optional<int64_t> pad_token_id, bos_token_id;
  std::vector<int64_t> eos_token_ids;
  std::string dtype = "float32";  // `dtype` or the legacy `torch_dtype`: the weights' dtype as saved
  // The config.json text this was read from (kept for export; empty when
  // built in code).
  std::string source_json;
  // DEPRECATED (kept for one release; not of config.json): adapters the
  // model gets as it is built (rank 0: none). Build the model without them
  // and call fsdp::peft::inject_lora(*model, lora) before sharding it
  // instead. With rank > 0 the Llama's builder still does it for you: each
  // decoder layer is adapted as it is built (inject_lora on the layer, so a
  // deferred layer is rebuilt with its adapters), and every other parameter
  // is frozen.
  LoraConfig lora;
  // Not of config.json: false builds the decoder's parameters uninitialised
  // (at::empty: no time spent drawing values), as transformers'
  // from_pretrained does, for a model whose weights are loaded next
  // (hf::load_weights, a checkpoint); the LoRA adapters, the norms and an
  // untied lm_head (LibTorch's Linear) are initialised either way.
  bool initialize = true;
  std::string source_path;  // the file it was read from (parse_llama_config's `where`; "" when built in code)
};

// The architectures this model implements, as config.json names them.
const std::vector<std::string>& llama_architectures();

}  // namespace fsdp::models
