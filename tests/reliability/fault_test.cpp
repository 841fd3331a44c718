// The end-to-end fault suite (issue 9; docs/reliability.md maps each fault to
// its test): a rank that dies in a step or a save, a rank that dies on another
// node (no launcher to stop the survivor), a disk that fills up, and a
// checkpoint that carries code.
// Faults are injected from outside: tests/support/fault_injector.cpp, preloaded
// into the ranks (docs/reliability.md).
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <sstream>
#include <fstream>
#include <set>
#include <thread>
#include <tuple>

#include "../support/models.h"
#include "../support/fault_injection.h"
#include "../support/sockets.h"
#include "../support/subprocess.h"
#include "../support/test_hosts.h"
#include "../support/thread_ranks.h"
#include "../support/tmpfs.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/error.h"
#include "fsdp/models/gpt.h"
#include "fsdp/state_dict/state_dict.h"
#include "fsdp/train/gpt_trainer.h"

using namespace fsdp;
using namespace fsdp::testing;
namespace fs = std::filesystem;

namespace {

// fsdp-train's flags for every run here: the tiny preset, 10 steps, a
// checkpoint every 3 steps.
std::vector<std::string> train_flags(const std::string& out) {
  return {FSDP_TRAIN_PATH, "--preset", "tiny", "--steps", "10", "--batch", "2", "--save-every", "3",
          "--log-every", "100", "--eval-every", "0", "--out", out};
}

// fsdp-train on 2 ranks of one node.
std::vector<std::string> train_command(const std::string& out, const std::vector<std::string>& launcher_flags = {}) {
  std::vector<std::string> cmd{FSDP_RUN_PATH, "--nproc-per-node", "2"};
  cmd.insert(cmd.end(), launcher_flags.begin(), launcher_flags.end());
  cmd.emplace_back("--");
  for (auto& f : train_flags(out)) cmd.push_back(f);
  return cmd;
}

std::map<std::string, torch::Tensor> weights_of(const std::string& checkpoint) {
  auto model = std::make_shared<models::GPTImpl>(train::preset("tiny"));
  run_ranks(1, [&](dist::ProcessGroup& pg) { load_checkpoint(checkpoint, model, pg); });
  return named_params(*model);
}

// The uninterrupted run every faulty run must end like (made once).
const std::map<std::string, torch::Tensor>& reference_weights() {
  static TempDir* dir = new TempDir;
  static std::map<std::string, torch::Tensor> w = [] {
    auto r = run_program(train_command(dir->path() + "/ref"), std::chrono::seconds(240));
    EXPECT_EQ(r.exit_code(), 0) << r.output;
    return weights_of(dir->path() + "/ref/checkpoints/step-00000010");
  }();
  return w;
}

void expect_same_weights(const std::string& checkpoint) {
  auto got = weights_of(checkpoint);
  const auto& want = reference_weights();
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [k, v] : want) EXPECT_TRUE(torch::equal(got.at(k), v)) << k;
}

