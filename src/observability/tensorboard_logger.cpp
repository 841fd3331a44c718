// TensorBoardLogger: event files as torch.utils.tensorboard writes them
// (the bytes: tensorboard_events.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "fsdp/error.h"
#include "fsdp/observability/loggers.h"
#include "logger_files.h"
#include "tensorboard_events.h"

namespace fsdp {

namespace fs = std::filesystem;
namespace tb = detail::tensorboard;

TensorBoardLogger::TensorBoardLogger(std::string root_dir, std::string name, LoggerVersion version,
                                     bool default_hp_metric)
    : root_(std::move(root_dir)), name_(std::move(name)), version_(std::move(version)),
      default_hp_metric_(default_hp_metric) {}

TensorBoardLogger::~TensorBoardLogger() {
  if (fd_ >= 0) ::close(fd_);
}

std::string TensorBoardLogger::version() const {
  if (version_) return *version_;
  return dir_.empty() ? "" : fs::path(dir_).filename().string();
}

std::string TensorBoardLogger::log_dir() const { return dir_; }

double TensorBoardLogger::now() const {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void TensorBoardLogger::open() {
  if (fd_ >= 0 || deferred_) return;
  if (dir_.empty()) dir_ = detail::versioned_dir(root_, name_, version_, "TensorBoardLogger");
  int error = ENOSPC;
  if (detail::make_log_dir(dir_, "TensorBoardLogger")) error = create_file();
  if (error == 0) return;
  // A full disk is not a reason to stop a run: log nothing until it can.
  deferred_ = failing_ = true;
  TORCH_WARN("TensorBoardLogger: cannot write an event file in ", dir_, ": ", detail::errno_text(error),
             "; training goes on, and each log tries again");
}

int TensorBoardLogger::create_file() {
  // SummaryWriter's name: events.out.tfevents.<seconds, 10 digits>.<host>.<pid>.<n>
  static std::atomic<int> uid{0};
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  // TensorBoard reads a directory's files in name order: a new file must sort
  // after the old ones (a restart within the same second, or a smaller pid,
  // would not), so that its session START comes after what it replaces.
  long long seconds = static_cast<long long>(now());
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("events.out.tfevents.", 0) == 0) seconds = std::max(seconds, std::atoll(n.c_str() + 20) + 1);
  }
  char stamp[32];
  std::snprintf(stamp, sizeof stamp, "%010lld", seconds);
  const std::string path = (fs::path(dir_) / ("events.out.tfevents." + std::string(stamp) + "." + host + "." +
                                              std::to_string(::getpid()) + "." + std::to_string(uid++)))
                               .string();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    if (detail::disk_full(err)) return err;
    throw ConfigError("TensorBoardLogger: cannot create the event file " + path + ": " + detail::errno_text(err));
  }
  const std::string first = tb::record(tb::file_version_event(now()));
  int error = 0;
  if (!detail::write_all(fd, first, 0, error)) {
    ::close(fd);
    ::unlink(path.c_str());
    if (detail::disk_full(error)) return error;
    throw ConfigError("TensorBoardLogger: cannot write the event file " + path + ": " + detail::errno_text(error));
  }
  fd_ = fd;
  file_ = path;
  size_ = static_cast<int64_t>(first.size());
  return 0;
}

bool TensorBoardLogger::ready() {
  open();
  if (fd_ >= 0) return true;
  if (create_file() != 0) return false;
  TORCH_WARN("TensorBoardLogger: ", file_, " is written (the disk takes writes again)");
  deferred_ = failing_ = false;
  return true;
}

void TensorBoardLogger::append(const std::string& records, const char* what) {
  int error = 0;
  if (!detail::write_all(fd_, records, size_, error)) {
    if (!failing_) {
      TORCH_WARN("TensorBoardLogger: cannot write ", what, " to ", file_, ": ", detail::errno_text(error),
                 "; training goes on without them");
    }
    failing_ = true;
    return;
  }
  if (failing_) TORCH_WARN("TensorBoardLogger: ", file_, " is written again");
  failing_ = false;
  size_ += static_cast<int64_t>(records.size());
}

void TensorBoardLogger::log_metrics(const Metrics& metrics, std::optional<int64_t> step) {
  const int64_t s = step.value_or(calls_);
  ++calls_;
  if (!ready()) return;
  const double t = now();
  std::string records;
  for (const auto& [tag, value] : metrics) records += tb::record(tb::scalar_event(t, s, tag, static_cast<float>(value)));
  append(records, "scalars");
}

void TensorBoardLogger::log_hyperparams(const Hyperparameters& params) {
  // Lightning: without metrics, "hp_metric" -1 is logged at step 0, and the
  // hparams plugin lists it as the session's metric.
  if (default_hp_metric_) {
    log_metrics({{"hp_metric", -1.0}}, 0);
    log_hyperparams(params, {"hp_metric"});
  } else {
    log_hyperparams(params, {});
  }
}

void TensorBoardLogger::log_hyperparams(const Hyperparameters& params, const std::vector<std::string>& metric_tags) {
  if (!ready()) return;
  std::string records;
  for (const auto& e : tb::hparams_events(now(), 0, params, metric_tags)) records += tb::record(e);
  append(records, "hyperparameters");
}

void TensorBoardLogger::log_restart(int64_t step) {
  if (!ready()) return;
  append(tb::record(tb::session_start_event(now(), step)), "a restart");
}

void TensorBoardLogger::flush() {
  if (fd_ >= 0) ::fdatasync(fd_);
}

void TensorBoardLogger::finalize(const std::string&) {
  if (fd_ < 0) return;
  flush();
  ::close(fd_);
  fd_ = -1;
  deferred_ = false;
}

}  // namespace fsdp
