// Launching under the cluster's own launchers (issue 29, docs/launching.md):
// torchrun (the venv's, torch 2.x: its agent serves the store), mpirun (Open
// MPI), and SLURM's variables on processes started here, with fsdp-train and
// example-strategy as the programs. Every test holds a ProcessTreeGuard: the
// launchers' workers leave their process group and could outlive them.
#include <gtest/gtest.h>

#include <regex>

#include "../support/fault_injection.h"
#include "../support/sockets.h"
#include "../support/subprocess.h"

using namespace fsdp::testing;
using namespace std::chrono_literals;

namespace {

// The variables of every launcher this file tests, unset in the programs it
// starts, so that the environment ctest runs in cannot leak into them.
std::vector<std::string> clean_env(std::vector<std::string> extra = {}) {
  std::vector<std::string> env{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                               "GROUP_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                               "TORCHELASTIC_USE_AGENT_STORE", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID",
                               "SLURM_NODELIST", "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST", "SLURM_JOB_ID",
                               "SLURM_NNODES", "SLURM_JOB_NAME", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                               "PMI_SIZE", "PMI_RANK", "FSDP_CLUSTER", "OMP_NUM_THREADS=1",
                               "OPENBLAS_NUM_THREADS=1"};
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

// fsdp-train's flags: the tiny preset, a checkpoint every 3 steps.
std::vector<std::string> train(const std::string& out, int steps) {
  return {FSDP_TRAIN_PATH, "--preset", "tiny", "--steps", std::to_string(steps), "--batch", "2", "--save-every", "3",
          "--log-every", "1", "--eval-every", "0", "--out", out};
}

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// `launcher` starting fsdp-train (train's flags, into `out`), to its end.
RunResult launch_train(const std::vector<std::string>& launcher, const std::string& out, int steps,
                       std::chrono::seconds deadline, const std::vector<std::string>& env = clean_env()) {
  return run_program(concat(launcher, train(out, steps)), deadline, env);
}

// One job of world 2 trained: rank 0's progress lines show both ranks'
// memory ("mem a/b MiB"), once per step (two world-1 runs would print one
// number each, twice per step).
void expect_world_2(const std::string& output, int steps) {
  const std::string last = "step " + std::to_string(steps) + "/" + std::to_string(steps) + " ";
  std::smatch m;
  EXPECT_TRUE(std::regex_search(output, m, std::regex(last + "loss [0-9.]+ .*mem [0-9]+/[0-9]+ MiB"))) << output;
  size_t n = 0;
  for (size_t at = output.find(last); at != std::string::npos; at = output.find(last, at + 1)) ++n;
  EXPECT_EQ(n, 1u) << output;
}

std::vector<std::string> slurm_task(int procid, int port, const std::string& job_id) {
  return clean_env({"SLURM_NTASKS=2", "SLURM_PROCID=" + std::to_string(procid),
                    "SLURM_LOCALID=" + std::to_string(procid), "SLURM_NNODES=1", "SLURM_NODELIST=127.0.0.1",
                    "SLURM_JOB_ID=" + job_id, "MASTER_PORT=" + std::to_string(port)});
}

}  // namespace

#ifdef FSDP_TORCHRUN
// torchrun as a user runs it: the agent serves the store on MASTER_PORT
// (TORCHELASTIC_USE_AGENT_STORE=True) and every worker joins it as a client.
TEST(Torchrun, StandaloneTrainsFsdpTrain) {
  ProcessTreeGuard tree;
  TempDir dir;
  auto r = launch_train({FSDP_TORCHRUN, "--standalone", "--nproc-per-node", "2", "--no-python"},
                        dir.path() + "/run", 4, 240s);
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_EQ(r.output.find("Address already in use"), std::string::npos) << r.output;
  expect_world_2(r.output, 4);
}

TEST(Torchrun, StandaloneRunsExampleStrategy) {
  ProcessTreeGuard tree;
  TempDir dir;
  auto r = run_program({FSDP_TORCHRUN, "--standalone", "--nproc-per-node", "2", "--no-python", EXAMPLE_STRATEGY_PATH,
                        dir.path() + "/ckpt"},
                       240s, clean_env());
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("saved and reloaded " + dir.path() + "/ckpt at step 20"), std::string::npos) << r.output;
}

