// src/train/metrics.h — a run's metrics.jsonl: one JSON object per step
// ({"step", "loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s"[,
// "eval_loss"][, "resumed_from"[, "set_aside"]]}), written by rank 0 and read back on resume and for the loss
// curve. Local: no collectives.
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::train {

// What one step writes; eval_loss on the steps that evaluate.
struct StepMetrics {
  int64_t step = 0;  // 1-based: the steps done
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, elapsed_s = 0;
  std::optional<double> eval_loss;
  // The first step of a job that resumed: the step it resumed from (0: no
  // checkpoint to resume), and the damaged checkpoints it set aside.
  std::optional<int64_t> resumed_from;
  std::vector<std::string> set_aside;
};

// A line of metrics.jsonl as read back: its number in the file (blank lines
// counted), its text, its "step", and its "loss" and "eval_loss" if present.
struct MetricsLine {
  int64_t lineno = 0;
  std::string text;
  int64_t step = 0;
  std::optional<double> loss, eval_loss;
};

// Reads every non-blank line of `path` (none when it does not exist).
// ConfigError naming the file and the line when a line is not one JSON
// object, has no "step", or has a "step", "loss" or "eval_loss" that is not
// a finite number.
std::vector<MetricsLine> read_metrics(const std::string& path);

// Appends one line per step to a metrics.jsonl, flushed after each.
class MetricsWriter {
 public:
  // Starts `path` for a run that begins after step `start`: empties it
  // (start 0), or keeps the lines of steps up to `start` and drops the rest
  // (a resume). Reads and rewrites the file; ConfigError as read_metrics for
  // a malformed line.
  MetricsWriter(const std::string& path, int64_t start);

  void write(const StepMetrics& m);

 private:
  std::ofstream out_;
};

}  // namespace fsdp::train
