#include "fsdp/observability/profiler.h"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/version.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <charconv>
#include <filesystem>
#include <fstream>
#include <set>

#include "fsdp/error.h"

namespace fsdp {

namespace fs = std::filesystem;
namespace kineto = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

namespace {

// The events as a Chrome trace, for a LibTorch without Kineto's writer
// (Debian's 1.13 records the events but cannot save them): complete events
// ("ph": "X") with name, cat ("user_annotation" for USER_SCOPE spans,
// "cpu_op" otherwise), pid, tid (LibTorch's thread id), ts and dur in
// microseconds.
void write_trace(const kineto::ProfilerResult& result, const std::string& path) {
  nlohmann::json events = nlohmann::json::array();
  for (const auto& ev : result.events()) {
#if TORCH_VERSION_MAJOR >= 2
    const double ts = static_cast<double>(ev.startNs()) / 1000.0, dur = static_cast<double>(ev.durationNs()) / 1000.0;
#else
    const double ts = static_cast<double>(ev.startUs()), dur = static_cast<double>(ev.durationUs());
#endif
    const bool user = ev.scope() == static_cast<uint8_t>(at::RecordScope::USER_SCOPE);
    events.push_back({{"ph", "X"},
                      {"cat", user ? "user_annotation" : "cpu_op"},
                      {"name", ev.name()},
                      {"pid", static_cast<int64_t>(::getpid())},
                      {"tid", static_cast<int64_t>(ev.startThreadId())},
                      {"ts", ts},
                      {"dur", dur}});
  }
  std::ofstream out(path, std::ios::trunc);
  out << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() << "\n";
  out.flush();
  if (!out) throw Error("Profiler::stop: cannot write the trace " + path);
}

}  // namespace

Profiler::~Profiler() {
  if (!running_) return;
  try {
    kineto::disableProfiler();
  } catch (...) {
  }
}

void Profiler::start(bool cuda) {
  if (running_) throw Error("Profiler::start: already running");
  if (impl::profilerEnabled()) {
    throw Error("Profiler::start: LibTorch's profiler is already on in this process (one profiler per process)");
  }
  const impl::ProfilerConfig config(impl::ProfilerState::KINETO);
  std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
  if (cuda) activities.insert(impl::ActivityType::CUDA);
  try {
    kineto::prepareProfiler(config, activities);
    kineto::enableProfiler(config, activities);
  } catch (const c10::Error& e) {
    throw Error(std::string("Profiler::start: LibTorch's profiler refused to start: ") + e.what_without_backtrace());
  }
  running_ = true;
}

void Profiler::stop(const std::string& path) {
  if (!running_) throw Error("Profiler::stop: not running");
  running_ = false;
  auto result = kineto::disableProfiler();
  const fs::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  if (ec) throw Error("Profiler::stop: cannot create " + p.parent_path().string() + " for the trace: " + ec.message());
  std::error_code gone;
  fs::remove(p, gone);
  try {
    result->save(path);
  } catch (const c10::Error& e) {
    // No Kineto (its message: "Saving a trace requires ... USE_KINETO=1"), or
    // a write it could not do: write the events ourselves, which names the path.
    write_trace(*result, path);
  }
  if (!fs::is_regular_file(p, ec) || fs::file_size(p, ec) == 0) {
    throw Error("Profiler::stop: LibTorch wrote no trace to " + path + " (is the disk full or the directory read-only?)");
  }
}

StepRange parse_step_range(const std::string& text, const std::string& what) {
  const auto bad = [&](const std::string& why) {
    return ConfigError(what + " '" + text + "': " + why + "; expected A:B, the first and last step to profile (1 <= A <= B)");
  };
  const auto colon = text.find(':');
  if (colon == std::string::npos) throw bad("no ':'");
  auto number = [&](const std::string& s) {
    int64_t v = 0;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size()) throw bad("'" + s + "' is not a step number");
    return v;
  };
  StepRange range{number(text.substr(0, colon)), number(text.substr(colon + 1))};
  if (range.first < 1 || range.last < range.first) throw bad("the steps must satisfy 1 <= A <= B");
  return range;
}

}  // namespace fsdp
