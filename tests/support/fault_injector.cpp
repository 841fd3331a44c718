// The fault injector of the crash tests (docs/reliability.md): a small shared
// library that the tests preload (LD_PRELOAD) into the programs they start,
// or link into an in-process test. Its static initialiser installs a hook on
// the library's fault points (fsdp/fault_points/fault_points.h) when the environment
// variable FSDP_TEST_FAULT is "<point>:<rank>:<n>" or "<point>:<rank>:<n>:<how>":
// the n-th time `rank` ("*": whichever rank the process is) reaches `point`,
// the process kills itself with SIGKILL; with ":oom" it touches ever more
// memory until the kernel's OOM killer ends it (exit status 99 after 4 GiB
// without one); with ":launcher" it kills its parent (the launcher's agent:
// torchrun's, fsdp-run) with SIGKILL first, then itself, as a lost node does;
// with ":slow" it sleeps 250 ms there, and at every later hit (a slow rank,
// to give a test time to act while the job runs). A worker that
// fsdp-run restarted (TORCHELASTIC_RESTART_COUNT above 0) gets no hook, so a
// fault strikes once. In a process without libfsdp (fsdp-run, a shell) it does
// nothing.
#include <dlfcn.h>

#include <csignal>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <chrono>
#include <map>
#include <thread>
#include <mutex>
#include <string>

#include "fsdp/fault_points/fault_points.h"

namespace {

const char* g_spec = nullptr;  // FSDP_TEST_FAULT, when the hook is installed

// Touches ever more memory until the kernel's OOM killer ends the process
// (the tests run it under a memory cgroup's limit); gives up after 4 GiB.
[[noreturn]] void exhaust_memory() {
  constexpr size_t kBlock = size_t{64} << 20, kMax = size_t{4} << 30, kPage = 4096;
  for (size_t total = 0; total < kMax; total += kBlock) {
    auto* p = static_cast<volatile char*>(std::malloc(kBlock));  // never freed: the point is to hold it
    if (p == nullptr) break;
    for (size_t i = 0; i < kBlock; i += kPage) p[i] = 1;
  }
  std::fprintf(stderr, "fault injection: no out-of-memory kill after touching 4 GiB\n");
  std::_Exit(99);
}

void strike(const char* point, int rank) {
  static std::mutex mu;
  static std::map<std::string, int> hits;  // by "<point>:<rank>"
  static std::atomic<bool> slow{false};
  const std::string spec = g_spec;
  const bool any_rank = spec.find(std::string(point) + ":*:") == 0;
  const std::string here = std::string(point) + ":" + (any_rank ? std::string("*") : std::to_string(rank));
  std::string hit;
  {
    std::lock_guard<std::mutex> lock(mu);
    hit = here + ":" + std::to_string(++hits[here]);
  }
  if (hit == spec) ::raise(SIGKILL);
  if (hit + ":oom" == spec) exhaust_memory();
  if (hit + ":slow" == spec) slow = true;
  if (slow && spec.rfind(here + ":", 0) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(250));
  if (hit + ":launcher" == spec) {
    ::kill(::getppid(), SIGKILL);
    ::raise(SIGKILL);
  }
}

struct Installer {
  Installer() {
    g_spec = std::getenv("FSDP_TEST_FAULT");
    if (g_spec == nullptr || *g_spec == '\0') return;
    const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");
    if (restarts != nullptr && std::string(restarts) != "0") return;
    // Found, not linked: preloaded into a program without libfsdp, it stays idle.
    auto set = reinterpret_cast<fsdp_fault_hook (*)(fsdp_fault_hook)>(::dlsym(RTLD_DEFAULT, "fsdp_set_fault_hook"));
    if (set != nullptr) set(&strike);
  }
};

const Installer installer;

}  // namespace