// Rank 1 is killed (SIGKILL) at its 8th optimizer step. torchrun restarts
// both workers; the new attempt joins the agent's store, which still holds
// the dead attempt's keys, under a fresh prefix, and fsdp-train resumes from
// step 6's checkpoint (TORCHELASTIC_RESTART_COUNT > 0) and finishes.
TEST(Torchrun, KilledWorkerIsRestartedAndResumes) {
  ProcessTreeGuard tree;
  TempDir dir;
  auto r = launch_train({FSDP_TORCHRUN, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--no-python"},
                        dir.path() + "/run", 10, 300s, concat(clean_env(), fault_env("optimizer-step:1:8")));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("exitcode: -9"), std::string::npos) << r.output;  // torchrun saw the kill
  EXPECT_NE(r.output.find("resumed from " + dir.path() + "/run/checkpoints/step-00000006 at step 6"),
            std::string::npos)
      << r.output;
  expect_world_2(r.output, 10);
}

// Two agents (on this host) meet through the c10d rendezvous backend, as two
// nodes do: --nnodes 2 --rdzv-backend c10d --rdzv-endpoint, one worker each.
TEST(Torchrun, TwoAgentsMeetThroughC10dRendezvous) {
  ProcessTreeGuard tree;
  TempDir dir;
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  std::vector<pid_t> pids;
  std::vector<int> fds;
  for (int node = 0; node < 2; ++node) {
    int fd = -1;
    pids.push_back(spawn(concat({FSDP_TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                                 "--rdzv-endpoint", endpoint, "--rdzv-id", "fsdp-test", "--no-python"},
                                train(dir.path() + "/run", 4)),
                         clean_env(), &fd));
    fds.push_back(fd);
  }
  std::string output;
  for (int node = 0; node < 2; ++node) {
    auto r = wait_program(pids[node], fds[node], 240s);
    EXPECT_EQ(r.exit_code(), 0) << r.output;
    output += r.output;
  }
  expect_world_2(output, 4);
}
#endif

// mpirun starts both ranks; fsdp-cpp reads Open MPI's variables and the
// address passed with -x. mpirun's own flags: docs/launching.md.
TEST(Mpirun, TrainsOneJobOfWorld2) {
  ProcessTreeGuard tree;
  TempDir dir;
  const std::string port = std::to_string(free_port());
  auto r = launch_train({FSDP_MPIRUN, "-np", "2", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-x",
                         "MASTER_ADDR=127.0.0.1", "-x", "MASTER_PORT=" + port},
                        dir.path() + "/run", 3, 240s);
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  expect_world_2(r.output, 3);
  // What each rank read, as fsdp-run --print-env shows it.
  auto p = run_program({FSDP_MPIRUN, "-np", "2", "--allow-run-as-root", "--oversubscribe", "-x", "MASTER_PORT=" + port,
                        FSDP_RUN_PATH, "--print-env"},
                       60s, clean_env());
  ASSERT_EQ(p.exit_code(), 0) << p.output;
  for (const char* line : {"cluster: mpi\n", "rank: 0\n", "rank: 1\n", "world_size: 2\n", "local_world_size: 2\n",
                           "nodes: 1\n", "master_addr: 127.0.0.1 (every rank on this node: OMPI_COMM_WORLD_LOCAL_SIZE "
                                         "= OMPI_COMM_WORLD_SIZE)\n",
                           "master_port: "}) {
    EXPECT_NE(p.output.find(line), std::string::npos) << line << " not in:\n" << p.output;
  }
}

// Without a port, mpirun's ranks stop with the variable to set instead of
// training as two jobs of world 1.
TEST(Mpirun, WithoutMasterPortEveryRankNamesIt) {
  ProcessTreeGuard tree;
  TempDir dir;
  auto r = launch_train({FSDP_MPIRUN, "-np", "2", "--allow-run-as-root", "--oversubscribe"}, dir.path() + "/run", 3,
                        120s);
  EXPECT_NE(r.exit_code(), 0) << r.output;
  EXPECT_EQ(r.output.find("step 1/3"), std::string::npos) << r.output;
  for (const char* rank : {"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_RANK=1"}) {
    EXPECT_NE(r.output.find(std::string("fsdp-train: MASTER_PORT is not set: expected the TCP port of rank 0's store "
                                        "passed to every rank of the 2 MPI ranks, e.g. mpirun -x MASTER_ADDR=<the "
                                        "host of rank 0> -x MASTER_PORT=<a free port> (mpi variables read: "
                                        "OMPI_COMM_WORLD_SIZE=2, ") +
                            rank),
              std::string::npos)
        << r.output;
  }
}

