#include "progress.h"

#include <iomanip>
#include <iostream>
#include <sstream>

namespace fsdp::train {

std::string progress_line(const StepMetrics& m, int64_t steps, double eta_s, const std::vector<std::string>& mem_mib) {
  std::ostringstream os;
  os << "step " << m.step << "/" << steps << " loss " << std::fixed << std::setprecision(4) << m.loss;
  if (m.eval_loss) os << " eval " << *m.eval_loss;
  os << " tokens/s " << std::setprecision(0) << m.tokens_per_s << " eta " << eta_s << "s mem";
  for (size_t r = 0; r < mem_mib.size(); ++r) os << (r ? "/" : " ") << mem_mib[r];
  os << " MiB";
  return os.str();
}

Progress::Progress(const std::string& log_path, bool resumed, int64_t steps, int64_t log_every, bool terminal)
    : log_path_(log_path), log_(log_path, resumed ? std::ios::app : std::ios::trunc), steps_(steps),
      log_every_(log_every), terminal_(terminal) {}

void Progress::log(const std::string& line, int64_t step) {
  log_ << line << std::endl;
  if (!log_) {  // a full disk: said once, and the run goes on
    if (!log_failed_) {
      std::cerr << "fsdp-train: WARNING: cannot write " << log_path_ << " at step " << step
                << " (is the disk full?); training goes on, its lines go to the console only" << std::endl;
    }
    log_failed_ = true;
    log_.clear();
  }
}

void Progress::note(const std::string& line) {
  log(line, 0);
  if (terminal_) std::cout << "\r\x1b[K";
  std::cout << line << std::endl;
}

void Progress::report(const StepMetrics& m, double eta_s, const std::vector<std::string>& mem_mib) {
  const std::string line = progress_line(m, steps_, eta_s, mem_mib);
  const bool last = m.step == steps_;
  log(line, m.step);
  if (terminal_) {
    std::cout << "\r" << line << "\x1b[K" << std::flush;  // in place
    if (last) std::cout << std::endl;
  } else if (m.step % log_every_ == 0 || last || m.eval_loss) {
    std::cout << line << std::endl;
  }
}

}  // namespace fsdp::train
