#include "fsdp/models/gpt.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/dropout.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/init.h>

#include <torch/version.h>

#include <cmath>

#include "fsdp/error.h"
#include "fsdp/core/fully_sharded_data_parallel.h"

namespace fsdp::models {

namespace F = torch::nn::functional;

GPTBlockImpl::GPTBlockImpl(const GPTConfig& c) : config_(c) {
  if (c.heads <= 0 || c.dim % c.heads != 0) {
    throw ConfigError("GPT: heads=" + std::to_string(c.heads) + " must divide dim=" + std::to_string(c.dim));
  }
  ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})));
  qkv_ = register_module("qkv", peft::Linear(c.dim, 3 * c.dim));
  proj_ = register_module("proj", peft::Linear(c.dim, c.dim));
  ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})));
  fc_ = register_module("fc", peft::Linear(c.dim, 4 * c.dim));
  fc_proj_ = register_module("fc_proj", peft::Linear(4 * c.dim, c.dim));
  // GPT-2's initialisation: N(0, 0.02), residual projections scaled down.
  torch::NoGradGuard no_grad;
  for (auto* l : {&qkv_, &proj_, &fc_, &fc_proj_}) {
    torch::nn::init::normal_((*l)->weight, 0.0, 0.02);
    torch::nn::init::zeros_((*l)->bias);
  }
  const double scaled = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));
  torch::nn::init::normal_(proj_->weight, 0.0, scaled);
  torch::nn::init::normal_(fc_proj_->weight, 0.0, scaled);
}

at::Tensor GPTBlockImpl::forward(at::Tensor x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), H = config_.heads;
  auto qkv = qkv_(ln1_(x)).view({B, T, 3, H, C / H}).permute({2, 0, 3, 1, 4});  // [3, B, H, T, C/H]
  auto q = qkv[0], k = qkv[1], v = qkv[2];
  const double attn_dropout = is_training() ? config_.dropout : 0.0;
#if TORCH_VERSION_MAJOR >= 2
  // LibTorch's fused attention (flash attention on CPU and CUDA where it
  // applies): no [T, T] score matrix per head kept for backward.
  auto y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, attn_dropout, /*is_causal=*/true)
               .transpose(1, 2)
               .reshape({B, T, C});
#else
  auto att = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(C / H));
  auto causal = at::ones({T, T}, at::TensorOptions().dtype(at::kBool).device(x.device())).triu(1);
  att = att.masked_fill(causal, -std::numeric_limits<float>::infinity()).softmax(-1);
  if (attn_dropout > 0) att = F::dropout(att, F::DropoutFuncOptions().p(attn_dropout).training(true));
  auto y = at::matmul(att, v).transpose(1, 2).reshape({B, T, C});
#endif
  y = proj_(y);
  if (config_.dropout > 0) y = F::dropout(y, F::DropoutFuncOptions().p(config_.dropout).training(is_training()));
  x = x + y;
  auto m = fc_proj_(F::gelu(fc_(ln2_(x))));
  if (config_.dropout > 0) m = F::dropout(m, F::DropoutFuncOptions().p(config_.dropout).training(is_training()));
  return x + m;
}

GPTImpl::GPTImpl(const GPTConfig& c) : config_(c) {
  if (c.vocab_size <= 0 || c.context <= 0 || c.dim <= 0 || c.layers < 0) {
    throw ConfigError("GPT: vocab_size, context and dim must be positive and layers >= 0");
  }
  tok_ = register_module("tok", torch::nn::Embedding(c.vocab_size, c.dim));
  pos_ = register_module("pos", torch::nn::Embedding(c.context, c.dim));
  blocks_ = register_module("blocks", torch::nn::Sequential());
  // fsdp::Unit: under fsdp::EmptyInitGuard a block's memory waits for FSDP.
  for (int64_t i = 0; i < c.layers; ++i) blocks_->push_back(fsdp::Unit<GPTBlockImpl>(c));
  ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})));
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(tok_->weight, 0.0, 0.02);
  torch::nn::init::normal_(pos_->weight, 0.0, 0.02);
}

at::Tensor GPTImpl::forward(at::Tensor tokens) {
  const int64_t T = tokens.size(1);
  if (T > config_.context) {
    throw ConfigError("GPT: sequence of " + std::to_string(T) + " tokens is longer than the context " +
                      std::to_string(config_.context));
  }
  auto pos = at::arange(T, at::TensorOptions().dtype(at::kLong).device(tokens.device()));
  auto x = tok_(tokens) + pos_(pos);
  x = blocks_->forward(x);
  // The output projection is the token embedding (tied).
  return F::linear(ln_f_(x), tok_->weight);
}

std::vector<std::pair<std::string, std::vector<int64_t>>> gpt_state_shapes(const GPTConfig& c) {
  const int64_t D = c.dim;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out = {{"tok.weight", {c.vocab_size, D}},
                                                                   {"pos.weight", {c.context, D}}};
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"ln1.weight", {D}},
             {"ln1.bias", {D}},
             {"qkv.weight", {3 * D, D}},
             {"qkv.bias", {3 * D}},
             {"proj.weight", {D, D}},
             {"proj.bias", {D}},
             {"ln2.weight", {D}},
             {"ln2.bias", {D}},
             {"fc.weight", {4 * D, D}},
             {"fc.bias", {4 * D}},
             {"fc_proj.weight", {D, 4 * D}},
             {"fc_proj.bias", {D}}}) {
      out.emplace_back(b + name, shape);
    }
  }
  out.push_back({"ln_f.weight", {D}});
  out.push_back({"ln_f.bias", {D}});
  return out;
}

at::Tensor gpt_loss(const at::Tensor& logits, const at::Tensor& targets) {
  return F::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(at::kFloat), targets.reshape({-1}));
}

}  // namespace fsdp::models
