#include "fsdp/launch/env.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "env_impl.h"
#include "fsdp/error.h"
#include "fsdp/text/enum_names.h"

namespace fsdp::launch {

namespace {

constexpr text::EnumName<Backend> kBackendNames[] = {
    {Backend::kAuto, "auto"}, {Backend::kGloo, "gloo"}, {Backend::kNccl, "nccl"}};
// In the order parse_cluster's error lists them, after "auto".
constexpr text::EnumName<Cluster> kClusterNames[] = {{Cluster::kEnv, "env"},
                                                     {Cluster::kTorchElastic, "torchelastic"},
                                                     {Cluster::kSlurm, "slurm"},
                                                     {Cluster::kMpi, "mpi"},
                                                     {Cluster::kNone, "none"}};

}  // namespace

const char* backend_name(Backend backend) { return text::name_of(kBackendNames, backend); }

Backend parse_backend(const std::string& value, const std::string& what) {
  if (auto backend = text::value_of(kBackendNames, value)) return *backend;
  throw ConfigError(what + "='" + value + "' is not a backend: expected one of " + text::list_names(kBackendNames));
}

bool backend_available(Backend backend) {
  switch (backend) {
    case Backend::kAuto:
    case Backend::kGloo:
      return true;
    case Backend::kNccl:
#ifdef FSDP_WITH_NCCL
      return true;
#else
      return false;
#endif
  }
  return false;
}

const char* cluster_name(Cluster cluster) { return text::name_of(kClusterNames, cluster); }

Cluster parse_cluster(const std::string& value, const std::string& what) {
  if (auto cluster = text::value_of(kClusterNames, value)) return *cluster;
  throw ConfigError(what + "='" + value + "' is not a cluster environment: expected one of auto, " +
                    text::list_names(kClusterNames));
}

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

namespace detail {

long parse_int(const std::string& name, const std::string& value, long lo, long hi, const std::string& expected) {
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || end == value.c_str() || *end != '\0' || errno == ERANGE) {
    throw ConfigError(name + "='" + value + "' is not a number: expected " + expected);
  }
  if (v < lo || v > hi) {
    throw ConfigError(name + "=" + value + " is out of range: expected " + expected);
  }
  return v;
}

int nodes_of(int world, int local) {
  return local > 0 ? static_cast<int>((static_cast<long long>(world) + local - 1) / local) : 1;
}

}  // namespace detail

namespace {

using detail::is_slurm_job;
using detail::kMaxInt;
using detail::nodes_of;
using detail::parse_int;
using detail::read_slurm;
using detail::Reader;

const char* const kTorchrunVars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};

std::string require(Reader& in, const std::string& name, const std::string& hint) {
  auto v = in.get(name);
  if (!v) {
    throw ConfigError("environment variable " + name + " is not set: expected " + hint +
                      " (torchrun and fsdp-run set it; with none of RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, "
                      "MASTER_ADDR, MASTER_PORT set and no SLURM or MPI job, the process runs alone as rank 0 of 1)");
  }
  return *v;
}

// MASTER_ADDR and MASTER_PORT as torchrun passes them.
void read_master(Reader& in, DistEnv& env) {
  env.master_addr = require(in, "MASTER_ADDR", "the address of rank 0, e.g. MASTER_ADDR=127.0.0.1");
  if (env.master_addr.empty()) {
    throw ConfigError("MASTER_ADDR is empty: expected the address of rank 0, e.g. 127.0.0.1");
  }
  env.master_port = static_cast<int>(parse_int(
      "MASTER_PORT", require(in, "MASTER_PORT", "the TCP port of rank 0's store, e.g. 29500"), 1, 65535,
      "a TCP port number in 1..65535"));
  env.master_addr_from = "MASTER_ADDR";
  env.master_port_from = "MASTER_PORT";
}

// An MPI launcher's rank and size, when set beside explicit RANK/WORLD_SIZE,
// must be the same job's.
void check_agrees(Reader& in, const DistEnv& env, const char* rank_var, const char* size_var) {
  auto check = [&](const char* var, int value, const char* ours) {
    auto v = in.get(var);
    if (v && *v != std::to_string(value)) {
      throw ConfigError(std::string(ours) + "=" + std::to_string(value) + " disagrees with " + var + "=" + *v +
                        ": expected " + ours + "=" + *v + " (the rank mpirun gave this process), or " + ours +
                        " and its companions unset so that fsdp-cpp reads mpirun's variables itself");
    }
  };
  check(size_var, env.world_size, "WORLD_SIZE");
  check(rank_var, env.rank, "RANK");
}

