#include "metrics.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "fsdp/error.h"
#include "fsdp/text/bytes_json.h"

namespace fsdp::train {

namespace {

using Json = nlohmann::ordered_json;
using detail::number_json;

// The value under `key`: nullopt when absent or not a number (nor one of
// the strings above).
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
  return std::nullopt;
}

}  // namespace

Metrics StepMetrics::scalars() const {
  Metrics s{{"loss", loss},
            {"lr", lr},
            {"grad_norm", grad_norm},
            {"tokens_per_s", tokens_per_s},
            {"rss_mib", rss_mib},
            {"all_gather_wait_s", all_gather_wait_s},
            {"reduction_wait_s", reduction_wait_s},
            {"all_gather_bytes", static_cast<double>(all_gather_bytes)},
            {"reduction_bytes", static_cast<double>(reduction_bytes)}};
  if (eval_loss) s["eval_loss"] = *eval_loss;
  return s;
}

MetricsFile read_metrics(const std::string& path) {
  const detail::JsonLinesFile file = detail::read_json_lines(path);
  MetricsFile out;
  out.skipped = file.skipped;
  out.end = file.end;
  out.size = file.size;
  for (const auto& line : file.lines) {
    if (line.step == 0 && !line.gap) continue;  // not a step (hyperparameters)
    MetricsLine m;
    m.lineno = line.lineno;
    m.offset = line.offset;
    m.text = line.text;
    m.step = line.step;
    m.gap = line.gap;
    if (!m.gap) {
      const Json object = Json::parse(line.text);  // read_json_lines parsed it already
      m.loss = number_at(object, "loss");
      m.eval_loss = number_at(object, "eval_loss");
      if (object.contains("loss") && !m.loss) {
        out.skipped.push_back({line.offset, "line " + std::to_string(line.lineno) + " (byte " +
                                                std::to_string(line.offset) + "): \"loss\" is not a number"});
        continue;
      }
    }
    out.lines.push_back(std::move(m));
  }
  return out;
}

MetricsWriter::MetricsWriter(const std::string& path, int64_t start) : log_(path, start) { log_.open(); }

void MetricsWriter::write(const StepMetrics& m) {
  Json j;
  j["step"] = m.step;
  j["loss"] = number_json(m.loss);
  j["lr"] = number_json(m.lr);
  j["grad_norm"] = number_json(m.grad_norm);
  j["tokens_per_s"] = number_json(m.tokens_per_s);
  j["elapsed_s"] = number_json(m.elapsed_s);
  j["rss_mib"] = number_json(m.rss_mib);
  j["all_gather_wait_s"] = number_json(m.all_gather_wait_s);
  j["reduction_wait_s"] = number_json(m.reduction_wait_s);
  j["all_gather_bytes"] = m.all_gather_bytes;
  j["reduction_bytes"] = m.reduction_bytes;
  j["world"] = m.world;
  j["samples"] = Json::array({m.samples_from, m.samples_to});
  if (m.eval_loss) j["eval_loss"] = number_json(*m.eval_loss);
  if (m.nonfinite) j["nonfinite"] = true;
  if (m.skipped) j["skipped"] = true;
  if (m.resumed_from) j["resumed_from"] = *m.resumed_from;
  for (const auto& path : m.set_aside) j["set_aside"].push_back(text::escape_bytes(path));  // paths are bytes
  if (m.resized) {
    j["resized"] = {{"from_world", m.resized->from_world},
                    {"to_world", m.resized->to_world},
                    {"step", m.resized->step},
                    {"seconds_lost", number_json(m.resized->seconds_lost)}};
  }
  log_.log_line(m.step, text::json_text(j.dump()));
}

}  // namespace fsdp::train
