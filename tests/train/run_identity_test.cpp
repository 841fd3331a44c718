// Issue 37 item 9: only a real restart of the same job continues a run.
// A restart repeats the command line, so --overwrite still resumes then;
// at a job's first start --overwrite starts over, and no flag refuses a
// directory that holds a run. torchrun's run id ("none" for every job of
// the static rendezvous: --master-port) and a leaked
// TORCHELASTIC_RESTART_COUNT prove nothing.
//
// The jobs are real: fsdp-run and the venv's torchrun (wheel build only)
// start fsdp-train with the tiny preset; the fault injector kills rank 0
// at its 3rd optimizer step to make the launcher restart it.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "../support/fault_injection.h"
#include "../support/sockets.h"
#include "../support/subprocess.h"

using namespace fsdp::testing;
using namespace std::chrono_literals;

namespace {

// The launcher variables unset (the environment ctest runs in cannot leak
// into the jobs), and `extra`.
std::vector<std::string> clean_env(std::vector<std::string> extra = {}) {
  std::vector<std::string> env{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                               "GROUP_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                               "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE", "SLURM_NTASKS",
                               "SLURM_PROCID", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "FSDP_CLUSTER",
                               "OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1"};
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

// fsdp-train on a small model: 4 steps, a checkpoint every 2, into `out`, plus `more`.
std::vector<std::string> train(const std::string& out, std::vector<std::string> more = {}) {
  std::vector<std::string> argv{FSDP_TRAIN_PATH, "--preset", "tiny", "--dim", "16", "--layers", "1", "--heads", "2",
                                "--context", "16", "--steps", "4", "--batch", "2", "--save-every", "2",
                                "--log-every", "1", "--eval-every", "0", "--out", out};
  argv.insert(argv.end(), more.begin(), more.end());
  return argv;
}

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string run_id(const std::string& out) {
  return nlohmann::json::parse(read_file(out + "/run.json")).at("run_id").get<std::string>();
}

bool resumed(const RunResult& r) { return r.output.find("resumed from") != std::string::npos; }

}  // namespace

// Before the fix: a direct start with a leaked TORCHELASTIC_RESTART_COUNT=1
// took --overwrite for a resume ("resumed from …/step-00000004"). fsdp-run's
// own restart (rank 0 killed at step 3) still resumes the new run from
// step 2 with --overwrite on its command line.
TEST(RunIdentity, ALeakedRestartCountStartsOverAndFsdpRunsRestartResumes) {
  TempDir dir;
  const std::string out = dir.path() + "/run";
  auto r = run_program(train(out), 240s, clean_env());
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  const std::string first = run_id(out);
  r = run_program(train(out, {"--overwrite"}), 240s,
                  clean_env({"TORCHELASTIC_RESTART_COUNT=1", "TORCHELASTIC_MAX_RESTARTS=3"}));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_FALSE(resumed(r)) << r.output;
  const std::string second = run_id(out);
  EXPECT_NE(second, first);
  r = run_program(concat({FSDP_RUN_PATH, "--nproc-per-node", "1", "--max-restarts", "1", "--"},
                         train(out, {"--overwrite"})),
                  240s, concat(clean_env(), fault_env("optimizer-step:0:3")));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + out + "/checkpoints/step-00000002 at step 2"), std::string::npos)
      << r.output;
  EXPECT_NE(run_id(out), second);  // the job's first start started over; its restart continued that run
}

#ifdef FSDP_TORCHRUN
// Before the fix: the second of two torchrun jobs with --master-port (run id
// "none" both times) printed "resumed from …/step-00000004", with no flag
// and with --overwrite alike. Now the second is refused, the third
// (--overwrite) starts over, and a --max-restarts restart of a job started
// with --overwrite resumes it.
TEST(RunIdentity, TorchrunJobsInARowAreNewJobsAndARestartResumes) {
  ProcessTreeGuard tree;
  TempDir dir;
  const std::string out = dir.path() + "/run";
  auto torchrun = [&](std::vector<std::string> more, const std::vector<std::string>& env = clean_env(),
                      const char* max_restarts = "0") {
    std::vector<std::string> launcher{FSDP_TORCHRUN, "--nproc-per-node", "1", "--master-port",
                                      std::to_string(free_port()), "--max-restarts", max_restarts, "--no-python"};
    return run_program(concat(launcher, train(out, std::move(more))), 300s, env);
  };
  auto r = torchrun({});
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  const std::string first = run_id(out);
  r = torchrun({});
  EXPECT_NE(r.exit_code(), 0) << r.output;
  EXPECT_FALSE(resumed(r)) << r.output;
  EXPECT_NE(r.output.find("already holds run " + first), std::string::npos) << r.output;
  r = torchrun({"--overwrite"});
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_FALSE(resumed(r)) << r.output;
  const std::string second = run_id(out);
  EXPECT_NE(second, first);
  r = torchrun({"--overwrite"}, concat(clean_env(), fault_env("optimizer-step:0:3")), "1");
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + out + "/checkpoints/step-00000002 at step 2"), std::string::npos)
      << r.output;
  EXPECT_NE(run_id(out), second);
}
#endif
