// fsdp/launch/env.h — the process's place in the job, read from the environment
// its launcher or scheduler set: torchrun (and fsdp-run, Kubernetes'
// PyTorchJob), SLURM's srun, mpirun. Lightning's cluster environments
// (lightning/fabric/plugins/environments/) are the model.
//
// Which environment (FSDP_CLUSTER=auto, the default), in this order:
//   1. env / torchelastic: any of RANK, WORLD_SIZE, LOCAL_RANK,
//      LOCAL_WORLD_SIZE or TORCHELASTIC_RUN_ID is set ("torchelastic" when
//      TORCHELASTIC_RUN_ID is: torchrun started the process);
//   2. slurm: SLURM_NTASKS is set and SLURM_JOB_NAME is not "bash" or
//      "interactive" (Lightning's opt-out for hand-started processes);
//   3. mpi: OMPI_COMM_WORLD_SIZE (Open MPI) or PMI_SIZE (MPICH, Intel MPI);
//   4. env again when only MASTER_ADDR or MASTER_PORT is set (an error: the
//      rest is missing);
//   5. none: the process runs alone, rank 0 of 1 (no launcher needed, as in
//      torch.distributed).
//
// FSDP_CLUSTER=env|torchelastic|slurm|mpi|none takes that one instead ("none":
// rank 0 of 1 whatever else is set, e.g. a one-process tool in a SLURM batch
// script).
//
// Variables read, by environment:
//   env, torchelastic
//     RANK, WORLD_SIZE            required; 0 <= RANK < WORLD_SIZE
//     LOCAL_RANK, LOCAL_WORLD_SIZE optional; default RANK / WORLD_SIZE
//     GROUP_WORLD_SIZE            optional: the node count (torchrun and
//                                 fsdp-run set it); default
//                                 ceil(WORLD_SIZE / LOCAL_WORLD_SIZE)
//     MASTER_ADDR, MASTER_PORT    required when WORLD_SIZE > 1 (the TCPStore
//                                 of rank 0, which listens on MASTER_ADDR only,
//                                 so it must be an address of rank 0's host);
//                                 port in 1..65535
//     OMPI_COMM_WORLD_RANK/SIZE,  env only, without GROUP_RANK (which torchrun
//     PMI_RANK/PMI_SIZE           and fsdp-run set; mpirun may start them, one
//                                 per node): when set beside RANK/WORLD_SIZE
//                                 they must agree with them
//   torchelastic only
//     TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT (shown by describe)
//     TORCHELASTIC_USE_AGENT_STORE "True": torchrun's agent serves the store
//                                 at MASTER_ADDR:MASTER_PORT and every rank,
//                                 rank 0 too, joins it as a client
//                                 (StoreHost::kLauncher; see InitOptions)
//   slurm (srun)
//     SLURM_NTASKS                the world size
//     SLURM_PROCID                the rank, 0 <= SLURM_PROCID < SLURM_NTASKS;
//                                 required when SLURM_NTASKS > 1 (without it
//                                 the tasks were not started by srun)
//     SLURM_LOCALID               the local rank (default: the rank)
//     SLURM_NTASKS_PER_NODE, SLURM_TASKS_PER_NODE with SLURM_NODEID
//                                 the local world size ("2(x3),1": this
//                                 node's entry; checked whenever set);
//                                 default NTASKS / nodes
//     SLURM_NNODES, SLURM_JOB_NUM_NODES  the node count (default: the hosts
//                                 of the node list, else 1)
//     SLURM_STEP_NODELIST, SLURM_NODELIST, SLURM_JOB_NODELIST
//                                 MASTER_ADDR = the first host of the first
//                                 one set, unless MASTER_ADDR is set; each
//                                 one set is checked (expand_slurm_nodelist's
//                                 rules), counted but never expanded
//     SLURM_JOB_ID                MASTER_PORT = 15000 + its last 4 digits, as
//                                 Lightning's SLURMEnvironment derives it
//                                 (12910 without a job id), unless
//                                 MASTER_PORT is set
//   mpi (mpirun)
//     OMPI_COMM_WORLD_SIZE, _RANK, _LOCAL_RANK, _LOCAL_SIZE, and
//     OMPI_MCA_orte_num_nodes (Open MPI); or PMI_SIZE, PMI_RANK,
//     MPI_LOCALRANKID, MPI_LOCALNRANKS (MPICH, Intel MPI)
//     MASTER_PORT                 required when the world is larger than 1
//                                 (mpirun -x MASTER_PORT=29500)
//     MASTER_ADDR                 required unless every rank is on this node
//                                 (local size == world size: 127.0.0.1)
//   every environment
//     FSDP_BACKEND                optional: "auto" (default), "gloo", "nccl"
//     FSDP_TIMEOUT_S              optional: collective timeout in seconds
//                                 (default 1800, like PyTorch)
//     FSDP_RENDEZVOUS_TIMEOUT_S   optional: how long init_process_group waits
//                                 for every rank to join, in seconds (default
//                                 180); the error names the missing ranks (the
//                                 first 16, and their count). It bounds the
//                                 connection to the store too: one that takes
//                                 connections and never answers (rank 0
//                                 stopped) fails after it plus at most 5 s,
//                                 naming the address
// Never silent: when a scheduler's variables say the world is larger than 1
// and the job cannot be formed (no SLURM_PROCID, no address), read_dist_env
// throws a ConfigError naming the variables it read and the one to set.
// Nor does one scheduler's world hide another's: every one of SLURM_NTASKS
// (in a SLURM job, as above), OMPI_COMM_WORLD_SIZE and PMI_SIZE that is set
// beside the variables the world came from and says more than 1 must equal
// the world size, or, under a node launcher (env, torchelastic), the node
// count (torchrun or fsdp-run started once per node); where srun or mpirun
// started every rank (slurm, mpi), an MPI rank of the same world must be
// this process's rank. Else a ConfigError names both variables, e.g.
//   "SLURM_NTASKS=1 disagrees with OMPI_COMM_WORLD_SIZE=2: ...".
// No collectives; no side effects. Dependencies: the standard library only
// (fsdp-run, which links no LibTorch, uses it for --print-env).
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::launch {

// Which c10d backend carries the collectives.
enum class Backend {
  kAuto,  // NCCL when LibTorch has it and a CUDA device is present, else Gloo
  kGloo,  // Gloo over TCP, CPU tensors
  kNccl,  // NCCL, CUDA tensors (only in builds against a CUDA LibTorch)
};

// "auto", "gloo", "nccl".
const char* backend_name(Backend backend);

// Parses "auto" | "gloo" | "nccl" (case-sensitive). Throws ConfigError naming
// `what` (e.g. "FSDP_BACKEND") and the bad value otherwise.
Backend parse_backend(const std::string& value, const std::string& what);

// True when this build of fsdp-cpp can use `backend` (kAuto: always).
bool backend_available(Backend backend);

// Where the process's place in the job came from (the order above).
enum class Cluster {
  kNone,          // nothing: the process runs alone, rank 0 of 1
  kEnv,           // RANK, WORLD_SIZE, ... (fsdp-run, PyTorchJob, a script)
  kTorchElastic,  // torchrun: its variables and TORCHELASTIC_RUN_ID
  kSlurm,         // srun: SLURM_*
  kMpi,           // mpirun: OMPI_COMM_WORLD_* or PMI_*
};

// "none", "env", "torchelastic", "slurm", "mpi".
const char* cluster_name(Cluster cluster);

// Parses one of cluster_name's names. Throws ConfigError naming `what` (e.g.
// "FSDP_CLUSTER"), the bad value and the names otherwise.
Cluster parse_cluster(const std::string& value, const std::string& what);

// Who serves the rendezvous TCPStore at MASTER_ADDR:MASTER_PORT.
enum class StoreHost {
  kRank0,     // rank 0 serves it; the others connect (fsdp-run, SLURM, MPI)
  kLauncher,  // the launcher serves it (torchrun's agent): every rank connects
};

// The default timeout of every collective: 30 minutes, PyTorch's default.
inline constexpr std::chrono::milliseconds kDefaultTimeout{30 * 60 * 1000};

// The default bound on rendezvous (every rank joining the world group): 3
// minutes, so that a rank that never starts is named within minutes.
inline constexpr std::chrono::milliseconds kDefaultRendezvousTimeout{3 * 60 * 1000};

// A process's place in the job, as torchrun describes it, and where it came from.
struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int num_nodes = 1;
  std::string master_addr;  // empty only when world_size == 1
  int master_port = 0;      // 0 only when world_size == 1
  Backend backend = Backend::kAuto;
  std::chrono::milliseconds timeout = kDefaultTimeout;
  std::chrono::milliseconds rendezvous_timeout = kDefaultRendezvousTimeout;
  Cluster cluster = Cluster::kNone;
  bool launched = false;  // cluster != kNone (false: rank 0 of 1, alone)
  StoreHost store_host = StoreHost::kRank0;
  std::string run_id;     // TORCHELASTIC_RUN_ID (torchelastic), else empty
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT (torchelastic), else 0
  // How master_addr and master_port were found, e.g. "MASTER_ADDR", "first
  // host of SLURM_NODELIST", "15000 + the last 4 digits of SLURM_JOB_ID".
  std::string master_addr_from, master_port_from;
  // "NAME=value" of every variable that was consulted and set, in the order read.
  std::vector<std::string> variables_read;
};

