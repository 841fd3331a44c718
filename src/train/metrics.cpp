#include "metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>

#include "fsdp/error.h"

namespace fsdp::train {

namespace {

using Json = nlohmann::ordered_json;

// A double as metrics.jsonl holds it: a number, or "nan" / "inf" / "-inf".
Json number_json(double v) {
  if (std::isfinite(v)) return v;
  if (std::isnan(v)) return "nan";
  return v > 0 ? "inf" : "-inf";
}

// The value under `key`: nullopt when absent; throws std::invalid_argument
// naming the key when it is neither a number nor one of the strings above.
std::optional<double> number_at(const Json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end()) return std::nullopt;
  if (it->is_number()) return it->get<double>();
  if (it->is_string()) {
    const auto& s = it->get_ref<const std::string&>();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
  }
  throw std::invalid_argument(std::string("\"") + key + "\" is not a number");
}

// An integer step under `key` of `object` (or `value` itself).
int64_t step_value(const Json& value, const char* what) {
  if (!value.is_number_integer() || value.get<int64_t>() < 0) {
    throw std::invalid_argument(std::string(what) + " is not a step (a non-negative integer)");
  }
  return value.get<int64_t>();
}

// `line` as a metrics line; std::invalid_argument saying why it is not one.
MetricsLine parse_line(const std::string& line) {
  Json object;
  try {
    object = Json::parse(line);
  } catch (const Json::parse_error& e) {
    throw std::invalid_argument(std::string("not JSON (") + e.what() + ")");
  }
  if (!object.is_object()) throw std::invalid_argument("not a JSON object");
  MetricsLine m;
  if (const auto gap = object.find("gap"); gap != object.end()) {
    if (!gap->is_array() || gap->size() != 2) throw std::invalid_argument("\"gap\" is not [first, last]");
    const int64_t first = step_value((*gap)[0], "\"gap\"'s first"), last = step_value((*gap)[1], "\"gap\"'s last");
    if (first < 1 || last < first) throw std::invalid_argument("\"gap\" is not [first, last] with 1 <= first <= last");
    m.gap.emplace(first, last);
    m.step = last;
    return m;
  }
  const auto step = object.find("step");
  if (step == object.end()) throw std::invalid_argument("has no \"step\"");
  m.step = step_value(*step, "\"step\"");
  m.loss = number_at(object, "loss");
  m.eval_loss = number_at(object, "eval_loss");
  return m;
}

// "'<up to 60 printable characters>'" of a damaged line, for messages.
std::string preview(const std::string& text) {
  std::string out;
  for (char ch : text.substr(0, 60)) out += (ch >= 32 && ch < 127) ? ch : '?';
  return "'" + out + (text.size() > 60 ? "...'" : "'");
}

std::string errno_text(int error) { return std::strerror(error); }

}  // namespace

MetricsFile read_metrics(const std::string& path) {
  MetricsFile out;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return out;  // no file yet
  if (!S_ISREG(st.st_mode)) {
    throw ConfigError(path + " is not a regular file (a FIFO, device or directory); refusing to read it");
  }
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  out.size = static_cast<int64_t>(bytes.size());
  int64_t lineno = 0;
  size_t pos = 0;
  while (pos < bytes.size()) {
    const size_t nl = bytes.find('\n', pos);
    if (nl == std::string::npos) break;  // a torn last line: not a line (see `end`)
    ++lineno;
    const std::string line = bytes.substr(pos, nl - pos);
    const auto offset = static_cast<int64_t>(pos);
    pos = nl + 1;
    out.end = static_cast<int64_t>(pos);
    if (line.empty()) continue;
    try {
      MetricsLine m = parse_line(line);
      m.lineno = lineno;
      m.offset = offset;
      m.text = line;
      out.lines.push_back(std::move(m));
    } catch (const std::invalid_argument& e) {
      out.skipped.push_back({offset, "line " + std::to_string(lineno) + " (byte " + std::to_string(offset) +
                                         "): " + e.what() + ": " + preview(line)});
    }
  }
  if (static_cast<size_t>(out.end) < bytes.size()) {
    out.skipped.push_back({out.end, "a torn last line at byte " + std::to_string(out.end) + " (" +
                                        std::to_string(bytes.size() - static_cast<size_t>(out.end)) +
                                        " bytes without a newline): " +
                                        preview(bytes.substr(static_cast<size_t>(out.end)))});
  }
  return out;
}

