// write_loss_curve: out/loss.svg from out/metrics.jsonl. Drawn by hand: a
// line, points, two axes with "nice" ticks and a legend are a few dozen
// lines of SVG, where a plotting library would be a dependency of the
// library for one picture.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
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
#include "fsdp/run/run_directory.h"

namespace fsdp::train {

namespace fs = std::filesystem;

namespace {

// Ticks over [lo, hi]: a step of 1, 2 or 5 times a power of ten giving about
// `target` ticks; the range widened to whole steps. Any finite values give
// a finite step that the values can tell apart and at most 4 * target + 1
// ticks: a range of one value (or values too close for their magnitude, as
// 1e17 and 1e17 + 5) is widened by a millionth of it first, and the step is
// computed without overflow (hi / target - lo / target).
struct Axis {
  double lo = 0, hi = 1, step = 1;
  int64_t ticks = 2;  // lo, lo + step, ..., hi
  // In halves: i * step may pass the largest double where the tick does not.
  double tick(int64_t i) const {
    return i == ticks - 1 ? hi : std::min(hi, (lo / 2 + static_cast<double>(i) * (step / 2)) * 2);
  }
};
Axis nice_axis(double lo, double hi, int target) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) lo = 0, hi = 1;
  if (!(hi - lo > std::max(std::abs(lo), std::abs(hi)) * 1e-9)) {
    const double d = std::max(1.0, std::max(std::abs(lo), std::abs(hi)) * 1e-6);
    lo -= d;
    hi += d;
  }
  const double raw = hi / target - lo / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (!std::isfinite(m * mag)) break;
    step = m * mag;
    if (step >= raw) break;
  }
  Axis a;
  a.step = step;
  const double first = std::floor(lo / step), last = std::ceil(hi / step);
  a.lo = std::isfinite(first * step) ? first * step : lo;
  a.hi = std::isfinite(last * step) ? last * step : hi;
  a.ticks = std::clamp<int64_t>(static_cast<int64_t>(std::llround(last - first)) + 1, 2, 4 * target + 1);
  return a;
}

// A tick's label: no more decimals than the step needs; in scientific
// notation, with the digits that tell ticks apart, for values from a
// million up or steps below 1e-4.
std::string label(double v, const Axis& axis) {
  std::ostringstream s;
  const double step = axis.step, big = std::max(std::abs(axis.lo), std::abs(axis.hi));
  if (std::abs(v) < step / 2) v = 0;
  if (big >= 1e6 || step < 1e-4) {
    const int digits = std::clamp(static_cast<int>(std::ceil(std::log10(std::max(big, step) / step))) + 1, 1, 17);
    s << std::setprecision(digits) << v;
  } else {
    const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
    s << std::fixed << std::setprecision(decimals) << v;
  }
  return s.str();
}

// At most `most` points of `points` (in step order): beyond that, each of
// most / 2 runs of consecutive points gives its lowest and its highest, so
// a spike stays visible. The drawing's size does not grow with the run.
std::vector<std::pair<double, double>> thinned(const std::vector<std::pair<double, double>>& points, size_t most) {
  if (points.size() <= most) return points;
  std::vector<std::pair<double, double>> out;
  const size_t runs = most / 2;
  for (size_t r = 0; r < runs; ++r) {
    const size_t from = points.size() * r / runs, to = points.size() * (r + 1) / runs;
    if (from == to) continue;
    auto lo = points.begin() + static_cast<std::ptrdiff_t>(from), hi = lo;
    for (size_t i = from; i < to; ++i) {
      const auto it = points.begin() + static_cast<std::ptrdiff_t>(i);
      if (it->second < lo->second) lo = it;
      if (it->second > hi->second) hi = it;
    }
    if (lo > hi) std::swap(lo, hi);
    out.push_back(*lo);
    if (hi != lo) out.push_back(*hi);
  }
  return out;
}

