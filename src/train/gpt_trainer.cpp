// The GPT trainer's entry points: the settings (presets, validation, the
// learning-rate schedule), the training loop through FSDPStrategy, and
// generation. Its data, metrics, progress line and run directory are units
// of their own (batches, metrics, progress, run_directory; docs/architecture.md).
#include "fsdp/train/gpt_trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <tuple>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/error.h"
#include "fsdp/observability/loggers.h"
#include "fsdp/observability/profiler.h"
#include "fsdp/strategy/strategy.h"
#include "fsdp/dist/rank_errors.h"
#include "../core/trace_span.h"
#include "metrics.h"
#include "progress.h"
#include "run_directory.h"

namespace fsdp::train {

namespace fs = std::filesystem;

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

using Model = Unit<models::GPTImpl>;

// The run's text: --data memory-mapped (never copied whole), or the generated corpus.
Corpus read_corpus(const TrainConfig& c) {
  if (c.data.empty()) return Corpus::hold(generated_corpus(), "the generated corpus");
  return Corpus::map_file(c.data, "--data");
}

// The strategy of a run: the one place where TrainConfig's settings become
// FSDPStrategyOptions.
FSDPStrategyOptions strategy_options(const TrainConfig& c, const dist::ProcessGroupPtr& world) {
  FSDPStrategyOptions o = c.strategy;
  o.auto_wrap_module_types<models::GPTBlockImpl>();
  if (world) o.world(world);
  return o;
}

// [collective] The model, wrapped. Its initial weights come from the seed
// alone: under empty_init each block is built when FSDP shards it, from the
// generator state it was first built from, so with the values an eager
// build has. Seeds LibTorch's process-wide generator.
Model build_model(FSDPStrategy& strategy, const TrainConfig& c) {
  torch::manual_seed(c.strategy.seed());
  std::shared_ptr<models::GPTImpl> net;
  {
    auto deferred = strategy.module_init_context(c.empty_init);
    net = std::make_shared<models::GPTImpl>(c.model);
  }
  return strategy.setup_module(net);
}

// What a checkpoint of the run holds at `step` (the steps done); what a
// resume loads. A save adds the sample stream's position ("samples") and
// the world size ("world"); a resume finds them among the values it did not
// ask for (ResumePoint::values), absent in checkpoints from before them.
CheckpointState run_state(const Model& model, torch::optim::Optimizer& opt, int64_t step) {
  CheckpointState s;
  s.model("model", model.ptr()).optimizer("optimizer", opt).value("step", step);
  return s;
}

// ConfigError when the checkpoint a run resumed from (`from`) trained on the
// same --data path as `c` and recorded another fingerprint of it
// (Corpus::fingerprint) than `now`: the file changed in place. With
// --allow-data-change, said on stderr instead. A changed path is a changed
// flag (overridden_flags names it); a checkpoint from before fingerprints
// has none to compare.
void check_data_unchanged(const ResumePoint& from, const TrainConfig& c, const std::string& now) {
  const auto text = [&](const char* key) -> std::optional<std::string> {
    const auto it = from.values.find(key);
    if (it == from.values.end() || !std::holds_alternative<std::string>(it->second)) return std::nullopt;
    return std::get<std::string>(it->second);
  };
  const auto was = text("data_fingerprint"), path = text("config.run.data");
  if (!was || !path || *path != c.data || *was == now) return;
  const std::string what = (c.data.empty() ? std::string("the generated corpus") : "--data " + c.data) +
                           " changed since " + from.path + " was saved: its fingerprint (size:hash of sampled "
                           "pages) was " + *was + ", it is " + now;
  if (!c.allow_data_change) {
    throw ConfigError(what + ". The run would continue on other text than it trained on; expected the same file, or "
                             "--allow-data-change to resume on the changed one on purpose");
  }
  std::cerr << "fsdp-train: WARNING: " << what << "; resuming on it (--allow-data-change)" << std::endl;
}

// What train_step did: the mean loss over the ranks, the gradient norm
// before clipping, and whether they were finite (not: the optimizer step
// was not taken).
struct StepResult {
  double loss = 0, grad_norm = 0;
  bool finite = true;
};

// [collective] One optimizer step on `batch` at learning rate `lr`, with the
// gradients clipped to norm 1; taken only when the mean loss (and, without the
// strategy's gradient scaler, the gradient norm) is finite: the same decision
// on every rank.
StepResult train_step(const FSDPStrategy& strategy, Model& model, torch::optim::Optimizer& opt, const Batch& batch,
                      double lr) {
  for (auto& group : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  opt.zero_grad();
  auto loss = models::gpt_loss(model(batch.inputs), batch.targets);
  strategy.backward(loss);  // scaled under "16-mixed"
  StepResult r;
  r.loss = strategy.all_reduce(loss.detach().to(at::kDouble)).item<double>();
  r.grad_norm = strategy.clip_gradients_norm(model.ptr(), opt, 1.0).to(at::kDouble).item<double>();
  // Under "16-mixed" the scaler skips steps with inf gradients itself.
  r.finite = std::isfinite(r.loss) && (strategy.grad_scaler() != nullptr || std::isfinite(r.grad_norm));
  if (r.finite) strategy.optimizer_step(opt);
  return r;
}

// [collective] The mean loss over the held-out set (kHeldOutSamples samples,
// the same at any world size; the same value on every rank). Every rank
// runs the same forwards; the padding rows of a round are left out.
double evaluate(const FSDPStrategy& strategy, Model& model, const BatchSampler& batches) {
  torch::NoGradGuard no_grad;
  double sum = 0;  // over this rank's samples, of each sample's mean loss
  for (int64_t i = 0; i < batches.held_out_rounds(); ++i) {
    const Batch b = batches.held_out(i);
    const at::Tensor logits = model(b.inputs);
    const int64_t rows = batches.held_out_rows(i);
    if (rows == 0) continue;
    sum += models::gpt_loss(logits.narrow(0, 0, rows), b.targets.narrow(0, 0, rows)).to(at::kDouble).item<double>() *
           static_cast<double>(rows);
  }
  return strategy.all_reduce(at::full({1}, sum, at::kDouble), dist::ReduceOp::kSum).item<double>() /
         static_cast<double>(kHeldOutSamples);
}

// [collective] Every rank's resident memory in MiB, as text, in rank order.
std::vector<std::string> memory_of_ranks(const FSDPStrategy& strategy) {
  std::ostringstream mem;
  mem << std::fixed << std::setprecision(0) << resident_memory_mib();
  return strategy.group().all_gather_bytes(mem.str());
}

// The run's configuration as the loggers' hyperparameters.
Hyperparameters hyperparameters(const TrainConfig& c, int world) {
  return {{"preset", c.preset},
          {"dim", c.model.dim},
          {"layers", c.model.layers},
          {"heads", c.model.heads},
          {"context", c.model.context},
          {"steps", c.steps},
          {"batch", c.batch},
          {"lr", c.lr},
          {"warmup_steps", c.warmup_steps},
          {"min_lr", c.min_lr},
          {"precision", c.strategy.precision()},
          {"sharding_strategy", std::string(to_string(c.strategy.sharding_strategy()))},
          {"activation_checkpointing", activation_checkpointing(c.strategy)},
          {"world", int64_t{world}},
          {"seed", static_cast<int64_t>(c.strategy.seed())},
          {"data", c.data.empty() ? std::string("(generated)") : c.data}};
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

double train(const TrainConfig& config, const dist::ProcessGroupPtr& world) {
  validate(config);
  TrainConfig c = config;
  FSDPStrategy strategy(strategy_options(c, world));
  strategy.setup_environment();
  const int rank = strategy.global_rank(), nranks = strategy.world_size();
  if (rank == 0 && c.strategy.precision().rfind("16-", 0) == 0 && strategy.root_device().is_cpu()) {
    std::cerr << "fsdp-train: WARNING: --precision " << c.strategy.precision()
              << " on CPU: float16 is made for CUDA (16-mixed scales the loss against float16's narrow range); "
                 "LibTorch 2.x computes it on CPU, usually more slowly than float32. bf16-mixed is the CPU's mixed "
                 "precision"
              << std::endl;
  }
  // One job per run directory: rank 0 holds its lock until train() returns.
  const RunDirectory run(c.out);
  // [collective] Whether the job continues the run, agreed by every rank:
  // any rank's --resume, or a restart of the job that wrote run.json, which
  // rank 0 proves (job_token: the launcher's restart count alone proves
  // nothing, and torchrun restarts the nodes of an elastic job with
  // different counts). A restart repeats the command line: it continues
  // the run even with --overwrite, and takes the run's own newest
  // checkpoint over --resume-from's.
  std::string job;
  if (rank == 0) job = job_token();
  const bool restarted = rank == 0 && run.records_job(job);
  const auto votes = strategy.group().all_gather_bytes(restarted ? "restart" : c.resume ? "resume" : "");
  const bool any_restart = std::find(votes.begin(), votes.end(), "restart") != votes.end();
  const bool any_resume = std::find(votes.begin(), votes.end(), "resume") != votes.end();
  if (any_restart || (c.resume_from.empty() && any_resume)) {
    c.resume = true;
    c.overwrite = false;
  }
  std::optional<RunLock> lock;
  dist::agree_from(strategy.group(), 0, dist::capture([&] {
                       if (rank == 0) lock.emplace(c.out);
                     }),
                     "");
  const RunIdentity identity = run.begin(strategy, c, job);
  // A file one rank cannot map stops every rank with its error, not a hang.
  std::optional<Corpus> corpus;
  // Its fingerprint goes into each checkpoint; a resume compares it.
  std::string data_fingerprint;
  std::optional<BatchSampler> sampler;
  dist::agree(strategy.group(), dist::capture([&] {
                corpus.emplace(read_corpus(c));
                data_fingerprint = corpus->fingerprint();
                sampler.emplace(std::move(*corpus), c.model.context, c.batch, c.strategy.seed(), rank, nranks,
                                strategy.root_device());
              }),
              "reading --data");
  const BatchSampler& batches = *sampler;
  const bool evaluates = c.eval_every > 0 && batches.has_held_out();
  if (c.eval_every > 0 && !evaluates) {
    strategy.print("fsdp-train: " + batches.corpus().name() + " is too short to hold any text out (" +
                   std::to_string(batches.corpus().size()) + " bytes; at least " +
                   std::to_string(min_bytes_to_hold_out(c.model.context)) +
                   " needed): no held-out loss is computed");
  }
  Model model = build_model(strategy, c);
  // nanoGPT's betas: beta2 0.95 keeps early steps from overshooting.
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(c.lr).betas({0.9, 0.95}));
  strategy.setup_optimizer(opt);
  int64_t start = 0, position = 0;  // the step, and the sample stream's position
  ResumePoint from;
  std::optional<StepMetrics::Resize> resized;
  if (c.resume || !c.resume_from.empty()) {
    CheckpointState s = run_state(model, opt, 0);
    from = run.resume(strategy, c, identity, s);
    if (!from.path.empty()) {
      // Where the sample stream continues (batches.h), every value checked
      // against this run's settings: the same values, and so the same
      // error, on every rank.
      const ResumedPosition at = resumed_position(from.path, from.values, s.get<int64_t>("step"), c, nranks);
      start = at.step;
      position = at.samples;
      strategy.print("fsdp-train: resumed from " + from.path + " at step " + std::to_string(start));
      dist::agree(strategy.group(), dist::capture([&] { check_data_unchanged(from, c, data_fingerprint); }),
                  "--resume: comparing --data with the checkpoint's");
      const auto& saved_world = at.world;
      if (saved_world && *saved_world != nranks) {
        resized.emplace();
        resized->from_world = static_cast<int>(*saved_world);
        resized->to_world = nranks;
        resized->step = start;
      }
    }
  }
  // Before step 1: what every save will need (checkpoints/ usable, the
  // saves' names free), so that a run never trains to lose it at a save.
  dist::agree_from(strategy.group(), 0, dist::capture([&] {
                     if (rank == 0) run.check_saves(c, start);
                   }),
                   "");
  // Rank 0 writes the metrics (on resume, those after the checkpoint's step
  // go), the loggers' files and the log; its error reaches every rank.
  const LoggerChoice chosen = chosen_loggers(c.loggers);
  std::optional<MetricsWriter> metrics;
  std::optional<Progress> progress;
  std::vector<std::shared_ptr<Logger>> loggers;
  std::shared_ptr<TensorBoardLogger> tensorboard;
  const auto failure = dist::capture([&] {
    if (rank != 0) return;
    if (chosen.jsonl) metrics.emplace(run.metrics_path(), start);
    progress.emplace(run.log_path(), start > 0, c.steps, c.log_every, isatty(STDOUT_FILENO) != 0);
    if (chosen.tensorboard) {
      tensorboard = std::make_shared<TensorBoardLogger>(c.out, "", std::string(), /*default_hp_metric=*/false);
      loggers.push_back(tensorboard);
    }
    if (chosen.csv) loggers.push_back(std::make_shared<CSVLogger>(c.out, "csv"));
    for (const auto& logger : loggers) logger->open();
    // A session START: a resumed run does its later steps again, and
    // TensorBoard drops the old ones (its Python reader ignores a run's
    // first START, so every job writes one).
    if (tensorboard) tensorboard->log_restart(start + 1);
    const Hyperparameters hparams = hyperparameters(c, nranks);
    if (tensorboard) tensorboard->log_hyperparams(hparams, {"loss", "eval_loss"});
    for (const auto& logger : loggers) {
      if (logger != tensorboard) logger->log_hyperparams(hparams);
    }
  });
  dist::agree_from(strategy.group(), 0, failure, start > 0 ? "--resume: " : "");
  StepRange profiled;
  if (!c.profile_steps.empty()) {
    profiled = parse_step_range(c.profile_steps, "--profile-steps");
    if (profiled.last <= start) {
      strategy.print("fsdp-train: --profile-steps " + c.profile_steps + ": those steps were done before step " +
                     std::to_string(start) + ", where this job resumed; nothing is profiled");
    }
  }
  Profiler profiler;
  const std::string trace_path =
      (fs::path(c.out) / "profile" / ("rank_" + std::to_string(rank) + ".pt.trace.json")).string();
  double mean_loss = 0;
  int64_t skipped = 0;  // steps skipped for a non-finite loss (rank 0's count)
  const auto t0 = std::chrono::steady_clock::now();
  if (resized && rank == 0) {
    resized->seconds_lost = std::chrono::duration<double>(std::chrono::system_clock::now() - from.committed_at).count();
    std::ostringstream what;
    what << "fsdp-train: resized from world " << resized->from_world << " to world " << resized->to_world
         << ": resumed from step " << resized->step << " (" << from.path << "), resharded; " << std::fixed
         << std::setprecision(1) << resized->seconds_lost
         << " s lost since that checkpoint was committed; the sample stream continues at sample " << position;
    progress->note(what.str());
  }
  for (int64_t step = start; step < c.steps; ++step) {
    // A profile starts at its first step (or the first this job does).
    if (profiled.contains(step + 1) && !profiler.running()) profiler.start(strategy.root_device().is_cuda());
    detail::Span step_span;
    step_span.begin("step", std::to_string(step + 1));
    // A --data file truncated under the run is a named error on every rank
    // (Corpus::read), never SIGBUS nor a rank left waiting.
    Batch batch;
    dist::agree(strategy.group(), dist::capture([&] { batch = batches.training(position); }),
                "step " + std::to_string(step + 1) + ": reading --data");
    const auto ts = std::chrono::steady_clock::now();
    const RuntimeStats before = runtime_stats(model.ptr());
    StepMetrics m;
    m.step = step + 1;
    m.world = nranks;
    m.samples_from = position;
    m.samples_to = position += batches.samples_per_step();
    m.lr = learning_rate(c, step);
    const StepResult r = train_step(strategy, model, opt, batch, m.lr);
    m.loss = r.loss;
    m.grad_norm = r.grad_norm;
    m.nonfinite = !r.finite;
    m.skipped = !r.finite && c.on_nonfinite_loss == NonfiniteLoss::kSkip;
    m.tokens_per_s = static_cast<double>(c.batch * c.model.context * nranks) / seconds_since(ts);
    const RuntimeStats after = runtime_stats(model.ptr());
    m.all_gather_wait_s = after.all_gather_wait_s - before.all_gather_wait_s;
    m.reduction_wait_s = after.reduction_wait_s - before.reduction_wait_s;
    m.all_gather_bytes = after.all_gather_bytes - before.all_gather_bytes;
    m.reduction_bytes = after.reduction_bytes - before.reduction_bytes;
    const bool last = m.step == c.steps;
    if (m.nonfinite && !m.skipped) {
      // The same on every rank (global values): rank 0 logs the step, all stop.
      if (metrics) metrics->write(m);
      std::ostringstream what;
      what << "step " << m.step << ": the loss is " << m.loss << " (the mean over the ranks; gradient norm "
           << m.grad_norm << "): the run diverged. Stopped before the optimizer step (--on-nonfinite-loss stop); "
           << "the newest checkpoint in " << c.out << " is intact: continue with --resume and a lower --lr (now "
           << c.lr << "), or pass --on-nonfinite-loss skip to skip such steps";
      throw Error(what.str());
    }
    if (m.skipped && rank == 0 && (++skipped == 1 || skipped % 100 == 0)) {
      std::cerr << "fsdp-train: WARNING: step " << m.step << ": the loss is " << m.loss << " (gradient norm "
                << m.grad_norm << "): the optimizer step was skipped (--on-nonfinite-loss skip; " << skipped
                << " skipped so far)" << std::endl;
    }
    if (evaluates && (m.step % c.eval_every == 0 || last)) m.eval_loss = evaluate(strategy, model, batches);
    const auto mems = memory_of_ranks(strategy);
    for (const auto& mem : mems) m.rss_mib = std::max(m.rss_mib, std::strtod(mem.c_str(), nullptr));
    m.elapsed_s = seconds_since(t0);
    if (step == start && (c.resume || !c.resume_from.empty())) {
      m.resumed_from = start;  // where this job took over, and what it set aside
      m.set_aside = from.set_aside;
      m.resized = resized;
    }
    const double eta = m.elapsed_s / static_cast<double>(m.step - start) * static_cast<double>(c.steps - m.step);
    if (rank == 0) {
      if (metrics) metrics->write(m);
      progress->report(m, eta, mems);
      if (m.step % c.log_every == 0 || last || m.eval_loss) {
        const Metrics scalars = m.scalars();
        for (const auto& logger : loggers) logger->log_metrics(scalars, m.step);
      }
    }
    step_span.end();
    if (profiler.running() && (m.step == profiled.last || last)) {
      // A trace that cannot be written is a warning (Profiler::stop); an
      // earlier job's trace is kept, this job's goes beside it.
      const std::string path = unused_trace_path(trace_path);
      bool written = false;
      dist::agree(strategy.group(), dist::capture([&] { written = profiler.stop(path); }), "--profile-steps: ");
      if (written && rank == 0) {
        auto any_rank = [&](const std::string& p) {  // rank 0's name, said for every rank
          const std::string name = fs::path(p).filename().string();
          return (fs::path(c.out) / "profile").string() + "/rank_<r>" + name.substr(name.find('.'));
        };
        std::cout << "fsdp-train: profiled steps " << std::max(profiled.first, start + 1) << "-" << m.step << ": "
                  << any_rank(path)
                  << (path != trace_path ? " (an earlier job's " + any_rank(trace_path) + " is kept)" : std::string())
                  << " (open in https://ui.perfetto.dev or chrome://tracing)" << std::endl;
      }
    }
    if ((c.save_every > 0 && m.step % c.save_every == 0) || last) {
      CheckpointState s = run_state(model, opt, m.step);
      s.value("samples", position).value("world", int64_t{nranks}).value("data_fingerprint", data_fingerprint);
      put_config(s, c, identity);
      run.save(strategy, s, m.step, c.keep, identity);
    }
    mean_loss = m.loss;
  }
  for (const auto& logger : loggers) logger->finalize("success");
  if (rank == 0 && chosen.jsonl) {
    try {
      std::ostringstream title;
      title << "fsdp-train --preset " << c.preset << " (dim " << c.model.dim << ", " << c.model.layers << " layers, context "
            << c.model.context << "), world " << nranks << " x batch " << c.batch << ", " << c.strategy.precision()
            << ", " << to_string(c.strategy.sharding_strategy()) << ", lr " << c.lr;
      write_loss_curve(c.out, title.str());
    } catch (const std::exception& e) {  // a drawing is not worth the run
      std::cerr << "fsdp-train: WARNING: no loss curve: " << e.what() << std::endl;
    }
  }
  return mean_loss;
}

void generate_stream(const std::string& checkpoint, const std::string& prompt, const GenerateOptions& o,
                     const dist::ProcessGroupPtr& world, const std::function<void(char)>& emit) {
  if (o.tokens < 0) throw ConfigError("generate: --tokens must be 0 or positive, got " + std::to_string(o.tokens));
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature)) {
    throw ConfigError("generate: --temperature must be 0 (greedy) or positive, got " + std::to_string(o.temperature));
  }
  const auto info = inspect_checkpoint(checkpoint);
  const models::GPTConfig cfg = checkpoint_model_config(info, checkpoint);
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
