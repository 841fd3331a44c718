// fsdp/models/gpt.h — a GPT-style decoder-only transformer (byte vocabulary
// by default), the model of fsdp-bench and the trainer. Blocks sit in a
// torch::nn::Sequential, so FSDP auto-wraps them (transformer policy on
// GPTBlockImpl) with no change; the output projection is tied to the token
// embedding. Its linear layers take LoRA adapters (fsdp::peft::inject_lora).
// Pure LibTorch; no collectives.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "fsdp/peft/lora.h"

namespace fsdp::models {

struct GPTConfig {
  int64_t vocab_size = 256;  // bytes
  int64_t context = 128;     // longest sequence
  int64_t dim = 256;         // model width
  int64_t layers = 4;
  int64_t heads = 4;         // must divide dim
  double dropout = 0.0;
};

// Pre-norm block: x + attn(ln1(x)), then x + mlp(ln2(x)); causal attention.
class GPTBlockImpl : public torch::nn::Module {
 public:
  explicit GPTBlockImpl(const GPTConfig& config);
  // x: [batch, time, dim] -> [batch, time, dim].
  at::Tensor forward(at::Tensor x);

 private:
  GPTConfig config_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  // LibTorch's Linear with LoRA's seam: fsdp::peft::inject_lora can adapt them
  // ("blocks.<i>.qkv", "proj", "fc", "fc_proj").
  peft::Linear qkv_{nullptr}, proj_{nullptr}, fc_{nullptr}, fc_proj_{nullptr};
};
TORCH_MODULE(GPTBlock);

class GPTImpl : public torch::nn::Module {
 public:
  explicit GPTImpl(const GPTConfig& config);
  // tokens: [batch, time] int64 (time <= context) -> logits [batch, time, vocab].
  at::Tensor forward(at::Tensor tokens);
  const GPTConfig& config() const { return config_; }

 private:
  GPTConfig config_;
  torch::nn::Embedding tok_{nullptr}, pos_{nullptr};
  torch::nn::Sequential blocks_{nullptr};
  torch::nn::LayerNorm ln_f_{nullptr};
};
TORCH_MODULE(GPT);

// Mean next-token cross-entropy of logits [B, T, V] against targets [B, T].
at::Tensor gpt_loss(const at::Tensor& logits, const at::Tensor& targets);

// The state-dict keys of a GPT of `config` with their shapes, in the
// model's order (parameters; the GPT has no buffers), computed without
// building it: O(layers) small entries, no tensor memory. What a checkpoint's
// recorded configuration is checked against before a model is built from it.
std::vector<std::pair<std::string, std::vector<int64_t>>> gpt_state_shapes(const GPTConfig& config);

}  // namespace fsdp::models
