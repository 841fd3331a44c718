// src/train/progress.h — how rank 0 reports a run's progress: one plain line
// per step in train.log, and on stdout the same line, updated in place on a
// terminal, else printed every log_every steps (and at evaluations and the
// last step). Local: no collectives.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "metrics.h"

namespace fsdp::train {

// "step 10/200 loss 2.3456 eval 2.4567 tokens/s 1234 eta 56s mem 310/305 MiB":
// `mem_mib` holds every rank's resident memory, in rank order.
std::string progress_line(const StepMetrics& m, int64_t steps, double eta_s, const std::vector<std::string>& mem_mib);

class Progress {
 public:
  // Opens `log_path`: appended to on a resume, else emptied. `terminal`:
  // stdout is a terminal.
  Progress(const std::string& log_path, bool resumed, int64_t steps, int64_t log_every, bool terminal);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Writes the line to train.log and (as above) stdout.
  void report(const StepMetrics& m, double eta_s, const std::vector<std::string>& mem_mib);

  // Writes `line` (an event such as a resize) to train.log and stdout.
  void note(const std::string& line);

 private:
  void log(const std::string& line, int64_t step);

  std::string log_path_;
  int log_fd_ = -1;        // train.log; a failed write is said once on stderr (log_failed_), never an error
  std::string log_error_;  // why it could not be opened, if it could not
  int64_t steps_, log_every_;
  bool terminal_, log_failed_ = false;
};

}  // namespace fsdp::train
