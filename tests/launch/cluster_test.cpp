// Launching under the cluster's own launchers (issue 29, docs/launching.md):
// torchrun (the venv's, torch 2.x: its agent serves the store), mpirun (Open
// MPI), and SLURM's variables on processes started here, with fsdp-train and
// example-strategy as the programs. Every test holds a ProcessTreeGuard: the
// launchers' workers leave their process group and could outlive them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "../support/fault_injection.h"
#include "../support/sockets.h"
#include "../support/subprocess.h"
#include "../support/test_hosts.h"

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
  // torchrun saw the kill: rank 1's SIGKILL, or rank 0's SIGPIPE when rank 0
  // wrote to the dead peer's socket first and torchrun reported that one.
  EXPECT_TRUE(r.output.find("exitcode: -9") != std::string::npos ||
              r.output.find("exitcode: -13") != std::string::npos)
      << r.output;
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

// The steps of a run's metrics.jsonl, in order.
std::vector<nlohmann::json> steps_of(const std::string& out) {
  std::vector<nlohmann::json> steps;
  std::ifstream in(out + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step")) steps.push_back(j);
  }
  return steps;
}

// The sampler's record shows every sample trained on once, in order: each
// step's samples start where the step before ended, from 0, and a step at
// world W takes batch * W of them.
void expect_every_sample_once(const std::vector<nlohmann::json>& steps, int64_t batch) {
  int64_t next = 0;
  for (const auto& s : steps) {
    const int64_t from = s.at("samples").at(0), to = s.at("samples").at(1), world = s.at("world");
    EXPECT_EQ(from, next) << "step " << s.at("step") << ": " << s.dump();
    EXPECT_EQ(to - from, batch * world) << s.dump();
    next = to;
  }
}

// The last line that records a resize from `from` to `to` worlds; null if none.
nlohmann::json resize_of(const std::vector<nlohmann::json>& steps, int from, int to) {
  nlohmann::json found;
  for (const auto& s : steps) {
    if (s.contains("resized") && s["resized"]["from_world"] == from && s["resized"]["to_world"] == to) found = s;
  }
  return found;
}

#ifdef FSDP_TORCHRUN
// torchrun's agents on test hosts (tests/support/test_hosts.h), one worker
// each, meeting through the c10d rendezvous backend whose store host 0's
// agent serves. The hosts share one hostname, which resolves to none of
// them: is_host says which agent serves the rendezvous store, and
// --local-addr gives each agent its address (rank 0's becomes the workers'
// MASTER_ADDR, instead of this machine's name). `nnodes`: "2" or
// "2:3" (elastic); docs/launching.md's tuned timeouts: a lost host is noticed
// in about 3 s (keep_alive_interval x keep_alive_max_attempt) and a smaller
// group forms 3 s after (last_call_timeout).
class TorchrunHosts : public ::testing::Test {
 protected:
  static constexpr int kPort = 29400;
  void SetUp() override {
    if (!hosts_) hosts_ = std::make_unique<TestHosts>(3);
    if (!hosts_->why_not.empty()) GTEST_SKIP() << hosts_->why_not;
  }
  pid_t agent(int host, const std::string& nnodes, const std::vector<std::string>& program,
              const std::vector<std::string>& env, int* fd) const {
    std::vector<std::string> cmd{FSDP_TORCHRUN, "--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                                 "--rdzv-endpoint", TestHosts::address(0) + ":" + std::to_string(kPort),
                                 "--rdzv-id", "fsdp-elastic", "--local-addr", TestHosts::address(host),
                                 "--rdzv-conf",
                                 std::string("is_host=") + (host == 0 ? "1" : "0") +
                                     ",last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3",
                                 "--max-restarts", "3", "--no-python"};
    cmd.insert(cmd.end(), program.begin(), program.end());
    return spawn(hosts_->on(host, cmd), env, fd);
  }
  // Three agents of a --nnodes 2:3 job running `flags`, host 2's worker
  // striking `fault` (fault_env) to end host 2: the two survivors' agents
  // must end with status 0, host 2's not. Returns everything they printed.
  std::string three_hosts_losing_one(const std::vector<std::string>& flags, const std::string& fault) const {
    std::vector<pid_t> pids;
    std::vector<int> fds(3, -1);
    for (int host = 0; host < 3; ++host) {
      pids.push_back(agent(host, "2:3", flags, host == 2 ? env(fault_env(fault)) : env(), &fds[host]));
    }
    std::string output;
    for (int host = 0; host < 3; ++host) {
      auto r = wait_program(pids[host], fds[host], 360s);
      output += r.output;
      if (host < 2) EXPECT_EQ(r.exit_code(), 0) << r.output;
      if (host == 2) EXPECT_NE(r.exit_code(), 0) << r.output;  // its agent was killed
    }
    return output;
  }
  static std::vector<std::string> env(std::vector<std::string> extra = {}) {
    return clean_env(concat({"FSDP_TIMEOUT_S=30", "FSDP_RENDEZVOUS_TIMEOUT_S=60"}, extra));
  }
  // fsdp-train on 2 ranks of this machine, under fsdp-run, into `out`: the
  // reference runs.
  static RunResult fsdp_run(const std::vector<std::string>& train_flags) {
    return run_program(concat({FSDP_RUN_PATH, "--nproc-per-node", "2", "--"}, train_flags), 240s, clean_env());
  }

