// What a training job writes besides its checkpoints (src/train/job_outputs.h).
#include "job_outputs.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>

#include "fsdp/distributed/rank_errors.h"
#include "fsdp/train/run_settings.h"  // hyperparameters

namespace fsdp::train {

namespace fs = std::filesystem;

void open_outputs(const Strategy& strategy, const RunDirectory& run, const TrainConfig& c, int64_t start,
                  Outputs& out) {
  const LoggerChoice chosen = chosen_loggers(c.loggers);
  out.jsonl = chosen.jsonl;
  const auto failure = dist::capture([&] {
    if (strategy.global_rank() != 0) return;
    if (chosen.jsonl) out.metrics.emplace(run.metrics_path(), start);
    out.progress.emplace(run.log_path(), start > 0, c.steps, c.log_every, isatty(STDOUT_FILENO) != 0);
    std::shared_ptr<TensorBoardLogger> tensorboard;
    if (chosen.tensorboard) {
      tensorboard = std::make_shared<TensorBoardLogger>(c.out, "", std::string(), /*default_hp_metric=*/false);
      out.loggers.push_back(tensorboard);
    }
    if (chosen.csv) out.loggers.push_back(std::make_shared<CSVLogger>(c.out, "csv"));
    for (const auto& logger : out.loggers) logger->open();
    // A session START: a resumed run does its later steps again, and
    // TensorBoard drops the old ones (its Python reader ignores a run's
    // first START, so every job writes one).
    if (tensorboard) tensorboard->log_restart(start + 1);
    const Hyperparameters hparams = hyperparameters(c, strategy.world_size());
    if (tensorboard) tensorboard->log_hyperparams(hparams, {"loss", "eval_loss"});
    for (const auto& logger : out.loggers) {
      if (logger != tensorboard) logger->log_hyperparams(hparams);
    }
  });
  dist::agree_from(strategy.group(), 0, failure, start > 0 ? "--resume: " : "");
}

void note_resize(const Strategy& strategy, Start& at, Outputs& out) {
  if (!at.resized || strategy.global_rank() != 0) return;
  auto& r = *at.resized;
  r.seconds_lost = std::chrono::duration<double>(std::chrono::system_clock::now() - at.from.committed_at).count();
  std::ostringstream what;
  what << "fsdp-train: resized from world " << r.from_world << " to world " << r.to_world << ": resumed from step "
       << r.step << " (" << at.from.path << "), resharded; " << std::fixed << std::setprecision(1) << r.seconds_lost
       << " s lost since that checkpoint was committed; the sample stream continues at sample " << at.position;
  out.progress->note(what.str());
}

StepProfiler::StepProfiler(const Strategy& strategy, const TrainConfig& c, int64_t start)
    : strategy_(strategy), out_(c.out), start_(start) {
  trace_path_ = (fs::path(out_) / "profile" / ("rank_" + std::to_string(strategy.global_rank()) + ".pt.trace.json"))
                    .string();
  if (c.profile_steps.empty()) return;
  range_ = parse_step_range(c.profile_steps, "--profile-steps");
  if (range_.last <= start) {
    strategy.print("fsdp-train: --profile-steps " + c.profile_steps + ": those steps were done before step " +
                   std::to_string(start) + ", where this job resumed; nothing is profiled");
  }
}

void StepProfiler::before(int64_t step) {
  if (range_.contains(step + 1) && !profiler_.running()) profiler_.start(strategy_.root_device().is_cuda());
}

void StepProfiler::after(int64_t done, bool last) {
  if (!profiler_.running() || (done != range_.last && !last)) return;
  const std::string path = unused_trace_path(trace_path_);
  bool written = false;
  dist::agree(strategy_.group(), dist::capture([&] { written = profiler_.stop(path); }), "--profile-steps: ");
  if (!written || strategy_.global_rank() != 0) return;
  auto any_rank = [&](const std::string& p) {  // rank 0's name, said for every rank
    const std::string name = fs::path(p).filename().string();
    return (fs::path(out_) / "profile").string() + "/rank_<r>" + name.substr(name.find('.'));
  };
  std::cout << "fsdp-train: profiled steps " << std::max(range_.first, start_ + 1) << "-" << done << ": "
            << any_rank(path)
            << (path != trace_path_ ? " (an earlier job's " + any_rank(trace_path_) + " is kept)" : std::string())
            << " (open in https://ui.perfetto.dev or chrome://tracing)" << std::endl;
}

}  // namespace fsdp::train
