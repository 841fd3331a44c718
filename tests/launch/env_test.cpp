// Reading the job from torchrun's environment, and the errors for bad values.
#include <gtest/gtest.h>

#include <map>
#include <thread>
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "fsdp/launch/env.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/error.h"
#include "../support/sockets.h"

using fsdp::ConfigError;
using fsdp::launch::read_dist_env;

namespace {

fsdp::launch::EnvLookup env_of(std::map<std::string, std::string> vars) {
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
  EXPECT_EQ(env.backend, fsdp::launch::Backend::kAuto);
  EXPECT_EQ(env.timeout, fsdp::launch::kDefaultTimeout);
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
  EXPECT_EQ(env.backend, fsdp::launch::Backend::kGloo);
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
            "set and no SLURM or MPI job, the process runs alone as rank 0 of 1)");
  EXPECT_EQ(error_of(with("WORLD_SIZE", "two")), "WORLD_SIZE='two' is not a number: expected an integer >= 1");
  EXPECT_EQ(error_of(with("MASTER_ADDR", "<unset>")),
            "environment variable MASTER_ADDR is not set: expected the address of rank 0, e.g. "
            "MASTER_ADDR=127.0.0.1 (torchrun and fsdp-run set it; with none of RANK, WORLD_SIZE, LOCAL_RANK, "
            "LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT set and no SLURM or MPI job, the process runs alone as rank 0 "
            "of 1)");
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
  EXPECT_LE(fsdp::launch::kDefaultRendezvousTimeout, std::chrono::minutes(5));
  EXPECT_EQ(read_dist_env(env_of(good())).rendezvous_timeout, fsdp::launch::kDefaultRendezvousTimeout);
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
    o.backend = fsdp::launch::Backend::kGloo;
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
  if (fsdp::launch::backend_available(fsdp::launch::Backend::kNccl)) GTEST_SKIP() << "this build has NCCL";
  fsdp::dist::InitOptions o;
  o.backend = fsdp::launch::Backend::kNccl;
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
  using fsdp::launch::Backend;
  using fsdp::dist::ReduceOp;
  for (auto b : {Backend::kAuto, Backend::kGloo, Backend::kNccl}) {
    EXPECT_EQ(fsdp::launch::parse_backend(fsdp::launch::backend_name(b), "backend"), b);
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
  EXPECT_THROW(fsdp::launch::parse_backend("mpi", "backend"), ConfigError);
}

// ---------------------------------------------------------------------------
// Cluster environments (issue 29): SLURM node lists, detection, the errors.

namespace {

std::string join_hosts(const std::vector<std::string>& hosts) {
  std::string s;
  for (const auto& h : hosts) s += (s.empty() ? "" : " ") + h;
  return s;
}

}  // namespace

TEST(SlurmNodeList, ExpandsCompressedLists) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"node1", "node1"},
      {"a,b", "a b"},
      {"node[1-3]", "node1 node2 node3"},
      {"gpu-[01-04,07],cpu7", "gpu-01 gpu-02 gpu-03 gpu-04 gpu-07 cpu7"},
      {"n[08-10]", "n08 n09 n10"},                    // padding: the first number's width
      {"n[9-11]", "n9 n10 n11"},                      // no padding
      {"n[007]", "n007"},                              // one number
      {"n[1,3,5]", "n1 n3 n5"},
      {"rack[1-2]-n[8-9]", "rack1-n8 rack1-n9 rack2-n8 rack2-n9"},  // two ranges: every pair
      {"[1-2]x", "1x 2x"},
      {"a-b.example.com,c[1-2].example.com", "a-b.example.com c1.example.com c2.example.com"},
      {"127.0.0.1", "127.0.0.1"},
      {"localhost", "localhost"},
      {"x[0-0]", "x0"},
  };
  for (const auto& [list, want] : cases) {
    try {
      EXPECT_EQ(join_hosts(fsdp::launch::expand_slurm_nodelist(list, "SLURM_NODELIST")), want) << list;
    } catch (const ConfigError& e) {
      ADD_FAILURE() << list << ": " << e.what();
    }
  }
  EXPECT_EQ(fsdp::launch::expand_slurm_nodelist("n[1-1000]", "L").size(), 1000u);
}

