// The CSV and JSON-lines loggers, the JSON-lines reader, and what the
// loggers share (TensorBoardLogger is in tensorboard_logger.cpp).
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
#include "json_lines.h"
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

namespace {

int64_t step_value(const Json& value, const char* what) {
  if (!value.is_number_integer() || value.get<int64_t>() < 0) {
    throw std::invalid_argument(std::string(what) + " is not a step (a non-negative integer)");
  }
  return value.get<int64_t>();
}

// `line` as a record; std::invalid_argument saying why it is not one.
JsonLine parse_line(const std::string& line) {
  Json object;
  try {
    object = Json::parse(line);
  } catch (const Json::parse_error& e) {
    throw std::invalid_argument(std::string("not JSON (") + e.what() + ")");
  }
  if (!object.is_object()) throw std::invalid_argument("not a JSON object");
  JsonLine m;
  if (const auto gap = object.find("gap"); gap != object.end()) {
    if (!gap->is_array() || gap->size() != 2) throw std::invalid_argument("\"gap\" is not [first, last]");
    const int64_t first = step_value((*gap)[0], "\"gap\"'s first"), last = step_value((*gap)[1], "\"gap\"'s last");
    if (first < 1 || last < first) throw std::invalid_argument("\"gap\" is not [first, last] with 1 <= first <= last");
    m.gap.emplace(first, last);
    m.step = last;
    return m;
  }
  const auto step = object.find("step");
  if (step == object.end()) {
    if (object.contains("hparams")) return m;  // step 0: before every step
    throw std::invalid_argument("has no \"step\"");
  }
  m.step = step_value(*step, "\"step\"");
  return m;
}

// "'<up to 60 printable characters>'" of a damaged line, for messages.
std::string preview(const std::string& text) {
  std::string out;
  for (char ch : text.substr(0, 60)) out += (ch >= 32 && ch < 127) ? ch : '?';
  return "'" + out + (text.size() > 60 ? "...'" : "'");
}

}  // namespace

JsonLinesFile read_json_lines(const std::string& path) {
  JsonLinesFile out;
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
      JsonLine m = parse_line(line);
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

JsonLinesTail read_json_lines_tail(int fd, int64_t size, int64_t up_to) {
  constexpr int64_t kChunk = int64_t{64} << 10, kLongest = int64_t{1} << 20;
  JsonLinesTail out;
  std::vector<char> chunk(static_cast<size_t>(kChunk));
  auto read_at = [&](int64_t offset, int64_t n) {
    int64_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(fd, chunk.data() + done, static_cast<size_t>(n - done), offset + done);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return false;
      done += got;
    }
    return true;
  };
  // The lines from the end: [start, content_end), each followed by '\n'
  // but the last, which is torn when the file does not end in one.
  int64_t end = size;
  bool last = true;
  while (end > 0) {
    int64_t content_end = end - 1;  // the '\n' that ends the line
    bool torn = false;
    if (last) {
      if (!read_at(size - 1, 1)) return out;
      torn = chunk[0] != '\n';
      if (torn) content_end = size;
    }
    last = false;
    // Back to the line's start, holding at most kLongest of its bytes.
    std::vector<std::string> pieces;  // from the end
    int64_t held = 0, cursor = content_end, start = 0;
    bool too_long = false;
    while (cursor > 0) {
      const int64_t n = std::min(kChunk, cursor);
      if (!read_at(cursor - n, n)) return out;
      const void* nl = ::memrchr(chunk.data(), '\n', static_cast<size_t>(n));
      const int64_t from = nl != nullptr ? static_cast<const char*>(nl) - chunk.data() + 1 : 0;
      if (!too_long) {
        if (held + (n - from) > kLongest) {
          too_long = true;
          pieces.clear();
        } else {
          pieces.emplace_back(chunk.data() + from, static_cast<size_t>(n - from));
          held += n - from;
        }
      }
      cursor -= n - from;
      if (nl != nullptr) {
        start = cursor;
        break;
      }
    }
    if (cursor == 0) start = 0;
    end = start;
    if (torn || too_long) {
      out.damaged = true;
      continue;
    }
    std::string text;
    text.reserve(static_cast<size_t>(held));
    for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) text += *it;
    if (text.empty()) continue;  // a blank line
    try {
      const JsonLine m = parse_line(text);
      if (m.step <= up_to) {
        out.keep = content_end + 1;
        out.last_step = m.step;
        return out;
      }
    } catch (const std::invalid_argument&) {
      out.damaged = true;
    }
  }
  return out;
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

