// The JSON-lines logger and what the loggers share (CSVLogger is in
// csv_logger.cpp, TensorBoardLogger in tensorboard_logger.cpp, the
// JSON-lines reader in json_lines.cpp).
#include "fsdp/observability/loggers.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <algorithm>
#include <vector>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "fsdp/error.h"
#include "fsdp/text/bytes_json.h"
#include "fsdp/observability/json_lines.h"
#include "logger_files.h"

namespace fsdp {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

Logger::~Logger() = default;

std::string format_number(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, value);  // shortest round trip
  return std::string(buf, r.ptr);
}

namespace detail {

std::string errno_text(int error) { return std::strerror(error); }

std::string versioned_dir(const std::string& root, const std::string& name, const std::optional<std::string>& version,
                          const char* who) {
  const fs::path base = fs::path(root) / name;
  if (version) {
    fs::path dir = (base / *version).lexically_normal();
    if (dir.has_filename() || !dir.has_parent_path()) return dir.string();
    return dir.parent_path().string();  // "runs/" as "runs"
  }
  // Lightning's _get_next_version: one past the largest version_N there.
  int64_t next = 0;
  std::error_code ec;
  if (fs::is_directory(base, ec)) {
    for (const auto& entry : fs::directory_iterator(base, ec)) {
      const std::string n = entry.path().filename().string();
      if (n.rfind("version_", 0) != 0 || !entry.is_directory(ec)) continue;
      const std::string digits = n.substr(8);
      int64_t v = 0;
      const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v);
      if (!digits.empty() && r.ec == std::errc() && r.ptr == digits.data() + digits.size()) next = std::max(next, v + 1);
    }
    if (ec) throw ConfigError(std::string(who) + ": cannot list " + base.string() + " for its versions: " + ec.message());
  }
  return (base / ("version_" + std::to_string(next))).lexically_normal().string();
}

bool disk_full(int error) { return error == ENOSPC || error == EDQUOT; }

bool make_log_dir(const std::string& dir, const char* who) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec && disk_full(ec.value())) return false;
  if (ec || !fs::is_directory(dir)) {
    throw ConfigError(std::string(who) + ": cannot create the log directory '" + dir +
                      "': " + (ec ? ec.message() : "a file of that name is in the way"));
  }
  if (::access(dir.c_str(), W_OK) != 0) {
    const int err = errno;
    throw ConfigError(std::string(who) + ": the log directory '" + dir + "' is not writable: " + errno_text(err));
  }
  return true;
}

bool write_all(int fd, const std::string& bytes, int64_t undo_to, int& error) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = n < 0 ? errno : ENOSPC;
      // Undo a partial record: the file keeps whole records only. If even
      // that fails, a reader stops at the torn record (and a resume cuts it).
      if (done > 0 && ::ftruncate(fd, undo_to) != 0) {
      }
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

Json number_json(double v) {
  if (std::isfinite(v)) return v;
  return format_number(v);
}

static Json hyperparameter_json(const HyperparameterValue& v) {
  return std::visit([](const auto& x) -> Json { return x; }, v);
}

}  // namespace detail

// --- JsonLinesLogger ------------------------------------------------------------

JsonLinesLogger::JsonLinesLogger(std::string path, int64_t resume_after)
    : path_(std::move(path)), resume_after_(resume_after) {}

JsonLinesLogger::~JsonLinesLogger() {
  if (fd_ >= 0) ::close(fd_);
}

std::string JsonLinesLogger::name() const { return fs::path(path_).stem().string(); }

std::string JsonLinesLogger::log_dir() const {
  const auto parent = fs::path(path_).parent_path();
  return parent.empty() ? "." : parent.string();
}

