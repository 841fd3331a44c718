#include "fsdp/launch/env.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "fsdp/error.h"

namespace fsdp::dist {

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::kAuto: return "auto";
    case Backend::kGloo: return "gloo";
    case Backend::kNccl: return "nccl";
  }
  return "?";
}

Backend parse_backend(const std::string& value, const std::string& what) {
  if (value == "auto") return Backend::kAuto;
  if (value == "gloo") return Backend::kGloo;
  if (value == "nccl") return Backend::kNccl;
  throw ConfigError(what + "='" + value +
                    "' is not a backend: expected one of auto, gloo, nccl");
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

const char* cluster_name(Cluster cluster) {
  switch (cluster) {
    case Cluster::kNone: return "none";
    case Cluster::kEnv: return "env";
    case Cluster::kTorchElastic: return "torchelastic";
    case Cluster::kSlurm: return "slurm";
    case Cluster::kMpi: return "mpi";
  }
  return "?";
}

Cluster parse_cluster(const std::string& value, const std::string& what) {
  for (auto c : {Cluster::kNone, Cluster::kEnv, Cluster::kTorchElastic, Cluster::kSlurm, Cluster::kMpi}) {
    if (value == cluster_name(c)) return c;
  }
  throw ConfigError(what + "='" + value +
                    "' is not a cluster environment: expected one of auto, env, torchelastic, slurm, mpi, none");
}

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

namespace {

constexpr long kMaxInt = std::numeric_limits<int>::max();

// Parses a whole decimal integer in [lo, hi]; throws ConfigError naming the variable.
long parse_int(const std::string& name, const std::string& value, long lo, long hi,
               const std::string& expected) {
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

const char* const kTorchrunVars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};

// The environment as read_dist_env sees it: every variable consulted that is
// set is recorded (once) for describe() and for the scheduler errors.
class Reader {
 public:
  Reader(const EnvLookup& lookup, DistEnv& env) : lookup_(lookup), env_(env) {}

  std::optional<std::string> get(const std::string& name) {
    auto v = lookup_(name);
    if (v) {
      const std::string kv = name + "=" + *v;
      auto& read = env_.variables_read;
      if (std::find(read.begin(), read.end(), kv) == read.end()) read.push_back(kv);
    }
    return v;
  }
  bool has(const std::string& name) { return get(name).has_value(); }

  // An integer variable in [lo, hi], or `fallback` when unset.
  int number(const std::string& name, long lo, long hi, const std::string& expected, int fallback) {
    auto v = get(name);
    return v ? static_cast<int>(parse_int(name, *v, lo, hi, expected)) : fallback;
  }

  // A ConfigError for a scheduler's job that cannot be formed: `what`, then
  // the variables read so far.
  ConfigError fail(const std::string& what) const {
    std::string read;
    for (const auto& kv : env_.variables_read) read += (read.empty() ? "" : ", ") + kv;
    return ConfigError(what + " (" + cluster_name(env_.cluster) + " variables read: " +
                       (read.empty() ? std::string("none") : read) + ")");
  }

 private:
  const EnvLookup& lookup_;
  DistEnv& env_;
};

std::string require(Reader& in, const std::string& name, const std::string& hint) {
  auto v = in.get(name);
  if (!v) {
    throw ConfigError("environment variable " + name + " is not set: expected " + hint +
                      " (torchrun and fsdp-run set it; with none of RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, "
                      "MASTER_ADDR, MASTER_PORT set and no SLURM or MPI job, the process runs alone as rank 0 of 1)");
  }
  return *v;
}

// ceil(world / local): the node count where the launcher does not say
// (in 64 bits: WORLD_SIZE=2147483647 made it 0).
int nodes_of(int world, int local) {
  return local > 0 ? static_cast<int>((static_cast<long long>(world) + local - 1) / local) : 1;
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

constexpr size_t kMaxHosts = 1000000;

// A bracketed range of a node list: lo..hi, zero-padded to `width`.
struct NodeRange {
  long lo = 0, hi = 0;
  size_t width = 0;
};
// A part of one comma-free item: literal text, or (ranges non-empty) a
// bracket ("gpu-[01-04,07]x": "gpu-", [01-04,07], "x").
struct NodePart {
  std::string text;
  std::vector<NodeRange> ranges;
};

// A node list, parsed and checked but not expanded.
struct NodeList {
  std::vector<std::vector<NodePart>> items;
  size_t hosts = 0;  // how many it names; at most kMaxHosts
};

// Parses and checks `list` and counts its hosts before any is made, so that
// a list of 40 ranges of a million hosts fails at once, naming the variable
// and the limit (it used to expand first: 2.1 GB, then std::bad_alloc; issue
// 37, item 17). Memory: linear in the list's length.
NodeList parse_nodelist(const std::string& list, const std::string& what) {
  const std::string shown = list.size() > 200 ? list.substr(0, 200) + "..." : list;
  const std::string bad = what + "='" + shown + "' is not a SLURM node list (expected host names separated by "
                          "commas, each with optional [N-M,K] ranges, e.g. gpu-[01-04,07],cpu7): it has ";
  if (list.empty()) throw ConfigError(bad + "no hosts");
  std::vector<std::string> texts;
  std::string item;
  int depth = 0;
  for (char c : list) {
    if (std::isspace(static_cast<unsigned char>(c))) throw ConfigError(bad + "a space");
    if (c == '[' && ++depth > 1) throw ConfigError(bad + "nested '['");
    if (c == ']' && --depth < 0) throw ConfigError(bad + "a ']' without '['");
    if (c == ',' && depth == 0) {
      if (item.empty()) throw ConfigError(bad + "an empty host name");
      texts.push_back(std::move(item));
      item.clear();
    } else {
      item += c;
    }
  }
  if (depth != 0) throw ConfigError(bad + "an unclosed '['");
  if (item.empty()) throw ConfigError(bad + "an empty host name");
  texts.push_back(std::move(item));

  NodeList out;
  const auto over = [&] { return ConfigError(bad + "more than 1000000 hosts, the most fsdp-cpp reads"); };
  for (const std::string& text : texts) {
    std::vector<NodePart> parts;
    size_t count = 1;  // hosts of this item: the product of its brackets' sizes
    size_t i = 0;
    while (i < text.size()) {
      if (text[i] != '[') {
        const size_t next = std::min(text.find('[', i), text.size());
        parts.push_back({text.substr(i, next - i), {}});
        i = next;
        continue;
      }
      const size_t close = text.find(']', i);
      if (close == std::string::npos) throw ConfigError(bad + "an unclosed '['");
      const std::string body = text.substr(i + 1, close - i - 1);
      if (body.empty()) throw ConfigError(bad + "an empty range '[]'");
      NodePart part;
      size_t size = 0;
      std::stringstream ss(body);
      std::string range;
      while (std::getline(ss, range, ',')) {
        const size_t dash = range.find('-');
        const std::string lo = range.substr(0, dash);
        const std::string hi = dash == std::string::npos ? lo : range.substr(dash + 1);
        auto digits = [](const std::string& d) {
          return !d.empty() && d.size() <= 9 &&
                 std::all_of(d.begin(), d.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
        };
        if (!digits(lo) || !digits(hi)) {
          throw ConfigError(bad + "the range '" + range + "': expected N or N-M of up to 9 digits");
        }
        const long a = std::stol(lo), z = std::stol(hi);
        if (a > z) throw ConfigError(bad + "the range '" + range + "': expected N <= M");
        size += static_cast<size_t>(z - a + 1);  // at most kMaxHosts + 10^9: no overflow
        if (size > kMaxHosts) throw over();
        part.ranges.push_back({a, z, lo.size()});
      }
      if (body.back() == ',') throw ConfigError(bad + "an empty range in '[" + body + "]'");
      count *= size;  // both <= kMaxHosts: no overflow in 64 bits
      if (count > kMaxHosts) throw over();
      parts.push_back(std::move(part));
      i = close + 1;
    }
    out.hosts += count;
    if (out.hosts > kMaxHosts) throw over();
    out.items.push_back(std::move(parts));
  }
  return out;
}

// A range's k-th number, zero-padded to its width.
std::string number_of(const NodeRange& r, long k) {
  std::string s = std::to_string(k);
  if (s.size() < r.width) s.insert(0, r.width - s.size(), '0');
  return s;
}

// The first host of a parsed list.
std::string first_host(const NodeList& list) {
  std::string host;
  for (const NodePart& part : list.items.front()) {
    host += part.ranges.empty() ? part.text : number_of(part.ranges.front(), part.ranges.front().lo);
  }
  return host;
}

bool is_slurm_job(Reader& in) {
  if (!in.has("SLURM_NTASKS")) return false;
  auto name = in.get("SLURM_JOB_NAME");
  return !(name && (*name == "bash" || *name == "interactive"));
}

// This node's entry of SLURM_TASKS_PER_NODE ("2(x3),1": 2 tasks on each of
// nodes 0-2, 1 on node 3). Throws ConfigError naming the variable for text
// that is not such a list, or one with no entry for `node` (SLURM_NODEID).
int tasks_on_node(Reader& in, const std::string& spec, int node) {
  const std::string bad = "SLURM_TASKS_PER_NODE='" + spec + "' is not SLURM's tasks per node: expected counts "
                          "separated by commas, each with an optional (xN) repeat, e.g. 2(x3),1";
  auto number = [&](const std::string& text, const std::string& what) {
    const bool digits = !text.empty() && text.size() <= 9 &&
                        std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
    const long v = digits ? std::stol(text) : 0;
    if (v < 1) throw in.fail(bad + " (" + what + " '" + text + "' is not a number >= 1)");
    return v;
  };
  long first = 0;
  int found = 0;
  size_t at = 0;
  while (at <= spec.size()) {
    size_t comma = spec.find(',', at);
    if (comma == std::string::npos) comma = spec.size();
    const std::string item = spec.substr(at, comma - at);
    const size_t open = item.find('(');
    long repeat = 1;
    if (open != std::string::npos) {
      if (item.size() < open + 4 || item.compare(open, 2, "(x") != 0 || item.back() != ')') {
        throw in.fail(bad + " (the entry '" + item + "')");
      }
      repeat = number(item.substr(open + 2, item.size() - open - 3), "the repeat");
    }
    const long count = number(item.substr(0, open), "the count");
    if (found == 0 && node >= first && node < first + repeat) found = static_cast<int>(std::min<long>(count, kMaxInt));
    first = std::min<long>(first + repeat, kMaxInt);
    at = comma + 1;
  }
  if (found == 0) {
    throw in.fail(bad + " (it lists " + std::to_string(first) + " node(s), none for SLURM_NODEID=" +
                  std::to_string(node) + ")");
  }
  return found;
}

void read_slurm(Reader& in, DistEnv& env) {
  auto ntasks = in.get("SLURM_NTASKS");
  if (!ntasks) throw in.fail("FSDP_CLUSTER=slurm, but SLURM_NTASKS is not set: expected a task started by srun");
  env.world_size = static_cast<int>(parse_int("SLURM_NTASKS", *ntasks, 1, kMaxInt, "an integer >= 1"));
  const std::string ws = std::to_string(env.world_size);
  auto procid = in.get("SLURM_PROCID");
  if (!procid && env.world_size > 1) {
    throw in.fail("SLURM_NTASKS=" + ws + " says this job has " + ws +
                  " tasks, but SLURM_PROCID is not set, so this process is not one of them: expected the tasks "
                  "started by srun (srun fsdp-train ...); to run one process alone in a batch script or salloc "
                  "shell, set FSDP_CLUSTER=none");
  }
  env.rank = procid ? static_cast<int>(parse_int("SLURM_PROCID", *procid, 0, env.world_size - 1,
                                                 "0 <= SLURM_PROCID < SLURM_NTASKS=" + ws))
                    : 0;
  // The node lists: each one set is checked, even when an earlier one or
  // MASTER_ADDR is used instead; the first set names the address. Counted,
  // never expanded.
  std::optional<NodeList> hosts;
  std::string list_var;
  for (const char* var : {"SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"}) {
    if (auto v = in.get(var)) {
      NodeList parsed = parse_nodelist(*v, var);
      if (!hosts) {
        hosts = std::move(parsed);
        list_var = var;
      }
    }
  }
  int nodes = in.number("SLURM_NNODES", 1, env.world_size, "1 <= SLURM_NNODES <= SLURM_NTASKS=" + ws, 0);
  if (nodes == 0) nodes = in.number("SLURM_JOB_NUM_NODES", 1, kMaxInt, "an integer >= 1", 0);
  if (nodes == 0) nodes = !hosts ? 1 : static_cast<int>(std::min<size_t>(hosts->hosts, env.world_size));
  env.num_nodes = nodes;
  int local_size = in.number("SLURM_NTASKS_PER_NODE", 1, env.world_size,
                             "1 <= SLURM_NTASKS_PER_NODE <= SLURM_NTASKS=" + ws, 0);
  // Checked whenever set, used when SLURM_NTASKS_PER_NODE is not.
  if (auto spec = in.get("SLURM_TASKS_PER_NODE")) {
    const int node = in.number("SLURM_NODEID", 0, kMaxInt, "an integer >= 0", 0);
    const int on_node = std::min(tasks_on_node(in, *spec, node), env.world_size);
    if (local_size == 0) local_size = on_node;
  }
  if (local_size == 0) local_size = nodes_of(env.world_size, nodes);
  env.local_world_size = local_size;
  env.local_rank = in.number("SLURM_LOCALID", 0, local_size - 1,
                             "0 <= SLURM_LOCALID < " + std::to_string(local_size) + " (tasks on this node)",
                             env.rank % local_size);
  if (env.world_size == 1) return;
  if (auto addr = in.get("MASTER_ADDR"); addr && !addr->empty()) {
    env.master_addr = *addr;
    env.master_addr_from = "MASTER_ADDR";
  } else if (hosts) {
    env.master_addr = first_host(*hosts);
    env.master_addr_from = "first host of " + list_var;
  } else {
    throw in.fail("SLURM_NTASKS=" + ws +
                  ", but neither SLURM_NODELIST (SLURM_STEP_NODELIST, SLURM_JOB_NODELIST) nor MASTER_ADDR is set: "
                  "expected srun's node list, or MASTER_ADDR=<the host of SLURM_PROCID 0>");
  }
  if (auto port = in.get("MASTER_PORT")) {
    env.master_port = static_cast<int>(parse_int("MASTER_PORT", *port, 1, 65535, "a TCP port number in 1..65535"));
    env.master_port_from = "MASTER_PORT";
  } else if (auto job = in.get("SLURM_JOB_ID")) {
    const bool digits = !job->empty() && std::all_of(job->begin(), job->end(), [](unsigned char c) {
      return std::isdigit(c) != 0;
    });
    if (!digits) {
      throw ConfigError("SLURM_JOB_ID='" + *job + "' is not a job id: expected digits (MASTER_PORT is derived "
                        "from its last 4), or set MASTER_PORT");
    }
    env.master_port = 15000 + std::stoi(job->substr(job->size() > 4 ? job->size() - 4 : 0));
    env.master_port_from = "15000 + the last 4 digits of SLURM_JOB_ID";
  } else {
    env.master_port = 12910;
    env.master_port_from = "12910 (no SLURM_JOB_ID; Lightning's default)";
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

std::vector<std::string> expand_slurm_nodelist(const std::string& list, const std::string& what) {
  const NodeList parsed = parse_nodelist(list, what);
  std::vector<std::string> hosts;
  hosts.reserve(parsed.hosts);
  for (const auto& item : parsed.items) {
    std::vector<std::string> partial{""};
    for (const NodePart& part : item) {
      if (part.ranges.empty()) {
        for (auto& p : partial) p += part.text;
        continue;
      }
      std::vector<std::string> next;
      for (const auto& p : partial) {
        for (const NodeRange& r : part.ranges) {
          for (long k = r.lo; k <= r.hi; ++k) next.push_back(p + number_of(r, k));
        }
      }
      partial = std::move(next);
    }
    hosts.insert(hosts.end(), partial.begin(), partial.end());
  }
  return hosts;
}

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

}  // namespace fsdp::dist
