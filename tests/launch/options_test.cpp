// Argument parsing of fsdp-run: torchrun's spellings and every bad-input message.
#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include "fsdp/error.h"
#include "fsdp/launch/launcher.h"

using fsdp::ConfigError;
using fsdp::launch::parse_launch_args;
using fsdp::launch::usage;

namespace {

std::string error_of(const std::vector<std::string>& args) {
  try {
    parse_launch_args(args);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(LaunchOptions, TorchrunSpellings) {
  auto o = parse_launch_args({"--nproc_per_node=3", "--nnodes", "2", "--node-rank=1", "--master_addr", "10.0.0.1",
                              "--master-port", "29400", "--", "prog", "--flag", "x"});
  EXPECT_EQ(o.nproc_per_node, 3);
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "10.0.0.1");
  EXPECT_EQ(o.master_port, 29400);
  EXPECT_EQ(o.command, (std::vector<std::string>{"prog", "--flag", "x"}));
}

TEST(LaunchOptions, ProgramStartsAtFirstNonOption) {
  auto o = parse_launch_args({"--nproc-per-node", "2", "--max-restarts", "1", "--no-rank-prefix", "prog", "--nnodes", "9"});
  EXPECT_EQ(o.nproc_per_node, 2);
  EXPECT_EQ(o.max_restarts, 1);
  EXPECT_FALSE(o.rank_prefix);
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.command, (std::vector<std::string>{"prog", "--nnodes", "9"}));
}

TEST(LaunchOptions, Defaults) {
  auto o = parse_launch_args({"prog"});
  EXPECT_EQ(o.nproc_per_node, 1);
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 0);
  EXPECT_TRUE(o.rank_prefix);
  EXPECT_EQ(o.allocator, "auto");
  EXPECT_EQ(parse_launch_args({"--allocator=jemalloc", "prog"}).allocator, "jemalloc");
  EXPECT_TRUE(parse_launch_args({"--help"}).help);
  EXPECT_TRUE(o.warnings.empty());
  // The workers' timeouts are documented where users look.
  EXPECT_NE(usage().find("FSDP_TIMEOUT_S"), std::string::npos);
  EXPECT_NE(usage().find("FSDP_RENDEZVOUS_TIMEOUT_S"), std::string::npos);
}

// A wildcard address makes rank 0's store reachable from every network: said.
TEST(LaunchOptions, WildcardMasterAddressIsWarnedAbout) {
  for (const char* addr : {"0.0.0.0", "::"}) {
    auto o = parse_launch_args({"--master-addr", addr, "prog"});
    ASSERT_EQ(o.warnings.size(), 1u) << addr;
    EXPECT_NE(o.warnings[0].find("listen on every network interface"), std::string::npos) << o.warnings[0];
  }
  EXPECT_TRUE(parse_launch_args({"--master-addr", "10.0.0.1", "prog"}).warnings.empty());
}

