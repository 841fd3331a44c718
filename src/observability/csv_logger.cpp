// CSVLogger (fsdp/observability/loggers.h): metrics.csv and hparams.yaml as
// Lightning's CSVLogger writes them.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "fsdp/error.h"
#include "fsdp/observability/loggers.h"
#include "fsdp/text/bytes_json.h"
#include "logger_files.h"

namespace fsdp {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

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
