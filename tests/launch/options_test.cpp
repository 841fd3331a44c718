// Argument parsing of fsdp-run: torchrun's spellings and every bad-input message.
#include <gtest/gtest.h>

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
  EXPECT_EQ(error_of({"--nnodes", "1:2", "prog"}),
            "fsdp-run: --nnodes='1:2' is not a number: expected a fixed number of nodes, an integer >= 1 (no MIN:MAX)");
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
  EXPECT_NE(error_of({"--nnodes", "2", "--master-addr", "h", "--master-port", "5", "--max-restarts", "1", "prog"})
                .find("--max-restarts needs --nnodes 1"),
            std::string::npos);
  EXPECT_EQ(error_of({"--no-rank-prefix=1", "prog"}), "fsdp-run: option --no-rank-prefix takes no value, got '1'");
  EXPECT_EQ(error_of({"--allocator", "hoard", "prog"}),
            "fsdp-run: --allocator='hoard' is not known: expected auto, system, jemalloc, tcmalloc or mimalloc");
}