// A memory cgroup of its own (cgroup v1 or v2) with a memory limit, removed
// at destruction; `why` says why not where the machine does not allow one.
class MemoryCgroup {
 public:
  explicit MemoryCgroup(int64_t limit_bytes) {
    // The mount points of the cgroup hierarchies, and where this process sits in them.
    std::string v1_root, v2_root, v1_path, v2_path;
    std::ifstream mounts("/proc/self/mountinfo");
    for (std::string line; std::getline(mounts, line);) {
      std::istringstream f(line);
      std::vector<std::string> w{std::istream_iterator<std::string>(f), {}};
      const auto dash = std::find(w.begin(), w.end(), "-");
      if (dash == w.end() || dash + 3 >= w.end() || w.size() < 5) continue;
      if (dash[1] == "cgroup2") v2_root = w[4];
      if (dash[1] == "cgroup" && (dash[3].find(",memory") != std::string::npos || dash[3].rfind("memory", 0) == 0)) {
        v1_root = w[4];
      }
    }
    std::ifstream self("/proc/self/cgroup");
    for (std::string line; std::getline(self, line);) {
      if (line.rfind("0::", 0) == 0) v2_path = line.substr(3);
      const auto p = line.find(":memory:");
      if (p != std::string::npos) v1_path = line.substr(p + 8);
    }
    const std::string name = "/fsdp-test-" + std::to_string(getpid());
    if (!v1_root.empty()) {
      dir_ = v1_root + v1_path + name;
      v1_ = true;
    } else if (!v2_root.empty()) {
      dir_ = v2_root + v2_path + name;
    } else {
      why = "no memory cgroup hierarchy is mounted";
      return;
    }
    if (!fs::create_directory(dir_)) {
      why = "cannot create the cgroup " + dir_ + " (needs root)";
      dir_.clear();
      return;
    }
    std::ofstream limit(dir_ + (v1_ ? "/memory.limit_in_bytes" : "/memory.max"));
    limit << limit_bytes << std::flush;
    if (!limit) why = "cannot set a memory limit on " + dir_ + " (the memory controller is not enabled for it)";
  }
  ~MemoryCgroup() {
    if (!dir_.empty()) ::rmdir(dir_.c_str());
  }
  // Writing a pid here moves that process (and its later children) into the cgroup.
  std::string procs() const { return dir_ + "/cgroup.procs"; }
  // How many processes of the cgroup the kernel's OOM killer ended.
  int oom_kills() const {
    std::ifstream in(dir_ + (v1_ ? "/memory.oom_control" : "/memory.events"));
    for (std::string key; in >> key;) {
      int n = 0;
      if (in >> n && key == "oom_kill") return n;
    }
    return -1;
  }
  std::string why;  // empty when the cgroup is ready

 private:
  std::string dir_;
  bool v1_ = false;
};

}  // namespace

// Rank 1 is killed (SIGKILL) in step 8, at its optimizer step. fsdp-run
// reports it, stops rank 0, restarts both, and fsdp-train resumes from step
// 6's checkpoint: the run ends with the parameters of a run never interrupted.
TEST(DeadRank, KilledInAStepRestartsAndEndsLikeTheUninterruptedRun) {
  reference_weights();
  TempDir dir;
  auto r = run_program(train_command(dir.path() + "/run", {"--max-restarts", "1"}), std::chrono::seconds(300),
                       fault_env("optimizer-step:1:8"));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("rank 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("SIGKILL"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step-00000006"), std::string::npos) << r.output;
  expect_same_weights(dir.path() + "/run/checkpoints/step-00000010");
}

// Rank 1 runs out of memory at step 8: the whole job runs in a memory cgroup
// limited to 1 GiB (the two ranks need about 400 MiB), and rank 1 touches
// ever more memory until the kernel's OOM killer ends it. To fsdp-run that is
// a SIGKILL like any other: the restart resumes from step 6's checkpoint and
// ends like the uninterrupted run.
TEST(DeadRank, OutOfMemoryKillRestartsAndEndsLikeTheUninterruptedRun) {
  MemoryCgroup cgroup(int64_t{1} << 30);
  if (!cgroup.why.empty()) GTEST_SKIP() << cgroup.why;
  reference_weights();
  TempDir dir;
  std::vector<std::string> cmd{"sh", "-c", "echo $$ > '" + cgroup.procs() + "' && exec \"$0\" \"$@\""};
  for (auto& a : train_command(dir.path() + "/run", {"--max-restarts", "1"})) cmd.push_back(a);
  auto r = run_program(cmd, std::chrono::seconds(300), fault_env("optimizer-step:1:8:oom"));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_EQ(cgroup.oom_kills(), 1) << "the kernel's OOM killer did not end rank 1\n" << r.output;
  EXPECT_NE(r.output.find("rank 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("SIGKILL"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step-00000006"), std::string::npos) << r.output;
  expect_same_weights(dir.path() + "/run/checkpoints/step-00000010");
}

