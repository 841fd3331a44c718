// fsdp/models/llama.h — the Llama family of decoders as Hugging Face's
// transformers defines them (LlamaForCausalLM, Qwen2ForCausalLM,
// MistralForCausalLM), built from the model's config.json, with the same
// parameter names as transformers' state dict ("model.layers.0.self_attn.
// q_proj.weight", ...), so that a Hugging Face checkpoint loads by name
// (fsdp/hf/, docs/models.md).
//
// The parts, as transformers 5 computes them: RMSNorm in float32; rotary
// position embeddings (RoPE) of rope_type "default", "linear" or "llama3"
// (Llama 3's frequency scaling), from `rope_parameters` (transformers 5) or
// from the legacy `rope_theta` / `rope_scaling` keys of hub checkpoints;
// grouped-query attention (`num_key_value_heads`, `head_dim`) through
// LibTorch's scaled_dot_product_attention; the SwiGLU MLP; Llama's
// `attention_bias` and `mlp_bias`; Qwen2's q/k/v biases; a sliding window
// (Mistral's `sliding_window`, Qwen2's `use_sliding_window` with
// `max_window_layers` or `layer_types`); `tie_word_embeddings` (no lm_head:
// the output projection is the embedding). Anything else in a config that
// changes the computation (another rope_type, `partial_rotary_factor`, an
// activation other than SiLU, an architecture outside the family) is refused
// by name.
//
// Each decoder layer is an fsdp::Unit, so either engine can shard it
// (FSDP1's transformer policy on LlamaDecoderLayerImpl, or fully_shard on
// each layer) and activation checkpointing can wrap it; call the model as
// `model(tokens)` (the holder), never `model->layers()[i]->forward(...)`.
//
// LibTorch 1.13 has no scaled_dot_product_attention: there the constructor
// throws ConfigError saying so (README, "Status"). No collectives here; the
// layers' forwards are collectives only once an engine shards them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "fsdp/core/fully_sharded_data_parallel.h"

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

// Parses a config.json text. `where` names the file in errors. ConfigError
// naming the file, the key and what was expected for: text that is not a JSON
// object (or over 16 MiB), an architecture outside llama_architectures()
// (named, with the list), a missing or ill-typed key the model needs, sizes
// that do not fit (heads that do not divide, num_key_value_heads not dividing
// num_attention_heads), and settings that change the computation in ways not
// implemented (rope_type, partial_rotary_factor, hidden_act). Cost: linear in
// the text.
LlamaConfig parse_llama_config(const std::string& json_text, const std::string& where);
// Reads and parses the file `path` (a config.json).
LlamaConfig read_llama_config(const std::string& path);
// The config as transformers' config.json (for export): the source text's
// keys kept, the fields above written over them, "dtype" set to `dtype`,
// "transformers_version" set to the release emulated (5.25.0), and the legacy
// keys (rope_theta, rope_scaling, torch_dtype) written beside
// rope_parameters and dtype with the same values, so that transformers 4.x
// and 5 read the same model.
std::string llama_config_json(const LlamaConfig& config, const std::string& dtype);

// RMSNorm: weight * (x / sqrt(mean(x^2) + eps)), computed in float32 and cast
// back to x's dtype before the weight, as transformers' LlamaRMSNorm.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// A projection of the decoder (q/k/v/o_proj, gate/up/down_proj):
// transformers' nn.Linear ("weight", "bias"), with, when LoRA targets it,
// PEFT's adapters "lora_A" and "lora_B" (Linear modules without bias):
// y = x W^T + b + lora_B(lora_A(x)) * scaling, in PEFT's order.
class LlamaLinearImpl : public torch::nn::Module {
 public:
  // init_std < 0: the weight is left uninitialised (LlamaConfig::initialize).
  LlamaLinearImpl(int64_t in, int64_t out, bool bias, double init_std, int64_t lora_rank = 0, double lora_alpha = 0);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight, bias;
  torch::nn::Linear lora_A{nullptr}, lora_B{nullptr};
  double scaling = 0;  // alpha / rank
};
TORCH_MODULE(LlamaLinear);