void JsonLinesLogger::open() {
  if (fd_ >= 0) return;
  if (!detail::make_log_dir(log_dir(), "JsonLinesLogger")) {
    throw ConfigError("JsonLinesLogger: cannot create the log directory '" + log_dir() + "': No space left on device");
  }
  struct stat st {};
  // lstat and O_NOFOLLOW: a symbolic link there is refused, never written through.
  if (::lstat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    throw ConfigError("JsonLinesLogger: " + path_ + " is not a regular file (a symbolic link, FIFO, device or directory)");
  }
  const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    throw ConfigError("JsonLinesLogger: cannot open " + path_ + " to write: " + detail::errno_text(err));
  }
  int64_t keep = 0, last_step = 0;  // the end of the lines kept, and their last step
  // A resume over a big file reads its tail only (back to the line of the
  // resumed step): its memory does not grow with the file. A small one is
  // read whole, and damaged lines before the kept ones are named too.
  constexpr int64_t kReadWholeUpTo = int64_t{8} << 20;
  struct stat now {};
  const int64_t file_size = ::fstat(fd, &now) == 0 ? static_cast<int64_t>(now.st_size) : 0;
  if (resume_after_ > 0 && file_size > kReadWholeUpTo) {
    const detail::JsonLinesTail tail = detail::read_json_lines_tail(fd, file_size, resume_after_);
    keep = tail.keep;
    last_step = tail.last_step;
    if (tail.damaged) {
      TORCH_WARN(path_, ": cut off a torn or damaged tail at byte offset ", keep, " (", file_size - keep,
                 " bytes: lines after step ", last_step,
                 " that are not whole metrics lines, or that a crash cut)");
    }
  } else if (resume_after_ > 0) {
    const detail::JsonLinesFile file = detail::read_json_lines(path_);
    // Keep up to the last record that ends at or before `resume_after_`.
    size_t kept = 0;
    for (size_t i = 0; i < file.lines.size(); ++i) {
      if (file.lines[i].step <= resume_after_) kept = i + 1;
    }
    if (kept > 0) {
      const detail::JsonLine& last = file.lines[kept - 1];
      keep = last.offset + static_cast<int64_t>(last.text.size()) + 1;
      last_step = last.step;
    }
    // What goes: named unless it is only whole lines of steps past `resume_after_`.
    bool damaged_tail = false;
    for (size_t i = kept; i < file.lines.size(); ++i) damaged_tail |= file.lines[i].step <= resume_after_;
    for (const auto& skipped : file.skipped) {
      if (skipped.offset >= keep) {
        damaged_tail = true;
      } else {
        TORCH_WARN(path_, ": ", skipped.what, "; kept, readers skip it");
      }
    }
    if (damaged_tail) {
      TORCH_WARN(path_, ": cut off a torn or damaged tail at byte offset ", keep, " (", file.size - keep,
                 " bytes: lines after step ", last_step,
                 " that are not whole metrics lines, or that a crash cut)");
    }
  }
  if (::ftruncate(fd, keep) != 0) {
    const int err = errno;
    ::close(fd);
    throw ConfigError("JsonLinesLogger: cannot truncate " + path_ + " to " + std::to_string(keep) +
                      " bytes: " + detail::errno_text(err));
  }
  fd_ = fd;
  size_ = keep;
  if (resume_after_ > 0 && last_step < resume_after_) record_gap(last_step + 1, resume_after_);
}

bool JsonLinesLogger::append(const std::string& line, int& error) {
  const std::string text = line + "\n";
  if (!detail::write_all(fd_, text, size_, error)) return false;
  size_ += static_cast<int64_t>(text.size());
  return true;
}

void JsonLinesLogger::record_gap(int64_t first, int64_t last) {
  Json j;
  j["gap"] = Json::array({first, last});
  int error = 0;
  if (!append(j.dump(), error)) {
    TORCH_WARN("cannot record steps ", first, "-", last, " as a gap in ", path_, ": ", detail::errno_text(error));
  }
}

void JsonLinesLogger::log_line(int64_t step, const std::string& json_object) {
  if (json_object.find('\n') != std::string::npos || json_object.empty() || json_object.front() != '{' ||
      json_object.back() != '}') {
    throw std::invalid_argument("JsonLinesLogger::log_line: not one JSON object on one line: " +
                                json_object.substr(0, 60));
  }
  open();
  ++calls_;
  int error = 0;
  if (first_lost_ > 0) {
    // The disk took writes again: the lost steps become a gap first.
    if (step - 1 >= first_lost_) {
      Json gap;
      gap["gap"] = Json::array({first_lost_, step - 1});
      if (!append(gap.dump(), error)) return;
    }
    TORCH_WARN(path_, " is written again from step ", step,
               step - 1 >= first_lost_ ? "; steps " + std::to_string(first_lost_) + "-" + std::to_string(step - 1) +
                                             " are a gap"
                                       : std::string());
    first_lost_ = 0;
  }
  if (append(json_object, error)) return;
  if (first_lost_ == 0) {
    first_lost_ = std::max<int64_t>(step, 1);
    TORCH_WARN("cannot write ", path_, " at step ", step, ": ", detail::errno_text(error),
               "; training goes on, and the steps whose lines cannot be written are recorded as a gap once it "
               "can write again");
  }
}

void JsonLinesLogger::log_metrics(const Metrics& metrics, std::optional<int64_t> step) {
  const int64_t s = step.value_or(calls_);
  Json j;
  j["step"] = s;
  for (const auto& [k, v] : metrics) {
    if (k != "step") j[k] = detail::number_json(v);
  }
  log_line(s, j.dump());
}

void JsonLinesLogger::log_hyperparams(const Hyperparameters& params) {
  Json h = Json::object();
  for (const auto& [k, v] : params) h[k] = detail::hyperparameter_json(v);
  Json j;
  j["hparams"] = h;
  open();
  int error = 0;
  if (!append(j.dump(), error)) TORCH_WARN("cannot write the hyperparameters to ", path_, ": ", detail::errno_text(error));
}

}  // namespace fsdp
