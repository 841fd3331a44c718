// fsdp/core/trace_span.h — FSDP's phases as profiler spans: an
// at::RecordFunction (USER_SCOPE) named "fsdp::<phase> <unit path>", which
// LibTorch's profiler (Kineto, fsdp/observability/profiler.h) records as a user
// annotation. With no profiler on, a span costs one thread-local check of
// LibTorch's callbacks and builds no name. Local.
#pragma once

#include <ATen/record_function.h>

#include <optional>
#include <string>

namespace fsdp::detail {

// A span that may begin in one call and end in another (a unit's backward
// runs from its pre-backward hook to its post-backward hook), on the same
// thread.
class Span {
 public:
  Span() = default;
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  // Starts "fsdp::<phase>[ <unit>]" unless this span is already open.
  void begin(const char* phase, const std::string& unit = "") {
    if (rf_) return;
    rf_.emplace(at::RecordScope::USER_SCOPE);
    if (!rf_->isActive()) {
      rf_.reset();
      return;
    }
    // Kept here: LibTorch 2.x takes the name as a string_view.
    name_ = std::string("fsdp::") + phase + (unit.empty() ? "" : " " + unit);
    rf_->before(name_, c10::ArrayRef<const c10::IValue>{});
  }
  void end() { rf_.reset(); }

 private:
  std::string name_;
  std::optional<at::RecordFunction> rf_;
};

// A span for the current scope.
class ScopedSpan {
 public:
  explicit ScopedSpan(const char* phase, const std::string& unit = "") { span_.begin(phase, unit); }

 private:
  Span span_;
};

}  // namespace fsdp::detail
