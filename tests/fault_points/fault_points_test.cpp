// Fault points (fsdp/fault_points/fault_points.h, docs/reliability.md): the library
// exports the hook installer that the fault injector finds at run time, and
// a save passes each of its points, on the ranks the crash tests name.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <mutex>
#include <set>
#include <string>

#include "fsdp/fault_points/fault_points.h"
#include "../support/subprocess.h"
#include "../support/thread_ranks.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "../support/trainer.h"

using namespace fsdp;
using namespace fsdp::testing;

namespace {

std::mutex g_mu;
std::multiset<std::string> g_seen;  // "<point>:<rank>"

void record(const char* point, int rank) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_seen.insert(std::string(point) + ":" + std::to_string(rank));
}

// The installer as the injector finds it: by name, in the process's global scope.
fsdp_fault_hook install(fsdp_fault_hook hook) {
  auto set = reinterpret_cast<fsdp_fault_hook (*)(fsdp_fault_hook)>(::dlsym(RTLD_DEFAULT, "fsdp_set_fault_hook"));
  if (set == nullptr) throw std::runtime_error("libfsdp.so does not export fsdp_set_fault_hook");
  return set(hook);
}

std::multiset<std::string> seen() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_seen;
}

void forget() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_seen.clear();
}

std::multiset<std::string> points_of_saves(std::initializer_list<CheckpointFormat> formats) {
  TempDir dir;
  const auto batches = make_batches(1, 4, 1);
  forget();
  const fsdp_fault_hook before = install(&record);
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer job(pg, Opt::kAdamW, 3);
    int n = 0;
    for (auto f : formats) {
      CheckpointState s;
      s.model("model", job.model.ptr()).optimizer("optimizer", *job.optimizer).value("step", int64_t{1});
      save_checkpoint(dir.path() + "/ckpt" + std::to_string(n++), s, pg, {f});
    }
  });
  install(before);
  return seen();
}

}  // namespace

TEST(FaultPoints, TheLibraryExportsTheHookInstaller) {
  EXPECT_NE(::dlsym(RTLD_DEFAULT, "fsdp_set_fault_hook"), nullptr) << "the fault injector could not find it";
}

TEST(FaultPoints, ASavePassesEachOfItsPointsOnTheRanksThatWrite) {
  const auto seen = points_of_saves({CheckpointFormat::kSharded, CheckpointFormat::kFull});
  EXPECT_EQ(seen.count("sharded-mid-data:0"), 1u);
  EXPECT_EQ(seen.count("sharded-mid-data:1"), 1u);
  EXPECT_EQ(seen.count("sharded-before-index:0"), 1u);
  EXPECT_EQ(seen.count("sharded-after-index:0"), 1u);
  EXPECT_EQ(seen.count("full-after-first-record:0"), 1u);
  EXPECT_EQ(seen.count("full-before-commit:0"), 1u);
  EXPECT_EQ(seen.size(), 6u);  // no other point, no other rank
}

TEST(FaultPoints, APointCallsTheInstalledHookOnlyWhileItIsInstalled) {
  forget();
  const fsdp_fault_hook before = install(&record);
  fsdp::detail::fault_point("a-point", 3);
  EXPECT_EQ(install(nullptr), &record);
  fsdp::detail::fault_point("a-point", 3);  // no hook: nothing happens
  install(before);
  EXPECT_EQ(seen(), std::multiset<std::string>{"a-point:3"});
}
