// fsdp/observability/loggers.h — Lightning Fabric's loggers, in C++: metrics and
// hyperparameters written where TensorBoard, a spreadsheet or a script can
// read them.
//
//   auto tb = std::make_shared<fsdp::TensorBoardLogger>("runs", "gpt");   // runs/gpt/version_0/events.out.tfevents.*
//   auto csv = std::make_shared<fsdp::CSVLogger>("runs", "gpt");          // runs/gpt/version_0/metrics.csv
//   fsdp::FSDPStrategy strategy(fsdp::FSDPStrategyOptions().loggers({tb, csv}));
//   ...
//   strategy.log("loss", loss.item<double>(), step);   // rank 0 only, as fabric.log
//
// Then `tensorboard --logdir runs`.
//
// Every call here is local (no collectives), and a logger is not
// thread-safe. Write only from one rank: FSDPStrategy::log / log_dict do
// that (rank 0), as Lightning's rank_zero_only loggers do.
//
// Loggers never stop a run: a write that fails on a full disk is reported
// once through c10's warning handler (TORCH_WARN), the file is cut back to
// its last whole record, and training goes on; the next write that succeeds
// says so. Only open() throws (ConfigError naming the directory and the
// system's reason), so that a log directory that cannot be written (a file
// in the way, no permission) is found before training starts; a full disk
// at open() is a warning too (TensorBoard and CSV; JSON lines, which a
// resume repairs, needs its file). Costs: a log_metrics call is
// one write(2) (CSVLogger: buffered, one write per flush); nothing else runs
// between calls.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace fsdp {

// A hyperparameter's value, as TensorBoard's hparams plugin and YAML hold it.
using HyperparameterValue = std::variant<bool, int64_t, double, std::string>;
// Name to value, in name order (so files are deterministic).
using Hyperparameters = std::map<std::string, HyperparameterValue>;
// Metric name to value. A value that is not finite is kept (TensorBoard
// shows NaN; CSV and JSON lines write "nan", "inf", "-inf").
using Metrics = std::map<std::string, double>;

// Lightning's Logger: an experiment `name` and `version` in `log_dir()`.
class Logger {
 public:
  virtual ~Logger();
  Logger(const Logger&) = delete;
  Logger& operator=(const Logger&) = delete;

  virtual std::string name() const = 0;
  // The version: the one given, or (once opened) the next free version_N.
  virtual std::string version() const = 0;
  // Where the files go ("" until open() for a logger whose version is chosen then).
  virtual std::string log_dir() const = 0;

  // Creates the log directory and opens the files (log_* do it at first
  // use). ConfigError naming the directory or file when it cannot be
  // written. Idempotent.
  virtual void open() = 0;
  // Records `metrics` at `step` (nullopt: the number of log_metrics calls so far).
  virtual void log_metrics(const Metrics& metrics, std::optional<int64_t> step = std::nullopt) = 0;
  virtual void log_hyperparams(const Hyperparameters& params) = 0;
  // Makes what was logged durable on disk (CSVLogger writes its buffer).
  virtual void flush() = 0;
  // Flushes and closes the files (a later log_* opens new ones). `status`
  // ("success", "failed") is Lightning's argument; these formats keep no
  // place for it.
  virtual void finalize(const std::string& status) = 0;

 protected:
  Logger() = default;
};

// Lightning's `version` rule: nullopt picks the next free "version_N" under
// root_dir/name at open(); a string is used as is ("" : log into
// root_dir/name itself).
using LoggerVersion = std::optional<std::string>;

// TensorBoard event files (events.out.tfevents.<seconds>.<host>.<pid>.<n>),
// as torch.utils.tensorboard's SummaryWriter writes them: TFRecord framing
// (length and data each guarded by a masked CRC-32C), a first event with
// file_version "brain.Event:2", one event per scalar (tag, simple_value as
// float32, step, wall time), and hyperparameters through the hparams plugin
// as Lightning's log_hyperparams writes them (with the default "hp_metric"
// of -1). Every log_metrics call is appended with one write(2): a crash
// leaves a file TensorBoard reads up to the last whole record.
class TensorBoardLogger : public Logger {
 public:
  explicit TensorBoardLogger(std::string root_dir, std::string name = "lightning_logs", LoggerVersion version = std::nullopt,
                             bool default_hp_metric = true);
  ~TensorBoardLogger() override;

  std::string name() const override { return name_; }
  std::string version() const override;
  std::string log_dir() const override;
  // The event file being written ("" before open()).
  const std::string& file() const { return file_; }

  void open() override;
  void log_metrics(const Metrics& metrics, std::optional<int64_t> step = std::nullopt) override;
  void log_hyperparams(const Hyperparameters& params) override;
  // Lightning's log_hyperparams(params, metrics) without values: lists
  // these scalar tags as the metrics of TensorBoard's HPARAMS view (logged
  // with log_metrics as the run goes).
  void log_hyperparams(const Hyperparameters& params, const std::vector<std::string>& metric_tags);
  void flush() override;
  void finalize(const std::string& status) override;
  // A session START at `step`: TensorBoard drops what earlier files of this
  // directory hold at steps >= `step` (the steps a resumed run does again).
  // Write one at every start of a job (TensorBoard's Python reader ignores a
  // directory's first). A new file's name sorts after the directory's older
  // ones, as TensorBoard reads them in name order.
  void log_restart(int64_t step);

