// src/observability/json_lines.h — reading a JSON-lines log back (JsonLinesLogger's
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

}  // namespace fsdp::detail
