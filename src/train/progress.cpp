#include "progress.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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
    : log_path_(log_path), steps_(steps), log_every_(log_every), terminal_(terminal) {
  // O_NOFOLLOW: a symbolic link put where train.log belongs is never written
  // through (issue 37 item 1; RunDirectory refuses one before step 1 too).
  log_fd_ = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC | (resumed ? 0 : O_TRUNC),
                   0644);
  if (log_fd_ < 0) log_error_ = std::strerror(errno);
}

Progress::~Progress() {
  if (log_fd_ >= 0) ::close(log_fd_);
}

void Progress::log(const std::string& line, int64_t step) {
  std::string why = log_error_;
  if (log_fd_ >= 0) {
    const std::string text = line + "\n";
    const ssize_t n = ::write(log_fd_, text.data(), text.size());  // one write: lines never interleave
    if (n < 0) why = std::strerror(errno);
    else if (static_cast<size_t>(n) != text.size()) why = "a short write";
  }
  if (!why.empty()) {  // a full disk: said once, and the run goes on
    if (!log_failed_) {
      std::cerr << "fsdp-train: WARNING: cannot write " << log_path_ << " at step " << step << " (" << why
                << "; is the disk full?); training goes on, its lines go to the console only" << std::endl;
    }
    log_failed_ = true;
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
