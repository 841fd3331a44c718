// fsdp/observability/json_lines.h — reading a JSON-lines log back (JsonLinesLogger's
// files, fsdp-train's metrics.jsonl): which lines are records, and which are
// damaged. Local; costs one read of the file.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::detail {

// A record: its line number (blank lines counted), the byte offset where it
// starts, its text, and its step: a step line's "step", a gap line's last
// step ({"gap": [first, last]}), or 0 for a hyperparameter line
// ({"hparams": {...}}).
struct JsonLine {
  int64_t lineno = 0, offset = 0;
  std::string text;
  int64_t step = 0;
  std::optional<std::pair<int64_t, int64_t>> gap;
};

// A line that is not a record: where it starts, and what is wrong
// ("line 7 (byte 412): not JSON (...): '<its start>'").
struct SkippedLine {
  int64_t offset = 0;
  std::string what;
};

// What read_json_lines found. `end` is the byte offset just after the last
// newline (what follows it, up to `size`, is a torn line, also in skipped).
struct JsonLinesFile {
  std::vector<JsonLine> lines;
  std::vector<SkippedLine> skipped;
  int64_t end = 0, size = 0;
};

// A double as a JSON-lines log holds it: a number, or the string "nan",
// "inf" or "-inf" (JSON has none of these; Python's float() reads them).
nlohmann::ordered_json number_json(double v);

// Reads `path` (empty when it does not exist). ConfigError only when the
// path is not a regular file (a FIFO, a device). Damaged lines are listed,
// never an error.
JsonLinesFile read_json_lines(const std::string& path);

// What a resume keeps of a JSON-lines log, found from its end
// (read_json_lines_tail): `keep`, the byte offset just after the last
// record whose step is at most the resume's (0: none), that record's step,
// and whether anything after it is damaged (a torn or damaged line, as
// opposed to whole records of later steps).
struct JsonLinesTail {
  int64_t keep = 0, last_step = 0;
  bool damaged = false;
};

// Reads the `size` bytes of `fd` from the end back to the last record whose
// step is at most `up_to`, and no further: memory does not grow with the
// file (a line longer than 1 MiB is damaged, never held), and the time
// grows with the lines after that record only. A read error ends the
// search there, as the file's start would.
JsonLinesTail read_json_lines_tail(int fd, int64_t size, int64_t up_to);

}  // namespace fsdp::detail
