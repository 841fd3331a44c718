// The GPT trainer: data, the training loop through FSDPStrategy, metrics,
// checkpoints (save every N, keep K, resume), and generation.
#include "fsdp/train/gpt_trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>

#include "fsdp/checkpoint_io.h"
#include "fsdp/error.h"
#include "fsdp/strategy.h"
#include "../fsdp/ckpt_format.h"

namespace fsdp::train {

namespace fs = std::filesystem;

namespace {

// "R,S" -> (R, S), both positive.
std::pair<int, int> parse_mesh(const std::string& mesh) {
  const auto comma = mesh.find(',');
  try {
    if (comma == std::string::npos) throw std::invalid_argument("no comma");
    const int r = std::stoi(mesh.substr(0, comma)), sh = std::stoi(mesh.substr(comma + 1));
    if (r <= 0 || sh <= 0) throw std::invalid_argument("not positive");
    return {r, sh};
  } catch (const std::exception&) {
    throw ConfigError("--mesh '" + mesh + "' is invalid: expected R,S (replicate and shard sizes, e.g. 2,4)");
  }
}

}  // namespace

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
  if (!(c.lr > 0) || !std::isfinite(c.lr)) {
    throw ConfigError("--lr must be a positive number, got " + std::to_string(c.lr));
  }
  if (std::isnan(c.min_lr) || c.min_lr > c.lr) {
    throw ConfigError("--min-lr must be at most --lr (" + std::to_string(c.lr) + "; negative: a tenth of it), got " +
                      std::to_string(c.min_lr));
  }
  if (c.save_every < 0) throw ConfigError("--save-every must be 0 (only at the end) or positive");
  if (c.eval_every < 0) throw ConfigError("--eval-every must be 0 (never) or positive");
  if (c.backward_prefetch != "pre" && c.backward_prefetch != "post" && c.backward_prefetch != "none") {
    throw ConfigError("--backward-prefetch '" + c.backward_prefetch + "' is invalid: expected pre, post or none");
  }
  if (!c.mesh.empty()) parse_mesh(c.mesh);
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
  if (c.out.empty()) throw ConfigError("--out is empty: expected the run directory (e.g. runs/latest)");
  std::error_code ec;
  fs::create_directories(c.out, ec);
  bool writable = false;
  if (!ec) {
    const std::string probe = (fs::path(c.out) / ".write-test").string();
    writable = static_cast<bool>(std::ofstream(probe));
    fs::remove(probe, ec);
  }
  if (!writable) throw ConfigError("--out " + c.out + ": the run directory cannot be created or written");
}

int64_t held_out_bytes(int64_t total, int64_t context) {
  const int64_t want = std::max<int64_t>(total / 10, (context + 2) * 8);
  return total - want >= context + 2 ? want : 0;
}

int64_t warmup_steps(const TrainConfig& c) { return c.warmup_steps < 0 ? c.steps / 5 : c.warmup_steps; }

double min_learning_rate(const TrainConfig& c) { return c.min_lr < 0 ? c.lr / 10 : c.min_lr; }

double learning_rate(const TrainConfig& c, int64_t step) {
  const int64_t warmup = warmup_steps(c);
  if (step < warmup) return c.lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (c.steps <= warmup) return c.lr;
  const double progress = std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(c.steps - warmup));
  const double min_lr = min_learning_rate(c);
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (c.lr - min_lr);
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

// A number after `key` in a metrics.jsonl line; nullopt when the key is
// absent, ConfigError naming the file and line when what follows is not one.
std::optional<double> metric(const std::string& line, const char* key, const std::string& path, int64_t lineno) {
  const auto at = line.find(key);
  if (at == std::string::npos) return std::nullopt;
  const char* begin = line.c_str() + at + std::strlen(key);
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(v)) {
    throw ConfigError(path + " line " + std::to_string(lineno) + ": " + key + " is not followed by a number (line: '" +
                      line.substr(0, 80) + "'): expected one JSON object per step as fsdp-train writes it");
  }
  return v;
}

// A metrics.jsonl line with its number in the file and its "step".
struct MetricsLine {
  int64_t step, lineno;
  std::string text;
};