// Reads a variable; std::nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// Reads the process environment (getenv).
EnvLookup process_env();

// Detects the environment and reads and validates its variables (above)
// through `lookup`. Throws ConfigError naming the variable, its value and
// what was expected, e.g.
//   "RANK=3 is out of range: expected 0 <= RANK < WORLD_SIZE=2".
DistEnv read_dist_env(const EnvLookup& lookup = process_env());

// The hosts of a SLURM node list, in order: comma-separated host names, each
// with any number of bracketed ranges, as SLURM compresses them:
//   "gpu-[01-04,07],cpu7" -> gpu-01 gpu-02 gpu-03 gpu-04 gpu-07 cpu7
//   "rack[1-2]-n[8-9]"    -> rack1-n8 rack1-n9 rack2-n8 rack2-n9
// A range's numbers are zero-padded to the width of its first number
// ("[08-10]": 08 09 10). Throws ConfigError naming `what` (the variable) and
// the value (its first 200 characters) for a malformed list: empty names,
// unbalanced or nested brackets, a range that is not "N" or "N-M" with
// N <= M, spaces, or more than 1,000,000 hosts, which is found by counting
// before any host is made. Cost: linear in the list's length, then in the
// hosts listed.
std::vector<std::string> expand_slurm_nodelist(const std::string& list, const std::string& what);

// What read_dist_env found, one "name: value" line each (cluster, rank,
// world_size, local_rank, local_world_size, nodes, master_addr, master_port,
// store, backend, variables read), as `fsdp-run --print-env` prints it.
std::string describe(const DistEnv& env);

}  // namespace fsdp::launch

// Deprecated: the names above in their old namespace, fsdp::dist. fsdp-cpp
// 0.1 keeps these aliases for one release; the next one removes them.
namespace fsdp::dist {
using launch::Backend;
using launch::backend_available;
using launch::backend_name;
using launch::Cluster;
using launch::cluster_name;
using launch::describe;
using launch::DistEnv;
using launch::EnvLookup;
using launch::expand_slurm_nodelist;
using launch::kDefaultRendezvousTimeout;
using launch::kDefaultTimeout;
using launch::parse_backend;
using launch::parse_cluster;
using launch::process_env;
using launch::read_dist_env;
using launch::StoreHost;
}  // namespace fsdp::dist
