// The Llama family's decoder, operation for operation as transformers 5's
// modeling_llama.py (and Qwen2's, Mistral's), so that float32 logits agree
// with transformers' to rounding: RMSNorm in float32, RoPE's inverse
// frequencies computed with the same tensor operations in the same order
// (modeling_rope_utils.py), attention through scaled_dot_product_attention
// with transformers' scale (head_dim ** -0.5).
#include "fsdp/models/llama.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/embedding.h>
#include <torch/version.h>
#include <torch/utils.h>
#include <c10/core/DefaultDtype.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "fsdp/error.h"

namespace fsdp::models {

namespace F = torch::nn::functional;

namespace {

constexpr double kPi = 3.141592653589793;  // Python's math.pi
constexpr bool kHasSdpa = TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1);

torch::nn::Linear linear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// A projection of layer config `c`.
LlamaLinear projection(const LlamaConfig& c, int64_t in, int64_t out, bool bias) {
  return LlamaLinear(in, out, bias, c.initialize ? c.initializer_range : -1.0);
}

// transformers' _init_weights: normal(0, initializer_range), zero biases.
void init_linear(torch::nn::Linear& l, double std) {
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(l->weight, 0.0, std);
  if (l->bias.defined()) torch::nn::init::zeros_(l->bias);
}

// rotate_half: cat(-x2, x1) of x's halves on the last dimension.
at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

// repeat_kv: [B, KV, T, D] -> [B, KV * n, T, D], each head n times in a row.
at::Tensor repeat_kv(const at::Tensor& x, int64_t n) {
  if (n == 1) return x;
  const auto B = x.size(0), KV = x.size(1), T = x.size(2), D = x.size(3);
  return x.unsqueeze(2).expand({B, KV, n, T, D}).reshape({B, KV * n, T, D});
}

// The inverse frequencies of RoPE, as modeling_rope_utils.py computes them.
at::Tensor rope_inv_freq(const LlamaConfig& c) {
  const int64_t dim = c.head_dim;
  auto exponents = at::arange(0, dim, 2, at::TensorOptions().dtype(at::kLong)).to(at::kFloat) / dim;
  // `1.0 / (base ** x)`: Python's reflected division is reciprocal() * 1.0.
  auto inv_freq = at::pow(c.rope_theta, exponents).reciprocal();
  if (c.rope_type == "linear") return inv_freq / c.rope_factor;
  if (c.rope_type != "llama3") return inv_freq;
  const double factor = c.rope_factor, low = c.rope_low_freq_factor, high = c.rope_high_freq_factor;
  const double old_context = static_cast<double>(c.rope_original_max_position_embeddings);
  const double low_freq_wavelen = old_context / low, high_freq_wavelen = old_context / high;
  auto wavelen = inv_freq.reciprocal() * (2 * kPi);
  auto llama = at::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
  auto smooth = (wavelen.reciprocal() * old_context - low) / (high - low);
  auto smoothed = (1 - smooth) * llama / factor + smooth * llama;
  auto medium = (wavelen < high_freq_wavelen).logical_not() * (wavelen > low_freq_wavelen).logical_not();
  return at::where(medium, smoothed, llama);
}

}  // namespace

LlamaLinearImpl::LlamaLinearImpl(int64_t in, int64_t out, bool with_bias, double init_std, int64_t lora_rank,
                                 double lora_alpha) {
  weight = register_parameter("weight", at::empty({out, in}));
  if (with_bias) bias = register_parameter("bias", at::empty({out}));
  if (init_std >= 0) {
    torch::NoGradGuard no_grad;
    torch::nn::init::normal_(weight, 0.0, init_std);
    if (bias.defined()) bias.zero_();
  }
  if (lora_rank > 0) peft::add_lora(*this, lora_rank, lora_alpha);
}