// (step, loss) and (step, eval_loss) of each metrics line of `path` whose
// values are finite numbers, read a line at a time: the memory is that of
// the points, never of the file (a line longer than 1 MiB is skipped
// unread, as damage).
void read_points(const std::string& path, std::vector<std::pair<double, double>>& train,
                 std::vector<std::pair<double, double>>& eval) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return;
  constexpr size_t kLongest = size_t{1} << 20;
  std::string line;
  bool too_long = false;
  auto take = [&] {
    if (too_long || line.empty() || line.front() != '{') return;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number()) return;
    const double step = j["step"].get<double>();
    auto finite = [&](const char* key, std::vector<std::pair<double, double>>& to) {
      const auto it = j.find(key);
      if (it != j.end() && it->is_number() && std::isfinite(it->get<double>())) to.emplace_back(step, it->get<double>());
    };
    finite("loss", train);
    finite("eval_loss", eval);
  };
  std::vector<char> buf(size_t{64} << 10);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto n = static_cast<size_t>(in.gcount());
    size_t at = 0;
    while (at < n) {
      const void* nl = std::memchr(buf.data() + at, '\n', n - at);
      const size_t to = nl ? static_cast<size_t>(static_cast<const char*>(nl) - buf.data()) : n;
      if (!too_long) {
        if (line.size() + (to - at) > kLongest) {
          too_long = true;
          line.clear();
          line.shrink_to_fit();
        } else {
          line.append(buf.data() + at, to - at);
        }
      }
      at = to;
      if (nl) {
        take();
        line.clear();
        too_long = false;
        ++at;
      }
    }
  }
  // A torn last line is no metrics line.
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
  read_points(run::RunDirectory(out).metrics_path(), train, eval);
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
  train = thinned(train, 2000);
  eval = thinned(eval, 500);
  const Axis ax = nice_axis(std::min(0.0, min_step), max_step, 8);
  const Axis ay = nice_axis(min_loss, max_loss, 6);
  // Coordinates of values far apart (1e300 and -1e300) are computed as
  // fractions first, so they stay finite.
  auto px = [&](double x) { return left + (w - left - right) * ((x / 2 - ax.lo / 2) / (ax.hi / 2 - ax.lo / 2)); };
  auto py = [&](double y) { return h - bottom - (h - top - bottom) * ((y / 2 - ay.lo / 2) / (ay.hi / 2 - ay.lo / 2)); };
  std::ostringstream svg;
  svg << std::fixed << std::setprecision(1) << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w
      << "\" height=\"" << h << "\" viewBox=\"0 0 " << w << " " << h
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << w / 2 << "\" y=\"20\" text-anchor=\"middle\" font-size=\"13\">"
      << escape(title.empty() ? "fsdp-train: " + out : title) << "</text>\n";
  // Grid and ticks: a bounded count (Axis::ticks), by index.
  for (int64_t i = 0; i < ax.ticks; ++i) {
    const double x = ax.tick(i);
    svg << "<line x1=\"" << px(x) << "\" y1=\"" << top << "\" x2=\"" << px(x) << "\" y2=\"" << h - bottom
        << "\" stroke=\"#e6e6e6\"/>\n<text x=\"" << px(x) << "\" y=\"" << h - bottom + 16
        << "\" text-anchor=\"middle\">" << label(x, ax) << "</text>\n";
  }
  for (int64_t i = 0; i < ay.ticks; ++i) {
    const double y = ay.tick(i);
    svg << "<line x1=\"" << left << "\" y1=\"" << py(y) << "\" x2=\"" << w - right << "\" y2=\"" << py(y)
        << "\" stroke=\"#e6e6e6\"/>\n<text x=\"" << left - 6 << "\" y=\"" << py(y) + 4
        << "\" text-anchor=\"end\">" << label(y, ay) << "</text>\n";
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
  // Written in one go to a file of our own: never through a symlink, never
  // into what is not a regular file.
  const std::string text = svg.str();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    throw Error("cannot write " + path + ": " + std::strerror(err) +
                (err == ELOOP ? " (a symlink; it is not followed)" : std::string()));
  }
  struct stat st {};
  bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  size_t done = 0;
  while (ok && done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  const int err = ok ? 0 : errno;
  ::close(fd);
  if (!ok) {
    if (S_ISREG(st.st_mode)) ::unlink(path.c_str());  // no half drawing
    throw Error("cannot write " + path + ": " + (err ? std::strerror(err) : "not a regular file") +
                " (is the disk full?)");
  }
  return path;
}

}  // namespace fsdp::train