// Each non-empty line, its "step" required; ConfigError naming the line otherwise.
std::vector<MetricsLine> read_metrics(const std::string& path) {
  std::vector<MetricsLine> out;
  std::ifstream in(path);
  int64_t lineno = 0;
  for (std::string line; std::getline(in, line);) {
    ++lineno;
    if (line.empty()) continue;
    auto step = metric(line, "\"step\":", path, lineno);
    if (!step) {
      throw ConfigError(path + " line " + std::to_string(lineno) + " has no \"step\" (line: '" + line.substr(0, 80) +
                        "'): expected one JSON object per step as fsdp-train writes it");
    }
    out.push_back({static_cast<int64_t>(*step), lineno, line});
  }
  return out;
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

void put_config(CheckpointState& s, const TrainConfig& run) {
  const models::GPTConfig& c = run.model;
  s.value("model.vocab", c.vocab_size).value("model.context", c.context).value("model.dim", c.dim);
  s.value("model.layers", c.layers).value("model.heads", c.heads);
  // The run's settings, so that a resume can say which flags it overrides.
  s.value("run.lr", run.lr).value("run.min_lr", min_learning_rate(run)).value("run.warmup_steps", warmup_steps(run));
  s.value("run.steps", run.steps).value("run.batch", run.batch).value("run.seed", static_cast<int64_t>(run.seed));
}

// The flags of `c` that differ from the run settings saved in a checkpoint
// ("--lr 0.003 -> 0.03"); checkpoints without them give none.
std::vector<std::string> overridden_flags(const CheckpointInfo& info, const TrainConfig& c) {
  std::vector<std::string> out;
  auto check = [&](const char* key, const char* flag, double now) {
    auto it = info.values.find(key);
    if (it == info.values.end()) return;
    const double was = std::strtod(it->second.c_str(), nullptr);
    if (std::abs(was - now) > 1e-9 * std::max(1.0, std::abs(now))) {
      std::ostringstream os;
      os << flag << " " << was << " -> " << now;
      out.push_back(os.str());
    }
  };
  check("run.lr", "--lr", c.lr);
  check("run.min_lr", "--min-lr", min_learning_rate(c));
  check("run.warmup_steps", "--warmup-steps", static_cast<double>(warmup_steps(c)));
  check("run.steps", "--steps", static_cast<double>(c.steps));
  check("run.batch", "--batch", static_cast<double>(c.batch));
  check("run.seed", "--seed", static_cast<double>(c.seed));
  return out;
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
                                           int world, at::Device device) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(c.seed * 1000003ULL + static_cast<uint64_t>(step));
  const int64_t span = c.model.context + 1;
  at::Tensor starts = at::randint(0, tokens.numel() - span, {c.batch * world}, gen, at::kLong);
  at::Tensor mine = starts.narrow(0, rank * c.batch, c.batch);
  std::vector<at::Tensor> rows;
  for (int64_t i = 0; i < c.batch; ++i) rows.push_back(tokens.narrow(0, mine[i].item<int64_t>(), span));
  at::Tensor b = at::stack(rows).to(device);
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
  if (!c.mesh.empty()) {
    const auto [r, sh] = parse_mesh(c.mesh);
    o.sharding_strategy(ShardingStrategy::kHybridShard).device_mesh(r, sh);
  }
  o.forward_prefetch(c.forward_prefetch).limit_all_gathers(c.limit_all_gathers);
  o.backward_prefetch(c.backward_prefetch == "pre"    ? BackwardPrefetch::kBackwardPre
                      : c.backward_prefetch == "post" ? BackwardPrefetch::kBackwardPost
                                                      : BackwardPrefetch::kNone);
  if (world) o.world(world);
  FSDPStrategy strategy(o);
  strategy.setup_environment();
  const int rank = strategy.global_rank(), nranks = strategy.world_size();
  // The last tenth of the text is held out for evaluation.
  const at::Tensor all_tokens = bytes_to_tokens(read_text(c));
  const int64_t split = all_tokens.numel() - held_out_bytes(all_tokens.numel(), c.model.context);
  const bool can_eval = split < all_tokens.numel();
  const at::Tensor tokens = can_eval ? all_tokens.narrow(0, 0, split) : all_tokens;
  const at::Tensor held_out = can_eval ? all_tokens.narrow(0, split, all_tokens.numel() - split) : all_tokens;

  // The initial weights come from the seed alone: built under a process-wide
  // lock right after seeding, so that ranks that are threads of one process
  // (LibTorch's generator is global) build identical weights too. Under
  // empty_init the blocks are rebuilt at wrapping from the generator state
  // they were first built from: the same values.
  std::shared_ptr<models::GPTImpl> net;
  {
    static std::mutex init_mutex;
    std::lock_guard<std::mutex> lock(init_mutex);
    torch::manual_seed(c.seed);
    auto deferred = strategy.module_init_context(c.empty_init);
    net = std::make_shared<models::GPTImpl>(c.model);
  }
  // Thread ranks share the generator: no rank wraps (rebuilding its blocks
  // from replayed generator states) while another still builds, and none
  // trains (dropout draws) while another still wraps.
  strategy.barrier();
  auto model = strategy.setup_module(net);
  strategy.barrier();
  // nanoGPT's betas: beta2 0.95 keeps early steps from overshooting.
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(c.lr).betas({0.9, 0.95}));
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
            const auto over = overridden_flags(info, c);
            if (!over.empty()) {
              std::string msg = "fsdp-train: --resume: these flags differ from the checkpoint's run and apply from "
                                "its step on:";
              for (size_t i = 0; i < over.size(); ++i) msg += (i ? "; " : " ") + over[i];
              std::cout << msg << std::endl;
            }
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
  std::string metrics_problem;  // rank 0's, told to every rank
  if (rank == 0) {
    try {
      std::vector<std::string> kept;
      if (start > 0) {
        for (const auto& m : read_metrics(metrics_path)) {
          if (m.step <= start) kept.push_back(m.text);
        }
      }
      std::ofstream out(metrics_path, std::ios::trunc);
      for (const auto& l : kept) out << l << "\n";
    } catch (const ConfigError& e) {
      metrics_problem = std::string("--resume: ") + e.what();
    }
  }
  metrics_problem = strategy.broadcast(metrics_problem, 0);
  if (!metrics_problem.empty()) throw ConfigError(metrics_problem);
  std::ofstream metrics, log;
  if (rank == 0) {
    metrics.open(metrics_path, std::ios::app);
    log.open((fs::path(c.out) / "train.log").string(), start > 0 ? std::ios::app : std::ios::trunc);
  }
  const bool terminal = rank == 0 && isatty(STDOUT_FILENO);
  // [collective] Mean loss over fixed held-out batches (the same on every rank).
  auto evaluate = [&]() {
    torch::NoGradGuard no_grad;
    TrainConfig ec = c;
    ec.seed = c.seed + 7777;
    double sum = 0;
    const int n = 4;
    for (int i = 0; i < n; ++i) {
      auto [x, y] = batch_of(held_out, i, ec, rank, nranks, strategy.root_device());
      sum += models::gpt_loss(model(x), y).to(at::kDouble).item<double>();
    }
    return strategy.all_reduce(at::full({1}, sum / n, at::kDouble)).item<double>();
  };
  double mean_loss = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = start; step < c.steps; ++step) {
    detail::ckpt::crash_point("train-step", rank);  // fault injection for the reliability tests
    auto [x, y] = batch_of(tokens, step, c, rank, nranks, strategy.root_device());
    const auto ts = std::chrono::steady_clock::now();
    const double lr = learning_rate(c, step);
    for (auto& group : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    opt.zero_grad();
    auto loss = models::gpt_loss(model(x), y);
    strategy.backward(loss);  // scaled under "16-mixed"
    const double grad_norm = strategy.clip_gradients_norm(model.ptr(), opt, 1.0).to(at::kDouble).item<double>();
    strategy.optimizer_step(opt);
    mean_loss = strategy.all_reduce(loss.detach().to(at::kDouble)).item<double>();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
    const double tok_s = static_cast<double>(c.batch * c.model.context * nranks) / dt;
    const bool last = step + 1 == c.steps;
    double eval_loss = -1;
    if (c.eval_every > 0 && ((step + 1) % c.eval_every == 0 || last)) eval_loss = evaluate();
    // Memory of every rank, for the progress line.
    std::ostringstream mem;
    mem << std::fixed << std::setprecision(0) << resident_memory_mib();
    auto mems = strategy.group().all_gather_bytes(mem.str());
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double eta = elapsed / static_cast<double>(step + 1 - start) * static_cast<double>(c.steps - step - 1);
    if (rank == 0) {
      metrics << "{\"step\":" << step + 1 << ",\"loss\":" << mean_loss << ",\"lr\":" << lr
              << ",\"grad_norm\":" << grad_norm << ",\"tokens_per_s\":" << tok_s << ",\"elapsed_s\":" << elapsed;
      if (eval_loss >= 0) metrics << ",\"eval_loss\":" << eval_loss;
      metrics << "}" << std::endl;
      std::ostringstream os;
      os << "step " << step + 1 << "/" << c.steps << " loss " << std::fixed << std::setprecision(4) << mean_loss;
      if (eval_loss >= 0) os << " eval " << eval_loss;
      os << " tokens/s " << std::setprecision(0) << tok_s << " eta " << eta << "s mem";
      for (size_t r = 0; r < mems.size(); ++r) os << (r ? "/" : " ") << mems[r];
      os << " MiB";
      log << os.str() << std::endl;
      if (terminal) {
        std::cout << "\r" << os.str() << "\x1b[K" << std::flush;  // in place
        if (last) std::cout << std::endl;
      } else if ((step + 1) % c.log_every == 0 || last || eval_loss >= 0) {
        std::cout << os.str() << std::endl;
      }
    }
    if ((c.save_every > 0 && (step + 1) % c.save_every == 0) || step + 1 == c.steps) {
      CheckpointState s;
      s.model("model", model.ptr()).optimizer("optimizer", opt).value("step", step + 1);
      put_config(s, c);
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
  if (rank == 0) write_loss_curve(c.out);
  return mean_loss;
}

std::string write_loss_curve(const std::string& out) {
  std::vector<std::pair<double, double>> train, eval;
  const std::string metrics_path = (fs::path(out) / "metrics.jsonl").string();
  for (const auto& m : read_metrics(metrics_path)) {
    const auto loss = metric(m.text, "\"loss\":", metrics_path, m.lineno);
    const auto ev = metric(m.text, "\"eval_loss\":", metrics_path, m.lineno);
    if (!loss) continue;
    train.emplace_back(static_cast<double>(m.step), *loss);
    if (ev) eval.emplace_back(static_cast<double>(m.step), *ev);
  }
  const std::string path = (fs::path(out) / "loss.svg").string();
  const double w = 640, h = 360, pad = 50;
  double max_step = 1, max_loss = 0.1;
  for (auto& [x, y] : train) max_step = std::max(max_step, x), max_loss = std::max(max_loss, y);
  for (auto& [x, y] : eval) max_loss = std::max(max_loss, y);
  auto px = [&](double x) { return pad + (w - 2 * pad) * x / max_step; };
  auto py = [&](double y) { return h - pad - (h - 2 * pad) * y / max_loss; };
  std::ofstream svg(path, std::ios::trunc);
  svg << std::fixed << std::setprecision(1) << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w
      << "\" height=\"" << h << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<line x1=\"" << pad << "\" y1=\"" << h - pad << "\" x2=\"" << w - pad << "\" y2=\"" << h - pad
      << "\" stroke=\"black\"/>\n<line x1=\"" << pad << "\" y1=\"" << pad << "\" x2=\"" << pad << "\" y2=\""
      << h - pad << "\" stroke=\"black\"/>\n"
      << "<text x=\"" << w / 2 << "\" y=\"" << h - 12 << "\" text-anchor=\"middle\">step (last " << max_step
      << ")</text>\n<text x=\"14\" y=\"" << h / 2 << "\" transform=\"rotate(-90 14 " << h / 2
      << ")\" text-anchor=\"middle\">loss (top " << max_loss << ")</text>\n";
  auto polyline = [&](const std::vector<std::pair<double, double>>& pts, const char* color, const char* label, double ly) {
    if (pts.empty()) return;
    svg << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"1.5\" points=\"";
    for (auto& [x, y] : pts) svg << px(x) << "," << py(y) << " ";
    svg << "\"/>\n<text x=\"" << w - pad - 110 << "\" y=\"" << ly << "\" fill=\"" << color << "\">" << label
        << "</text>\n";
  };
  polyline(train, "steelblue", "training loss", pad);
  polyline(eval, "darkorange", "held-out loss", pad + 16);
  svg << "</svg>\n";
  return path;
}

std::string generate(const std::string& checkpoint, const std::string& prompt, const GenerateOptions& o,
                     const dist::ProcessGroupPtr& world) {
  if (o.tokens < 0) throw ConfigError("generate: --tokens must be 0 or positive, got " + std::to_string(o.tokens));
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature)) {
    throw ConfigError("generate: --temperature must be 0 (greedy) or positive, got " + std::to_string(o.temperature));
  }
  const auto info = inspect_checkpoint(checkpoint);
  const models::GPTConfig cfg = config_of(info, checkpoint);
  if (o.top_k < 0 || o.top_k > cfg.vocab_size) {
    throw ConfigError("generate: --top-k must be between 0 (all) and the vocabulary size " +
                      std::to_string(cfg.vocab_size) + ", got " + std::to_string(o.top_k));
  }
  auto model = std::make_shared<models::GPTImpl>(cfg);
  load_checkpoint(checkpoint, model, *world);
  model->eval();
  torch::NoGradGuard no_grad;
  std::string text = prompt.empty() ? std::string("\n") : prompt;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  for (int64_t i = 0; i < o.tokens; ++i) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(text.size()), cfg.context);
    at::Tensor ctx = bytes_to_tokens(text.substr(text.size() - static_cast<size_t>(n))).unsqueeze(0);
    at::Tensor logits = model->forward(ctx).select(1, n - 1).squeeze(0).to(at::kFloat);
    int64_t next = 0;
    if (o.temperature == 0) {
      next = logits.argmax().item<int64_t>();
    } else {
      auto [top, idx] = logits.topk(o.top_k > 0 ? o.top_k : logits.size(0));
      at::Tensor probs = at::softmax(top / o.temperature, 0);
      next = idx[at::multinomial(probs, 1, false, gen).item<int64_t>()].item<int64_t>();
    }
    text += static_cast<char>(next);
  }
  return text;
}

}  // namespace fsdp::train