// Rank 1 dies while writing its data file of the second checkpoint (step 6):
// that checkpoint never commits, the restart resumes from step 3's, and the
// run still ends like the uninterrupted one.
TEST(DeadRank, KilledInASaveResumesFromTheLastCompleteCheckpoint) {
  reference_weights();
  TempDir dir;
  auto r = run_program(train_command(dir.path() + "/run", {"--max-restarts", "1"}), std::chrono::seconds(300),
                       fault_env("sharded-mid-data:1:2"));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("SIGKILL"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step-00000003"), std::string::npos) << "resumed from the step-3 checkpoint\n" << r.output;
  expect_same_weights(dir.path() + "/run/checkpoints/step-00000010");
}

// Rank 0 dies while writing the second full checkpoint (step 6): its
// temporary file (step-00000006.tmp-<id>) stays behind until the restarted
// run's next save removes it (issue 19 item 7); the run still ends like the
// uninterrupted one, with nothing temporary left in its directory.
TEST(DeadRank, AFullSaveKilledMidWriteLeavesNoTemporaryFileBehind) {
  reference_weights();
  TempDir dir;
  auto cmd = train_command(dir.path() + "/run", {"--max-restarts", "1"});
  cmd.insert(cmd.end(), {"--state-dict-type", "full"});
  auto r = run_program(cmd, std::chrono::seconds(300), fault_env("full-after-first-record:0:2"));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("SIGKILL"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step-00000006.tmp-"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(", left by a save that was killed"), std::string::npos) << r.output;
  for (const auto& e : fs::recursive_directory_iterator(dir.path() + "/run")) {
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << "left behind: " << e.path();
  }
  expect_same_weights(dir.path() + "/run/checkpoints/step-00000010");
}

// Two "nodes" (one fsdp-run each, as on two machines): when node 1's rank dies
// nobody stops node 0's rank, which must fail by itself with an error naming
// the collective, within the collective timeout plus a few seconds.
TEST(DeadRank, TheSurvivorOnAnotherNodeNamesTheCollective) {
  TempDir dir;
  const std::string port = std::to_string(free_port());
  auto node = [&](int rank) {
    return std::vector<std::string>{FSDP_RUN_PATH, "--nnodes", "2", "--node-rank", std::to_string(rank),
                                    "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port,
                                    "--", FSDP_TRAIN_PATH, "--preset", "tiny", "--steps", "40", "--batch", "2",
                                    "--log-every", "100", "--eval-every", "0", "--out", dir.path() + "/run"};
  };
  std::vector<std::string> env = fault_env("optimizer-step:1:5");
  env.push_back("FSDP_TIMEOUT_S=10");
  int fd1 = -1;
  const pid_t node1 = spawn(node(1), env, &fd1);
  auto r0 = run_program(node(0), std::chrono::seconds(120), env);
  // Node 1: its rank was killed, and its launcher says so.
  const std::string out1 = wait_program(node1, fd1, std::chrono::seconds(60)).output;
  EXPECT_NE(out1.find("SIGKILL"), std::string::npos) << out1;
  // Node 0: an error naming the collective, not a hang, and well within timeout + a few seconds.
  EXPECT_FALSE(r0.timed_out) << r0.output;
  EXPECT_NE(r0.exit_code(), 0) << r0.output;
  EXPECT_NE(r0.output.find("fsdp: collective "), std::string::npos) << r0.output;
  EXPECT_LT(r0.seconds, 60.0) << r0.output;
}

// Two test hosts on this machine (tests/support/test_hosts.h): `a`
// (10.77.0.1) and `b` (10.77.0.2) on one switch, as two machines on one
// network. Needs root (CAP_NET_ADMIN), as CI has; skipped with the reason
// otherwise.
class TwoHosts : public ::testing::Test {
 protected:
  static constexpr int kPort = 29500;  // rank 0's store, on host a
  void SetUp() override {
    if (!hosts_.why_not.empty()) GTEST_SKIP() << hosts_.why_not;
  }
  // fsdp-run for node `rank` (one rank per node) on its host, rank 0's store on host a.
  std::vector<std::string> node(int rank, const std::vector<std::string>& train) const {
    std::vector<std::string> cmd{FSDP_RUN_PATH, "--nnodes", "2", "--node-rank", std::to_string(rank),
                                 "--nproc-per-node", "1", "--master-addr", TestHosts::address(0), "--master-port",
                                 std::to_string(kPort), "--"};
    cmd.insert(cmd.end(), train.begin(), train.end());
    return hosts_.on(rank, cmd);
  }
  void cut_the_link() const { ASSERT_TRUE(hosts_.cut(0)); }

 private:
  TestHosts hosts_{2};
};

// fsdp-run's multi-node mode across two hosts trains to the parameters of the
// same run on one machine, bit for bit (2 ranks with the same threads each:
// fsdp-run gives a lone rank every core, and another thread count sums in
// another order; the shared checkpoint directory stands for a shared
// filesystem). Rank 0's store listens on host a's address given as
// --master-addr only, not on host a's loopback or any other interface.
TEST_F(TwoHosts, TrainingAcrossTwoHostsEndsLikeOnOneMachine) {
  reference_weights();
  TempDir dir;
  const auto train = train_flags(dir.path() + "/run");
  cpu_set_t cores;  // what fsdp-run counts: the cores this process may run on
  const int ncores = sched_getaffinity(0, sizeof cores, &cores) == 0 ? CPU_COUNT(&cores) : 1;
  const std::string threads = std::to_string(std::max(1, ncores / 2));
  const std::vector<std::string> env{"OMP_NUM_THREADS=" + threads, "OPENBLAS_NUM_THREADS=" + threads};
  int fd0 = -1, fd1 = -1;
  const pid_t node0 = spawn(node(0, train), env, &fd0);
  std::set<std::string> listeners;  // on the store's port, in host a (node 0's namespace)
  for (auto t0 = std::chrono::steady_clock::now();
       listeners.empty() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60);
       std::this_thread::sleep_for(std::chrono::milliseconds(20))) {
    listeners = tcp_listeners(kPort, "/proc/" + std::to_string(node0));
  }
  const pid_t node1 = spawn(node(1, train), env, &fd1);
  auto r0 = wait_program(node0, fd0, std::chrono::seconds(240));
  auto r1 = wait_program(node1, fd1, std::chrono::seconds(30));
  ASSERT_EQ(r0.exit_code(), 0) << r0.output;
  ASSERT_EQ(r1.exit_code(), 0) << r1.output;
  EXPECT_EQ(listeners, std::set<std::string>{"10.77.0.1"});
  expect_same_weights(dir.path() + "/run/checkpoints/step-00000010");
}

// The cable is cut mid-training (`ip link set ... down`): no socket closes,
// packets just stop. Both hosts end with Gloo's timeout error naming the
// collective, within the collective timeout (10 s here) plus a few seconds,
// and each fsdp-run reports its failed worker. Never a hang.
TEST_F(TwoHosts, CuttingTheLinkEndsBothSidesWithATimeoutError) {
  TempDir dir;
  std::vector<std::string> train{FSDP_TRAIN_PATH, "--preset", "tiny", "--steps", "100000", "--batch", "2",
                                 "--log-every", "1", "--eval-every", "0", "--save-every", "0",
                                 "--out", dir.path() + "/run"};
  const std::vector<std::string> env{"FSDP_TIMEOUT_S=10"};
  using Clock = std::chrono::steady_clock;
  Clock::time_point cut{}, end1{};
  RunResult r1;
  int fd1 = -1;
  const pid_t node1 = spawn(node(1, train), env, &fd1);
  std::thread collect1([&] {
    r1 = wait_program(node1, fd1, std::chrono::seconds(240));
    end1 = Clock::now();
  });
  auto r0 = run_program(node(0, train), std::chrono::seconds(240), env, [&](pid_t, const std::string& out) {
    if (cut == Clock::time_point{} && out.find("step 5/") != std::string::npos) {  // training across the link
      cut_the_link();
      cut = Clock::now();
    }
  });
  const auto end0 = Clock::now();
  collect1.join();
  ASSERT_NE(cut, Clock::time_point{}) << "training never reached step 5\n" << r0.output << "\n" << r1.output;
  for (const auto& [r, end, name] : {std::tuple{&r0, end0, "host a"}, std::tuple{&r1, end1, "host b"}}) {
    SCOPED_TRACE(name);
    EXPECT_FALSE(r->timed_out) << r->output;
    EXPECT_EQ(r->exit_code(), 1) << r->output;
    EXPECT_NE(r->output.find("fsdp: collective "), std::string::npos) << r->output;
    EXPECT_NE(r->output.find("Timed out waiting 10000ms"), std::string::npos) << r->output;
    EXPECT_NE(r->output.find("fsdp-run: worker rank"), std::string::npos) << r->output;
    const double after_cut = std::chrono::duration<double>(end - cut).count();
    EXPECT_LT(after_cut, 30.0) << "ended " << after_cut << " s after the cut\n" << r->output;
  }
}

// A save onto a disk that fills up fails with a message that says so, and
// the previous checkpoint stays intact and loadable (both formats). Needs
// root for the small tmpfs (CI runs as root); skipped otherwise.
TEST(FullDisk, SaveFailsSayingSoAndThePreviousCheckpointSurvives) {
  TempDir dir;
  const SmallTmpfs disk(dir.path() + "/disk", "size=2m");
  if (!disk.mounted()) GTEST_SKIP() << disk.why_not();
  const std::string mnt = disk.path();
  for (auto format : {CheckpointFormat::kSharded, CheckpointFormat::kFull}) {
    const std::string tag = to_string(format);
    SCOPED_TRACE(tag);
    const std::string good = mnt + "/" + tag + "-good", bad = mnt + "/" + tag + "-bad";
    std::map<std::string, torch::Tensor> saved;
    run_ranks(2, [&](dist::ProcessGroup& pg) {
      auto net = make_net(41);  // seeds and builds under rng_mutex()
      pg.barrier();
      FSDPOptions o = options_for_strategy(pg, ShardingStrategy::kFullShard);
      FullyShardedDataParallel<NetImpl> model(net, o);
      CheckpointOptions co;
      co.format(format);
      CheckpointState s;
      s.model("model", model.ptr());
      save_checkpoint(good, s, pg, co);
      if (pg.rank() == 0) saved = to_map(full_parameters(model.ptr()));
      else full_parameters(model.ptr());
      // Fill the disk but for a few KiB, then save again.
      if (pg.rank() == 0) disk.fill();
      pg.barrier();
      try {
        save_checkpoint(bad, s, pg, co);
        ADD_FAILURE() << "the " << tag << " save onto a full disk did not fail on rank " << pg.rank();
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("No space left on device"), std::string::npos) << e.what();
      }
      pg.barrier();
      if (pg.rank() == 0) fs::remove(mnt + "/filler");
      pg.barrier();
    });
    EXPECT_TRUE(verify_checkpoint(good).empty());
    auto fresh = make_net(99);
    run_ranks(1, [&](dist::ProcessGroup& pg) { load_checkpoint(good, fresh, pg); });
    expect_close(named_params(*fresh), saved, 0.0, tag);
    EXPECT_THROW(inspect_checkpoint(bad), ConfigError) << "the failed save left something that looks complete";
    for (const auto& e : fs::recursive_directory_iterator(mnt)) {
      EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << "left behind: " << e.path();
    }
  }
}