 private:
  std::unique_ptr<TestHosts> hosts_;
};

// torchrun --nnodes 2 across two hosts trains as fsdp-run does on one
// machine: every step's loss and gradient norm, bit for bit.
TEST_F(TorchrunHosts, TwoNodesTrainLikeFsdpRun) {
  ProcessTreeGuard tree;
  TempDir dir;
  std::vector<pid_t> pids;
  std::vector<int> fds(2, -1);
  for (int host = 0; host < 2; ++host) pids.push_back(agent(host, "2", train(dir.path() + "/run", 6), env(), &fds[host]));
  for (int host = 0; host < 2; ++host) {
    auto r = wait_program(pids[host], fds[host], 300s);
    ASSERT_EQ(r.exit_code(), 0) << r.output;
  }
  auto ref = fsdp_run(train(dir.path() + "/ref", 6));
  ASSERT_EQ(ref.exit_code(), 0) << ref.output;
  const auto got = steps_of(dir.path() + "/run"), want = steps_of(dir.path() + "/ref");
  ASSERT_EQ(got.size(), 6u);
  ASSERT_EQ(want.size(), 6u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].at("world"), 2);
    for (const char* k : {"loss", "grad_norm", "samples"}) EXPECT_EQ(got[i].at(k), want[i].at(k)) << k << " at step " << i + 1;
  }
}

