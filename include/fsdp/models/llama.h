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
// LlamaConfig, config.json read and written, and the size checks: in their
// own headers, included here so that this header declares all it did.
#include "fsdp/models/llama_config.h"
#include "fsdp/models/llama_config_json.h"
#include "fsdp/models/llama_sizes.h"
#include "fsdp/peft/lora.h"

namespace fsdp::models {

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
// transformers' nn.Linear ("weight", "bias"), with LoRA's seam
// (peft::LoraLayer): fsdp::peft::inject_lora gives it PEFT's adapters
// "lora_A" and "lora_B" (Linear modules without bias), and then
// y = x W^T + b + lora_B(lora_A(x)) * scaling, in PEFT's order.
class LlamaLinearImpl : public torch::nn::Module, public peft::LoraLayer {
 public:
  // init_std < 0: the weight is left uninitialised (LlamaConfig::initialize).
  // lora_rank > 0 (deprecated: use peft::inject_lora) adds the adapters
  // at once (peft::add_lora).
  LlamaLinearImpl(int64_t in, int64_t out, bool bias, double init_std, int64_t lora_rank = 0, double lora_alpha = 0);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight, bias;
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
// Adapters: fsdp::peft::inject_lora on the built model. (Deprecated, for one
// release: with config.lora.rank > 0 the builder injects them itself, each
// decoder layer as it is built, and only the adapters require gradients.)
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

}  // namespace fsdp::models