// Issue 28 item 1 (b): the disk that holds the run's logs fills between
// saves (its checkpoints live on another disk, mounted at checkpoints/). Every
// failed metrics write is reported on the console, training goes on, the
// checkpoints are saved and the run ends well; once there is room again, the
// run resumes, and the steps whose lines were lost are recorded as a gap.
// Needs root for the small tmpfs (CI runs as root); skipped otherwise; the
// tmpfs is unmounted (lazily) even when an assertion fails.
TEST(FullDisk, MetricsOnAFullDiskAreReportedTheRunGoesOnAndResumes) {
  TempDir dir;
  const std::string mnt = dir.path() + "/disk", out = mnt + "/run", ckpts = out + "/checkpoints";
  const SmallTmpfs disk(mnt, "size=256k");
  if (!disk.mounted()) GTEST_SKIP() << disk.why_not();
  fs::create_directories(out);
  // Another disk mounted there (fsdp-train follows no symbolic link beneath --out since issue 37).
  const SmallTmpfs checkpoint_disk(ckpts, "size=64m");
  if (!checkpoint_disk.mounted()) GTEST_SKIP() << checkpoint_disk.why_not();
  auto flags = [&](int steps) {
    return std::vector<std::string>{FSDP_TRAIN_PATH, "--preset", "tiny", "--steps", std::to_string(steps), "--batch",
                                    "2", "--save-every", "4", "--log-every", "100", "--eval-every", "0", "--out", out};
  };
  auto r = run_program(flags(4), std::chrono::seconds(240));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  // Pad the logs with blank lines (which readers skip; in metrics.jsonl
  // before its lines, where a resume keeps them) to whole pages, so that
  // their next line needs a new page of the tmpfs; then fill the disk.
  for (const char* name : {"/metrics.jsonl", "/train.log"}) {
    const std::string text = read_file(out + name);
    write_file(out + name, std::string((4096 - text.size() % 4096) % 4096, '\n') + text);
  }
  const std::string filler = disk.fill();
  auto resumed = flags(8);
  resumed.emplace_back("--resume");
  r = run_program(resumed, std::chrono::seconds(240));
  EXPECT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("cannot write " + out + "/metrics.jsonl at step 5: No space left on device; training goes on"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("cannot write " + out + "/train.log"), std::string::npos) << r.output;
  EXPECT_TRUE(verify_checkpoint(ckpts + "/step-00000008").empty());
  fs::remove(filler);
  auto again = flags(10);
  again.emplace_back("--resume");
  r = run_program(again, std::chrono::seconds(240));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + out + "/checkpoints/step-00000008 at step 8"), std::string::npos)
      << r.output;
  std::vector<std::string> lines;
  {
    std::ifstream in(out + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) lines.push_back(line);
    }
  }
  ASSERT_EQ(lines.size(), 7u) << read_file(out + "/metrics.jsonl");
  EXPECT_EQ(lines[4], "{\"gap\":[5,8]}");
  EXPECT_EQ(lines[5].rfind("{\"step\":9,", 0), 0u) << lines[5];
}