// --- CSVLogger ------------------------------------------------------------------

namespace {

// A CSV field as Python's csv module writes it: quoted when it holds a
// comma, a quote or a line break.
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// A YAML scalar: numbers and booleans plain, strings double-quoted (JSON's
// escapes are YAML's).
std::string yaml_value(const HyperparameterValue& v) {
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) {
    if (std::isnan(*d)) return ".nan";
    if (std::isinf(*d)) return *d > 0 ? ".inf" : "-.inf";
    std::string s = format_number(*d);
    // YAML 1.1 (PyYAML) reads "1e-05" as a string: write it with a dot.
    if (s.find_first_of(".") == std::string::npos && s.find('e') != std::string::npos) s.insert(s.find('e'), ".0");
    else if (s.find_first_of(".e") == std::string::npos) s += ".0";
    return s;
  }
  // A path is bytes: written losslessly (fsdp/text/bytes_json.h; YAML's "\udcXX" as JSON's).
  return text::json_text(Json(text::escape_bytes(std::get<std::string>(v))).dump());
}

// Writes `text` to `path` atomically (a temporary, then rename). False and
// `error` set when it cannot; the old file is then untouched.
bool replace_file(const std::string& path, const std::string& text, int& error) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);  // no link followed
  if (fd < 0) {
    error = errno;
    return false;
  }
  const bool ok = detail::write_all(fd, text, 0, error);
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    if (ok) error = errno;
    ::unlink(tmp.c_str());
    return false;
  }
  return true;
}

