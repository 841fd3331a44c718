#include "metrics.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>

#include "fsdp/error.h"

namespace fsdp::train {

namespace {

using Json = nlohmann::ordered_json;

// "<path> line <n>" and what follows, with the line and what was expected.
[[noreturn]] void malformed(const std::string& path, int64_t lineno, const std::string& line,
                            const std::string& problem) {
  throw ConfigError(path + " line " + std::to_string(lineno) + problem + " (line: '" + line.substr(0, 80) +
                    "'): expected one JSON object per step as fsdp-train writes it");
}

// The number under `key` in `object`; nullopt when the key is absent,
// ConfigError naming the line when its value is not a finite number.
std::optional<double> number(const Json& object, const char* key, const std::string& path, int64_t lineno,
                             const std::string& line) {
  const auto it = object.find(key);
  if (it == object.end()) return std::nullopt;
  if (!it->is_number() || !std::isfinite(it->get<double>())) {
    malformed(path, lineno, line, std::string(": \"") + key + "\" is not a number");
  }
  return it->get<double>();
}

}  // namespace

std::vector<MetricsLine> read_metrics(const std::string& path) {
  std::vector<MetricsLine> out;
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec)) {
    throw ConfigError(path + " is not a regular file (a FIFO, device or directory); refusing to read it");
  }
  std::ifstream in(path);
  int64_t lineno = 0;
  for (std::string line; std::getline(in, line);) {
    ++lineno;
    if (line.empty()) continue;
    Json object;
    try {
      object = Json::parse(line);
    } catch (const Json::parse_error& e) {
      malformed(path, lineno, line, " is not JSON (" + std::string(e.what()) + ")");
    }
    if (!object.is_object()) malformed(path, lineno, line, " is not a JSON object");
    const auto step = number(object, "step", path, lineno, line);
    if (!step) malformed(path, lineno, line, " has no \"step\"");
    MetricsLine m;
    m.lineno = lineno;
    m.text = line;
    m.step = static_cast<int64_t>(*step);
    m.loss = number(object, "loss", path, lineno, line);
    m.eval_loss = number(object, "eval_loss", path, lineno, line);
    out.push_back(std::move(m));
  }
  return out;
}

MetricsWriter::MetricsWriter(const std::string& path, int64_t start) {
  std::vector<std::string> kept;
  if (start > 0) {
    for (const auto& m : read_metrics(path)) {
      if (m.step <= start) kept.push_back(m.text);
    }
  }
  out_.open(path, std::ios::trunc);
  for (const auto& line : kept) out_ << line << "\n";
  out_.flush();
}

void MetricsWriter::write(const StepMetrics& m) {
  Json j;
  j["step"] = m.step;
  j["loss"] = m.loss;
  j["lr"] = m.lr;
  j["grad_norm"] = m.grad_norm;
  j["tokens_per_s"] = m.tokens_per_s;
  j["elapsed_s"] = m.elapsed_s;
  if (m.eval_loss) j["eval_loss"] = *m.eval_loss;
  if (m.resumed_from) j["resumed_from"] = *m.resumed_from;
  if (!m.set_aside.empty()) j["set_aside"] = m.set_aside;
  out_ << j.dump() << std::endl;
}

}  // namespace fsdp::train