// Issue 19 item 2: a checkpoint's file replaced by a FIFO (whose open would
// wait for a writer forever) or a device is refused by name by every tool
// that reads checkpoints, never waited on.
TEST(HostileFiles, AFifoOrDeviceInPlaceOfACheckpointFileIsRefusedNotWaitedOn) {
  TempDir dir;
  const std::string run = dir.path() + "/run";
  auto with_steps = [&](const std::string& steps) {
    std::vector<std::string> flags = train_flags(run);
    *(std::find(flags.begin(), flags.end(), "--steps") + 1) = steps;  // a checkpoint every 3 steps
    return flags;
  };
  auto r = run_program(with_steps("3"), std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  const std::string ckpt = run + "/checkpoints/step-00000003";
  std::string data_file;
  for (const auto& f : fs::directory_iterator(ckpt)) {
    if (f.path().extension() == ".distcp") data_file = f.path().string();
  }
  ASSERT_FALSE(data_file.empty());
  const std::string full = dir.path() + "/full.pt";
  r = run_program({FSDP_CKPT_PATH, "convert", ckpt, full, "--format", "full"}, std::chrono::seconds(60));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  auto refused = [&](const std::vector<std::string>& cmd, const std::string& what, const std::string& kind) {
    const auto res = run_program(cmd, std::chrono::seconds(60));
    EXPECT_FALSE(res.timed_out) << what << ": waited on the " << kind;
    EXPECT_NE(res.exit_code(), 0) << what << "\n" << res.output;
    EXPECT_NE(res.output.find(kind), std::string::npos) << what << "\n" << res.output;
  };
  fs::remove(data_file);
  ASSERT_EQ(::mkfifo(data_file.c_str(), 0644), 0);
  const std::string fifo_says = data_file + " is a FIFO (named pipe), not a regular file";
  refused({FSDP_CKPT_PATH, "verify", ckpt}, "verify", fifo_says);
  refused({FSDP_CKPT_PATH, "consolidate", ckpt, dir.path() + "/out.pt"}, "consolidate", fifo_says);
  refused({FSDP_TRAIN_PATH, "generate", "--checkpoint", ckpt, "--prompt", "the", "--tokens", "4"}, "generate", fifo_says);
  {  // resume: the checkpoint counts as damaged (set aside, named), and nothing waits
    std::vector<std::string> resume = with_steps("4");
    resume.push_back("--resume");
    const auto res = run_program(resume, std::chrono::seconds(120));
    EXPECT_FALSE(res.timed_out) << "resume waited on the FIFO";
    EXPECT_NE(res.output.find(fifo_says), std::string::npos) << res.output;
  }
  // A device in place of a full checkpoint's file or of a DCP .metadata.
  fs::remove(full);
  fs::create_symlink("/dev/zero", full);
  refused({FSDP_CKPT_PATH, "verify", full}, "verify of a device", "does not point to a valid checkpoint");
  refused({FSDP_TRAIN_PATH, "generate", "--checkpoint", full, "--prompt", "the"}, "generate of a device",
          "does not point to a valid checkpoint");
  const std::string other = dir.path() + "/other";
  fs::create_directories(other);
  ASSERT_EQ(::mkfifo((other + "/.metadata").c_str(), 0644), 0);
  refused({FSDP_CKPT_PATH, "verify", other}, "verify of a FIFO .metadata", other + "/.metadata is not a regular file");
}

// Loading never runs code from a checkpoint: fsdp-cpp reads its own JSON
// index and the raw tensor records of a full file, never its pickle. A full
// checkpoint whose data.pkl is replaced by a pickle that would run a shell
// command still loads, and the command never runs; a zip without the index is
// refused by name.
TEST(HostileFiles, APickleInAFullCheckpointIsNeverRun) {
  TempDir dir;
  const std::string good = dir.path() + "/good.pt", evil = dir.path() + "/evil.pt", marker = dir.path() + "/pwned";
  auto net = make_net(5);
  const auto want = named_params(*net);
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    FullyShardedDataParallel<NetImpl> model(net, options_for_strategy(pg, ShardingStrategy::kFullShard));
    CheckpointState s;
    s.model("model", model.ptr());
    CheckpointOptions o;
    o.format(CheckpointFormat::kFull);
    save_checkpoint(good, s, pg, o);
  });
  // Protocol-2 pickle: os.system("touch <marker>").
  const std::string payload = "cposix\nsystem\n(S'touch " + marker + "'\ntR.";
  auto rewrite = [&](const std::string& out, bool keep_index) {
    caffe2::serialize::PyTorchStreamReader in(good);
    std::ofstream file(out, std::ios::binary);
    caffe2::serialize::PyTorchStreamWriter zip([&](const void* d, size_t n) {
      file.write(static_cast<const char*>(d), static_cast<std::streamsize>(n));
      return n;
    });
    for (const auto& name : in.getAllRecords()) {
      if (name == "data.pkl") {
        zip.writeRecord(name, payload.data(), payload.size());
      } else if (keep_index || name.find("index") == std::string::npos) {
        auto [data, size] = in.getRecord(name);
        zip.writeRecord(name, data.get(), size);
      }
    }
    zip.writeEndOfFile();
  };
  rewrite(evil, /*keep_index=*/true);
  auto fresh = make_net(6);
  run_ranks(1, [&](dist::ProcessGroup& pg) { load_checkpoint(evil, fresh, pg); });
  expect_close(named_params(*fresh), want, 0.0, "loaded from the file with the hostile pickle");
  EXPECT_FALSE(fs::exists(marker)) << "the pickle ran";
  rewrite(evil, /*keep_index=*/false);
  try {
    inspect_checkpoint(evil);
    ADD_FAILURE() << "a zip without fsdp-cpp's index was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(evil), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(marker)) << "the pickle ran";
}

// A LOCAL state dict holds one rank's flat shards, which only the same
// sharding can use: loading it at another world size is refused on every rank
// (rank 0's elements would even be covered) with a message that says so and
// what to do instead.
TEST(BadInput, ALocalStateDictAtAnotherWorldSizeIsNamed) {
  StateDict saved;
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    FullyShardedDataParallel<NetImpl> model(make_net(3), options_for_strategy(pg, ShardingStrategy::kFullShard));
    StateDictTypeGuard guard(model.ptr(), StateDictType::kLocal);
    auto sd = state_dict(model.ptr());
    if (pg.rank() == 0) saved = sd;
  });
  run_ranks(3, [&](dist::ProcessGroup& pg) {
    FullyShardedDataParallel<NetImpl> model(make_net(3), options_for_strategy(pg, ShardingStrategy::kFullShard));
    StateDictTypeGuard guard(model.ptr(), StateDictType::kLocal);
    try {
      load_state_dict(model.ptr(), saved);
      ADD_FAILURE() << "rank " << pg.rank() << " loaded another world's LOCAL state dict";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("it was saved with another sharding"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("FULL_STATE_DICT"), std::string::npos) << e.what();
    }
  });
}