at::Tensor LlamaLinearImpl::forward(const at::Tensor& x) { return with_lora(x, F::linear(x, weight, bias)); }

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  auto h = x.to(at::kFloat);
  auto variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * at::rsqrt(variance + eps_);
  return weight * h.to(x.scalar_type());
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& c, int64_t layer)
    : layer_(layer),
      heads_(c.num_attention_heads),
      kv_heads_(c.num_key_value_heads),
      head_dim_(c.head_dim),
      window_(layer < static_cast<int64_t>(c.layer_windows.size()) ? c.layer_windows[layer] : 0),
      dropout_(c.attention_dropout) {
  const bool qkv_bias = c.attention_bias || c.qkv_bias;
  q_proj = register_module("q_proj", projection(c, c.hidden_size, heads_ * head_dim_, qkv_bias));
  k_proj = register_module("k_proj", projection(c, c.hidden_size, kv_heads_ * head_dim_, qkv_bias));
  v_proj = register_module("v_proj", projection(c, c.hidden_size, kv_heads_ * head_dim_, qkv_bias));
  o_proj = register_module("o_proj", projection(c, heads_ * head_dim_, c.hidden_size, c.attention_bias));
}

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                       LlamaKVCache* cache) {
  const int64_t B = x.size(0), T = x.size(1);
  auto q = q_proj(x).view({B, T, -1, head_dim_}).transpose(1, 2);
  auto k = k_proj(x).view({B, T, -1, head_dim_}).transpose(1, 2);
  auto v = v_proj(x).view({B, T, -1, head_dim_}).transpose(1, 2);
  auto c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  q = q * c + rotate_half(q) * s;
  k = k * c + rotate_half(k) * s;
  int64_t past = 0;
  if (cache) {
    auto& ck = cache->keys.at(layer_);
    auto& cv = cache->values.at(layer_);
    if (ck.defined()) {
      past = ck.size(2);
      k = at::cat({ck, k}, 2);
      v = at::cat({cv, v}, 2);
    }
    ck = k;
    cv = v;
  }
  const int64_t S = k.size(2);
  k = repeat_kv(k, heads_ / kv_heads_);
  v = repeat_kv(v, heads_ / kv_heads_);
  // transformers' mask: key j is seen from query position p = past + i when
  // j <= p and, with a window, j > p - window. Without a window and without a
  // past that is SDPA's is_causal (what transformers passes then).
  std::optional<at::Tensor> mask;
  bool causal = false;
  if (T > 1 || window_ > 0) {
    if (past == 0 && (window_ == 0 || S <= window_)) {
      causal = T > 1;
    } else {
      auto opts = at::TensorOptions().dtype(at::kLong).device(x.device());
      auto p = at::arange(past, past + T, opts).unsqueeze(1), j = at::arange(S, opts).unsqueeze(0);
      auto allowed = j <= p;
      if (window_ > 0) allowed = allowed.logical_and(j > p - window_);
      mask = allowed;
    }
  }
  const double dropout = is_training() ? dropout_ : 0.0;
  const double scale = std::pow(static_cast<double>(head_dim_), -0.5);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  auto y = at::scaled_dot_product_attention(q, k, v, mask, dropout, causal, scale);
#else
  (void)dropout, (void)scale, (void)causal;
  at::Tensor y;
  throw ConfigError("fsdp::models::Llama needs LibTorch >= 2.1 (scaled_dot_product_attention)");
#endif
  return o_proj(y.transpose(1, 2).reshape({B, T, -1}));
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& c) {
  gate_proj = register_module("gate_proj", projection(c, c.hidden_size, c.intermediate_size, c.mlp_bias));
  up_proj = register_module("up_proj", projection(c, c.hidden_size, c.intermediate_size, c.mlp_bias));
  down_proj = register_module("down_proj", projection(c, c.intermediate_size, c.hidden_size, c.mlp_bias));
}

at::Tensor LlamaMLPImpl::forward(const at::Tensor& x) { return down_proj(F::silu(gate_proj(x)) * up_proj(x)); }

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& c, int64_t layer) {
  self_attn = register_module("self_attn", LlamaAttention(c, layer));
  mlp = register_module("mlp", LlamaMLP(c));
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  // Deprecated path (LlamaConfig::lora): the layer's adapters, added as it
  // is built, so that a deferred layer's rebuild has them too.
  if (c.lora.rank > 0) peft::inject_lora(*this, c.lora);
}