// Two processes with srun's variables (no SLURM here: docs/launching.md)
// form one job: MASTER_ADDR from SLURM_NODELIST, the port from MASTER_PORT.
TEST(Slurm, TwoTasksTrainTogether) {
  ProcessTreeGuard tree;
  TempDir dir;
  const int port = free_port();
  std::vector<pid_t> pids;
  std::vector<int> fds;
  for (int procid = 0; procid < 2; ++procid) {
    int fd = -1;
    pids.push_back(spawn(train(dir.path() + "/run", 3), slurm_task(procid, port, "4242"), &fd));
    fds.push_back(fd);
  }
  auto r0 = wait_program(pids[0], fds[0], 240s);
  auto r1 = wait_program(pids[1], fds[1], 240s);
  ASSERT_EQ(r0.exit_code(), 0) << r0.output;
  ASSERT_EQ(r1.exit_code(), 0) << r1.output;
  expect_world_2(r0.output, 3);
  EXPECT_EQ(r1.output.find("step 3/3"), std::string::npos) << r1.output;  // rank 1 prints no progress
  auto p = run_program({FSDP_RUN_PATH, "--print-env"}, 30s, slurm_task(1, port, "4242"));
  ASSERT_EQ(p.exit_code(), 0) << p.output;
  for (const std::string& line : std::vector<std::string>{"cluster: slurm\n", "rank: 1\n", "world_size: 2\n", "local_rank: 1\n",
                                 "master_addr: 127.0.0.1 (first host of SLURM_NODELIST)\n",
                                 "master_port: " + std::to_string(port) + " (MASTER_PORT)\n"}) {
    EXPECT_NE(p.output.find(line), std::string::npos) << line << " not in:\n" << p.output;
  }
}

// The traps that used to train as separate jobs of world 1 end in errors
// naming the variables.
TEST(Slurm, JobsThatCannotFormNameTheVariables) {
  ProcessTreeGuard tree;
  TempDir dir;
  struct Trap {
    std::vector<std::string> env;
    std::string error;
  };
  const std::vector<Trap> traps = {
      {clean_env({"SLURM_NTASKS=2", "SLURM_JOB_ID=77"}),
       "fsdp-train: SLURM_NTASKS=2 says this job has 2 tasks, but SLURM_PROCID is not set"},
      {clean_env({"SLURM_NTASKS=2", "SLURM_PROCID=0", "SLURM_JOB_ID=77"}),
       "fsdp-train: SLURM_NTASKS=2, but neither SLURM_NODELIST (SLURM_STEP_NODELIST, SLURM_JOB_NODELIST) nor "
       "MASTER_ADDR is set"},
      {clean_env({"SLURM_NTASKS=2", "SLURM_PROCID=2", "SLURM_NODELIST=n1"}),
       "fsdp-train: SLURM_PROCID=2 is out of range: expected 0 <= SLURM_PROCID < SLURM_NTASKS=2"},
      {clean_env({"SLURM_NTASKS=2", "SLURM_PROCID=0", "SLURM_NODELIST=gpu-[01-04"}),
       "fsdp-train: SLURM_NODELIST='gpu-[01-04' is not a SLURM node list"},
      {clean_env({"OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=0", "MASTER_PORT=29999"}),
       "fsdp-train: MASTER_ADDR is not set, and nothing shows that all 2 MPI ranks are on this node"},
      {clean_env({"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29999", "OMPI_COMM_WORLD_RANK=0",
                  "OMPI_COMM_WORLD_SIZE=2"}),
       "fsdp-train: RANK=1 disagrees with OMPI_COMM_WORLD_RANK=0"},
  };
  for (const auto& trap : traps) {
    auto r = run_program(train(dir.path() + "/run", 3), 60s, trap.env);
    EXPECT_EQ(r.exit_code(), 1) << r.output;  // fsdp-train's status for any error
    EXPECT_NE(r.output.find(trap.error), std::string::npos) << trap.error << "\nnot in:\n" << r.output;
    auto p = run_program({FSDP_RUN_PATH, "--print-env"}, 30s, trap.env);
    EXPECT_EQ(p.exit_code(), 2) << p.output;
    EXPECT_NE(p.output.find("fsdp-run --print-env: " + trap.error.substr(std::string("fsdp-train: ").size())),
              std::string::npos)
        << p.output;
  }
}