// The keys and values of past positions, per layer, for generation. Filled
// by a forward that is given it; `length()` positions long.
class LlamaKVCache {
 public:
  explicit LlamaKVCache(int64_t layers) : keys(layers), values(layers) {}
  int64_t length() const { return keys.empty() || !keys[0].defined() ? 0 : keys[0].size(2); }
  std::vector<at::Tensor> keys, values;  // per layer: [batch, kv_heads, length, head_dim]
};

// Self-attention with grouped-query heads and RoPE ("self_attn").
class LlamaAttentionImpl : public torch::nn::Module {
 public:
  LlamaAttentionImpl(const LlamaConfig& config, int64_t layer);
  // x [B, T, hidden]; cos/sin [B or 1, T, head_dim]; `cache` (may be null):
  // the past keys/values are prepended and this call's appended.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, LlamaKVCache* cache);
  LlamaLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  int64_t layer_, heads_, kv_heads_, head_dim_, window_;
  double dropout_;
};
TORCH_MODULE(LlamaAttention);

// down_proj(silu(gate_proj(x)) * up_proj(x)) ("mlp").
class LlamaMLPImpl : public torch::nn::Module {
 public:
  explicit LlamaMLPImpl(const LlamaConfig& config);
  at::Tensor forward(const at::Tensor& x);
  LlamaLinear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(LlamaMLP);

// x + attn(norm(x)), then + mlp(norm(x)): one decoder layer, the unit of
// sharding and of activation checkpointing.
class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  LlamaDecoderLayerImpl(const LlamaConfig& config, int64_t layer);
  at::Tensor forward(at::Tensor x, at::Tensor cos, at::Tensor sin, LlamaKVCache* cache);
  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(LlamaDecoderLayer);

// The decoder stack ("model"): embed_tokens, layers, norm.
class LlamaModelImpl : public torch::nn::Module {
 public:
  explicit LlamaModelImpl(const LlamaConfig& config);
  // tokens [B, T] int64 -> hidden states [B, T, hidden] after the final norm.
  // With `cache`, positions continue from cache->length().
  at::Tensor forward(const at::Tensor& tokens, LlamaKVCache* cache = nullptr);
  // RoPE's cos and sin for positions [start, start + T), in `dtype`.
  std::pair<at::Tensor, at::Tensor> rotary(int64_t start, int64_t T, at::ScalarType dtype, at::Device device) const;
  torch::nn::Embedding embed_tokens{nullptr};
  std::vector<fsdp::Unit<LlamaDecoderLayerImpl>> layers;
  RMSNorm norm{nullptr};

 private:
  LlamaConfig config_;
  at::Tensor inv_freq_;  // float32 [head_dim / 2], not a parameter or buffer (transformers: not persistent)
};
TORCH_MODULE(LlamaModel);

// The causal language model (LlamaForCausalLM): `model` and `lm_head`
// (absent when tie_word_embeddings: the embedding projects). Parameters are
// initialised as transformers initialises them (normal(0,
// initializer_range), zero biases, unit norms), from LibTorch's generator.
// With config.lora.rank > 0 the targeted projections carry adapters and
// only the adapters require gradients.
class LlamaImpl : public torch::nn::Module {
 public:
  explicit LlamaImpl(const LlamaConfig& config);
  // tokens [B, T] int64 -> logits [B, T, vocab] (float32 when the model is).
  at::Tensor forward(const at::Tensor& tokens, LlamaKVCache* cache = nullptr);
  const LlamaConfig& config() const { return config_; }
  LlamaModel model{nullptr};
  torch::nn::Linear lm_head{nullptr};