// The rows of a CSV file this logger wrote (Python's csv dialect: fields
// quoted when they hold a comma, a quote or a line break; rows end in \r\n),
// as header name to field. Empty when it cannot be read.
std::vector<std::map<std::string, std::string>> read_csv_rows(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::vector<std::vector<std::string>> records(1, std::vector<std::string>(1));
  bool quoted = false;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const char c = bytes[i];
    if (quoted) {
      if (c == '"' && i + 1 < bytes.size() && bytes[i + 1] == '"') {
        records.back().back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        records.back().back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      records.back().emplace_back();
    } else if (c == '\n') {
      records.emplace_back(1);
    } else if (c != '\r') {
      records.back().back() += c;
    }
  }
  std::vector<std::map<std::string, std::string>> rows;
  for (size_t r = 1; r < records.size(); ++r) {
    if (records[r].size() == 1 && records[r][0].empty()) continue;  // the end
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < records[r].size() && i < records[0].size(); ++i) {
      if (!records[r][i].empty()) row[records[0][i]] = records[r][i];
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace

CSVLogger::CSVLogger(std::string root_dir, std::string name, LoggerVersion version, int64_t flush_logs_every_n_steps)
    : root_(std::move(root_dir)), name_(std::move(name)), version_(std::move(version)),
      every_(flush_logs_every_n_steps) {
  if (every_ < 1) {
    throw ConfigError("CSVLogger: flush_logs_every_n_steps must be at least 1, got " + std::to_string(every_));
  }
}

CSVLogger::~CSVLogger() {
  try {
    flush();
  } catch (...) {
  }
}

std::string CSVLogger::version() const {
  if (version_) return *version_;
  return dir_.empty() ? "" : fs::path(dir_).filename().string();
}

std::string CSVLogger::log_dir() const { return dir_; }

void CSVLogger::open() {
  if (!dir_.empty()) return;
  const std::string dir = detail::versioned_dir(root_, name_, version_, "CSVLogger");
  if (!detail::make_log_dir(dir, "CSVLogger")) {
    TORCH_WARN("CSVLogger: cannot create ", dir, ": No space left on device; training goes on, and the rows are kept "
               "to be written at the next flush");
  }
  // Lightning deletes an old metrics.csv here; so does this (a new run).
  const std::string metrics = (fs::path(dir) / "metrics.csv").string();
  std::error_code ec;
  if (fs::exists(metrics, ec)) {
    TORCH_WARN("CSVLogger: ", dir, " exists and holds a metrics.csv; it is replaced by this run's");
    fs::remove(metrics, ec);
  }
  dir_ = dir;
}

void CSVLogger::log_metrics(const Metrics& metrics, std::optional<int64_t> step) {
  open();
  std::map<std::string, std::string> row;
  for (const auto& [k, v] : metrics) row[k] = format_number(v);
  const int64_t s = step.value_or(calls_);
  ++calls_;
  row["step"] = std::to_string(s);
  rows_.push_back(std::move(row));
  if ((s + 1) % every_ == 0) flush();
}

void CSVLogger::log_hyperparams(const Hyperparameters& params) {
  open();
  std::string text;
  for (const auto& [k, v] : params) text += k + ": " + yaml_value(v) + "\n";
  int error = 0;
  if (!replace_file((fs::path(dir_) / "hparams.yaml").string(), text, error)) {
    TORCH_WARN("CSVLogger: cannot write ", dir_, "/hparams.yaml: ", detail::errno_text(error));
  }
}

void CSVLogger::flush() {
  if (dir_.empty() || rows_.empty()) return;
  std::error_code mkdir_error;
  fs::create_directories(dir_, mkdir_error);  // made late after a full disk
  std::vector<std::string> keys = keys_;
  for (const auto& row : rows_) {
    for (const auto& [k, v] : row) {
      if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
    }
  }
  std::sort(keys.begin(), keys.end());
  const std::string path = (fs::path(dir_) / "metrics.csv").string();
  auto row_text = [&](const std::map<std::string, std::string>& row) {
    std::string line;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (i) line += ',';
      const auto it = row.find(keys[i]);
      if (it != row.end()) line += csv_field(it->second);
    }
    return line + "\r\n";  // Python's csv writes \r\n
  };
  int error = 0;
  bool ok;
  // Deleted during the run (the append below would fail for good): made
  // again, header first; the rows it held are gone.
  struct stat gone {};
  const bool deleted = written_ && ::stat(path.c_str(), &gone) != 0 && errno == ENOENT;
  if (deleted && !recreated_) {
    TORCH_WARN("CSVLogger: ", path, " was deleted during the run; it is written again from step ",
               rows_.front().count("step") ? rows_.front().at("step") : std::string("?"),
               " on, with its header (the rows it held are gone)");
    recreated_ = true;
  }
  if (keys != keys_ || !written_ || deleted) {
    // A new column (or the first flush): the whole file with the wider
    // header, the rows already written read back (as Lightning does).
    std::string text;
    for (size_t i = 0; i < keys.size(); ++i) text += (i ? "," : "") + csv_field(keys[i]);
    text += "\r\n";
    if (written_ && !deleted) {
      for (const auto& row : read_csv_rows(path)) text += row_text(row);
    }
    for (const auto& row : rows_) text += row_text(row);
    ok = replace_file(path, text, error);
  } else {
    std::string text;
    for (const auto& row : rows_) text += row_text(row);
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC);
    struct stat st {};
    ok = fd >= 0 && ::fstat(fd, &st) == 0 && detail::write_all(fd, text, st.st_size, error);
    if (fd < 0) error = errno;
    if (fd >= 0) ::close(fd);
  }
  if (!ok) {
    if (!failing_) {
      TORCH_WARN("CSVLogger: cannot write ", path, ": ", detail::errno_text(error),
                 "; training goes on, and the rows are kept to be written at the next flush");
    }
    failing_ = true;
    return;
  }
  if (failing_) TORCH_WARN("CSVLogger: ", path, " is written again");
  failing_ = false;
  keys_ = std::move(keys);
  rows_.clear();
  written_ = true;
}

void CSVLogger::finalize(const std::string&) { flush(); }

}  // namespace fsdp