// Elastic, --nnodes 2:3 on three hosts: host 2's agent and worker are killed
// (SIGKILL, at the worker's 8th optimizer step: after step 6's checkpoint).
// The survivors' agents form a group of 2; fsdp-train resumes from the
// newest checkpoint, resharded from world 3 to 2, records the resize, and
// finishes. Its steps after the resize equal those of a --resume-from run at
// world 2 from the same checkpoint, bit for bit; the sampler's record shows
// no sample lost or seen twice.
TEST_F(TorchrunHosts, ALostHostEndsTheRunAtWorld2LikeAResumeFrom) {
  ProcessTreeGuard tree;
  TempDir dir;
  const std::string out = dir.path() + "/run";
  const std::string output =
      three_hosts_losing_one(concat(train(out, 12), {"--keep", "10"}), "optimizer-step:*:8:launcher");
  const auto steps = steps_of(out);
  ASSERT_FALSE(steps.empty()) << output;
  EXPECT_EQ(steps.back().at("step"), 12) << output;
  EXPECT_EQ(steps.back().at("world"), 2) << output;
  expect_every_sample_once(steps, 2);
  const auto resized = resize_of(steps, 3, 2);
  ASSERT_FALSE(resized.is_null()) << "no resize from world 3 to 2 in metrics.jsonl\n" << output;
  const int64_t from = resized["resized"]["step"];
  EXPECT_GE(from, 6) << resized.dump();
  EXPECT_EQ(from % 3, 0) << resized.dump();
  EXPECT_GT(resized["resized"]["seconds_lost"].get<double>(), 0.0) << resized.dump();
  std::ifstream log(out + "/train.log");
  const std::string logged((std::istreambuf_iterator<char>(log)), {});
  EXPECT_NE(logged.find("fsdp-train: resized from world 3 to world 2: resumed from step " + std::to_string(from)),
            std::string::npos)
      << logged;
  // The reference: fsdp-run at world 2 from the same checkpoint.
  char name[32];
  std::snprintf(name, sizeof name, "/step-%08lld", static_cast<long long>(from));
  auto ref = fsdp_run(concat(train(dir.path() + "/ref", 12), {"--resume-from", out + "/checkpoints" + name}));
  ASSERT_EQ(ref.exit_code(), 0) << ref.output;
  const auto want = steps_of(dir.path() + "/ref");
  ASSERT_EQ(static_cast<int64_t>(want.size()), 12 - from) << ref.output;
  for (const auto& w : want) {
    const auto& g = steps.at(w.at("step").get<size_t>() - 1);
    for (const char* k : {"loss", "grad_norm", "samples", "world"}) EXPECT_EQ(g.at(k), w.at(k)) << k << ": " << g.dump();
  }
}

