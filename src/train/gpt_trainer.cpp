// The GPT trainer's training loop through a Strategy (fsdp/train/gpt_trainer.h:
// train). train() reads in one screen; each of its steps is a function
// below. Its settings (run_settings.cpp, train_config.cpp), data
// (batches), metrics, progress line, the job's start (job_start.h: run
// directory, data, resume) and outputs (job_outputs.h), the run directory
// itself (the run module, fsdp/run/) and generation (generate.cpp) are
// units of their own (docs/architecture.md).
#include "fsdp/train/gpt_trainer.h"

#include <torch/torch.h>


#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/core/trace_span.h"
#include "fsdp/core/utils.h"
#include "fsdp/distributed/rank_errors.h"
#include "fsdp/error.h"
#include "fsdp/hf/export.h"
#include "fsdp/hf/hf_model.h"
#include "fsdp/hf/peft.h"
#include "fsdp/peft/lora.h"
#include "fsdp/observability/loggers.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/strategy/engine.h"
#include "fsdp/train/model_spec.h"
#include "fsdp/train/run_settings.h"
#include "fsdp/run/rotation.h"
#include "job_outputs.h"
#include "job_start.h"
#include "metrics.h"
#include "progress.h"
#include "run_record.h"
#include "step.h"

namespace fsdp::train {

namespace {

// std::visit's visitor of one lambda per alternative.
template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

// The token ids the model of `spec` knows.
int64_t vocab_size(const ModelSpec& spec) {
  return std::visit(Overloaded{[](const GptSpec& gpt) { return gpt.config.vocab_size; },
                               [](const LlamaSpec& llama) { return llama.config.vocab_size; }},
                    spec);
}

// The strategy's options of a run: the one place where TrainConfig's
// settings become FSDPStrategyOptions (make_strategy gives either engine's
// strategy from them). The unit (and the activation-checkpointed block) is
// the model's block: the GPT's, or a Llama's decoder layer.
FSDPStrategyOptions strategy_options(const TrainConfig& c, const ModelSpec& spec, const dist::ProcessGroupPtr& world) {
  FSDPStrategyOptions o = c.strategy;
  std::visit(Overloaded{[&](const GptSpec&) { o.auto_wrap_module_types<models::GPTBlockImpl>(); },
                        [&](const LlamaSpec&) {
                          o.auto_wrap_module_types<models::LlamaDecoderLayerImpl>();
                          if (activation_checkpointing(c.strategy)) {
                            o.activation_checkpointing_module_types<models::LlamaDecoderLayerImpl>();
                          }
                        }},
             spec);
  if (world) o.world(world);
  return o;
}

// [collective] The model `Net` built from `config`, sharded by the
// strategy (its auto-wrap policy's block the unit). Its initial weights
// come from the seed alone: under empty_init each block is built when the
// engine shards it, from the generator state it was first built from, so
// with the values an eager build has. Seeds LibTorch's process-wide
// generator.
template <class Net, class Config>
Model build(Strategy& strategy, const TrainConfig& c, const Config& config) {
  torch::manual_seed(c.strategy.seed());
  std::shared_ptr<Net> net;
  {
    auto deferred = strategy.module_init_context(c.empty_init);
    net = std::make_shared<Net>(config);
    // LoRA's adapter pass on the built model, before the engine shards it.
    if (c.lora.rank > 0) peft::inject_lora(*net, c.lora);
  }
  return strategy.setup_module(net);
}

// [collective] The run's model: the GPT or the Llama of `spec` (a Llama's
// config.json; with --lora-rank, the run's adapters injected by
// peft::inject_lora in build; an hf: source's weights are loaded later,
// load_hf_weights).
Model build_model(Strategy& strategy, const TrainConfig& c, const ModelSpec& spec) {
  return std::visit(Overloaded{[&](const GptSpec& gpt) { return build<models::GPTImpl>(strategy, c, gpt.config); },
                               [&](const LlamaSpec& llama) {
                                 models::LlamaConfig base = llama.config;
                                 base.lora = {};  // the adapters come from peft::inject_lora (build), not the builder
                                 return build<models::LlamaImpl>(strategy, c, base);
                               }},
                    spec);
}

// [collective] --model hf:DIR on a run that starts fresh: the directory's
// weights into the sharded model, each rank reading only its shards' byte
// ranges (hf::load_weights; its errors agreed across the ranks). The
// adapters of a LoRA run keep their initial values.
void load_hf_weights(const Strategy& strategy, const LlamaSpec& llama, const Model& model) {
  const auto t = std::chrono::steady_clock::now();
  const std::string& dir = llama.hf_directory;
  const hf::LoadStats stats = hf::load_weights(dir, llama.config, model.ptr(), strategy.group());
  std::ostringstream what;
  what << "fsdp-train: loaded " << dir << " (rank 0 read " << std::fixed << std::setprecision(1)
       << static_cast<double>(stats.bytes_read) / (1 << 20) << " MiB of weights) in "
       << std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count() << " s";
  strategy.print(what.str());
}

// The optimizer's parameters: those that train (a LoRA run's base is
// frozen, and holds no optimizer state).
std::vector<at::Tensor> trained_parameters(const Model& model) {
  std::vector<at::Tensor> out;
  for (const auto& p : model->parameters()) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The warning that float16 on CPU is slow (rank 0 only).
void warn_about_precision(const Strategy& strategy, const TrainConfig& c) {
  if (strategy.global_rank() != 0 || c.strategy.precision().rfind("16-", 0) != 0 || !strategy.root_device().is_cpu()) {
    return;
  }
  std::cerr << "fsdp-train: WARNING: --precision " << c.strategy.precision()
            << " on CPU: float16 is made for CUDA (16-mixed scales the loss against float16's narrow range); "
               "LibTorch 2.x computes it on CPU, usually more slowly than float32. bf16-mixed is the CPU's mixed "
               "precision"
            << std::endl;
}

// What a training job holds while it runs its steps.
struct Job {
  const Strategy& strategy;
  const TrainConfig& c;
  const RunDirectory& run;
  const RunIdentity& identity;
  const RunData& data;
  Model& model;
  torch::optim::Optimizer& opt;
  Start& start;
  Outputs& out;
  const ModelSpec& spec;  // the model it trains
  int64_t skipped = 0;  // steps skipped for a non-finite loss (rank 0's count)
};

// [collective] Trains 0-based `step` on the next batch at `position`
// (advanced), and measures it: the step's metrics, before evaluation.
StepMetrics train_one(Job& job, int64_t step, int64_t& position) {
  const Strategy& strategy = job.strategy;
  const BatchSampler& batches = *job.data.batches;
  // A --data file truncated under the run is a named error on every rank
  // (Corpus::read), never SIGBUS nor a rank left waiting.
  Batch batch;
  dist::agree(strategy.group(), dist::capture([&] { batch = batches.training(position); }),
              "step " + std::to_string(step + 1) + ": reading --data");
  const auto ts = std::chrono::steady_clock::now();
  const RuntimeStats before = runtime_stats(job.model.ptr());
  StepMetrics m;
  m.step = step + 1;
  m.world = strategy.world_size();
  m.samples_from = position;
  m.samples_to = position += batches.samples_per_step();
  m.lr = learning_rate(job.c, step);
  const StepResult r = train_step(strategy, job.model, job.opt, batch, m.lr);
  m.loss = r.loss;
  m.grad_norm = r.grad_norm;
  m.nonfinite = !r.finite;
  m.skipped = !r.finite && job.c.on_nonfinite_loss == NonfiniteLoss::kSkip;
  m.tokens_per_s = static_cast<double>(job.c.batch * job.c.model.context * m.world) / seconds_since(ts);
  const RuntimeStats after = runtime_stats(job.model.ptr());
  m.all_gather_wait_s = after.all_gather_wait_s - before.all_gather_wait_s;
  m.reduction_wait_s = after.reduction_wait_s - before.reduction_wait_s;
  m.all_gather_bytes = after.all_gather_bytes - before.all_gather_bytes;
  m.reduction_bytes = after.reduction_bytes - before.reduction_bytes;
  return m;
}

// A step whose loss is not finite: under --on-nonfinite-loss stop, rank 0
// logs it and every rank throws (the same decision everywhere: global
// values); under skip, rank 0 warns (the first time, then every 100th).
void handle_nonfinite(Job& job, const StepMetrics& m) {
  if (!m.nonfinite) return;
  if (!m.skipped) {
    if (job.out.metrics) job.out.metrics->write(m);
    std::ostringstream what;
    what << "step " << m.step << ": the loss is " << m.loss << " (the mean over the ranks; gradient norm "
         << m.grad_norm << "): the run diverged. Stopped before the optimizer step (--on-nonfinite-loss stop); "
         << "the newest checkpoint in " << job.c.out << " is intact: continue with --resume and a lower --lr (now "
         << job.c.lr << "), or pass --on-nonfinite-loss skip to skip such steps";
    throw Error(what.str());
  }
  if (job.strategy.global_rank() == 0 && (++job.skipped == 1 || job.skipped % 100 == 0)) {
    std::cerr << "fsdp-train: WARNING: step " << m.step << ": the loss is " << m.loss << " (gradient norm "
              << m.grad_norm << "): the optimizer step was skipped (--on-nonfinite-loss skip; " << job.skipped
              << " skipped so far)" << std::endl;
  }
}

// [collective] Completes step m.step's metrics (the held-out loss when due,
// every rank's memory, the time) and records them on rank 0: metrics.jsonl,
// the progress line, and the loggers every log_every steps, at held-out
// evaluations and at the last step.
void record_step(Job& job, StepMetrics& m, std::chrono::steady_clock::time_point t0) {
  const TrainConfig& c = job.c;
  const bool last = m.step == c.steps;
  if (job.data.evaluates && (m.step % c.eval_every == 0 || last)) {
    m.eval_loss = evaluate(job.strategy, job.model, *job.data.batches);
  }
  const auto mems = memory_of_ranks(job.strategy);
  for (const auto& mem : mems) m.rss_mib = std::max(m.rss_mib, std::strtod(mem.c_str(), nullptr));
  m.elapsed_s = seconds_since(t0);
  const int64_t start = job.start.step;
  if (m.step == start + 1 && (c.resume || !c.resume_from.empty())) {
    m.resumed_from = start;  // where this job took over, and what it set aside
    m.set_aside = job.start.from.set_aside;
    m.resized = job.start.resized;
  }
  if (job.strategy.global_rank() != 0) return;
  const double eta = m.elapsed_s / static_cast<double>(m.step - start) * static_cast<double>(c.steps - m.step);
  if (job.out.metrics) job.out.metrics->write(m);
  job.out.progress->report(m, eta, mems);
  if (m.step % c.log_every == 0 || last || m.eval_loss) {
    const Metrics scalars = m.scalars();
    for (const auto& logger : job.out.loggers) logger->log_metrics(scalars, m.step);
  }
}

// [collective] Saves the checkpoint of step `done` when due (every
// save_every steps, and at the last), with the sample stream's `position`,
// the world size, the data's fingerprint and the run's record.
void save_if_due(Job& job, int64_t done, int64_t position) {
  const TrainConfig& c = job.c;
  if (!((c.save_every > 0 && done % c.save_every == 0) || done == c.steps)) return;
  CheckpointState s = run_state(job.model, job.opt, done);
  s.value("samples", position).value("world", int64_t{job.strategy.world_size()});
  s.value("data_fingerprint", job.data.fingerprint).value("data_format", job.data.format);
  put_config(s, c, job.identity);
  // A Llama's config.json: what generate, export and a resume build it from.
  if (const auto* llama = std::get_if<LlamaSpec>(&job.spec)) {
    s.value("config.model.llama", models::llama_config_json(llama->config, llama->config.dtype));
  }
  fsdp::run::save_and_rotate(job.run, job.strategy, s, done, c.keep, job.identity);
}

// [collective] --save-hf, after the last checkpoint (`checkpoint`): the
// adapters of a LoRA run as PEFT's (gathered to rank 0), or the
// checkpoint's model exported by rank 0 as a Hugging Face directory in the
// dtype the model came in, with an hf: source's generation config and
// tokenizer files. Every rank returns once it is there, or throws the same
// error.
void save_hf(const Strategy& strategy, const TrainConfig& c, const models::LlamaConfig& llama, const Model& model,
             const std::string& checkpoint) {
  const std::string hf_dir = hf_directory(c);
  const std::string source = hf_dir.empty() ? c.model_config : hf_dir;
  if (c.lora.rank > 0) {
    hf::save_peft_adapter(model.ptr(), llama, c.save_hf, source, strategy.group());
  } else {
    dist::agree_from(strategy.group(), 0, dist::capture([&] {
                       if (strategy.global_rank() != 0) return;
                       hf::ExportOptions o;
                       o.config = llama;
                       o.config.lora = {};
                       o.source_dir = hf_dir;
                       o.dtype = llama.dtype;
                       hf::export_hf(checkpoint, c.save_hf, o);
                     }),
                     "--save-hf: ");
  }
  strategy.print("fsdp-train: wrote " + c.save_hf + (c.lora.rank > 0 ? " (the LoRA adapters, as PEFT's)" : " (a Hugging Face model directory)"));
}

// Closes the loggers and draws loss.svg on rank 0 (a drawing is not worth
// the run: its failure is a warning).
void finish(const Strategy& strategy, const TrainConfig& c, Outputs& out) {
  for (const auto& logger : out.loggers) logger->finalize("success");
  if (strategy.global_rank() != 0 || !out.jsonl) return;
  try {
    write_loss_curve(c.out, loss_curve_title(c, strategy.world_size()));
  } catch (const std::exception& e) {
    std::cerr << "fsdp-train: WARNING: no loss curve: " << e.what() << std::endl;
  }
}

}  // namespace

double train(const TrainConfig& config, const dist::ProcessGroupPtr& world) {
  TrainConfig c = config;
  ModelSpec spec = model_spec(c);
  validate(c);
  LlamaSpec* llama = std::get_if<LlamaSpec>(&spec);
  // config.json read once: the sizes the run records are the model's.
  if (llama) c.llama_as_read = std::make_shared<const models::LlamaConfig>(llama->config);
  // An hf: model's weights are loaded (or a checkpoint's, on resume): not drawn first.
  if (llama) llama->config.initialize = llama->hf_directory.empty();
  const std::unique_ptr<Strategy> strategy_ptr = make_strategy(c.engine, strategy_options(c, spec, world));
  Strategy& strategy = *strategy_ptr;
  strategy.setup_environment();
  warn_about_precision(strategy, c);
  const RunDirectory run(c.out);
  std::optional<RunLock> lock;  // rank 0's, until train() returns
  const RunIdentity identity = begin_job(strategy, run, c, lock);
  RunData data;
  read_data(strategy, c, vocab_size(spec), data);
  Model model = build_model(strategy, c, spec);
  // nanoGPT's betas: beta2 0.95 keeps early steps from overshooting.
  // torch.optim.AdamW's update to the bit (fsdp/optim/adamw.h), so a run
  // continued in PyTorch steps as it would have here.
  optim::AdamW opt(trained_parameters(model), torch::optim::AdamWOptions(c.lr).betas({0.9, 0.95}));
  strategy.setup_optimizer(opt);
  Start start = resume_job(strategy, run, c, identity, model, opt, data);
  if (start.from.path.empty() && llama && !llama->hf_directory.empty()) load_hf_weights(strategy, *llama, model);
  // Before step 1: what every save will need (checkpoints/ usable, the
  // saves' names free), so that a run never trains to lose it at a save.
  dist::agree_from(strategy.group(), 0, dist::capture([&] {
                     if (strategy.global_rank() == 0) run.check_saves(c.steps, c.save_every, start.step);
                   }),
                   "");
  Outputs out;
  open_outputs(strategy, run, c, start.step, out);
  StepProfiler profiler(strategy, c, start.step);
  note_resize(strategy, start, out);
  Job job{strategy, c, run, identity, data, model, opt, start, out, spec};
  int64_t position = start.position;
  double mean_loss = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = start.step; step < c.steps; ++step) {
    profiler.before(step);
    detail::Span span;
    span.begin("step", std::to_string(step + 1));
    StepMetrics m = train_one(job, step, position);
    handle_nonfinite(job, m);
    record_step(job, m, t0);
    span.end();
    profiler.after(m.step, m.step == c.steps);
    save_if_due(job, m.step, position);
    mean_loss = m.loss;
  }
  if (!c.save_hf.empty()) save_hf(strategy, c, llama->config, model, run.checkpoint_path(c.steps));
  finish(strategy, c, out);
  return mean_loss;
}

}  // namespace fsdp::train