 private:
  void append(const std::string& records, const char* what);
  double now() const;
  // Creates the event file and writes its first record: 0, or the errno of a
  // full disk (nothing left behind); ConfigError for any other failure.
  int create_file();
  // open(), and a new attempt at the file after a full disk; false: nothing
  // can be written now.
  bool ready();

  std::string root_, name_;
  LoggerVersion version_;
  bool default_hp_metric_;
  std::string dir_, file_;
  int fd_ = -1;
  int64_t size_ = 0, calls_ = 0;
  bool failing_ = false;
  bool deferred_ = false;  // the disk was full at open(): each log tries again
};

// Lightning's CSVLogger layout: root_dir/name/version_N/metrics.csv, one row
// per log_metrics call with a "step" column and a column per metric name
// (sorted; a new name rewrites the file with the wider header, as Lightning
// does), and hparams.yaml (Lightning Fabric's CSVLogger has no
// hyperparameters; this writes them as PyTorch Lightning's CSVLogger does,
// one "name: value" per line, strings double-quoted). Rows are buffered and
// written every `flush_logs_every_n_steps` steps, on flush() and on
// destruction (a new column rewrites the file atomically: write, then
// rename). A metrics.csv deleted during the run is recreated with its
// header at the next flush (the rows it held are gone), said once as a
// warning. Memory: the rows not yet written.
class CSVLogger : public Logger {
 public:
  explicit CSVLogger(std::string root_dir, std::string name = "lightning_logs", LoggerVersion version = std::nullopt,
                     int64_t flush_logs_every_n_steps = 100);
  ~CSVLogger() override;

  std::string name() const override { return name_; }
  std::string version() const override;
  std::string log_dir() const override;

  void open() override;
  void log_metrics(const Metrics& metrics, std::optional<int64_t> step = std::nullopt) override;
  void log_hyperparams(const Hyperparameters& params) override;
  void flush() override;
  void finalize(const std::string& status) override;

 private:
  std::string root_, name_;
  LoggerVersion version_;
  int64_t every_;
  std::string dir_;
  std::vector<std::string> keys_;                         // the file's header, sorted ("step" among them)
  std::vector<std::map<std::string, std::string>> rows_;  // rows not yet written, as text
  bool written_ = false;                                  // metrics.csv has this run's header
  int64_t calls_ = 0;
  bool failing_ = false;
  bool recreated_ = false;  // metrics.csv was deleted and made again (warned once)
};

// One JSON object per line in one file — fsdp-train's metrics.jsonl. Each
// line is one write(2); a failed or short one is undone (the file is cut
// back to its last whole line). A number that is not finite is written as
// the string "nan", "inf" or "-inf" (JSON has none; Python's float() reads
// them). Steps whose lines could not be written are recorded, once writes
// succeed again, as a gap line {"gap": [first, last]}.
class JsonLinesLogger : public Logger {
 public:
  // The file `path` (its directory is log_dir()). `resume_after` > 0: the
  // file continues a run resumed after that step. open() then repairs it in
  // place, by truncation only (nothing is rewritten, so a full disk cannot
  // lose it):
  // - a torn or damaged tail (what follows the last line whose step is at
  //   most `resume_after`: lines past it, a line a crash cut, NUL bytes) is
  //   cut off; a tail that was not whole lines of later steps is named with
  //   its byte offset (a warning);
  // - damaged lines before it stay (readers skip them), named;
  // - when the last step kept is below `resume_after`, the missing steps are
  //   recorded as a gap.
  //
  // `resume_after` 0: open() empties the file.
  explicit JsonLinesLogger(std::string path, int64_t resume_after = 0);
  ~JsonLinesLogger() override;

  std::string name() const override;  // the file's name without ".jsonl"
  std::string version() const override { return ""; }
  std::string log_dir() const override;
  const std::string& path() const { return path_; }

  void open() override;
  // {"step": step, "<name>": value, ...}
  void log_metrics(const Metrics& metrics, std::optional<int64_t> step = std::nullopt) override;
  // {"hparams": {"<name>": value, ...}}
  void log_hyperparams(const Hyperparameters& params) override;
  void flush() override {}  // every line is written at once
  void finalize(const std::string&) override {}
  // Appends one line for `step`: `json_object`, the text of a JSON object
  // (no newline), for records richer than numbers (fsdp-train's "samples",
  // "resized"). std::invalid_argument when it is not one JSON object on one line.
  void log_line(int64_t step, const std::string& json_object);

 private:
  bool append(const std::string& line, int& error);
  void record_gap(int64_t first, int64_t last);

  std::string path_;
  int64_t resume_after_;
  int fd_ = -1;
  int64_t size_ = 0, calls_ = 0;
  int64_t first_lost_ = 0;  // > 0: steps from here on could not be written
};

// A number as loggers write it in text: the shortest decimal that reads back
// as the same double ("0.1", "1e-05"), or "nan", "inf", "-inf".
std::string format_number(double value);

}  // namespace fsdp
