// fsdp-run end to end: real worker processes, real signals.
#include <gtest/gtest.h>

#include <regex>
#include <thread>

#include "../support/subprocess.h"
#include "../support/tmpfs.h"
#include "fsdp/launch/launcher.h"

using fsdp::testing::process_alive;
using fsdp::testing::read_file;
using fsdp::testing::run_program;
using fsdp::testing::SmallTmpfs;
using fsdp::testing::TempDir;
using namespace std::chrono_literals;

namespace {

const std::string kRun = FSDP_RUN_PATH;

std::vector<std::string> fsdp_run(std::vector<std::string> options, const std::string& script) {
  std::vector<std::string> argv{kRun};
  argv.insert(argv.end(), options.begin(), options.end());
  argv.insert(argv.end(), {"--", "sh", "-c", script});
  return argv;
}

// Pids that workers wrote to <dir>/pid_<rank>.
std::vector<pid_t> worker_pids(const std::string& dir, int n) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    std::string s = read_file(dir + "/pid_" + std::to_string(r));
    if (!s.empty()) pids.push_back(static_cast<pid_t>(std::stol(s)));
  }
  return pids;
}

bool all_gone(const std::vector<pid_t>& pids) {
  for (pid_t p : pids) {
    if (process_alive(p)) return false;
  }
  return true;
}

}  // namespace

TEST(Launcher, PrintsRankOverWorldSize) {
  auto r = run_program({kRun, "--nproc-per-node", "2", "--", "sh", "-c", "echo $RANK/$WORLD_SIZE"}, 30s);
  EXPECT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("[rank0]: 0/2\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank1]: 1/2\n"), std::string::npos) << r.output;
}

TEST(Launcher, WorkersSeeTorchrunEnvironment) {
  auto r = run_program(fsdp_run({"--nproc-per-node", "3", "--nnodes", "2", "--node-rank", "1", "--master-addr",
                                 "127.0.0.1", "--master-port", "29123"},
                                "echo R=$RANK W=$WORLD_SIZE L=$LOCAL_RANK LW=$LOCAL_WORLD_SIZE G=$GROUP_RANK "
                                "A=$MASTER_ADDR P=$MASTER_PORT C=$TORCHELASTIC_RESTART_COUNT"),
                       30s);
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  for (int lr = 0; lr < 3; ++lr) {
    const int rank = 3 + lr;
    std::string line = "[rank" + std::to_string(rank) + "]: R=" + std::to_string(rank) + " W=6 L=" +
                       std::to_string(lr) + " LW=3 G=1 A=127.0.0.1 P=29123 C=0\n";
    EXPECT_NE(r.output.find(line), std::string::npos) << line << " not in:\n" << r.output;
  }
}

TEST(Launcher, PicksAFreePortAndSetsThreadCounts) {
  auto r = run_program(fsdp_run({"--nproc-per-node", "2"}, "echo P=$MASTER_PORT O=$OMP_NUM_THREADS B=$OPENBLAS_NUM_THREADS"),
                       30s, {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"});
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex("P=([0-9]+) O=([0-9]+) B=([0-9]+)"))) << r.output;
  EXPECT_GT(std::stoi(m[1]), 0);
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  EXPECT_EQ(std::stoi(m[2]), std::max(1, cores / 2));
  EXPECT_EQ(std::stoi(m[3]), std::max(1, cores / 2));
}

TEST(Launcher, KeepsThreadCountsTheUserSet) {
  auto r = run_program(fsdp_run({}, "echo O=$OMP_NUM_THREADS B=$OPENBLAS_NUM_THREADS"), 30s,
                       {"OMP_NUM_THREADS=5", "OPENBLAS_NUM_THREADS=3"});
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("O=5 B=3"), std::string::npos) << r.output;
}