 private:
  LlamaConfig config_;
};
TORCH_MODULE(Llama);

// The state-dict keys of a model of `config` with their shapes, in
// transformers' order, without building it (no tensor memory). What an HF
// checkpoint is checked against before it loads.
std::vector<std::pair<std::string, std::vector<int64_t>>> llama_state_shapes(const LlamaConfig& config);

// The LoRA adapters' keys and shapes of a model of `config` (config.lora),
// layer by layer in transformers' order of the projections: each targeted
// projection's "<name>.lora_A.weight" [rank, in] and "<name>.lora_B.weight"
// [out, rank]. Empty without adapters. With llama_state_shapes: all a
// model built with adapters holds.
std::vector<std::pair<std::string, std::vector<int64_t>>> llama_adapter_shapes(const LlamaConfig& config);
// Both: every tensor a model of `config` holds (llama_state_shapes, then
// llama_adapter_shapes).
std::vector<std::pair<std::string, std::vector<int64_t>>> llama_model_shapes(const LlamaConfig& config);

// Greedy generation: appends `max_new_tokens` tokens to `prompt` [B, T]
// (argmax of the last position's logits, with a KV cache), stopping early
// when every row has produced one of `stop_ids` (empty: never). Returns
// [B, T + generated]. `model`: the holder the model is called through (a
// plain fsdp::Unit, FSDP1's FullyShardedDataParallel, or the fully_shard
// root). Runs the model's forward once per new token, in no-grad mode: under
// an engine, every rank must call it with the same lengths (collectives).
at::Tensor llama_generate(fsdp::Unit<LlamaImpl>& model, const at::Tensor& prompt, int64_t max_new_tokens,
                          const std::vector<int64_t>& stop_ids = {});

// ---------------------------------------------------------------------------
// Sizes (src/models/llama_sizes.cpp): what a Llama config would cost, counted
// from its sizes alone (no tensor made), against the memory this process can
// have, so that a hostile config.json ends in a ConfigError naming the file,
// the key and the bytes, never in LibTorch's allocator or the OOM killer.
// Local calls, no collectives.

// The memory this process may have: physical RAM (sysconf), or less when
// RLIMIT_AS caps the address space (the cap less what is mapped already).
// `what` says which, with the bytes, for messages.
struct MemoryBudget {
  long double bytes = 0;
  std::string what;
};
MemoryBudget memory_budget();
// "549755813632 bytes (512.0 GiB)"; "about 1.209e+24 bytes" past int64.
std::string byte_text(long double bytes);
// The bytes a model of `config` takes: its parameters (and LoRA adapters)
// of `element_bytes` each, and each decoder layer's module objects (64 KiB
// counted per layer).
long double llama_memory_bytes(const LlamaConfig& config, int64_t element_bytes);
// Sizes no process could hold, checked as a config is parsed
// (parse_llama_config calls it before anything of num_hidden_layers' length
// is made): ConfigError naming `where` (default: config.source_path) and
// the costliest key when the model would exceed 2^62 bytes in float32
// (int64 counts overflow past that), or when its num_hidden_layers' module
// objects alone exceed memory_budget().
void check_llama_sizes(const LlamaConfig& config, const std::string& where = "");
// The model against memory_budget() before it is built: ConfigError naming
// `where` (default: config.source_path), the costliest key (the one whose
// setting to 1 saves the most bytes), or the LoRA rank (named `rank_name`)
// when the adapters are what does not fit, and the bytes needed. Counts the
// whole model, or this machine's share when WORLD_SIZE and LOCAL_WORLD_SIZE
// say ranks span machines. LlamaImpl's constructor calls it with the
// default dtype's size.
void check_llama_memory(const LlamaConfig& config, int64_t element_bytes, const std::string& where = "",
                        const std::string& rank_name = "LoraConfig::rank");
// Warnings for a LoRA rank above a target projection's smaller dimension
// (the adapter's product B A cannot have that rank: memory for nothing).
// PEFT accepts any rank above 0, and so does this: warnings, not an error.
std::vector<std::string> lora_rank_warnings(const LlamaConfig& config, const std::string& rank_name);

}  // namespace fsdp::models
