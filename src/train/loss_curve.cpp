// write_loss_curve: out/loss.svg from out/metrics.jsonl. Drawn by hand: a
// line, points, two axes with "nice" ticks and a legend are a few dozen
// lines of SVG, where a plotting library would be a dependency of the
// library for one picture.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <utility>
#include <vector>

#include "fsdp/error.h"
#include "fsdp/train/gpt_trainer.h"
#include "metrics.h"
#include "run_directory.h"

namespace fsdp::train {

namespace fs = std::filesystem;

namespace {

// Ticks over [lo, hi]: a step of 1, 2 or 5 times a power of ten giving about
// `target` ticks; the range widened to whole steps.
struct Axis {
  double lo = 0, hi = 1, step = 1;
};
Axis nice_axis(double lo, double hi, int target) {
  if (!(hi > lo)) hi = lo + 1;
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  return {std::floor(lo / step) * step, std::ceil(hi / step) * step, step};
}

// A tick's label: no more decimals than the step needs.
std::string label(double v, double step) {
  std::ostringstream s;
  const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  s << std::fixed << std::setprecision(decimals) << (std::abs(v) < step / 2 ? 0.0 : v);
  return s.str();
}

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

}  // namespace

std::string write_loss_curve(const std::string& out, const std::string& title) {
  std::vector<std::pair<double, double>> train, eval;
  // Lines that are not metrics, and losses that are not finite (a diverged
  // step), are left out of the drawing.
  for (const auto& m : read_metrics(RunDirectory(out).metrics_path()).lines) {
    if (!m.loss || !std::isfinite(*m.loss)) continue;
    train.emplace_back(static_cast<double>(m.step), *m.loss);
    if (m.eval_loss && std::isfinite(*m.eval_loss)) eval.emplace_back(static_cast<double>(m.step), *m.eval_loss);
  }
  const std::string path = (fs::path(out) / "loss.svg").string();
  const double w = 760, h = 420, left = 64, right = 20, top = 44, bottom = 52;
  double min_step = 1e300, max_step = -1e300, min_loss = 1e300, max_loss = -1e300;
  for (const auto* pts : {&train, &eval}) {
    for (const auto& [x, y] : *pts) {
      min_step = std::min(min_step, x), max_step = std::max(max_step, x);
      min_loss = std::min(min_loss, y), max_loss = std::max(max_loss, y);
    }
  }
  if (train.empty() && eval.empty()) min_step = 0, max_step = 1, min_loss = 0, max_loss = 1;
  const Axis ax = nice_axis(std::min(0.0, min_step), max_step, 8);
  const Axis ay = nice_axis(min_loss, max_loss, 6);
  auto px = [&](double x) { return left + (w - left - right) * (x - ax.lo) / (ax.hi - ax.lo); };
  auto py = [&](double y) { return h - bottom - (h - top - bottom) * (y - ay.lo) / (ay.hi - ay.lo); };
  std::ofstream svg(path, std::ios::trunc);
  svg << std::fixed << std::setprecision(1) << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w
      << "\" height=\"" << h << "\" viewBox=\"0 0 " << w << " " << h
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << w / 2 << "\" y=\"20\" text-anchor=\"middle\" font-size=\"13\">"
      << escape(title.empty() ? "fsdp-train: " + out : title) << "</text>\n";
  // Grid and ticks.
  for (double x = ax.lo; x <= ax.hi + ax.step / 2; x += ax.step) {
    svg << "<line x1=\"" << px(x) << "\" y1=\"" << top << "\" x2=\"" << px(x) << "\" y2=\"" << h - bottom
        << "\" stroke=\"#e6e6e6\"/>\n<text x=\"" << px(x) << "\" y=\"" << h - bottom + 16
        << "\" text-anchor=\"middle\">" << label(x, ax.step) << "</text>\n";
  }
  for (double y = ay.lo; y <= ay.hi + ay.step / 2; y += ay.step) {
    svg << "<line x1=\"" << left << "\" y1=\"" << py(y) << "\" x2=\"" << w - right << "\" y2=\"" << py(y)
        << "\" stroke=\"#e6e6e6\"/>\n<text x=\"" << left - 6 << "\" y=\"" << py(y) + 4
        << "\" text-anchor=\"end\">" << label(y, ay.step) << "</text>\n";
  }
  svg << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << w - left - right << "\" height=\""
      << h - top - bottom << "\" fill=\"none\" stroke=\"black\"/>\n"
      << "<text x=\"" << (left + w - right) / 2 << "\" y=\"" << h - 12 << "\" text-anchor=\"middle\">step</text>\n"
      << "<text x=\"16\" y=\"" << (top + h - bottom) / 2 << "\" transform=\"rotate(-90 16 " << (top + h - bottom) / 2
      << ")\" text-anchor=\"middle\">loss (cross-entropy, nats per byte)</text>\n";
  if (!train.empty()) {
    svg << "<polyline fill=\"none\" stroke=\"steelblue\" stroke-width=\"1.5\" points=\"";
    for (const auto& [x, y] : train) svg << px(x) << "," << py(y) << " ";
    svg << "\"/>\n";
  }
  for (const auto& [x, y] : eval) {
    svg << "<circle cx=\"" << px(x) << "\" cy=\"" << py(y) << "\" r=\"3.5\" fill=\"darkorange\"/>\n";
  }
  // Legend, top right inside the plot.
  const double lx = w - right - 150, ly = top + 16;
  svg << "<rect x=\"" << lx - 8 << "\" y=\"" << ly - 13 << "\" width=\"150\" height=\"" << (eval.empty() ? 22 : 40)
      << "\" fill=\"white\" stroke=\"#bbbbbb\"/>\n"
      << "<line x1=\"" << lx << "\" y1=\"" << ly - 4 << "\" x2=\"" << lx + 20 << "\" y2=\"" << ly - 4
      << "\" stroke=\"steelblue\" stroke-width=\"1.5\"/>\n<text x=\"" << lx + 26 << "\" y=\"" << ly
      << "\">training loss</text>\n";
  if (!eval.empty()) {
    svg << "<circle cx=\"" << lx + 10 << "\" cy=\"" << ly + 14 << "\" r=\"3.5\" fill=\"darkorange\"/>\n<text x=\""
        << lx + 26 << "\" y=\"" << ly + 18 << "\">held-out loss</text>\n";
  }
  svg << "</svg>\n";
  svg.flush();
  if (!svg) throw Error("cannot write " + path + " (is the disk full?)");
  return path;
}

}  // namespace fsdp::train