// Elastic growth: two hosts start a --nnodes 2:3 job (their workers slowed to
// 250 ms a step), and a third joins after the first checkpoint. The agents
// restart their workers for it; the run continues at world 3 from the newest
// checkpoint, resharded from world 2, and records the resize. Growth needs
// TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 with torch 2.15 (docs/launching.md:
// with the shared store, the node that joins waits for a store address that
// the new round's rank 0, holding its store from the first round, never
// publishes); workers then serve their own store, rank 0's worker hosting it.
TEST_F(TorchrunHosts, AHostThatJoinsGrowsTheRunToWorld3) {
  ProcessTreeGuard tree;
  TempDir dir;
  const std::string out = dir.path() + "/run";
  const auto flags = train(out, 40);
  std::vector<pid_t> pids;
  std::vector<int> fds(3, -1);
  for (int host = 0; host < 2; ++host) {
    pids.push_back(agent(host, "2:3", flags,
                         env(concat({"TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"}, fault_env("optimizer-step:*:1:slow"))),
                         &fds[host]));
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (!std::filesystem::exists(out + "/checkpoints/step-00000003/.metadata") &&
         std::chrono::steady_clock::now() - t0 < 240s) {
    std::this_thread::sleep_for(50ms);
  }
  pids.push_back(agent(2, "2:3", flags, env({"TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"}), &fds[2]));
  std::string output;
  for (int host = 0; host < 3; ++host) {
    auto r = wait_program(pids[host], fds[host], 360s);
    output += r.output;
    EXPECT_EQ(r.exit_code(), 0) << r.output;
  }
  const auto steps = steps_of(out);
  ASSERT_FALSE(steps.empty()) << output;
  EXPECT_EQ(steps.back().at("step"), 40) << output;
  EXPECT_EQ(steps.back().at("world"), 3) << output;
  expect_every_sample_once(steps, 2);
  const auto resized = resize_of(steps, 2, 3);
  ASSERT_FALSE(resized.is_null()) << "no resize from world 2 to 3 in metrics.jsonl\n" << output;
  EXPECT_GE(resized["resized"]["step"].get<int64_t>(), 3) << resized.dump();
}

// A host is lost in the middle of a save (its worker dies after writing its
// first file of step 6's checkpoint): that checkpoint never commits, and the
// survivors resume from step 3's, the last committed one, which is kept
// intact. Every checkpoint left verifies.
TEST_F(TorchrunHosts, AHostLostInASaveResumesFromTheLastCommittedCheckpoint) {
  ProcessTreeGuard tree;
  TempDir dir;
  const std::string out = dir.path() + "/run";
  const std::string output =
      three_hosts_losing_one(concat(train(out, 9), {"--keep", "10"}), "sharded-mid-data:*:2:launcher");
  const auto steps = steps_of(out);
  ASSERT_FALSE(steps.empty()) << output;
  EXPECT_EQ(steps.back().at("step"), 9) << output;
  expect_every_sample_once(steps, 2);
  const auto resized = resize_of(steps, 3, 2);
  ASSERT_FALSE(resized.is_null()) << output;
  EXPECT_EQ(resized["resized"]["step"], 3) << resized.dump();
  for (const char* step : {"3", "6", "9"}) {
    const std::string ckpt = out + "/checkpoints/step-0000000" + step;
    auto v = run_program({FSDP_CKPT_PATH, "verify", ckpt}, 60s);
    EXPECT_EQ(v.exit_code(), 0) << ckpt << ": " << v.output;
  }
}
#endif

// torchrun restarts the nodes of an elastic job with different
// TORCHELASTIC_RESTART_COUNTs (a failed node's counts; a node restarted for
// one that joined does not). The ranks agree to continue the run, whichever
// of them a launcher restarted: here rank 0 with count 1, rank 1 with 0
// (before, rank 1 started a new run and read rank 0's collectives as its
// own: "fsdp-train: <run id> <digest> 0").
TEST(Restarts, RanksRestartedADifferentNumberOfTimesContinueTheRunTogether) {
  ProcessTreeGuard tree;
  TempDir dir;
  const std::string out = dir.path() + "/run";
  auto first = run_program(concat({FSDP_RUN_PATH, "--nproc-per-node", "2", "--"}, train(out, 3)), 240s, clean_env());
  ASSERT_EQ(first.exit_code(), 0) << first.output;
  const std::string port = std::to_string(free_port());
  std::vector<pid_t> pids;
  std::vector<int> fds(2, -1);
  for (int rank = 0; rank < 2; ++rank) {
    // Rank 0 alone says --resume (since issue 37 a restart count set by
    // hand proves no restart): any rank's --resume continues the run on all.
    pids.push_back(spawn(rank == 0 ? concat(train(out, 6), {"--resume"}) : train(out, 6),
                         clean_env({"RANK=" + std::to_string(rank), "LOCAL_RANK=" + std::to_string(rank),
                                    "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port,
                                    "TORCHELASTIC_RESTART_COUNT=" + std::string(rank == 0 ? "1" : "0")}),
                         &fds[rank]));
  }
  auto r0 = wait_program(pids[0], fds[0], 240s);
  auto r1 = wait_program(pids[1], fds[1], 240s);
  ASSERT_EQ(r0.exit_code(), 0) << r0.output << r1.output;
  ASSERT_EQ(r1.exit_code(), 0) << r1.output;
  EXPECT_NE(r0.output.find("resumed from " + out + "/checkpoints/step-00000003 at step 3"), std::string::npos)
      << r0.output;
  const auto steps = steps_of(out);
  ASSERT_EQ(steps.size(), 6u);
  expect_every_sample_once(steps, 2);
}

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
      // Before the fix (issue 37, item 18): trained as world 1.
      {clean_env({"SLURM_NTASKS=1", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=1", "MASTER_PORT=29999"}),
       "fsdp-train: SLURM_NTASKS=1 disagrees with OMPI_COMM_WORLD_SIZE=2: OMPI_COMM_WORLD_SIZE says the job has 2 "
       "processes, but the world formed here has 1 rank(s)"},
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
