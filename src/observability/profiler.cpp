#include "fsdp/observability/profiler.h"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/version.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <charconv>
#include <cstring>
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
  if (!out) throw Error("cannot write it (is the disk full or the directory read-only?)");
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

bool Profiler::stop(const std::string& path) {
  if (!running_) throw Error("Profiler::stop: not running");
  running_ = false;
  auto result = kineto::disableProfiler();
  const fs::path p(path);
  // A trace is worth less than the run: what stops it writing is a warning.
  const auto lost = [&](const std::string& why) {
    TORCH_WARN("Profiler: the trace ", path, " cannot be written: ", why,
               "; the profile is lost, and training goes on");
    return false;
  };
  std::error_code ec;
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  if (ec || (p.has_parent_path() && !fs::is_directory(p.parent_path()))) {
    return lost("cannot create the directory " + p.parent_path().string() + ": " +
                (ec ? ec.message() : std::string("a file of that name is in the way")));
  }
  // The trace is written under a temporary name that this process creates
  // (O_EXCL | O_NOFOLLOW: no link there is followed, no file of another
  // replaced), then renamed to `path`: a symbolic link put at `path` is
  // replaced, never written through (issue 37 item 1).
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const auto drop_tmp = [&] {
    std::error_code ignored;
    if (fs::is_regular_file(fs::symlink_status(tmp, ignored))) fs::remove(tmp, ignored);
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return lost("cannot create " + tmp + ": " + std::strerror(errno));
  ::close(fd);
  try {
    try {
      result->save(tmp);
    } catch (const c10::Error& e) {
      // No Kineto (its message: "Saving a trace requires ... USE_KINETO=1"), or
      // a write it could not do: write the events ourselves.
      write_trace(*result, tmp);
    }
  } catch (const std::exception& e) {
    drop_tmp();
    return lost(e.what());
  }
  if (!fs::is_regular_file(fs::symlink_status(tmp, ec)) || fs::file_size(tmp, ec) == 0) {
    drop_tmp();
    return lost("LibTorch wrote no trace (is the disk full or the directory read-only?)");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    drop_tmp();
    return lost("cannot rename " + tmp + " to it: " + why);
  }
  return true;
}

std::string unused_trace_path(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return path;
  const std::string ext = ".pt.trace.json";
  const bool trace = path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
  const std::string stem = trace ? path.substr(0, path.size() - ext.size()) : fs::path(path).replace_extension().string();
  const std::string suffix = trace ? ext : fs::path(path).extension().string();
  for (int n = 1;; ++n) {
    const std::string candidate = stem + "." + std::to_string(n) + suffix;
    if (!fs::exists(fs::symlink_status(candidate, ec))) return candidate;
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
