// src/train/metrics.h — a run's metrics.jsonl: one JSON object per line,
// written by rank 0 and read back on resume and for the loss curve. Local:
// no collectives.
//
// A line is a step:
//   {"step", "loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s",
//    "rss_mib", "all_gather_wait_s", "reduction_wait_s", "all_gather_bytes",
//    "reduction_bytes", "world", "samples": [first, end)
//    [, "eval_loss"][, "nonfinite": true][, "skipped": true]
//    [, "resumed_from"[, "set_aside"][, "resized"]]}
// "rss_mib" is the largest resident memory of any rank after the step; the
// communication counters are rank 0's for this step (fsdp::RuntimeStats:
// seconds its host blocked on all-gathers and on reductions, and the
// collectives' payload bytes). The scalars (StepMetrics::scalars) are what
// the TensorBoard and CSV loggers get, with the same names.
// "samples" is the sampler's record: the global sample positions the step
// trained on (include/fsdp/train/batches.h), at world size "world". A job
// that resumed at another world size than its checkpoint's (an elastic
// resize) says so on its first line:
//   "resized": {"from_world", "to_world", "step", "seconds_lost"}
// "step" is the step resumed from; "seconds_lost" the wall time from that
// checkpoint's commit to the first step at the new size (the steps done
// after it and discarded, the failure's detection, the re-rendezvous and the
// load).
// or a gap, the steps a run did whose lines are missing (a full disk, or a
// crash that lost them):
//   {"gap": [first, last]}
// A number that is not finite (a diverged loss) is written as the string
// "nan", "inf" or "-inf": JSON has no such numbers, and nlohmann's `null`
// would be unreadable (Python's json.loads reads the strings; float("nan")
// turns them back).
//
// The checkpoint is the truth, metrics are a log: nothing here may stop a
// run. The file is written by fsdp::JsonLinesLogger (fsdp/observability/loggers.h): a
// write that fails (a full disk) is reported (a warning) and training goes
// on; a damaged file is repaired on resume, not refused.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/observability/loggers.h"
#include "fsdp/observability/json_lines.h"

namespace fsdp::train {

// What one step writes; eval_loss on the steps that evaluate.
struct StepMetrics {
  int64_t step = 0;  // 1-based: the steps done
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, elapsed_s = 0;
  std::optional<double> eval_loss;
  double rss_mib = 0, all_gather_wait_s = 0, reduction_wait_s = 0;
  int64_t all_gather_bytes = 0, reduction_bytes = 0;
  // The loss (or, without a gradient scaler, the gradient norm) was not
  // finite; skipped: the optimizer step was skipped for it
  // (--on-nonfinite-loss skip).
  bool nonfinite = false, skipped = false;
  // The first step of a job that resumed: the step it resumed from (0: no
  // checkpoint to resume), and the damaged checkpoints it set aside.
  std::optional<int64_t> resumed_from;
  std::vector<std::string> set_aside;
  // The world size and the global sample positions [samples_from,
  // samples_to) of the step.
  int world = 0;
  int64_t samples_from = 0, samples_to = 0;
  // A resume at another world size than the checkpoint's.
  struct Resize {
    int from_world = 0, to_world = 0;
    int64_t step = 0;
    double seconds_lost = 0;
  };
  std::optional<Resize> resized;

  // The numbers the loggers get: loss, lr, grad_norm, tokens_per_s,
  // eval_loss (when evaluated), rss_mib and the communication counters.
  Metrics scalars() const;
};

// A line of metrics.jsonl as read back: its number in the file (blank lines
// counted), the byte offset where it starts, its text, its "step" (a gap's
// last step), and its "loss" and "eval_loss" if present (possibly not
// finite).
struct MetricsLine {
  int64_t lineno = 0, offset = 0;
  std::string text;
  int64_t step = 0;
  std::optional<double> loss, eval_loss;
  std::optional<std::pair<int64_t, int64_t>> gap;  // a gap line: its first and last step
};

// A line of metrics.jsonl that is not a metrics line: where it starts, and
// what is wrong ("line 7 (byte 412): not JSON (...): '<its start>'").
using SkippedLine = detail::SkippedLine;

// What read_metrics found: the lines that are metrics, and those that are
// not (skipped, never an error). `end` is the byte offset just after the
// last newline (what follows it, up to `size`, is a torn line).
struct MetricsFile {
  std::vector<MetricsLine> lines;
  std::vector<SkippedLine> skipped;
  int64_t end = 0, size = 0;
};

// Reads `path` (empty when it does not exist). Costs one read of the file.
// ConfigError only when the path is not a regular file (a FIFO, a device).
MetricsFile read_metrics(const std::string& path);

// Appends one line per step to a metrics.jsonl (a JsonLinesLogger). Not
// thread-safe; rank 0 only.
class MetricsWriter {
 public:
  // Starts `path` for a run that begins after step `start`: empties it
  // (start 0), or repairs it for a resume (start > 0) as
  // JsonLinesLogger::open does. Error (ConfigError) only when the file
  // cannot be opened at all.
  MetricsWriter(const std::string& path, int64_t start);

  // Appends `m` (JsonLinesLogger::log_line: a failed write is undone and
  // reported, and the steps lost become a gap once writing works again).
  void write(const StepMetrics& m);

 private:
  JsonLinesLogger log_;
};

}  // namespace fsdp::train