// --allocator preloads the library into every worker, before what the user
// preloads; scripts/deps.sh installs all three.
TEST(Launcher, AllocatorIsPreloadedIntoEveryWorker) {
  for (const char* name : {"jemalloc", "tcmalloc", "mimalloc"}) {
    const std::string lib = fsdp::launch::allocator_library(name);
    auto r = run_program(fsdp_run({"--nproc-per-node", "2", "--allocator", name},
                                  "echo \"P=$LD_PRELOAD\"; grep -c '" + lib + "' /proc/$$/maps"),
                         30s, {"LD_PRELOAD=libz.so.1"});
    ASSERT_EQ(r.exit_code(), 0) << name << ": " << r.output;
    EXPECT_NE(r.output.find("[rank0]: P=" + lib + ":libz.so.1"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("[rank1]: P=" + lib + ":libz.so.1"), std::string::npos) << r.output;
    // Mapped into the worker's own process.
    EXPECT_EQ(r.output.find("[rank0]: 0"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("[rank1]: 0"), std::string::npos) << r.output;
  }
  auto plain = run_program(fsdp_run({"--allocator", "system"}, "echo \"P=$LD_PRELOAD.\""), 30s);
  EXPECT_NE(plain.output.find("P=."), std::string::npos) << plain.output;
  // The default: tcmalloc, which scripts/deps.sh installs.
  auto preset = run_program(fsdp_run({}, "echo \"P=$LD_PRELOAD.\""), 30s);
  EXPECT_NE(preset.output.find("P=libtcmalloc_minimal.so.4."), std::string::npos) << preset.output;
}

TEST(Launcher, NoRankPrefixAndLogDir) {
  TempDir dir;
  auto r = run_program(fsdp_run({"--nproc-per-node", "2", "--no-rank-prefix", "--log-dir", dir.path()},
                                "echo out$RANK; echo err$RANK >&2"),
                       30s);
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_EQ(r.output.find("[rank"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("out1\n"), std::string::npos) << r.output;
  std::string log1 = read_file(dir.path() + "/attempt_0/rank_1.log");
  EXPECT_NE(log1.find("out1\n"), std::string::npos) << log1;
  EXPECT_NE(log1.find("err1\n"), std::string::npos) << log1;
}

// --log-dir on a full disk (issue 28): each log file that cannot be written
// is named once on the launcher's stderr with the reason, the output still
// reaches the console, and the job goes on as it would (here: attempt 0
// fails on rank 0 after rank 1 is done; the restart, which cannot even
// create its log directory because the disk's inodes are used up, succeeds,
// so the job exits 0).
TEST(Launcher, ALogDirOnAFullDiskIsReportedOncePerFileAndTheJobGoesOn) {
  TempDir dir;
  // Five inodes: the root, the filler, attempt_0 and its two rank logs.
  const SmallTmpfs disk(dir.path() + "/disk", "size=64k,nr_inodes=5");
  if (!disk.mounted()) GTEST_SKIP() << disk.why_not();
  disk.fill();
  auto r = run_program(fsdp_run({"--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", disk.path()},
                                "for i in 1 2 3; do echo out$RANK.$i; echo err$RANK.$i >&2; sleep 0.05; done; "
                                "echo attempt$TORCHELASTIC_RESTART_COUNT.$RANK; "
                                "[ $TORCHELASTIC_RESTART_COUNT = 1 ] || [ $RANK = 1 ] || { sleep 0.3; exit 3; }"),
                       30s);
  EXPECT_EQ(r.exit_code(), 0) << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string n = std::to_string(rank);
    for (const std::string& line : {"out" + n + ".3\n", "err" + n + ".3\n", "attempt0." + n, "attempt1." + n}) {
      EXPECT_NE(r.output.find("[rank" + n + "]: " + line), std::string::npos) << line << " not in:\n" << r.output;
    }
    const std::string said = "fsdp-run: cannot write the log file '" + disk.path() + "/attempt_0/rank_" + n +
                             ".log': No space left on device";
    EXPECT_NE(r.output.find(said), std::string::npos) << said << " not in:\n" << r.output;
  }
  size_t reports = 0;
  for (size_t at = 0; (at = r.output.find("cannot write the log file", at)) != std::string::npos; ++at) ++reports;
  EXPECT_EQ(reports, 2u) << "expected one report per log file:\n" << r.output;
  const std::string restart = "fsdp-run: cannot create log directory '" + disk.path() +
                              "/attempt_1': No space left on device; restart 1 goes on with its output on the "
                              "console only";
  EXPECT_NE(r.output.find(restart), std::string::npos) << restart << " not in:\n" << r.output;
}

TEST(Launcher, WorkerExitCodeStopsTheOthersAndIsReturned) {
  TempDir dir;
  auto r = run_program(fsdp_run({"--nproc-per-node", "3"},
                                "echo $$ > " + dir.path() + "/pid_$RANK; "
                                "if [ $RANK = 1 ]; then sleep 0.5; exit 7; fi; exec sleep 60"),
                       30s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code(), 7) << r.output;
  EXPECT_LT(r.seconds, 10.0) << "fsdp-run did not stop promptly";
  EXPECT_NE(r.output.find("worker rank 1 (local rank 1, pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("failed: exit code 7"), std::string::npos) << r.output;
  auto pids = worker_pids(dir.path(), 3);
  EXPECT_EQ(pids.size(), 3u);
  EXPECT_TRUE(all_gone(pids)) << "a worker outlived fsdp-run";
}

TEST(Launcher, WorkerKilledBySignalIsReportedByName) {
  auto r = run_program(fsdp_run({"--nproc-per-node", "2"}, "if [ $RANK = 0 ]; then kill -9 $$; fi; exec sleep 60"), 30s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code(), 128 + 9) << r.output;
  EXPECT_NE(r.output.find("worker rank 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("killed by signal SIGKILL (9)"), std::string::npos) << r.output;
}

TEST(Launcher, WorkerIgnoringSigtermIsKilledAfterTheGrace) {
  TempDir dir;
  auto r = run_program(fsdp_run({"--nproc-per-node", "2", "--stop-grace-s", "1"},
                                "echo $$ > " + dir.path() + "/pid_$RANK; "
                                "if [ $RANK = 1 ]; then sleep 0.5; exit 3; fi; trap '' TERM; sleep 60 & wait"),
                       30s);
  EXPECT_EQ(r.exit_code(), 3) << r.output;
  EXPECT_LT(r.seconds, 8.0);
  EXPECT_TRUE(all_gone(worker_pids(dir.path(), 2)));
}

TEST(Launcher, SigintReachesEveryWorker) {
  TempDir dir;
  bool sent = false;
  auto r = run_program(fsdp_run({"--nproc-per-node", "2"},
                                "echo $$ > " + dir.path() + "/pid_$RANK.tmp && mv " + dir.path() + "/pid_$RANK.tmp " +
                                    dir.path() + "/pid_$RANK; exec sleep 60"),
                       30s, {}, [&](pid_t launcher, const std::string&) {
                         if (!sent && worker_pids(dir.path(), 2).size() == 2) {
                           kill(launcher, SIGINT);
                           sent = true;
                         }
                       });
  ASSERT_TRUE(sent);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code(), 130) << r.output;
  EXPECT_LT(r.seconds, 15.0);
  EXPECT_NE(r.output.find("received SIGINT"), std::string::npos) << r.output;
  EXPECT_TRUE(all_gone(worker_pids(dir.path(), 2))) << "a worker outlived fsdp-run";
}

TEST(Launcher, MaxRestartsRestartsOnceThenSucceeds) {
  auto r = run_program(fsdp_run({"--nproc-per-node", "2", "--max-restarts", "1"},
                                "echo attempt=$TORCHELASTIC_RESTART_COUNT; "
                                "if [ $TORCHELASTIC_RESTART_COUNT = 0 ] && [ $RANK = 1 ]; then exit 3; fi; "
                                "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then exec sleep 60; fi"),
                       30s);
  EXPECT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("restarting the worker group (restart 1 of 1)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank0]: attempt=1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank1]: attempt=1"), std::string::npos) << r.output;
}

TEST(Launcher, GivesUpAfterMaxRestarts) {
  auto r = run_program(fsdp_run({"--max-restarts", "2"}, "echo try; exit 4"), 30s);
  EXPECT_EQ(r.exit_code(), 4) << r.output;
  EXPECT_NE(r.output.find("after 2 restart(s)"), std::string::npos) << r.output;
}

TEST(Launcher, MissingProgramIsReported) {
  auto r = run_program({kRun, "--", "/nonexistent/program"}, 30s);
  EXPECT_EQ(r.exit_code(), 127) << r.output;
  EXPECT_NE(r.output.find("cannot execute '/nonexistent/program'"), std::string::npos) << r.output;
}

TEST(Launcher, BadArgumentsExitTwoWithTheMessage) {
  auto r = run_program({kRun, "--nproc-per-node", "zero", "--", "true"}, 30s);
  EXPECT_EQ(r.exit_code(), 2);
  EXPECT_NE(r.output.find("--nproc-per-node='zero' is not a number"), std::string::npos) << r.output;
}

// Two real processes rendezvous through the TCPStore and run Gloo collectives.
TEST(Launcher, SmokeJobRunsCollectivesAcrossProcesses) {
  auto r = run_program({kRun, "--nproc-per-node", "2", "--", FSDP_SMOKE_PATH}, 120s, {"FSDP_TIMEOUT_S=60"});
  EXPECT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("[rank0]: rank 0/2 backend gloo: all_reduce, all_gather, reduce_scatter ok"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("[rank1]: rank 1/2 backend gloo: all_reduce, all_gather, reduce_scatter ok"),
            std::string::npos)
      << r.output;
}

// A rank that never starts: rank 0's rendezvous fails with an error naming it
// and the rendezvous timeout (not the collectives' longer one), within that
// timeout plus a few seconds. No hang.
TEST(Launcher, MissingRankBecomesARendezvousError) {
  const std::string port = std::to_string(20000 + getpid() % 20000);
  auto r = run_program({FSDP_SMOKE_PATH}, 60s,
                       {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port,
                        "FSDP_RENDEZVOUS_TIMEOUT_S=2", "FSDP_TIMEOUT_S=600"});
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code(), 1) << r.output;
  EXPECT_NE(r.output.find("rendezvous of group 'world' (rank 0 of 2 through the TCPStore at 127.0.0.1:" + port),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("timeout 2s) failed: 1 of 2 ranks joined; missing rank(s): 1"), std::string::npos)
      << r.output;
  EXPECT_LT(r.seconds, 7.0);
}
