// Text generation from a checkpoint written by train(), the GPT's or a Llama's
// (fsdp/train/gpt_trainer.h: generate, generate_stream).
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/error.h"
#include "fsdp/hf/hf_model.h"  // read_config, load_weights (--model hf:DIR)
#include "fsdp/train/batches.h"  // bytes_to_tokens, kByteVocab
#include "fsdp/train/gpt_trainer.h"
#ifndef FSDP_NO_TOKENIZERS
#include "fsdp/tokenizers/tokenizer.h"
#endif

namespace fsdp::train {

namespace {

// The next token from the last position's `logits` [vocab]: the most likely
// (temperature 0), or drawn among the top k at the temperature.
int64_t next_token(const at::Tensor& logits, const GenerateOptions& o, at::Generator& gen) {
  if (o.temperature == 0) return logits.argmax().item<int64_t>();
  auto [top, idx] = logits.topk(o.top_k > 0 ? o.top_k : logits.size(0));
  // In float64, less the largest logit: any positive temperature, down to
  // the smallest double, gives finite probabilities (the most likely
  // token's exponent is 0).
  at::Tensor scaled = (top.to(at::kDouble) - top.max().to(at::kDouble)) / o.temperature;
  at::Tensor probs = at::softmax(scaled, 0);
  return idx[at::multinomial(probs, 1, false, gen).item<int64_t>()].item<int64_t>();
}

void check_top_k(const GenerateOptions& o, int64_t vocab) {
  if (o.top_k < 0 || o.top_k > vocab) {
    throw ConfigError("generate: --top-k must be between 0 (all) and the vocabulary size " + std::to_string(vocab) +
                      ", got " + std::to_string(o.top_k));
  }
}

// Where a Llama's model comes from: a checkpoint's or a Hugging Face
// directory's (--model hf:DIR) config, the tokenizer to use when none is
// given, and how its weights are loaded into a model of that config.
struct LlamaSource {
  std::string name;              // in messages: the checkpoint or hf:DIR
  models::LlamaConfig config;
  std::string default_tokenizer;  // "" when it records none
  std::string no_tokenizer;       // why none is known, when default_tokenizer is ""
  std::function<void(const std::shared_ptr<models::LlamaImpl>&, dist::ProcessGroup&)> load;
};

// A Llama's generation, through its tokenizer (gpt_trainer.h).
void generate_llama(const LlamaSource& src, const std::string& prompt, const GenerateOptions& o,
                    const dist::ProcessGroupPtr& world, const std::function<void(char)>& emit) {
#ifdef FSDP_NO_TOKENIZERS
  (void)prompt, (void)o, (void)world, (void)emit;
  throw ConfigError("generate: " + src.name + " holds a Llama-family model, whose text goes through its "
                    "tokenizer, and this build has no fsdp::tokenizers (Debian's LibTorch 1.13 build leaves them out; "
                    "it has no Llama either): expected the wheel build");
#else
  const models::LlamaConfig& cfg = src.config;
  const std::string path = o.tokenizer.empty() ? src.default_tokenizer : o.tokenizer;
  if (path.empty()) {
    throw ConfigError("generate: " + src.name + " " + src.no_tokenizer + ": expected --tokenizer DIR (the model's "
                      "tokenizer.json or tokenizer.model)");
  }
  const auto tok = tokenizers::load_tokenizer(path);
  if (tok->vocab_size() > cfg.vocab_size) {
    throw ConfigError("generate: the tokenizer " + tok->source() + " has " + std::to_string(tok->vocab_size()) +
                      " tokens, more than the model's vocab_size " + std::to_string(cfg.vocab_size) +
                      ": expected the tokenizer of the model the checkpoint trained");
  }
  check_top_k(o, cfg.vocab_size);
  const std::vector<int64_t> prompt_ids = tok->encode(prompt, true);
  if (prompt_ids.empty()) {
    throw ConfigError("generate: the prompt is empty and the tokenizer " + tok->source() +
                      " adds no BOS: expected a prompt of at least one token");
  }
  const auto positions = static_cast<int64_t>(prompt_ids.size()) + o.tokens;
  if (positions > cfg.max_position_embeddings) {
    throw ConfigError("generate: a prompt of " + std::to_string(prompt_ids.size()) + " tokens and --tokens " +
                      std::to_string(o.tokens) + " make " + std::to_string(positions) +
                      " positions, more than the model's max_position_embeddings " +
                      std::to_string(cfg.max_position_embeddings) + ": expected fewer --tokens");
  }
  std::vector<int64_t> stops = cfg.eos_token_ids;
  if (tok->eos_id()) stops.push_back(*tok->eos_id());
  auto model = std::make_shared<models::LlamaImpl>(cfg);
  src.load(model, *world);
  model->eval();
  torch::NoGradGuard no_grad;
  for (char ch : prompt) emit(ch);
  // The text is decode(prompt + generated) past decode(prompt): a token's
  // leading space (SentencePiece's "▁") stays; a character split across
  // tokens (decoded as U+FFFD until whole) waits for its last token.
  std::vector<int64_t> ids = prompt_ids;
  const std::string before = tok->decode(ids, true);
  size_t emitted = 0;
  auto flush = [&](bool last) {
    const std::string text = tok->decode(ids, true);
    if (text.compare(0, before.size(), before) != 0) return;
    std::string fresh = text.substr(before.size());
    static const std::string kReplacement = "\xEF\xBF\xBD";
    if (!last && fresh.size() >= kReplacement.size() &&
        fresh.compare(fresh.size() - kReplacement.size(), kReplacement.size(), kReplacement) == 0) {
      fresh.resize(fresh.size() - kReplacement.size());
    }
    for (size_t i = emitted; i < fresh.size(); ++i) emit(fresh[i]);
    emitted = std::max(emitted, fresh.size());
  };
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  models::LlamaKVCache cache(cfg.num_hidden_layers);
  at::Tensor input = at::tensor(prompt_ids, at::kLong).unsqueeze(0);
  for (int64_t i = 0; i < o.tokens; ++i) {
    const at::Tensor logits = model->forward(input, &cache).select(1, input.size(1) - 1).squeeze(0).to(at::kFloat);
    const int64_t next = next_token(logits, o, gen);
    if (std::find(stops.begin(), stops.end(), next) != stops.end()) break;
    ids.push_back(next);
    flush(false);
    input = at::full({1, 1}, next, at::kLong);
  }
  flush(true);
#endif
}

// Whether `dir` is a Hugging Face model directory (config.json and its
// weights) that is no checkpoint (no .metadata, fsdp_index.json or index.json).
bool hf_model_directory(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path d(dir);
  if (!fs::is_directory(d, ec) || !fs::is_regular_file(d / "config.json", ec)) return false;
  for (const char* marker : {".metadata", "fsdp_index.json", "index.json"}) {
    if (fs::exists(fs::symlink_status(d / marker, ec))) return false;
  }
  return fs::exists(d / "model.safetensors", ec) || fs::exists(d / "model.safetensors.index.json", ec);
}

// --model hf:DIR: the directory's config.json, its weights (hf::load_weights),
// its tokenizer unless --tokenizer names another.
void generate_hf(const std::string& dir, const std::string& prompt, const GenerateOptions& o,
                 const dist::ProcessGroupPtr& world, const std::function<void(char)>& emit) {
  if (dir.empty()) throw ConfigError("generate: --model hf: names no directory: expected hf:DIR");
  LlamaSource src;
  src.name = "hf:" + dir;
  src.config = hf::read_config(dir);
  src.config.initialize = false;  // its weights are loaded next
  src.default_tokenizer = dir;
  src.load = [&](const std::shared_ptr<models::LlamaImpl>& model, dist::ProcessGroup& pg) {
    hf::load_weights(dir, src.config, model, pg);
  };
  generate_llama(src, prompt, o, world, emit);
}

}  // namespace

void generate_stream(const std::string& checkpoint, const std::string& prompt, const GenerateOptions& o,
                     const dist::ProcessGroupPtr& world, const std::function<void(char)>& emit) {
  if (o.tokens < 0) throw ConfigError("generate: --tokens must be 0 or positive, got " + std::to_string(o.tokens));
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature)) {
    throw ConfigError("generate: --temperature must be 0 (greedy) or positive, got " + std::to_string(o.temperature));
  }
  if (checkpoint.rfind("hf:", 0) == 0) return generate_hf(checkpoint.substr(3), prompt, o, world, emit);
  if (hf_model_directory(checkpoint)) {
    throw ConfigError("generate: " + checkpoint + " is a Hugging Face model directory (config.json and " +
                      "model.safetensors), not a checkpoint of fsdp-train's: expected --model hf:" + checkpoint +
                      " to generate from it");
  }
  const auto info = inspect_checkpoint(checkpoint);
  const CheckpointModel held = checkpoint_model(info, checkpoint);
  if (held.llama) {
    LlamaSource src;
    src.name = checkpoint;
    src.config = *held.llama;
    if (held.source.rfind("hf:", 0) == 0) src.default_tokenizer = held.source.substr(3);
    src.no_tokenizer = "holds a Llama trained from --model " + held.source + ", which records no tokenizer";
    src.load = [&](const std::shared_ptr<models::LlamaImpl>& model, dist::ProcessGroup& pg) {
      load_checkpoint(checkpoint, model, pg);
    };
    return generate_llama(src, prompt, o, world, emit);
  }
  const models::GPTConfig& cfg = held.gpt;
  if (cfg.vocab_size != kByteVocab) {
    throw ConfigError("generate: " + checkpoint + " holds a model of " + std::to_string(cfg.vocab_size) +
                      " tokens (--vocab: trained on token ids); generate reads the prompt and writes its text as "
                      "bytes: expected a byte-level checkpoint (vocab " + std::to_string(kByteVocab) + ")");
  }
  check_top_k(o, cfg.vocab_size);
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
    const int64_t next = next_token(logits, o, gen);
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
