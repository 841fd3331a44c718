// The environment that makes the programs a test starts (run_program, spawn)
// strike a fault (tests/support/fault_injector.cpp, docs/reliability.md):
// the injector preloaded after what LD_PRELOAD already holds (fsdp-run puts
// its --allocator first and keeps both), and FSDP_TEST_FAULT. Needs
// FSDP_FAULT_INJECTOR_PATH (tests/CMakeLists.txt's PROGRAMS).
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

namespace fsdp::testing {

// spec: "<point>:<rank>:<n>", or "<point>:<rank>:<n>:<how>" with how one of
// oom, launcher, slow
// (tests/support/fault_injector.cpp); <rank> may be "*" (any rank).
inline std::vector<std::string> fault_env(const std::string& spec) {
  const char* preloaded = std::getenv("LD_PRELOAD");
  std::string preload = FSDP_FAULT_INJECTOR_PATH;
  if (preloaded != nullptr && *preloaded != '\0') preload = std::string(preloaded) + ":" + preload;
  return {"LD_PRELOAD=" + preload, "FSDP_TEST_FAULT=" + spec};
}

}  // namespace fsdp::testing
