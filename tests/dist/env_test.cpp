// Reading the job from torchrun's environment, and the errors for bad values.
#include <gtest/gtest.h>

#include <map>

#include "fsdp/dist/env.h"
#include "fsdp/dist/process_group.h"
#include "fsdp/error.h"
#include "../support/sockets.h"

using fsdp::ConfigError;
using fsdp::dist::read_dist_env;

namespace {

fsdp::dist::EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::map<std::string, std::string> good() {
  return {{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
          {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29500"}};
}

std::string error_of(std::map<std::string, std::string> vars) {
  try {
    read_dist_env(env_of(std::move(vars)));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(DistEnv, ReadsTorchrunVariables) {
  auto env = read_dist_env(env_of(good()));
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "10.1.2.3");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_EQ(env.backend, fsdp::dist::Backend::kAuto);
  EXPECT_EQ(env.timeout, fsdp::dist::kDefaultTimeout);
}

TEST(DistEnv, OptionalVariables) {
  auto vars = good();
  vars.erase("LOCAL_RANK");
  vars.erase("LOCAL_WORLD_SIZE");
  vars["FSDP_BACKEND"] = "gloo";
  vars["FSDP_TIMEOUT_S"] = "7";
  auto env = read_dist_env(env_of(vars));
  EXPECT_EQ(env.local_rank, 3);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.backend, fsdp::dist::Backend::kGloo);
  EXPECT_EQ(env.timeout, std::chrono::seconds(7));
  // A single process needs no address.
  auto single = read_dist_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}}));
  EXPECT_EQ(single.world_size, 1);
  EXPECT_TRUE(single.master_addr.empty());
}

TEST(DistEnv, BadValuesNameTheVariable) {
  auto with = [](std::string k, std::string v) {
    auto vars = good();
    if (v == "<unset>") vars.erase(k);
    else vars[k] = v;
    return vars;
  };
  EXPECT_EQ(error_of(with("RANK", "4")), "RANK=4 is out of range: expected 0 <= RANK < WORLD_SIZE=4");
  EXPECT_EQ(error_of(with("RANK", "-1")), "RANK=-1 is out of range: expected 0 <= RANK < WORLD_SIZE=4");
  EXPECT_EQ(error_of(with("RANK", "<unset>")),
            "environment variable RANK is not set: expected this process's rank, e.g. RANK=0 (torchrun and "
            "fsdp-run set it; with none of RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT "
            "set, the process runs alone as rank 0 of 1)");
  EXPECT_EQ(error_of(with("WORLD_SIZE", "two")), "WORLD_SIZE='two' is not a number: expected an integer >= 1");
  EXPECT_EQ(error_of(with("MASTER_ADDR", "<unset>")),
            "environment variable MASTER_ADDR is not set: expected the address of rank 0, e.g. "
            "MASTER_ADDR=127.0.0.1 (torchrun and fsdp-run set it; with none of RANK, WORLD_SIZE, LOCAL_RANK, "
            "LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT set, the process runs alone as rank 0 of 1)");
  EXPECT_EQ(error_of(with("MASTER_PORT", "http")),
            "MASTER_PORT='http' is not a number: expected a TCP port number in 1..65535");
  EXPECT_EQ(error_of(with("MASTER_PORT", "70000")),
            "MASTER_PORT=70000 is out of range: expected a TCP port number in 1..65535");
  EXPECT_EQ(error_of(with("MASTER_PORT", "29500x")),
            "MASTER_PORT='29500x' is not a number: expected a TCP port number in 1..65535");
  EXPECT_EQ(error_of(with("LOCAL_RANK", "2")), "LOCAL_RANK=2 is out of range: expected 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE=2");
  EXPECT_EQ(error_of(with("FSDP_BACKEND", "mpi")), "FSDP_BACKEND='mpi' is not a backend: expected one of auto, gloo, nccl");
  EXPECT_EQ(error_of(with("FSDP_TIMEOUT_S", "0")),
            "FSDP_TIMEOUT_S=0 is out of range: expected a timeout in whole seconds, 1..604800");
}

// No launcher variable at all: the process runs alone (rank 0 of 1), as
// torch.distributed and Lightning run a single device; a partly set
// environment stays an error.
TEST(DistEnv, NoLauncherRunsAloneAsRank0Of1) {
  auto env = read_dist_env(env_of({{"FSDP_TIMEOUT_S", "9"}}));
  EXPECT_FALSE(env.launched);
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.local_world_size, 1);
  EXPECT_EQ(env.timeout, std::chrono::seconds(9));  // the options are still read
  EXPECT_TRUE(read_dist_env(env_of(good())).launched);
  auto group = fsdp::dist::init_process_group(fsdp::dist::InitOptions::from_env(env));
  EXPECT_EQ(group->size(), 1);
  EXPECT_EQ(group->rank(), 0);
  group->barrier();
  EXPECT_NE(error_of({{"RANK", "0"}}).find("environment variable WORLD_SIZE is not set"), std::string::npos);
  EXPECT_NE(error_of({{"MASTER_PORT", "29500"}}).find("environment variable WORLD_SIZE is not set"), std::string::npos);
  EXPECT_NE(error_of({{"WORLD_SIZE", "2"}}).find("environment variable RANK is not set"), std::string::npos);
}