TEST(SlurmNodeList, MalformedListsNameTheVariableAndTheValue) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "no hosts"},
      {"a,,b", "an empty host name"},
      {",a", "an empty host name"},
      {"a,", "an empty host name"},
      {"node[1-3", "an unclosed '['"},
      {"node1-3]", "a ']' without '['"},
      {"node[[1-3]]", "nested '['"},
      {"node[]", "an empty range '[]'"},
      {"node[3-1]", "the range '3-1': expected N <= M"},
      {"node[a-b]", "the range 'a-b': expected N or N-M of up to 9 digits"},
      {"node[1-]", "the range '1-': expected N or N-M"},
      {"node[-2]", "the range '-2': expected N or N-M"},
      {"node[1,,2]", "the range '': expected N or N-M"},
      {"node[1,2,]", "an empty range in '[1,2,]'"},
      {"node[1-2-3]", "the range '1-2-3'"},
      {"host0 host1", "a space"},
      {"n[1-9999999]x[1-999]", "more than 1000000 hosts"},
      {"n[0-999999,0-999999]", "more than 1000000 hosts, the most fsdp-cpp reads"},
      {"n[0-999],m[1-999999]", "more than 1000000 hosts"},
      {"n[1234567890]", "of up to 9 digits"},
  };
  for (const auto& [list, why] : cases) {
    try {
      auto hosts = fsdp::launch::expand_slurm_nodelist(list, "SLURM_JOB_NODELIST");
      ADD_FAILURE() << "'" << list << "' was accepted: " << join_hosts(hosts);
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("SLURM_JOB_NODELIST='" + list + "' is not a SLURM node list (expected host names "
                                "separated by commas, each with optional [N-M,K] ranges, e.g. gpu-[01-04,07],cpu7): "
                                "it has ",
                           0),
                0u)
          << what;
      EXPECT_NE(what.find(why), std::string::npos) << list << ": " << what;
    }
  }
}