at::Tensor LlamaDecoderLayerImpl::forward(at::Tensor x, at::Tensor cos, at::Tensor sin, LlamaKVCache* cache) {
  auto h = x + self_attn(input_layernorm(x), cos, sin, cache);
  return h + mlp(post_attention_layernorm(h));
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& c) : config_(c) {
  if (!kHasSdpa) {
    throw ConfigError("fsdp::models::Llama (" + c.architecture +
                      ") needs LibTorch >= 2.1 for scaled_dot_product_attention; this build's LibTorch is " +
                      std::string(TORCH_VERSION) + " (build with the torch 2.x wheel)");
  }
  if (static_cast<int64_t>(config_.layer_windows.size()) != c.num_hidden_layers) {
    config_.layer_windows.assign(c.num_hidden_layers, 0);
  }
  auto eopts = torch::nn::EmbeddingOptions(c.vocab_size, c.hidden_size);
  if (c.pad_token_id) eopts.padding_idx(*c.pad_token_id);
  if (!c.initialize) eopts._weight(at::empty({c.vocab_size, c.hidden_size}));  // LibTorch then draws nothing
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(eopts));
  if (c.initialize) {
    torch::NoGradGuard no_grad;
    torch::nn::init::normal_(embed_tokens->weight, 0.0, c.initializer_range);
    if (c.pad_token_id) embed_tokens->weight[*c.pad_token_id].zero_();
  }
  auto list = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers.emplace_back(config_, i);
    list->push_back(layers.back().ptr());
  }
  norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  inv_freq_ = rope_inv_freq(config_);
}

