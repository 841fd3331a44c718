// write_loss_curve: out/loss.svg from out/metrics.jsonl.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <utility>
#include <vector>

#include "fsdp/error.h"
#include "fsdp/train/gpt_trainer.h"
#include "metrics.h"
#include "run_directory.h"

namespace fsdp::train {

namespace fs = std::filesystem;

std::string write_loss_curve(const std::string& out) {
  std::vector<std::pair<double, double>> train, eval;
  // Lines that are not metrics, and losses that are not finite (a diverged
  // step), are left out of the drawing.
  for (const auto& m : read_metrics(RunDirectory(out).metrics_path()).lines) {
    if (!m.loss || !std::isfinite(*m.loss)) continue;
    train.emplace_back(static_cast<double>(m.step), *m.loss);
    if (m.eval_loss && std::isfinite(*m.eval_loss)) eval.emplace_back(static_cast<double>(m.step), *m.eval_loss);
  }
  const std::string path = (fs::path(out) / "loss.svg").string();
  const double w = 640, h = 360, pad = 50;
  double max_step = 1, max_loss = 0.1;
  for (auto& [x, y] : train) max_step = std::max(max_step, x), max_loss = std::max(max_loss, y);
  for (auto& [x, y] : eval) max_loss = std::max(max_loss, y);
  auto px = [&](double x) { return pad + (w - 2 * pad) * x / max_step; };
  auto py = [&](double y) { return h - pad - (h - 2 * pad) * y / max_loss; };
  std::ofstream svg(path, std::ios::trunc);
  svg << std::fixed << std::setprecision(1) << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w
      << "\" height=\"" << h << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<line x1=\"" << pad << "\" y1=\"" << h - pad << "\" x2=\"" << w - pad << "\" y2=\"" << h - pad
      << "\" stroke=\"black\"/>\n<line x1=\"" << pad << "\" y1=\"" << pad << "\" x2=\"" << pad << "\" y2=\""
      << h - pad << "\" stroke=\"black\"/>\n"
      << "<text x=\"" << w / 2 << "\" y=\"" << h - 12 << "\" text-anchor=\"middle\">step (last " << max_step
      << ")</text>\n<text x=\"14\" y=\"" << h / 2 << "\" transform=\"rotate(-90 14 " << h / 2
      << ")\" text-anchor=\"middle\">loss (top " << max_loss << ")</text>\n";
  auto polyline = [&](const std::vector<std::pair<double, double>>& pts, const char* color, const char* label, double ly) {
    if (pts.empty()) return;
    svg << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"1.5\" points=\"";
    for (auto& [x, y] : pts) svg << px(x) << "," << py(y) << " ";
    svg << "\"/>\n<text x=\"" << w - pad - 110 << "\" y=\"" << ly << "\" fill=\"" << color << "\">" << label
        << "</text>\n";
  };
  polyline(train, "steelblue", "training loss", pad);
  polyline(eval, "darkorange", "held-out loss", pad + 16);
  svg << "</svg>\n";
  svg.flush();
  if (!svg) throw Error("cannot write " + path + " (is the disk full?)");
  return path;
}

}  // namespace fsdp::train
