// Crash safety: a rank killed with SIGKILL at several points of a save
// (processes under fsdp-run, the fault injector preloaded into them:
// docs/reliability.md) leaves the previous checkpoint loadable and sound, or
// the new one complete.
#include <gtest/gtest.h>

#include "../support/fault_injection.h"
#include "../support/subprocess.h"
#include "../support/thread_ranks.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "../support/models.h"

using namespace fsdp;
using namespace fsdp::testing;

namespace {

struct CrashCase {
  const char* format;
  const char* point;
  int rank;
  int64_t expect_step;  // 1: the previous checkpoint; 2: the new one, already committed
  int hit = 2;           // which pass through the point (the second save's, unless the first never reaches it)
};

class CheckpointCrash : public ::testing::TestWithParam<CrashCase> {};

TEST_P(CheckpointCrash, ThePreviousCheckpointSurvivesAKilledSave) {
  const CrashCase c = GetParam();
  TempDir dir;
  auto env = fault_env(std::string(c.point) + ":" + std::to_string(c.rank) + ":" + std::to_string(c.hit));
  env.push_back("FSDP_TIMEOUT_S=30");
  auto r = run_program({FSDP_RUN_PATH, "--nproc-per-node", "2", "--", CHECKPOINT_HELPER_PATH, "crash", dir.path(),
                        c.format},
                       std::chrono::seconds(180), env);
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_NE(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("SIGKILL"), std::string::npos) << r.output;
  const std::string path = dir.path() + "/ckpt";
  EXPECT_TRUE(verify_checkpoint(path).empty()) << verify_checkpoint(path).front();
  auto net = make_net(9);
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    CheckpointState s;
    s.model("model", net).value("step", int64_t{0});
    load_checkpoint(path, s, pg);
    EXPECT_EQ(s.get<int64_t>("step"), c.expect_step);
  });
}

INSTANTIATE_TEST_SUITE_P(Points, CheckpointCrash,
                         ::testing::Values(CrashCase{"full", "full-after-first-record", 0, 1},
                                           CrashCase{"full", "full-before-commit", 0, 1},
                                           CrashCase{"sharded", "sharded-mid-data", 0, 1},
                                           CrashCase{"sharded", "sharded-mid-data", 1, 1},
                                           CrashCase{"sharded", "sharded-before-index", 0, 1},
                                           CrashCase{"sharded", "sharded-after-index", 0, 2},
                                           // The second save replaces a checkpoint of the other format.
                                           CrashCase{"sharded-then-full", "full-before-commit", 0, 1, 1},
                                           CrashCase{"sharded-then-full", "replace-before-exchange", 0, 1, 1},
                                           CrashCase{"sharded-then-full", "replace-after-exchange", 0, 2, 1},
                                           CrashCase{"full-then-sharded", "sharded-before-index", 0, 1, 1},
                                           CrashCase{"full-then-sharded", "replace-before-exchange", 0, 1, 1},
                                           CrashCase{"full-then-sharded", "replace-after-exchange", 0, 2, 1}),
                         [](const auto& info) {
                           std::string n = std::string(info.param.format) + "_" + info.param.point + "_rank" +
                                           std::to_string(info.param.rank);
                           for (auto& ch : n) ch = ch == '-' ? '_' : ch;
                           return n;
                         });

}  // namespace