std::pair<at::Tensor, at::Tensor> LlamaModelImpl::rotary(int64_t start, int64_t T, at::ScalarType dtype,
                                                         at::Device device) const {
  auto positions = at::arange(start, start + T, at::TensorOptions().dtype(at::kLong).device(device)).unsqueeze(0);
  auto freqs = positions.unsqueeze(-1).to(at::kFloat) * inv_freq_.to(device);
  auto emb = at::cat({freqs, freqs}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

at::Tensor LlamaModelImpl::forward(const at::Tensor& tokens, LlamaKVCache* cache) {
  if (tokens.dim() != 2) {
    throw ConfigError("Llama: tokens must be [batch, time], got " + std::to_string(tokens.dim()) + " dimensions");
  }
  if (tokens.numel() > 0) {
    const auto lo = tokens.min().item<int64_t>(), hi = tokens.max().item<int64_t>();
    if (lo < 0 || hi >= config_.vocab_size) {
      throw ConfigError("Llama: token id " + std::to_string(lo < 0 ? lo : hi) + " is outside the vocabulary [0, " +
                        std::to_string(config_.vocab_size) + ")");
    }
  }
  if (cache && static_cast<int64_t>(cache->keys.size()) != config_.num_hidden_layers) {
    throw ConfigError("Llama: the KV cache has " + std::to_string(cache->keys.size()) + " layers, the model " +
                      std::to_string(config_.num_hidden_layers));
  }
  auto x = embed_tokens(tokens);
  const int64_t start = cache ? cache->length() : 0;
  auto [cos, sin] = rotary(start, tokens.size(1), x.scalar_type(), x.device());
  for (auto& layer : layers) x = layer(x, cos, sin, cache);
  return norm(x);
}

LlamaImpl::LlamaImpl(const LlamaConfig& c) : config_(c) {
  check_lora(c.lora);
  // Before any tensor: a config too big for this machine is named with its
  // key and bytes, not left to the allocator (a SIGABRT, a bad_alloc).
  check_llama_memory(c, static_cast<int64_t>(c10::get_default_dtype().itemsize()));
  model = register_module("model", LlamaModel(c));
  if (!c.tie_word_embeddings) {
    lm_head = register_module("lm_head", linear(c.hidden_size, c.vocab_size, false));
    init_linear(lm_head, c.initializer_range);
  }
  // Deprecated path (LlamaConfig::lora): only the adapters train (the
  // decoder layers' own parameters froze as they were built, so a deferred
  // rebuild keeps it).
  if (c.lora.rank > 0) peft::mark_only_lora_trainable(*this);
}

at::Tensor LlamaImpl::forward(const at::Tensor& tokens, LlamaKVCache* cache) {
  auto h = model(tokens, cache);
  return lm_head ? lm_head(h) : F::linear(h, model->embed_tokens->weight);
}

std::vector<std::pair<std::string, std::vector<int64_t>>> llama_state_shapes(const LlamaConfig& c) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim;
  const bool qkv_bias = c.attention_bias || c.qkv_bias;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out = {{"model.embed_tokens.weight", {c.vocab_size, H}}};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    out.push_back({p + "self_attn.q_proj.weight", {q, H}});
    if (qkv_bias) out.push_back({p + "self_attn.q_proj.bias", {q}});
    out.push_back({p + "self_attn.k_proj.weight", {kv, H}});
    if (qkv_bias) out.push_back({p + "self_attn.k_proj.bias", {kv}});
    out.push_back({p + "self_attn.v_proj.weight", {kv, H}});
    if (qkv_bias) out.push_back({p + "self_attn.v_proj.bias", {kv}});
    out.push_back({p + "self_attn.o_proj.weight", {H, q}});
    if (c.attention_bias) out.push_back({p + "self_attn.o_proj.bias", {H}});
    out.push_back({p + "mlp.gate_proj.weight", {I, H}});
    if (c.mlp_bias) out.push_back({p + "mlp.gate_proj.bias", {I}});
    out.push_back({p + "mlp.up_proj.weight", {I, H}});
    if (c.mlp_bias) out.push_back({p + "mlp.up_proj.bias", {I}});
    out.push_back({p + "mlp.down_proj.weight", {H, I}});
    if (c.mlp_bias) out.push_back({p + "mlp.down_proj.bias", {H}});
    out.push_back({p + "input_layernorm.weight", {H}});
    out.push_back({p + "post_attention_layernorm.weight", {H}});
  }
  out.push_back({"model.norm.weight", {H}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, H}});
  return out;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> llama_adapter_shapes(const LlamaConfig& c) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  if (c.lora.rank <= 0) return out;
  const int64_t H = c.hidden_size, I = c.intermediate_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim, r = c.lora.rank;
  // (name, module path, in, out) in transformers' order.
  const std::vector<std::tuple<const char*, const char*, int64_t, int64_t>> projections = {
      {"q_proj", "self_attn", H, q},  {"k_proj", "self_attn", H, kv}, {"v_proj", "self_attn", H, kv},
      {"o_proj", "self_attn", q, H},  {"gate_proj", "mlp", H, I},     {"up_proj", "mlp", H, I},
      {"down_proj", "mlp", I, H}};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    for (const auto& [name, parent, in, o] : projections) {
      if (std::find(c.lora.targets.begin(), c.lora.targets.end(), name) == c.lora.targets.end()) continue;
      const std::string p = "model.layers." + std::to_string(i) + "." + parent + "." + name + ".";
      out.push_back({p + "lora_A.weight", {r, in}});
      out.push_back({p + "lora_B.weight", {o, r}});
    }
  }
  return out;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> llama_model_shapes(const LlamaConfig& c) {
  auto out = llama_state_shapes(c);
  for (auto& a : llama_adapter_shapes(c)) out.push_back(std::move(a));
  return out;
}

at::Tensor llama_generate(fsdp::Unit<LlamaImpl>& model, const at::Tensor& prompt, int64_t max_new_tokens,
                          const std::vector<int64_t>& stop_ids) {
  if (prompt.dim() != 2 || prompt.size(1) == 0) {
    throw ConfigError("llama_generate: the prompt must be [batch, time] with time >= 1");
  }
  torch::NoGradGuard no_grad;
  LlamaKVCache cache(model->config().num_hidden_layers);
  auto out = prompt;
  auto next_input = prompt;
  auto done = at::zeros({prompt.size(0)}, prompt.options().dtype(at::kBool));
  for (int64_t n = 0; n < max_new_tokens; ++n) {
    auto logits = model(next_input, &cache);
    auto next = logits.select(1, logits.size(1) - 1).argmax(-1, /*keepdim=*/true);  // [B, 1]
    out = at::cat({out, next}, 1);
    next_input = next;
    if (!stop_ids.empty()) {
      for (int64_t id : stop_ids) done = done.logical_or(next.squeeze(1) == id);
      if (done.all().item<bool>()) break;
    }
  }
  return out;
}

}  // namespace fsdp::models