// Rendezvous is bounded by its own timeout (minutes by default, not the
// collectives' 30), and the error names the ranks that did not come.
TEST(DistEnv, RendezvousIsBoundedAndNamesTheMissingRanks) {
  EXPECT_LE(fsdp::dist::kDefaultRendezvousTimeout, std::chrono::minutes(5));
  EXPECT_EQ(read_dist_env(env_of(good())).rendezvous_timeout, fsdp::dist::kDefaultRendezvousTimeout);
  auto vars = good();
  vars["FSDP_RENDEZVOUS_TIMEOUT_S"] = "2";
  EXPECT_EQ(read_dist_env(env_of(vars)).rendezvous_timeout, std::chrono::seconds(2));
  vars["FSDP_RENDEZVOUS_TIMEOUT_S"] = "soon";
  EXPECT_EQ(error_of(vars), "FSDP_RENDEZVOUS_TIMEOUT_S='soon' is not a number: expected a timeout in whole seconds, "
                            "1..604800");
  auto alone = [](int rank, int world) {
    fsdp::dist::InitOptions o;
    o.rank = rank;
    o.world_size = world;
    o.master_addr = "127.0.0.1";
    o.master_port = fsdp::testing::free_port();
    o.backend = fsdp::dist::Backend::kGloo;
    o.rendezvous_timeout = std::chrono::seconds(1);  // collectives keep the 30-minute default
    const auto t0 = std::chrono::steady_clock::now();
    std::string what;
    try {
      fsdp::dist::init_process_group(o);
    } catch (const fsdp::CollectiveError& e) {
      what = e.what();
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(waited, 30.0) << what;
    return what;
  };
  const std::string r0 = alone(0, 3);  // ranks 1 and 2 never start
  EXPECT_NE(r0.find("1 of 3 ranks joined; missing rank(s): 1, 2"), std::string::npos) << r0;
  EXPECT_NE(r0.find("timeout 1"), std::string::npos) << r0;
  const std::string r1 = alone(1, 2);  // rank 0 (the store) never starts
  EXPECT_NE(r1.find("rendezvous of group 'world' (rank 1 of 2"), std::string::npos) << r1;
  EXPECT_NE(r1.find("is rank 0 running"), std::string::npos) << r1;
}

TEST(DistEnv, BackendThatIsNotBuiltIn) {
  if (fsdp::dist::backend_available(fsdp::dist::Backend::kNccl)) GTEST_SKIP() << "this build has NCCL";
  fsdp::dist::InitOptions o;
  o.backend = fsdp::dist::Backend::kNccl;
  try {
    fsdp::dist::init_process_group(o);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "backend 'nccl' is not built into this fsdp-cpp (LibTorch without NCCL): expected one of: auto, gloo");
  }
}

TEST(DistEnv, BadInitOptions) {
  fsdp::dist::InitOptions o;
  o.world_size = 2;
  o.rank = 2;
  EXPECT_THROW(fsdp::dist::init_process_group(o), ConfigError);
  o.rank = 0;
  o.master_addr = "";
  try {
    fsdp::dist::init_process_group(o);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("master_addr is empty"), std::string::npos) << e.what();
  }
  o.master_addr = "127.0.0.1";
  o.master_port = 0;
  EXPECT_THROW(fsdp::dist::init_process_group(o), ConfigError);
}

// Each enum's one name table: every name parses back to its value, and an
// unknown name is a ConfigError that lists the valid ones.
TEST(DistNames, BackendAndReduceOpParseTheirNames) {
  using fsdp::dist::Backend;
  using fsdp::dist::ReduceOp;
  for (auto b : {Backend::kAuto, Backend::kGloo, Backend::kNccl}) {
    EXPECT_EQ(fsdp::dist::parse_backend(fsdp::dist::backend_name(b), "backend"), b);
  }
  for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
    EXPECT_EQ(fsdp::dist::parse_reduce_op(to_string(op)), op);
  }
  EXPECT_STREQ(to_string(ReduceOp::kAvg), "avg");
  EXPECT_EQ(fsdp::dist::parse_reduce_op("mean"), ReduceOp::kAvg);  // Lightning's name
  EXPECT_EQ(fsdp::dist::parse_reduce_op("SUM"), ReduceOp::kSum);   // case-insensitive
  try {
    fsdp::dist::parse_reduce_op("median", "all_reduce");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "all_reduce: reduce op 'median' is unknown: expected one of sum, avg (or mean), max");
  }
  EXPECT_THROW(fsdp::dist::parse_backend("mpi", "backend"), ConfigError);
}