// A node list of 40 ranges of a million hosts each is refused before any
// host is made, naming the variable and the limit. Before the fix (issue 37,
// item 17): each bracket was expanded before the count was checked: 2.1 GB,
// and under `ulimit -v` a bare std::bad_alloc.
TEST(SlurmNodeList, AHugeListIsCountedBeforeItIsExpanded) {
  std::string list = "n[";
  for (int i = 0; i < 40; ++i) list += std::string(i ? "," : "") + "0-999999";
  list += "]";
  const auto t0 = std::chrono::steady_clock::now();
  for (const char* var : {"SLURM_NODELIST", "SLURM_STEP_NODELIST"}) {
    std::string what;
    try {
      if (std::string(var) == "SLURM_NODELIST") {
        fsdp::launch::expand_slurm_nodelist(list, var);
      } else {
        read_dist_env(env_of({{"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "0"}, {var, list}}));
      }
    } catch (const ConfigError& e) {
      what = e.what();
    }
    EXPECT_EQ(what.rfind(std::string(var) + "='n[0-999999,", 0), 0u) << what;
    EXPECT_NE(what.find("more than 1000000 hosts, the most fsdp-cpp reads"), std::string::npos) << what;
    EXPECT_LT(what.size(), 600u) << "the value is shown shortened";
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
  // The address of a large list that is within the limit is its first host.
  auto env = read_dist_env(env_of({{"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "1"}, {"SLURM_NODELIST", "gpu[0007-999999]"}}));
  EXPECT_EQ(env.master_addr, "gpu0007");
  EXPECT_EQ(env.num_nodes, 2);
}

// WORLD_SIZE=2147483647 is one node of that many ranks. Before the fix
// (issue 37): `fsdp-run --print-env` showed "nodes: 0" (ceil(world / local)
// overflowed int).
TEST(DistEnv, TheLargestWorldSizeHasItsNodeCount) {
  auto env = read_dist_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2147483647"}, {"MASTER_ADDR", "h"},
                                   {"MASTER_PORT", "29500"}}));
  EXPECT_EQ(env.num_nodes, 1);
  EXPECT_NE(fsdp::launch::describe(env).find("\nnodes: 1\n"), std::string::npos) << fsdp::launch::describe(env);
  env = read_dist_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2147483647"}, {"LOCAL_WORLD_SIZE", "2147483646"},
                              {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}}));
  EXPECT_EQ(env.num_nodes, 2);
}

namespace {

// One detection case: the variables, then what read_dist_env must find (or
// the text its ConfigError must contain).
struct Detect {
  std::map<std::string, std::string> vars;
  std::string cluster;
  int rank, world, local_rank, local_world, nodes;
  std::string addr;
  int port;
  std::string error;  // non-empty: the error expected instead
};

}  // namespace

TEST(ClusterEnv, DetectsEachEnvironmentInOrder) {
  const std::map<std::string, std::string> slurm2 = {
      {"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "1"}, {"SLURM_LOCALID", "1"}, {"SLURM_NNODES", "1"},
      {"SLURM_NODELIST", "localhost"}, {"SLURM_JOB_ID", "4242"}};
  auto with = [](std::map<std::string, std::string> m, std::map<std::string, std::string> more) {
    for (auto& [k, v] : more) m[k] = v;
    return m;
  };
  const std::map<std::string, std::string> ompi2 = {
      {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"MASTER_PORT", "29600"}};
  const std::vector<Detect> cases = {
      {{}, "none", 0, 1, 0, 1, 1, "", 0, ""},
      {good(), "env", 3, 4, 1, 2, 2, "10.1.2.3", 29500, ""},
      {with(good(), {{"GROUP_WORLD_SIZE", "2"}, {"TORCHELASTIC_RUN_ID", "job7"}}), "torchelastic", 3, 4, 1, 2, 2,
       "10.1.2.3", 29500, ""},
      // torchrun's variables come first, also inside a SLURM or MPI job (torchrun under srun).
      {with(slurm2, good()), "env", 3, 4, 1, 2, 2, "10.1.2.3", 29500, ""},
      {slurm2, "slurm", 1, 2, 1, 2, 1, "localhost", 19242, ""},
      {with(slurm2, {{"SLURM_JOB_ID", "1234567"}}), "slurm", 1, 2, 1, 2, 1, "localhost", 19567, ""},
      {with(slurm2, {{"MASTER_PORT", "29555"}, {"MASTER_ADDR", "10.0.0.9"}}), "slurm", 1, 2, 1, 2, 1, "10.0.0.9", 29555,
       ""},
      {with(slurm2, {{"SLURM_JOB_NODELIST", "gpu-[01-04,07],cpu7"}, {"SLURM_NODELIST", "gpu-[03-04]"},
                     {"SLURM_NNODES", "2"}, {"SLURM_NTASKS_PER_NODE", "1"}, {"SLURM_LOCALID", "0"}}),
       "slurm", 1, 2, 0, 1, 2, "gpu-03", 19242, ""},
      {with(slurm2, {{"SLURM_NTASKS", "5"}, {"SLURM_PROCID", "4"}, {"SLURM_LOCALID", "0"}, {"SLURM_NNODES", "3"},
                     {"SLURM_TASKS_PER_NODE", "2(x2),1"}, {"SLURM_NODEID", "2"}, {"SLURM_NODELIST", "n[1-3]"}}),
       "slurm", 4, 5, 0, 1, 3, "n1", 19242, ""},
      {with(slurm2, {{"SLURM_JOB_ID", "<unset>"}}), "slurm", 1, 2, 1, 2, 1, "localhost", 12910, ""},
      {{{"SLURM_NTASKS", "1"}}, "slurm", 0, 1, 0, 1, 1, "", 0, ""},
      // Lightning's opt-out: a job named bash or interactive is no srun launch.
      {with(slurm2, {{"SLURM_JOB_NAME", "interactive"}}), "none", 0, 1, 0, 1, 1, "", 0, ""},
      {ompi2, "mpi", 1, 2, 1, 2, 1, "127.0.0.1", 29600, ""},
      {with(ompi2, {{"MASTER_ADDR", "10.0.0.5"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_MCA_orte_num_nodes", "2"}}),
       "mpi", 1, 2, 0, 1, 2, "10.0.0.5", 29600, ""},
      {{{"PMI_SIZE", "4"}, {"PMI_RANK", "2"}, {"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "2"},
        {"MASTER_ADDR", "h0"}, {"MASTER_PORT", "1234"}},
       "mpi", 2, 4, 0, 2, 2, "h0", 1234, ""},
      // SLURM before MPI (srun --mpi=pmi2 sets PMI_* too).
      {with(slurm2, {{"PMI_SIZE", "2"}, {"PMI_RANK", "1"}}), "slurm", 1, 2, 1, 2, 1, "localhost", 19242, ""},
      // FSDP_CLUSTER picks one.
      {with(with(slurm2, ompi2), {{"FSDP_CLUSTER", "mpi"}}), "mpi", 1, 2, 1, 2, 1, "127.0.0.1", 29600, ""},
      {with(slurm2, {{"FSDP_CLUSTER", "none"}}), "none", 0, 1, 0, 1, 1, "", 0, ""},
      {with(slurm2, {{"SLURM_JOB_NAME", "bash"}, {"FSDP_CLUSTER", "slurm"}}), "slurm", 1, 2, 1, 2, 1, "localhost",
       19242, ""},
      // The errors, each naming the variable and what was expected.
      {{{"SLURM_NTASKS", "2"}}, "", 0, 0, 0, 0, 0, "", 0,
       "SLURM_NTASKS=2 says this job has 2 tasks, but SLURM_PROCID is not set, so this process is not one of them: "
       "expected the tasks started by srun (srun fsdp-train ...); to run one process alone in a batch script or "
       "salloc shell, set FSDP_CLUSTER=none (slurm variables read: SLURM_NTASKS=2)"},
      {with(slurm2, {{"SLURM_NODELIST", "<unset>"}}), "", 0, 0, 0, 0, 0, "", 0,
       "SLURM_NTASKS=2, but neither SLURM_NODELIST (SLURM_STEP_NODELIST, SLURM_JOB_NODELIST) nor MASTER_ADDR is set: "
       "expected srun's node list, or MASTER_ADDR=<the host of SLURM_PROCID 0> (slurm variables read: "
       "SLURM_NTASKS=2, SLURM_PROCID=1, SLURM_NNODES=1, SLURM_LOCALID=1)"},
      {with(slurm2, {{"SLURM_PROCID", "2"}}), "", 0, 0, 0, 0, 0, "", 0,
       "SLURM_PROCID=2 is out of range: expected 0 <= SLURM_PROCID < SLURM_NTASKS=2"},
      {with(slurm2, {{"SLURM_PROCID", "one"}}), "", 0, 0, 0, 0, 0, "", 0,
       "SLURM_PROCID='one' is not a number: expected 0 <= SLURM_PROCID < SLURM_NTASKS=2"},
      {with(slurm2, {{"SLURM_NTASKS", "0"}}), "", 0, 0, 0, 0, 0, "", 0,
       "SLURM_NTASKS=0 is out of range: expected an integer >= 1"},
      {with(slurm2, {{"SLURM_NODELIST", "gpu-[01-"}}), "", 0, 0, 0, 0, 0, "", 0,
       "SLURM_NODELIST='gpu-[01-' is not a SLURM node list"},
      {with(slurm2, {{"SLURM_LOCALID", "2"}}), "", 0, 0, 0, 0, 0, "", 0,
       "SLURM_LOCALID=2 is out of range: expected 0 <= SLURM_LOCALID < 2 (tasks on this node)"},
      {with(slurm2, {{"SLURM_JOB_ID", "12a"}}), "", 0, 0, 0, 0, 0, "", 0,
       "SLURM_JOB_ID='12a' is not a job id: expected digits (MASTER_PORT is derived from its last 4), or set "
       "MASTER_PORT"},
      {with(ompi2, {{"MASTER_PORT", "<unset>"}}), "", 0, 0, 0, 0, 0, "", 0,
       "MASTER_PORT is not set: expected the TCP port of rank 0's store passed to every rank of the 2 MPI ranks, "
       "e.g. mpirun -x MASTER_ADDR=<the host of rank 0> -x MASTER_PORT=<a free port> (mpi variables read: "
       "OMPI_COMM_WORLD_SIZE=2, OMPI_COMM_WORLD_RANK=1, OMPI_COMM_WORLD_LOCAL_SIZE=2, OMPI_COMM_WORLD_LOCAL_RANK=1)"},
      {with(ompi2, {{"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}}), "", 0, 0, 0, 0, 0, "",
       0,
       "MASTER_ADDR is not set, and nothing shows that all 2 MPI ranks are on this node "
       "(OMPI_COMM_WORLD_LOCAL_SIZE=1 of OMPI_COMM_WORLD_SIZE=2), so the address of rank 0's host cannot be "
       "derived: expected MASTER_ADDR and MASTER_PORT passed to every rank, e.g. mpirun -x MASTER_ADDR=<the host "
       "of rank 0> -x MASTER_PORT=<a free port>"},
      {{{"OMPI_COMM_WORLD_SIZE", "2"}}, "", 0, 0, 0, 0, 0, "", 0,
       "OMPI_COMM_WORLD_SIZE=2, but OMPI_COMM_WORLD_RANK is not set: expected mpirun's rank"},
      {with(ompi2, {{"OMPI_COMM_WORLD_RANK", "2"}}), "", 0, 0, 0, 0, 0, "", 0,
       "OMPI_COMM_WORLD_RANK=2 is out of range: expected 0 <= OMPI_COMM_WORLD_RANK < OMPI_COMM_WORLD_SIZE=2"},
      {with(good(), {{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}}), "", 0, 0, 0, 0, 0, "", 0,
       "RANK=3 disagrees with OMPI_COMM_WORLD_RANK=2: expected RANK=2 (the rank mpirun gave this process), or RANK "
       "and its companions unset so that fsdp-cpp reads mpirun's variables itself"},
      {with(good(), {{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "8"}}), "", 0, 0, 0, 0, 0, "", 0,
       "WORLD_SIZE=4 disagrees with OMPI_COMM_WORLD_SIZE=8"},
      {with(good(), {{"PMI_RANK", "0"}, {"PMI_SIZE", "4"}}), "", 0, 0, 0, 0, 0, "", 0,
       "RANK=3 disagrees with PMI_RANK=0"},
      // fsdp-run's workers (GROUP_RANK), fsdp-run started by mpirun on each node: the MPI rank is the node's.
      {with(good(), {{"GROUP_RANK", "1"}, {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}), "env", 3, 4,
       1, 2, 2, "10.1.2.3", 29500, ""},
      // Every scheduler variable that declares a world larger than 1 agrees with the world formed (issue 37,
      // item 18). Before the fix: SLURM_NTASKS=1 beside OMPI_COMM_WORLD_SIZE=2 trained as world 1, and with
      // GROUP_RANK set Open MPI's and SLURM's sizes were not looked at.
      {{{"SLURM_NTASKS", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"}}, "", 0, 0, 0, 0, 0, "", 0,
       "SLURM_NTASKS=1 disagrees with OMPI_COMM_WORLD_SIZE=2: OMPI_COMM_WORLD_SIZE says the job has 2 processes, but "
       "the world formed here has 1 rank(s): expected OMPI_COMM_WORLD_SIZE=1, or FSDP_CLUSTER=mpi to form the world "
       "OMPI_COMM_WORLD_SIZE describes; unset the variables that are not this job's (slurm variables read: "
       "SLURM_NTASKS=1, OMPI_COMM_WORLD_SIZE=2)"},
      {with(ompi2, {{"SLURM_NTASKS", "1"}, {"FSDP_CLUSTER", "mpi"}}), "mpi", 1, 2, 1, 2, 1, "127.0.0.1", 29600, ""},
      {with(slurm2, {{"PMI_SIZE", "4"}, {"PMI_RANK", "1"}}), "", 0, 0, 0, 0, 0, "", 0,
       "SLURM_NTASKS=2 disagrees with PMI_SIZE=4"},
      // mpirun inside an sbatch script: every rank has the batch step's SLURM_PROCID=0.
      {with(slurm2, {{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                     {"OMPI_COMM_WORLD_RANK", "1"}}),
       "", 0, 0, 0, 0, 0, "", 0,
       "SLURM_PROCID=0 disagrees with OMPI_COMM_WORLD_RANK=1: SLURM_NTASKS and OMPI_COMM_WORLD_SIZE both say the job "
       "has 2 processes, but not that this process is the same one of them: expected one launcher's variables "
       "(FSDP_CLUSTER=mpi reads OMPI_COMM_WORLD_RANK)"},
      {with(good(), {{"GROUP_RANK", "1"}, {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "3"}}), "", 0, 0, 0,
       0, 0, "", 0,
       "WORLD_SIZE=4 disagrees with OMPI_COMM_WORLD_SIZE=3: OMPI_COMM_WORLD_SIZE says the job has 3 processes, but "
       "the world formed here has 4 rank(s) on 2 node(s): expected OMPI_COMM_WORLD_SIZE=4 (a process per rank) or 2 "
       "(a launcher, such as torchrun or fsdp-run, per node)"},
      {with(good(), {{"GROUP_RANK", "0"}, {"GROUP_WORLD_SIZE", "1"}, {"SLURM_NTASKS", "3"}}), "", 0, 0, 0, 0, 0, "",
       0, "WORLD_SIZE=4 disagrees with SLURM_NTASKS=3"},
      {with(good(), {{"TORCHELASTIC_RUN_ID", "j"}, {"GROUP_RANK", "1"}, {"PMI_SIZE", "8"}, {"PMI_RANK", "1"}}), "", 0,
       0, 0, 0, 0, "", 0, "WORLD_SIZE=4 disagrees with PMI_SIZE=8"},
      // ... but a launcher per node, or one process per rank, is one job.
      {with(good(), {{"TORCHELASTIC_RUN_ID", "j"}, {"GROUP_RANK", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "1"}}),
       "torchelastic", 3, 4, 1, 2, 2, "10.1.2.3", 29500, ""},
      {with(good(), {{"GROUP_RANK", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "0"}}), "env", 3, 4, 1, 2, 2,
       "10.1.2.3", 29500, ""},
      {with(good(), {{"SLURM_NTASKS", "8"}, {"SLURM_JOB_NAME", "interactive"}}), "env", 3, 4, 1, 2, 2, "10.1.2.3",
       29500, ""},
      // SLURM_TASKS_PER_NODE and every node list set are checked (issue 37). Before the fix: garbage in
      // SLURM_TASKS_PER_NODE was ignored, and SLURM_NODELIST was not read when SLURM_STEP_NODELIST was set.
      {with(slurm2, {{"SLURM_TASKS_PER_NODE", "2(x3"}}), "", 0, 0, 0, 0, 0, "", 0,
       "SLURM_TASKS_PER_NODE='2(x3' is not SLURM's tasks per node: expected counts separated by commas, each with an "
       "optional (xN) repeat, e.g. 2(x3),1 (the entry '2(x3')"},
      {with(slurm2, {{"SLURM_TASKS_PER_NODE", "two"}}), "", 0, 0, 0, 0, 0, "", 0,
       "SLURM_TASKS_PER_NODE='two' is not SLURM's tasks per node"},
      {with(slurm2, {{"SLURM_TASKS_PER_NODE", "2(x1)"}, {"SLURM_NODEID", "1"}}), "", 0, 0, 0, 0, 0, "", 0,
       "(it lists 1 node(s), none for SLURM_NODEID=1)"},
      {with(slurm2, {{"SLURM_TASKS_PER_NODE", "2,"}}), "", 0, 0, 0, 0, 0, "", 0, "(the count '' is not a number >= 1)"},
      {with(slurm2, {{"SLURM_STEP_NODELIST", "n7"}, {"SLURM_NODELIST", "gpu-[01-"}}), "", 0, 0, 0, 0, 0, "", 0,
       "SLURM_NODELIST='gpu-[01-' is not a SLURM node list"},
      {with(slurm2, {{"SLURM_STEP_NODELIST", "n7"}, {"SLURM_JOB_NODELIST", "a b"}}), "", 0, 0, 0, 0, 0, "", 0,
       "SLURM_JOB_NODELIST='a b' is not a SLURM node list"},
      {with(slurm2, {{"SLURM_STEP_NODELIST", "n[7-8]"}, {"SLURM_TASKS_PER_NODE", "1(x2)"}, {"SLURM_NODEID", "1"},
                     {"SLURM_LOCALID", "0"}}),
       "slurm", 1, 2, 0, 1, 1, "n7", 19242, ""},
      {{{"FSDP_CLUSTER", "slurm"}}, "", 0, 0, 0, 0, 0, "", 0,
       "FSDP_CLUSTER=slurm, but SLURM_NTASKS is not set: expected a task started by srun"},
      {{{"FSDP_CLUSTER", "mpi"}}, "", 0, 0, 0, 0, 0, "", 0, "FSDP_CLUSTER=mpi, but neither OMPI_COMM_WORLD_SIZE"},
      {with(good(), {{"FSDP_CLUSTER", "torchelastic"}}), "", 0, 0, 0, 0, 0, "", 0,
       "FSDP_CLUSTER=torchelastic, but TORCHELASTIC_RUN_ID is not set"},
      {{{"FSDP_CLUSTER", "k8s"}}, "", 0, 0, 0, 0, 0, "", 0,
       "FSDP_CLUSTER='k8s' is not a cluster environment: expected one of auto, env, torchelastic, slurm, mpi, none"},
      {{{"FSDP_CLUSTER", "env"}}, "", 0, 0, 0, 0, 0, "", 0, "environment variable WORLD_SIZE is not set"},
      {{{"MASTER_ADDR", "h"}}, "", 0, 0, 0, 0, 0, "", 0, "environment variable WORLD_SIZE is not set"},
  };
  for (const auto& c : cases) {
    std::string vars;
    std::map<std::string, std::string> set;
    for (const auto& [k, v] : c.vars) {
      if (v != "<unset>") set[k] = v;
    }
    for (const auto& [k, v] : set) vars += k + "=" + v + " ";
    if (!c.error.empty()) {
      const std::string got = error_of(set);
      EXPECT_NE(got.find(c.error), std::string::npos) << vars << "\n  got:  " << got << "\n  want: " << c.error;
      continue;
    }
    try {
      auto env = read_dist_env(env_of(set));
      EXPECT_EQ(fsdp::launch::cluster_name(env.cluster), c.cluster) << vars;
      EXPECT_EQ(env.launched, c.cluster != "none") << vars;
      EXPECT_EQ(env.rank, c.rank) << vars;
      EXPECT_EQ(env.world_size, c.world) << vars;
      EXPECT_EQ(env.local_rank, c.local_rank) << vars;
      EXPECT_EQ(env.local_world_size, c.local_world) << vars;
      EXPECT_EQ(env.num_nodes, c.nodes) << vars;
      EXPECT_EQ(env.master_addr, c.addr) << vars;
      EXPECT_EQ(env.master_port, c.port) << vars;
      EXPECT_EQ(env.store_host, fsdp::launch::StoreHost::kRank0) << vars;
    } catch (const ConfigError& e) {
      ADD_FAILURE() << vars << ": " << e.what();
    }
  }
}

// torchrun's agent serves the store when it says so; describe() shows where
// everything came from (fsdp-run --print-env prints it).
TEST(ClusterEnv, TorchrunAgentStoreAndDescribe) {
  auto vars = good();
  vars["TORCHELASTIC_RUN_ID"] = "job7";
  vars["TORCHELASTIC_RESTART_COUNT"] = "2";
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  auto env = read_dist_env(env_of(vars));
  EXPECT_EQ(env.cluster, fsdp::launch::Cluster::kTorchElastic);
  EXPECT_EQ(env.store_host, fsdp::launch::StoreHost::kLauncher);
  EXPECT_EQ(env.run_id, "job7");
  EXPECT_EQ(env.restart_count, 2);
  EXPECT_EQ(fsdp::dist::InitOptions::from_env(env).store_host, fsdp::launch::StoreHost::kLauncher);
  const std::string text = fsdp::launch::describe(env);
  for (const char* line :
       {"cluster: torchelastic\n", "rank: 3\n", "world_size: 4\n", "local_rank: 1\n", "local_world_size: 2\n",
        "nodes: 2\n", "master_addr: 10.1.2.3 (MASTER_ADDR)\n", "master_port: 29500 (MASTER_PORT)\n",
        "store: torchrun's agent serves it", "run_id: job7\n", "restart_count: 2\n",
        "variables read: TORCHELASTIC_RUN_ID=job7 WORLD_SIZE=4 RANK=3 LOCAL_WORLD_SIZE=2 LOCAL_RANK=1 "
        "MASTER_ADDR=10.1.2.3 MASTER_PORT=29500 TORCHELASTIC_RESTART_COUNT=2 TORCHELASTIC_USE_AGENT_STORE=True\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << " not in:\n" << text;
  }
  // Only "True" (torch's own test) hands the store to the agent.
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_EQ(read_dist_env(env_of(vars)).store_host, fsdp::launch::StoreHost::kRank0);
  vars["TORCHELASTIC_RESTART_COUNT"] = "-1";
  EXPECT_EQ(error_of(vars), "TORCHELASTIC_RESTART_COUNT=-1 is out of range: expected an integer >= 0");
  std::map<std::string, std::string> slurm = {{"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "0"},
                                              {"SLURM_NODELIST", "n[1-2]"}, {"SLURM_JOB_ID", "77"}};
  const std::string s = fsdp::launch::describe(read_dist_env(env_of(slurm)));
  EXPECT_NE(s.find("master_addr: n1 (first host of SLURM_NODELIST)\n"), std::string::npos) << s;
  EXPECT_NE(s.find("master_port: 15077 (15000 + the last 4 digits of SLURM_JOB_ID)\n"), std::string::npos) << s;
  EXPECT_NE(s.find("nodes: 2\n"), std::string::npos) << s;
  EXPECT_NE(s.find("store: rank 0 serves it\n"), std::string::npos) << s;
  for (auto c : {fsdp::launch::Cluster::kNone, fsdp::launch::Cluster::kEnv, fsdp::launch::Cluster::kTorchElastic,
                 fsdp::launch::Cluster::kSlurm, fsdp::launch::Cluster::kMpi}) {
    EXPECT_EQ(fsdp::launch::parse_cluster(fsdp::launch::cluster_name(c), "FSDP_CLUSTER"), c);
  }
}

namespace {

// Ranks as threads joining a store that someone else serves, as torchrun's
// workers join their agent's: each attempt's all-reduce of rank+1.
double attempt_sum(int world, int port, const std::vector<int>& ranks, std::chrono::milliseconds rendezvous,
                   std::vector<std::string>* errors = nullptr) {
  std::vector<std::thread> threads;
  std::vector<double> sums(world, -1);
  std::mutex mu;
  for (int r : ranks) {
    threads.emplace_back([&, r] {
      try {
        fsdp::dist::InitOptions o;
        o.rank = r;
        o.world_size = world;
        o.master_addr = "127.0.0.1";
        o.master_port = port;
        o.backend = fsdp::launch::Backend::kGloo;
        o.store_host = fsdp::launch::StoreHost::kLauncher;
        o.rendezvous_timeout = rendezvous;
        o.timeout = std::chrono::seconds(30);
        auto pg = fsdp::dist::init_process_group(o);
        auto t = at::full({1}, static_cast<double>(r + 1), at::kDouble);
        pg->all_reduce(t).wait();
        sums[r] = t.item<double>();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        if (errors) errors->push_back(e.what());
        else ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return sums[ranks.front()];
}

}  // namespace

// torchrun's agent store outlives a restart: the keys of the attempt before
// (its Gloo addresses, its join count) are still in it. Each attempt agrees
// on a fresh key prefix through the store, whatever TORCHELASTIC_RESTART_COUNT
// says (nothing here sets it).
TEST(AgentStore, EachAttemptJoinsUnderAFreshPrefix) {
  const int port = fsdp::testing::free_port();
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(port);
  so.isServer = true;
  so.waitWorkers = false;
  so.timeout = std::chrono::seconds(30);
  auto agent = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);  // the "agent"
  auto prefix_of = [&](int rank) {
    auto v = agent->get("fsdp/attempt/ack/" + std::to_string(rank));
    std::string s(v.begin(), v.end());
    return s.substr(s.find(' ') + 1);
  };
  EXPECT_EQ(attempt_sum(2, port, {0, 1}, std::chrono::seconds(30)), 3.0);
  const std::string first = prefix_of(1);
  EXPECT_EQ(first.rfind("fsdp/", 0), 0u) << first;
  EXPECT_TRUE(agent->check({first + "/world/joined"}));
  // The restart: a new group over the same store, with the old keys in it.
  EXPECT_EQ(attempt_sum(2, port, {0, 1}, std::chrono::seconds(30)), 3.0);
  EXPECT_NE(prefix_of(1), first);
  // An attempt in which rank 1 came alone (rank 0 died before starting): it
  // names rank 0, and leaves a hello behind that the next attempt ignores.
  std::vector<std::string> errors;
  attempt_sum(2, port, {1}, std::chrono::seconds(1), &errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("rendezvous of group 'world' (rank 1 of 2 through the launcher's TCPStore at "
                           "127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[0].find("rank 0 did not hand out this attempt's key prefix"), std::string::npos) << errors[0];
  // A bigger world after a resize, ranks arriving in any order.
  EXPECT_EQ(attempt_sum(3, port, {2, 1, 0}, std::chrono::seconds(30)), 6.0);
  // No client may serve: nobody listens on a port where no launcher runs.
  errors.clear();
  attempt_sum(2, fsdp::testing::free_port(), {0}, std::chrono::seconds(1), &errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("is the launcher running"), std::string::npos) << errors[0];
  // A huge declared world: rank 0's passes over the hellos and the report of
  // the missing ranks take bounded time. Before the fix (issue 37, item 13):
  // each pass asked the store once per rank, 2,000,000 round trips here.
  errors.clear();
  const auto t0 = std::chrono::steady_clock::now();
  attempt_sum(2000000, port, {0}, std::chrono::seconds(1), &errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("1 of 2000000 ranks joined; missing rank(s): 1, 2, 3,"), std::string::npos) << errors[0];
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 8.0);
}