TEST(LaunchOptions, BadInputNamesTheOptionAndTheExpectation) {
  EXPECT_EQ(error_of({"--nproc-per-node", "abc", "prog"}),
            "fsdp-run: --nproc-per-node='abc' is not a number: expected an integer in 1..4096");
  EXPECT_EQ(error_of({"--nproc-per-node", "0", "prog"}),
            "fsdp-run: --nproc-per-node=0 is out of range: expected an integer in 1..4096");
  EXPECT_EQ(error_of({"--master-port=70000", "prog"}),
            "fsdp-run: --master-port=70000 is out of range: expected a TCP port in 0..65535 (0: pick a free one)");
  EXPECT_EQ(error_of({"--master-port", "x1", "prog"}),
            "fsdp-run: --master-port='x1' is not a number: expected a TCP port in 0..65535 (0: pick a free one)");
  // An elastic or multi-node restarting job: refused, with the torchrun command that runs it.
  EXPECT_EQ(error_of({"--nnodes", "1:3", "--nproc-per-node", "2", "--master-addr", "node0", "--", "fsdp-train",
                      "--preset", "tiny", "--out", "my runs/a"}),
            "fsdp-run: --nnodes=1:3: fsdp-run runs a fixed number of nodes; an elastic job is torchrun's (its c10d "
            "rendezvous re-forms the group when a node is lost or joins, and fsdp-train resumes from its newest "
            "checkpoint, resharded). On every node run:\n  TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes 1:3 --nproc-per-node 2 --rdzv-backend "
            "c10d --rdzv-endpoint node0:29400 --rdzv-id JOB --rdzv-conf "
            "last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3 --max-restarts 3 --no-python fsdp-train --preset tiny "
            "--out 'my runs/a'\n(docs/launching.md)");
  EXPECT_EQ(error_of({"--nnodes", "x:y", "prog"}).rfind("fsdp-run: --nnodes=x:y: fsdp-run runs a fixed number", 0), 0u);
  EXPECT_EQ(error_of({"--nnodes", "two", "prog"}),
            "fsdp-run: --nnodes='two' is not a number: expected a fixed number of nodes, an integer >= 1 (no MIN:MAX)");
  EXPECT_EQ(error_of({"--bogus", "prog"}), "fsdp-run: unknown option '--bogus' (see fsdp-run --help)");
  EXPECT_EQ(error_of({"--nproc-per-node"}), "fsdp-run: option --nproc-per-node needs a value");
  EXPECT_EQ(error_of({"--nproc-per-node", "2"}),
            "fsdp-run: no program given: expected 'fsdp-run [options] -- program [args...]'");
  EXPECT_EQ(error_of({"--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "--master-port", "5", "prog"}),
            "fsdp-run: --node-rank=2 is out of range: expected 0 <= node-rank < nnodes=2");
  EXPECT_EQ(error_of({"--nnodes", "2", "--master-addr", "h", "prog"}),
            "fsdp-run: --master-port is required with --nnodes=2: every node must use the same port");
  EXPECT_EQ(error_of({"--nnodes", "2", "--master-port", "5", "prog"}),
            "fsdp-run: --master-addr is required with --nnodes=2: expected the address of the node that runs rank 0");
  EXPECT_EQ(error_of({"--nnodes", "2", "--master-addr", "h", "--master-port", "5", "--max-restarts", "1", "prog", "a"}),
            "fsdp-run: --max-restarts needs --nnodes 1: fsdp-run has no elastic rendezvous to restart the groups of "
            "several nodes together; torchrun's has. On every node run:\n  torchrun --nnodes 2 --nproc-per-node 1 "
            "--rdzv-backend c10d --rdzv-endpoint h:5 --rdzv-id JOB --max-restarts 1 --no-python prog a\n"
            "(docs/launching.md)");
  EXPECT_EQ(error_of({"--no-rank-prefix=1", "prog"}), "fsdp-run: option --no-rank-prefix takes no value, got '1'");
  EXPECT_EQ(error_of({"--allocator", "hoard", "prog"}),
            "fsdp-run: --allocator='hoard' is not known: expected auto, system, jemalloc, tcmalloc or mimalloc");
}

// --print-env needs no program; it prints what read_dist_env found, or the
// error that stops the job, through the same reader the workers use.
TEST(LaunchOptions, PrintEnv) {
  EXPECT_TRUE(parse_launch_args({"--print-env"}).print_env);
  EXPECT_TRUE(parse_launch_args({"--nproc-per-node", "2", "--print_env"}).print_env);
  EXPECT_FALSE(parse_launch_args({"prog"}).print_env);
  EXPECT_NE(usage().find("--print-env"), std::string::npos);
  auto lookup_of = [](std::map<std::string, std::string> vars) {
    return [vars](const std::string& name) -> std::optional<std::string> {
      auto it = vars.find(name);
      return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
    };
  };
  std::ostringstream out, err;
  EXPECT_EQ(fsdp::launch::print_env(lookup_of({{"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "3"},
                                               {"SLURM_NODELIST", "gpu-[01-02]"}, {"SLURM_NNODES", "2"},
                                               {"SLURM_JOB_ID", "98765"}}),
                                    out, err),
            0);
  EXPECT_EQ(out.str(),
            "cluster: slurm\nrank: 3\nworld_size: 4\nlocal_rank: 1\nlocal_world_size: 2\nnodes: 2\n"
            "master_addr: gpu-01 (first host of SLURM_NODELIST)\n"
            "master_port: 23765 (15000 + the last 4 digits of SLURM_JOB_ID)\nstore: rank 0 serves it\n"
            "backend: auto\nvariables read: SLURM_NTASKS=4 SLURM_PROCID=3 SLURM_NODELIST=gpu-[01-02] SLURM_NNODES=2 "
            "SLURM_JOB_ID=98765\n");
  EXPECT_EQ(err.str(), "");
  std::ostringstream out2, err2;
  EXPECT_EQ(fsdp::launch::print_env(lookup_of({{"SLURM_NTASKS", "4"}}), out2, err2), 2);
  EXPECT_EQ(out2.str(), "");
  EXPECT_NE(err2.str().find("fsdp-run --print-env: SLURM_NTASKS=4 says this job has 4 tasks, but SLURM_PROCID is "
                            "not set"),
            std::string::npos)
      << err2.str();
}