MetricsWriter::MetricsWriter(const std::string& path, int64_t start) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int err = errno;
    throw Error("fsdp-train: cannot open " + path + " to write the run's metrics: " + errno_text(err));
  }
  int64_t keep = 0, last_step = 0;  // the end of the lines kept, and their last step
  if (start > 0) {
    const MetricsFile file = read_metrics(path);
    // Keep up to the last step line (or gap) that ends at or before `start`.
    size_t kept = 0;
    for (size_t i = 0; i < file.lines.size(); ++i) {
      if (file.lines[i].step <= start) kept = i + 1;
    }
    if (kept > 0) {
      const MetricsLine& last = file.lines[kept - 1];
      keep = last.offset + static_cast<int64_t>(last.text.size()) + 1;
      last_step = last.step;
    }
    // What goes: named unless it is only whole lines of steps past `start`.
    bool damaged_tail = false;
    for (size_t i = kept; i < file.lines.size(); ++i) damaged_tail |= file.lines[i].step <= start;
    for (const auto& skipped : file.skipped) {
      if (skipped.offset >= keep) {
        damaged_tail = true;
      } else {
        std::cerr << "fsdp-train: WARNING: " << path << ": " << skipped.what << "; kept, readers skip it"
                  << std::endl;
      }
    }
    if (damaged_tail) {
      std::cerr << "fsdp-train: WARNING: " << path << ": cut off a torn or damaged tail at byte offset " << keep
                << " (" << (file.size - keep) << " bytes: lines after step " << last_step
                << " that are not whole metrics lines, or that a crash cut)" << std::endl;
    }
  }
  if (::ftruncate(fd_, keep) != 0) {
    const int err = errno;
    ::close(fd_);
    throw Error("fsdp-train: cannot truncate " + path + " to " + std::to_string(keep) + " bytes: " + errno_text(err));
  }
  size_ = keep;
  if (start > 0 && last_step < start) record_gap(last_step + 1, start);
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

bool MetricsWriter::append(const std::string& line, int& error) {
  const std::string text = line + "\n";
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = n < 0 ? errno : ENOSPC;
      // Undo a partial line: the file keeps whole lines only.
      if (done > 0 && ::ftruncate(fd_, size_) != 0) {
        // Cannot even shrink it: the next resume cuts the torn line off.
      }
      return false;
    }
    done += static_cast<size_t>(n);
  }
  size_ += static_cast<int64_t>(text.size());
  return true;
}

void MetricsWriter::record_gap(int64_t first, int64_t last) {
  Json j;
  j["gap"] = Json::array({first, last});
  int error = 0;
  if (!append(j.dump(), error)) {
    std::cerr << "fsdp-train: WARNING: cannot record steps " << first << "-" << last << " as a gap in " << path_
              << ": " << errno_text(error) << std::endl;
  }
}

void MetricsWriter::write(const StepMetrics& m) {
  Json j;
  j["step"] = m.step;
  j["loss"] = number_json(m.loss);
  j["lr"] = number_json(m.lr);
  j["grad_norm"] = number_json(m.grad_norm);
  j["tokens_per_s"] = number_json(m.tokens_per_s);
  j["elapsed_s"] = number_json(m.elapsed_s);
  j["world"] = m.world;
  j["samples"] = Json::array({m.samples_from, m.samples_to});
  if (m.eval_loss) j["eval_loss"] = number_json(*m.eval_loss);
  if (m.nonfinite) j["nonfinite"] = true;
  if (m.skipped) j["skipped"] = true;
  if (m.resumed_from) j["resumed_from"] = *m.resumed_from;
  if (!m.set_aside.empty()) j["set_aside"] = m.set_aside;
  if (m.resized) {
    j["resized"] = {{"from_world", m.resized->from_world},
                    {"to_world", m.resized->to_world},
                    {"step", m.resized->step},
                    {"seconds_lost", number_json(m.resized->seconds_lost)}};
  }
  int error = 0;
  if (first_lost_ > 0) {
    // The disk took writes again: the lost steps become a gap first.
    Json gap;
    gap["gap"] = Json::array({first_lost_, m.step - 1});
    if (m.step - 1 >= first_lost_ && !append(gap.dump(), error)) return;
    std::cerr << "fsdp-train: " << path_ << " is written again from step " << m.step;
    if (m.step - 1 >= first_lost_) std::cerr << "; steps " << first_lost_ << "-" << (m.step - 1) << " are a gap";
    std::cerr << std::endl;
    first_lost_ = 0;
  }
  if (append(j.dump(), error)) return;
  if (first_lost_ == 0) {
    first_lost_ = m.step;
    std::cerr << "fsdp-train: WARNING: cannot write " << path_ << " at step " << m.step << ": " << errno_text(error)
              << "; training goes on, and the steps whose lines cannot be written are recorded as a gap once it "
                 "can write again"
              << std::endl;
  }
}

}  // namespace fsdp::train