// env and torchelastic: torchrun's variables.
void read_torchrun(Reader& in, DistEnv& env) {
  env.world_size = static_cast<int>(parse_int(
      "WORLD_SIZE", require(in, "WORLD_SIZE", "the number of ranks, e.g. WORLD_SIZE=2"), 1, kMaxInt,
      "an integer >= 1"));
  const std::string ws = std::to_string(env.world_size);
  env.rank = static_cast<int>(parse_int("RANK", require(in, "RANK", "this process's rank, e.g. RANK=0"), 0,
                                        env.world_size - 1, "0 <= RANK < WORLD_SIZE=" + ws));
  env.local_world_size = in.number("LOCAL_WORLD_SIZE", 1, env.world_size,
                                   "1 <= LOCAL_WORLD_SIZE <= WORLD_SIZE=" + ws, env.world_size);
  env.local_rank = in.number("LOCAL_RANK", 0, env.local_world_size - 1,
                             "0 <= LOCAL_RANK < LOCAL_WORLD_SIZE=" + std::to_string(env.local_world_size),
                             env.rank % env.local_world_size);
  env.num_nodes = in.number("GROUP_WORLD_SIZE", 1, env.world_size, "1 <= GROUP_WORLD_SIZE <= WORLD_SIZE=" + ws,
                            nodes_of(env.world_size, env.local_world_size));
  if (env.world_size > 1 || in.has("MASTER_ADDR") || in.has("MASTER_PORT")) read_master(in, env);
  if (env.cluster == Cluster::kTorchElastic) {
    auto run_id = in.get("TORCHELASTIC_RUN_ID");
    if (!run_id) {
      throw ConfigError("FSDP_CLUSTER=torchelastic, but TORCHELASTIC_RUN_ID is not set: expected a process "
                        "started by torchrun");
    }
    env.run_id = *run_id;
    env.restart_count = in.number("TORCHELASTIC_RESTART_COUNT", 0, kMaxInt, "an integer >= 0", 0);
    // torchrun's agent serves the store at the MASTER_ADDR:MASTER_PORT it
    // exports beside this flag (torch/distributed/rendezvous.py).
    if (in.get("TORCHELASTIC_USE_AGENT_STORE") == std::optional<std::string>("True") && env.world_size > 1) {
      env.store_host = StoreHost::kLauncher;
    }
  } else if (!in.has("GROUP_RANK")) {
    // Set by hand beside an MPI launcher's: they must be the same job's. A
    // worker of fsdp-run (which sets GROUP_RANK) that mpirun started, one per
    // node, inherits the launcher's MPI rank instead: not compared here, and
    // its MPI size may be the node count (check_declared_worlds).
    check_agrees(in, env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
    check_agrees(in, env, "PMI_RANK", "PMI_SIZE");
  }
}


void read_mpi(Reader& in, DistEnv& env) {
  struct Names {
    const char *size, *rank, *local_rank, *local_size, *nodes;
  };
  const Names ompi{"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                   "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_MCA_orte_num_nodes"};
  const Names pmi{"PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", nullptr};
  const Names* n = in.has(ompi.size) ? &ompi : in.has(pmi.size) ? &pmi : nullptr;
  if (n == nullptr) {
    throw in.fail("FSDP_CLUSTER=mpi, but neither OMPI_COMM_WORLD_SIZE (Open MPI) nor PMI_SIZE (MPICH, Intel MPI) "
                  "is set: expected a process started by mpirun");
  }
  env.world_size = static_cast<int>(parse_int(n->size, *in.get(n->size), 1, kMaxInt, "an integer >= 1"));
  const std::string ws = std::to_string(env.world_size);
  auto rank = in.get(n->rank);
  if (!rank) {
    throw in.fail(std::string(n->size) + "=" + ws + ", but " + n->rank + " is not set: expected mpirun's rank");
  }
  env.rank = static_cast<int>(
      parse_int(n->rank, *rank, 0, env.world_size - 1, "0 <= " + std::string(n->rank) + " < " + n->size + "=" + ws));
  const int local_size = in.number(n->local_size, 1, env.world_size,
                                   "1 <= " + std::string(n->local_size) + " <= " + n->size + "=" + ws, 0);
  env.local_world_size = local_size > 0 ? local_size : env.world_size;
  env.local_rank = in.number(n->local_rank, 0, env.local_world_size - 1,
                             "0 <= " + std::string(n->local_rank) + " < " + std::to_string(env.local_world_size),
                             env.rank % env.local_world_size);
  env.num_nodes = n->nodes ? in.number(n->nodes, 1, env.world_size, "1 <= " + std::string(n->nodes) + " <= " +
                                                                        n->size + "=" + ws, 0)
                           : 0;
  if (env.num_nodes == 0) env.num_nodes = nodes_of(env.world_size, local_size > 0 ? local_size : env.world_size);
  if (env.world_size == 1) return;
  const std::string how = "mpirun -x MASTER_ADDR=<the host of rank 0> -x MASTER_PORT=<a free port>";
  if (auto addr = in.get("MASTER_ADDR"); addr && !addr->empty()) {
    env.master_addr = *addr;
    env.master_addr_from = "MASTER_ADDR";
  } else if (local_size == env.world_size && env.num_nodes == 1) {
    env.master_addr = "127.0.0.1";
    env.master_addr_from = std::string("every rank on this node: ") + n->local_size + " = " + n->size;
  } else {
    throw in.fail("MASTER_ADDR is not set, and nothing shows that all " + ws + " MPI ranks are on this node (" +
                  n->local_size +
                  (local_size > 0 ? "=" + std::to_string(local_size) + " of " + n->size + "=" + ws
                                  : std::string(" is not set")) +
                  "), so the address of rank 0's host cannot be derived: expected MASTER_ADDR and MASTER_PORT "
                  "passed to every rank, e.g. " + how);
  }
  auto port = in.get("MASTER_PORT");
  if (!port) {
    throw in.fail("MASTER_PORT is not set: expected the TCP port of rank 0's store passed to every rank of the " +
                  ws + " MPI ranks, e.g. " + how);
  }
  env.master_port = static_cast<int>(parse_int("MASTER_PORT", *port, 1, 65535, "a TCP port number in 1..65535"));
  env.master_port_from = "MASTER_PORT";
}

// Every scheduler variable beside the ones the world came from that
// declares a world larger than 1 must describe the world formed; else the
// job stops, naming them. (SLURM_NTASKS=1 beside OMPI_COMM_WORLD_SIZE=2
// trained as world 1, and with GROUP_RANK set Open MPI's values were not
// looked at; issue 37, item 18.) Under a node launcher (torchrun, fsdp-run,
// or RANK/WORLD_SIZE set by hand) a scheduler may have started the launcher
// once per node, so its size may be the node count instead. Where the
// scheduler started every rank itself (slurm, mpi), an MPI rank of the same
// world must be this process's rank too (mpirun inside an sbatch script
// hands every rank SLURM_PROCID=0). Hand-set RANK/WORLD_SIZE beside MPI's
// are compared by check_agrees, strictly.
void check_declared_worlds(Reader& in, const DistEnv& env) {
  const bool node_launcher = env.cluster == Cluster::kEnv || env.cluster == Cluster::kTorchElastic;
  const bool hand_set = env.cluster == Cluster::kEnv && !in.has("GROUP_RANK");
  std::string ours_size = "WORLD_SIZE", ours_rank = "RANK";
  if (env.cluster == Cluster::kSlurm) {
    ours_size = "SLURM_NTASKS";
    ours_rank = "SLURM_PROCID";
  } else if (env.cluster == Cluster::kMpi) {
    const bool ompi = in.has("OMPI_COMM_WORLD_SIZE");
    ours_size = ompi ? "OMPI_COMM_WORLD_SIZE" : "PMI_SIZE";
    ours_rank = ompi ? "OMPI_COMM_WORLD_RANK" : "PMI_RANK";
  }
  struct Declared {
    const char *size, *rank, *cluster;
  };
  std::vector<Declared> declared;
  if (env.cluster != Cluster::kSlurm && is_slurm_job(in)) declared.push_back({"SLURM_NTASKS", nullptr, "slurm"});
  if (!hand_set) {
    declared.push_back({"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "mpi"});
    declared.push_back({"PMI_SIZE", "PMI_RANK", "mpi"});
  }
  const std::string w = std::to_string(env.world_size), nodes = std::to_string(env.num_nodes);
  for (const Declared& d : declared) {
    if (d.size == ours_size) continue;
    auto v = in.get(d.size);
    if (!v) continue;
    const long size = parse_int(d.size, *v, 1, kMaxInt, "an integer >= 1");
    if (size <= 1) continue;
    const bool per_rank = size == env.world_size;
    const bool per_node = node_launcher && size == env.num_nodes;
    const std::string ours = ours_size + "=" + w + " disagrees with " + d.size + "=" + *v + ": ";
    if (!per_rank && !per_node) {
      throw in.fail(
          ours + d.size + " says the job has " + *v + " processes, but the world formed here has " + w + " rank(s)" +
          (node_launcher ? " on " + nodes + " node(s)" : std::string()) + ": expected " + d.size + "=" + w +
          (node_launcher && env.num_nodes != env.world_size
               ? " (a process per rank) or " + nodes + " (a launcher, such as torchrun or fsdp-run, per node)"
               : std::string()) +
          (node_launcher ? std::string() : std::string(", or FSDP_CLUSTER=") + d.cluster + " to form the world " +
                                               d.size + " describes") +
          "; unset the variables that are not this job's");
    }
    if (node_launcher || !per_rank || d.rank == nullptr) continue;
    auto r = in.get(d.rank);
    if (r && *r != std::to_string(env.rank)) {
      throw in.fail(ours_rank + "=" + std::to_string(env.rank) + " disagrees with " + d.rank + "=" + *r + ": " +
                    ours_size + " and " + d.size + " both say the job has " + w +
                    " processes, but not that this process is the same one of them: expected one launcher's "
                    "variables (FSDP_CLUSTER=" + d.cluster + " reads " + d.rank + "); unset the variables that are "
                    "not this job's");
    }
  }
}

// FSDP_CLUSTER=auto: the first environment whose variables are set (env.h).
Cluster detect(Reader& in) {
  bool torchrun = in.has("TORCHELASTIC_RUN_ID");
  if (torchrun) return Cluster::kTorchElastic;
  for (const char* name : kTorchrunVars) {
    if (in.has(name)) return Cluster::kEnv;
  }
  if (is_slurm_job(in)) return Cluster::kSlurm;
  if (in.has("OMPI_COMM_WORLD_SIZE") || in.has("PMI_SIZE")) return Cluster::kMpi;
  if (in.has("MASTER_ADDR") || in.has("MASTER_PORT")) return Cluster::kEnv;
  return Cluster::kNone;
}

}  // namespace

DistEnv read_dist_env(const EnvLookup& lookup) {
  DistEnv env;
  Reader in(lookup, env);
  env.cluster = Cluster::kNone;
  auto requested = in.get("FSDP_CLUSTER");
  if (requested && *requested != "auto") {
    env.cluster = parse_cluster(*requested, "FSDP_CLUSTER");
  } else {
    env.cluster = detect(in);
  }
  switch (env.cluster) {
    case Cluster::kNone: break;
    case Cluster::kEnv:
    case Cluster::kTorchElastic: read_torchrun(in, env); break;
    case Cluster::kSlurm: read_slurm(in, env); break;
    case Cluster::kMpi: read_mpi(in, env); break;
  }
  if (env.cluster != Cluster::kNone) check_declared_worlds(in, env);
  env.launched = env.cluster != Cluster::kNone;
  if (auto v = in.get("FSDP_BACKEND")) env.backend = parse_backend(*v, "FSDP_BACKEND");
  env.timeout = std::chrono::seconds(in.number("FSDP_TIMEOUT_S", 1, 7 * 24 * 3600,
                                               "a timeout in whole seconds, 1..604800",
                                               static_cast<int>(kDefaultTimeout.count() / 1000)));
  env.rendezvous_timeout = std::chrono::seconds(
      in.number("FSDP_RENDEZVOUS_TIMEOUT_S", 1, 7 * 24 * 3600, "a timeout in whole seconds, 1..604800",
                static_cast<int>(kDefaultRendezvousTimeout.count() / 1000)));
  return env;
}

std::string describe(const DistEnv& env) {
  std::ostringstream os;
  auto from = [](const std::string& how) { return how.empty() ? std::string() : " (" + how + ")"; };
  os << "cluster: " << cluster_name(env.cluster) << "\n"
     << "rank: " << env.rank << "\n"
     << "world_size: " << env.world_size << "\n"
     << "local_rank: " << env.local_rank << "\n"
     << "local_world_size: " << env.local_world_size << "\n"
     << "nodes: " << env.num_nodes << "\n";
  if (env.world_size > 1 || !env.master_addr.empty()) {
    os << "master_addr: " << env.master_addr << from(env.master_addr_from) << "\n"
       << "master_port: " << env.master_port << from(env.master_port_from) << "\n"
       << "store: "
       << (env.store_host == StoreHost::kLauncher
               ? "torchrun's agent serves it; every rank joins as a client, under a key prefix fresh for this attempt"
               : "rank 0 serves it")
       << "\n";
  } else {
    os << "store: none (one process)\n";
  }
  if (env.cluster == Cluster::kTorchElastic) {
    os << "run_id: " << env.run_id << "\n"
       << "restart_count: " << env.restart_count << "\n";
  }
  os << "backend: " << backend_name(env.backend) << "\n"
     << "variables read:";
  for (const auto& kv : env.variables_read) os << " " << kv;
  if (env.variables_read.empty()) os << " none";
  os << "\n";
  return os.str();
}

}  // namespace fsdp::launch
