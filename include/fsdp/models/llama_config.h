// fsdp/models/llama_config.h — the settings of a Llama-family model
// (fsdp/models/llama.h): LlamaConfig, what a model's config.json holds as
// transformers reads it, and the LoRA adapters a run adds. Plain values; no
// LibTorch, no collectives. config.json is read and written by
// fsdp/models/llama_config_json.h, and a config's bytes are checked against
// memory by fsdp/models/llama_sizes.h; fsdp/models/llama.h includes both.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::models {

// LoRA adapters (PEFT's LoraConfig, for the decoder's projections): each
// targeted projection W gets A [rank, in] and B [out, rank] and computes
// W x + (B (A x)) * alpha / rank; every other parameter is frozen
// (requires_grad false). A starts as PEFT's (Kaiming-uniform, a = sqrt(5)),
// B as zeros, so the adapted model starts as the base model.
struct LoraConfig {
  int64_t rank = 0;  // 0: no adapters
  double alpha = 16;
  // Of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj.
  std::vector<std::string> targets = {"q_proj", "v_proj"};
};
// The projections LoRA can target.
const std::vector<std::string>& lora_target_names();
// LoraConfig::targets as comma-separated text ("q_proj,v_proj"), and back
// (every piece kept, empty ones too: check_lora refuses those).
std::string lora_targets_text(const std::vector<std::string>& targets);
std::vector<std::string> parse_lora_targets(const std::string& text);
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
  // Not of config.json: adapters the run adds (rank 0: none).
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
