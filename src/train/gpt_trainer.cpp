// The GPT trainer: data, the training loop through FSDPStrategy, metrics,
// checkpoints (save every N, keep K, resume), and generation.
#include "fsdp/train/gpt_trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <random>
#include <sstream>

#include "fsdp/checkpoint_io.h"
#include "fsdp/error.h"
#include "fsdp/strategy.h"

namespace fsdp::train {

namespace fs = std::filesystem;

models::GPTConfig preset(const std::string& name) {
  models::GPTConfig c;
  if (name == "tiny") {
    c.context = 32;
    c.dim = 64;
    c.layers = 2;
    c.heads = 4;
  } else if (name == "default") {
    c.context = 128;
    c.dim = 256;
    c.layers = 4;
    c.heads = 4;
  } else if (name == "100m") {
    c.context = 128;
    c.dim = 768;
    c.layers = 14;
    c.heads = 12;
  } else {
    throw ConfigError("--preset '" + name + "' does not exist: expected tiny, default or 100m");
  }
  return c;
}

void validate(const TrainConfig& c) {
  auto positive = [](int64_t v, const char* flag) {
    if (v <= 0) throw ConfigError(std::string(flag) + " must be positive, got " + std::to_string(v));
  };
  positive(c.steps, "--steps");
  positive(c.batch, "--batch");
  positive(c.model.dim, "--dim");
  positive(c.model.layers, "--layers");
  positive(c.model.heads, "--heads");
  positive(c.model.context, "--context");
  positive(c.keep, "--keep");
  positive(c.log_every, "--log-every");
  if (c.save_every < 0) throw ConfigError("--save-every must be 0 (only at the end) or positive");
  if (c.model.dim % c.model.heads != 0) {
    throw ConfigError("--heads " + std::to_string(c.model.heads) + " does not divide the model width --dim " +
                      std::to_string(c.model.dim) + ": expected a divisor of it");
  }
  if (!c.data.empty()) {
    std::error_code ec;
    if (!fs::is_regular_file(c.data, ec)) throw ConfigError("--data " + c.data + ": no such file");
    const auto size = fs::file_size(c.data, ec);
    if (ec || size == 0) throw ConfigError("--data " + c.data + ": the file is empty");
    if (static_cast<int64_t>(size) < c.model.context + 2) {
      throw ConfigError("--data " + c.data + ": " + std::to_string(size) + " bytes is shorter than one sample (" +
                        std::to_string(c.model.context + 1) + " bytes at --context " + std::to_string(c.model.context) +
                        ")");
    }
  }
  std::error_code ec;
  fs::create_directories(c.out, ec);
  const std::string probe = (fs::path(c.out) / ".write-test").string();
  std::ofstream f(probe);
  if (ec || !f) throw ConfigError("--out " + c.out + ": the run directory cannot be created or written");
  f.close();
  fs::remove(probe, ec);
}

std::string generated_corpus(size_t bytes) {
  static const char* subjects[] = {"the cat", "a dog", "the old man", "my sister", "the teacher", "a small bird",
                                   "the farmer", "our neighbour"};
  static const char* verbs[] = {"sees", "likes", "finds", "carries", "paints", "follows", "remembers", "keeps"};
  static const char* objects[] = {"the red ball", "a green apple", "the long road", "a quiet song", "the blue door",
                                  "a warm coat", "the river", "an old book"};
  static const char* endings[] = {"in the morning", "after dinner", "near the house", "every day", "with care",
                                  "at night"};
  std::mt19937 gen(1234);
  std::string out;
  while (out.size() < bytes) {
    out += subjects[gen() % 8];
    out += ' ';
    out += verbs[gen() % 8];
    out += ' ';
    out += objects[gen() % 8];
    out += ' ';
    out += endings[gen() % 6];
    out += ". ";
    if (gen() % 5 == 0) out += "\n";
  }
  out.resize(bytes);
  return out;
}

namespace {

std::string read_text(const TrainConfig& c) {
  if (c.data.empty()) return generated_corpus();
  std::ifstream in(c.data, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

at::Tensor bytes_to_tokens(const std::string& text) {
  at::Tensor t = at::empty({static_cast<int64_t>(text.size())}, at::kByte);
  std::memcpy(t.data_ptr(), text.data(), text.size());
  return t.to(at::kLong);
}

std::string step_name(int64_t step) {
  std::ostringstream os;
  os << "step-" << std::setw(8) << std::setfill('0') << step;
  return os.str();
}

// Checkpoints in `dir`, newest first (by step in the name).
std::vector<std::pair<int64_t, std::string>> checkpoints_in(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() != 13 || name.rfind("step-", 0) != 0) continue;
    try {
      out.emplace_back(std::stoll(name.substr(5)), e.path().string());
    } catch (const std::exception&) {
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

void put_config(CheckpointState& s, const models::GPTConfig& c) {
  s.value("model.vocab", c.vocab_size).value("model.context", c.context).value("model.dim", c.dim);
  s.value("model.layers", c.layers).value("model.heads", c.heads);
}

models::GPTConfig config_of(const CheckpointInfo& info, const std::string& path) {
  models::GPTConfig c;
  auto get = [&](const char* key) {
    auto it = info.values.find(key);
    if (it == info.values.end()) throw ConfigError(path + " was not written by fsdp-train: it has no '" + key + "'");
    return std::stoll(it->second);
  };
  c.vocab_size = get("model.vocab");
  c.context = get("model.context");
  c.dim = get("model.dim");
  c.layers = get("model.layers");
  c.heads = get("model.heads");
  return c;
}

// The global batch of `step`: the same on every rank and after a resume.
std::pair<at::Tensor, at::Tensor> batch_of(const at::Tensor& tokens, int64_t step, const TrainConfig& c, int rank,
                                           int world) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(c.seed * 1000003ULL + static_cast<uint64_t>(step));
  const int64_t span = c.model.context + 1;
  at::Tensor starts = at::randint(0, tokens.numel() - span, {c.batch * world}, gen, at::kLong);
  at::Tensor mine = starts.narrow(0, rank * c.batch, c.batch);
  std::vector<at::Tensor> rows;
  for (int64_t i = 0; i < c.batch; ++i) rows.push_back(tokens.narrow(0, mine[i].item<int64_t>(), span));
  at::Tensor b = at::stack(rows);
  return {b.narrow(1, 0, c.model.context), b.narrow(1, 1, c.model.context)};
}

}  // namespace

double train(const TrainConfig& c, const dist::ProcessGroupPtr& world) {
  validate(c);
  FSDPStrategyOptions o;
  o.auto_wrap_module_types<models::GPTBlockImpl>()
      .precision(c.precision)
      .sharding_strategy(c.sharding_strategy)
      .state_dict_type(c.state_dict_type)
      .cpu_offload(c.cpu_offload)
      .seed(c.seed);
  if (c.activation_checkpointing) o.activation_checkpointing_module_types<models::GPTBlockImpl>();
  if (world) o.world(world);
  FSDPStrategy strategy(o);
  strategy.setup_environment();
  const int rank = strategy.global_rank(), nranks = strategy.world_size();
  const at::Tensor tokens = bytes_to_tokens(read_text(c));

  // The initial weights come from the seed alone: built under a process-wide
  // lock right after seeding, so that ranks that are threads of one process
  // (LibTorch's generator is global) build identical weights too.
  std::shared_ptr<models::GPTImpl> net;
  {
    static std::mutex init_mutex;
    std::lock_guard<std::mutex> lock(init_mutex);
    torch::manual_seed(c.seed);
    net = std::make_shared<models::GPTImpl>(c.model);
  }
  auto model = strategy.setup_module(net);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(c.lr));
  strategy.setup_optimizer(opt);
  const std::string ckpt_dir = (fs::path(c.out) / "checkpoints").string();
  int64_t start = 0;
  if (c.resume) {
    // Rank 0 picks the newest complete checkpoint; everyone loads it.
    std::string chosen;
    if (rank == 0) {
      for (const auto& [step, path] : checkpoints_in(ckpt_dir)) {
        try {
          auto info = inspect_checkpoint(path);
          auto saved = config_of(info, path);
          std::vector<std::string> diff;
          auto cmp = [&](const char* what, int64_t a, int64_t b) {
            if (a != b) diff.push_back(std::string(what) + " " + std::to_string(a) + " (checkpoint) vs " + std::to_string(b));
          };
          cmp("context", saved.context, c.model.context);
          cmp("dim", saved.dim, c.model.dim);
          cmp("layers", saved.layers, c.model.layers);
          cmp("heads", saved.heads, c.model.heads);
          if (!diff.empty()) {
            std::string msg = "--resume: " + path + " holds a model of another shape:";
            for (const auto& d : diff) msg += " " + d + ";";
            chosen = "!" + msg;
          } else {
            chosen = path;
          }
          break;
        } catch (const ConfigError&) {
          std::cerr << "fsdp-train: skipping incomplete or damaged checkpoint " << path << std::endl;
        }
      }
    }
    chosen = strategy.broadcast(chosen, 0);
    if (!chosen.empty() && chosen[0] == '!') throw ConfigError(chosen.substr(1));
    if (!chosen.empty()) {
      CheckpointState s;
      s.model("model", model.ptr()).optimizer("optimizer", opt).value("step", int64_t{0});
      strategy.load_checkpoint(chosen, s);
      start = s.get<int64_t>("step");
      strategy.print("fsdp-train: resumed from " + chosen + " at step " + std::to_string(start));
    }
  }
  // Metrics: one JSON object per step; on resume, the lines after the checkpoint go.
  const std::string metrics_path = (fs::path(c.out) / "metrics.jsonl").string();
  if (rank == 0) {
    std::vector<std::string> kept;
    if (start > 0) {
      std::ifstream in(metrics_path);
      for (std::string line; std::getline(in, line);) {
        const auto at = line.find("\"step\":");
        if (at != std::string::npos && std::stoll(line.substr(at + 7)) <= start) kept.push_back(line);
      }
    }
    std::ofstream out(metrics_path, std::ios::trunc);
    for (const auto& l : kept) out << l << "\n";
  }
  std::ofstream metrics;
  if (rank == 0) metrics.open(metrics_path, std::ios::app);
  double mean_loss = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = start; step < c.steps; ++step) {
    auto [x, y] = batch_of(tokens, step, c, rank, nranks);
    const auto ts = std::chrono::steady_clock::now();
    opt.zero_grad();
    auto loss = models::gpt_loss(model(x), y);
    loss.backward();
    strategy.clip_gradients_norm(model.ptr(), opt, 1.0);
    opt.step();
    mean_loss = strategy.all_reduce(loss.detach().to(at::kDouble)).item<double>();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
    const double tok_s = static_cast<double>(c.batch * c.model.context * nranks) / dt;
    if (rank == 0) {
      metrics << "{\"step\":" << step + 1 << ",\"loss\":" << mean_loss << ",\"tokens_per_s\":" << tok_s
              << ",\"elapsed_s\":" << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
              << "}" << std::endl;
    }
    if ((step + 1) % c.log_every == 0 || step + 1 == c.steps) {
      std::ostringstream os;
      os << "step " << step + 1 << "/" << c.steps << " loss " << std::fixed << std::setprecision(4) << mean_loss
         << " tokens/s " << std::setprecision(0) << tok_s;
      strategy.print(os.str());
    }
    if ((c.save_every > 0 && (step + 1) % c.save_every == 0) || step + 1 == c.steps) {
      CheckpointState s;
      s.model("model", model.ptr()).optimizer("optimizer", opt).value("step", step + 1);
      put_config(s, c.model);
      const std::string path = (fs::path(ckpt_dir) / step_name(step + 1)).string();
      if (rank == 0) fs::create_directories(ckpt_dir);
      strategy.barrier();
      strategy.save_checkpoint(path, s);
      if (rank == 0) {  // keep the newest K
        auto all = checkpoints_in(ckpt_dir);
        for (size_t i = static_cast<size_t>(c.keep); i < all.size(); ++i) fs::remove_all(all[i].second);
      }
      strategy.barrier();
    }
  }
  return mean_loss;
}

std::string generate(const std::string& checkpoint, const std::string& prompt, int64_t tokens, uint64_t seed,
                     const dist::ProcessGroupPtr& world) {
  const auto info = inspect_checkpoint(checkpoint);
  const models::GPTConfig cfg = config_of(info, checkpoint);
  auto model = std::make_shared<models::GPTImpl>(cfg);
  load_checkpoint(checkpoint, model, *world);
  model->eval();
  torch::NoGradGuard no_grad;
  std::string text = prompt.empty() ? std::string("\n") : prompt;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (int64_t i = 0; i < tokens; ++i) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(text.size()), cfg.context);
    at::Tensor ctx = bytes_to_tokens(text.substr(text.size() - static_cast<size_t>(n))).unsqueeze(0);
    at::Tensor logits = model->forward(ctx).select(1, n - 1).squeeze(0).to(at::kFloat) / 0.8;
    auto [top, idx] = logits.topk(20);
    at::Tensor probs = at::softmax(top, 0);
    const int64_t pick = at::multinomial(probs, 1, false, gen).item<int64_t>();
    text += static_cast<char>(idx[pick].item<int64_t>());
  }
  return text;
}

}  // namespace fsdp::train
