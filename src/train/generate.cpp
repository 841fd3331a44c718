// Text generation from a checkpoint written by train()
// (fsdp/train/gpt_trainer.h: generate, generate_stream).
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/error.h"
#include "fsdp/train/batches.h"  // bytes_to_tokens, kByteVocab
#include "fsdp/train/gpt_trainer.h"

namespace fsdp::train {

void generate_stream(const std::string& checkpoint, const std::string& prompt, const GenerateOptions& o,
                     const dist::ProcessGroupPtr& world, const std::function<void(char)>& emit) {
  if (o.tokens < 0) throw ConfigError("generate: --tokens must be 0 or positive, got " + std::to_string(o.tokens));
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature)) {
    throw ConfigError("generate: --temperature must be 0 (greedy) or positive, got " + std::to_string(o.temperature));
  }
  const auto info = inspect_checkpoint(checkpoint);
  const models::GPTConfig cfg = checkpoint_model_config(info, checkpoint);
  if (cfg.vocab_size != kByteVocab) {
    throw ConfigError("generate: " + checkpoint + " holds a model of " + std::to_string(cfg.vocab_size) +
                      " tokens (--vocab: trained on token ids); generate reads the prompt and writes its text as "
                      "bytes: expected a byte-level checkpoint (vocab " + std::to_string(kByteVocab) + ")");
  }
  if (o.top_k < 0 || o.top_k > cfg.vocab_size) {
    throw ConfigError("generate: --top-k must be between 0 (all) and the vocabulary size " +
                      std::to_string(cfg.vocab_size) + ", got " + std::to_string(o.top_k));
  }
  auto model = std::make_shared<models::GPTImpl>(cfg);
  load_checkpoint(checkpoint, model, *world);
  model->eval();
  torch::NoGradGuard no_grad;
  // The model sees the last `context` bytes: only those are kept.
  std::string window = prompt.empty() ? std::string("\n") : prompt;
  for (char ch : window) emit(ch);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  for (int64_t i = 0; i < o.tokens; ++i) {
    if (static_cast<int64_t>(window.size()) > cfg.context) window.erase(0, window.size() - static_cast<size_t>(cfg.context));
    const auto n = static_cast<int64_t>(window.size());
    at::Tensor ctx = bytes_to_tokens(window).unsqueeze(0);
    at::Tensor logits = model->forward(ctx).select(1, n - 1).squeeze(0).to(at::kFloat);
    int64_t next = 0;
    if (o.temperature == 0) {
      next = logits.argmax().item<int64_t>();
    } else {
      auto [top, idx] = logits.topk(o.top_k > 0 ? o.top_k : logits.size(0));
      // In float64, less the largest logit: any positive temperature, down
      // to the smallest double, gives finite probabilities (the most likely
      // byte's exponent is 0).
      at::Tensor scaled = (top.to(at::kDouble) - top.max().to(at::kDouble)) / o.temperature;
      at::Tensor probs = at::softmax(scaled, 0);
      next = idx[at::multinomial(probs, 1, false, gen).item<int64_t>()].item<int64_t>();
    }
    window += static_cast<char>(next);
    emit(static_cast<char>(next));
  }
}

std::string generate(const std::string& checkpoint, const std::string& prompt, const GenerateOptions& o,
                     const dist::ProcessGroupPtr& world) {
  std::string text;
  generate_stream(checkpoint, prompt, o, world, [&](char ch) { text += ch; });
  return text;
}

}  // namespace fsdp::train
