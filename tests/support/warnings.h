// Captures the warnings LibTorch's c10 reports (TORCH_WARN), which is where
// fsdp-cpp's library sends its own: while a CapturedWarnings lives,
// warnings go to it instead of stderr (the calling thread's on 2.x, every
// thread's on 1.13). The handler API
// differs between LibTorch 1.13 (c10::Warning, a global handler; process(location,
// msg, verbatim)) and 2.x (c10::WarningUtils, a handler per thread;
// process(const Warning&)).
#pragma once

#include <c10/util/Exception.h>
#include <torch/version.h>

#include <mutex>
#include <string>
#include <vector>

namespace fsdp::testing {

class CapturedWarnings : public c10::WarningHandler {
 public:
  CapturedWarnings() : guard_(this) {}
#if TORCH_VERSION_MAJOR >= 2
  void process(const c10::Warning& warning) override { add(warning.msg()); }
#else
  void process(const c10::SourceLocation&, const std::string& msg, const bool) override { add(msg); }
#endif
  std::vector<std::string> messages() const {
    std::lock_guard<std::mutex> lock(mu_);
    return messages_;
  }
  // How many captured messages contain `text`.
  size_t count(const std::string& text) const {
    size_t n = 0;
    for (const auto& m : messages()) n += m.find(text) != std::string::npos;
    return n;
  }

 private:
  void add(const std::string& msg) {
    std::lock_guard<std::mutex> lock(mu_);
    messages_.push_back(msg);
  }
  mutable std::mutex mu_;
  std::vector<std::string> messages_;
#if TORCH_VERSION_MAJOR >= 2
  c10::WarningUtils::WarningHandlerGuard guard_;
#else
  c10::Warning::WarningHandlerGuard guard_;
#endif
};

}  // namespace fsdp::testing
