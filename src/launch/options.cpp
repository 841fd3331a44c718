#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <ostream>

#include "fsdp/launch/env.h"
#include "fsdp/error.h"
#include "fsdp/launch/launcher.h"

namespace fsdp::launch {

std::string usage() {
  return R"(usage: fsdp-run [options] [--] program [args...]

Starts one worker process per local rank with torchrun's environment
(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...).

options:
  --nproc-per-node N   workers on this node (default 1)
  --nnodes N           number of nodes (default 1)
  --node-rank K        this node's index, 0 <= K < nnodes (default 0)
  --master-addr HOST   address of the node running rank 0 (default 127.0.0.1;
                       required when nnodes > 1)
  --master-port P      TCP port of rank 0's store; 0 or absent: pick a free one
                       (required when nnodes > 1)
  --max-restarts K     restart the whole worker group up to K times after a
                       failure (default 0; nnodes == 1 only: restarts across
                       nodes and elastic jobs (--nnodes MIN:MAX) are torchrun's,
                       and fsdp-run prints the torchrun command for them:
                       TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes
                       1:3 --nproc-per-node N --rdzv-backend c10d
                       --rdzv-endpoint HOST0:29400 --rdzv-id JOB
                       --rdzv-conf last_call_timeout=3,keep_alive_interval=1,
                       keep_alive_max_attempt=3 --max-restarts 3 --no-python
                       program [args...]; docs/launching.md)
  --log-dir DIR        also write each worker's output to
                       DIR/attempt_<k>/rank_<N>.log (a file that cannot be
                       written, e.g. on a full disk, is named once on stderr;
                       the output still reaches the console)
  --no-rank-prefix     print worker output as is, without "[rankN]: "
  --allocator NAME     the workers' malloc: auto (default: tcmalloc where
                       libtcmalloc-minimal4 is installed, else glibc's),
                       system (glibc's), jemalloc, tcmalloc or mimalloc
                       (Debian's libjemalloc2, libtcmalloc-minimal4,
                       libmimalloc2.0; preloaded with LD_PRELOAD)
  --stop-grace-s S     seconds between SIGTERM and SIGKILL when stopping
                       workers (default 5)
  --standalone         accepted for torchrun compatibility (single node)
  --print-env          print what fsdp-cpp reads from this environment (the
                       cluster: env, torchelastic, slurm, mpi or none; rank,
                       world, local rank and size, nodes, master address and
                       port, the variables read) and exit; e.g. under srun or
                       mpirun, to check a job before training
  -h, --help           this text

OMP_NUM_THREADS and OPENBLAS_NUM_THREADS default to cores / nproc-per-node
(at least 1) unless already set. Workers see TORCHELASTIC_RESTART_COUNT (the
attempt number, from 0).

environment read by fsdp-cpp in the workers (passed through):
  FSDP_TIMEOUT_S             timeout of each collective, in seconds (default
                             1800); the error names the collective
  FSDP_RENDEZVOUS_TIMEOUT_S  how long ranks wait for each other to join, in
                             seconds (default 180); the error names the
                             missing ranks
  FSDP_BACKEND               auto (default), gloo or nccl
  FSDP_CLUSTER               auto (default), env, torchelastic, slurm, mpi or
                             none: where a worker's rank comes from when
                             fsdp-run does not start it (docs/launching.md)
)";
}

std::string allocator_library(const std::string& name) {
  if (name == "auto") {
    // Preloading needs no more than the file: look for it where the loader does.
    for (const char* dir : {"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"}) {
      if (::access((std::string(dir) + "/libtcmalloc_minimal.so.4").c_str(), R_OK) == 0) {
        return "libtcmalloc_minimal.so.4";
      }
    }
    return "";
  }
  if (name == "system") return "";
  if (name == "jemalloc") return "libjemalloc.so.2";
  if (name == "tcmalloc") return "libtcmalloc_minimal.so.4";
  if (name == "mimalloc") return "libmimalloc.so.2";
  throw ConfigError("fsdp-run: --allocator='" + name + "' is not known: expected auto, system, jemalloc, tcmalloc or mimalloc");
}

namespace {

std::string canonical(std::string name) {
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

int parse_int(const std::string& opt, const std::string& value, long lo, long hi, const std::string& expected) {
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno == ERANGE) {
    throw ConfigError("fsdp-run: " + opt + "='" + value + "' is not a number: expected " + expected);
  }
  if (v < lo || v > hi) {
    throw ConfigError("fsdp-run: " + opt + "=" + value + " is out of range: expected " + expected);
  }
  return static_cast<int>(v);
}

// The torchrun command that runs `o`'s program on `nnodes` nodes ("N" or
// "MIN:MAX") with `restarts` restarts, through the c10d rendezvous at
// fsdp-run's master address (HOST0 when none was given) and port (29400 when
// none), its workers started as they are (--no-python). An elastic job
// ("MIN:MAX") gets the rendezvous timeouts docs/launching.md tunes (a lost
// node noticed in about 3 s instead of 15, a smaller group formed 3 s later
// instead of 30) and TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, without which
// torch 2.x's agents cannot grow the group (docs/launching.md).
std::string torchrun_command(const LaunchOptions& o, const std::string& nnodes, int restarts, bool addr_given) {
  const bool elastic = nnodes.find(':') != std::string::npos;
  std::string cmd = std::string(elastic ? "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 " : "") + "torchrun --nnodes " +
                    nnodes + " --nproc-per-node " + std::to_string(o.nproc_per_node) + " --rdzv-backend c10d --rdzv-endpoint " + (addr_given ? o.master_addr : std::string("HOST0")) +
                    ":" + std::to_string(o.master_port > 0 ? o.master_port : 29400) + " --rdzv-id JOB";
  if (elastic) {
    cmd += " --rdzv-conf last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3";
  }
  cmd += " --max-restarts " + std::to_string(restarts) + " --no-python";
  for (const auto& arg : o.command) {
    const bool plain = !arg.empty() && arg.find_first_of(" \t'\"$\\;&|<>()*?") == std::string::npos;
    cmd += " " + (plain ? arg : "'" + arg + "'");
  }
  return cmd;
}

}  // namespace

LaunchOptions parse_launch_args(const std::vector<std::string>& args) {
  LaunchOptions o;
  constexpr long kIntMax = std::numeric_limits<int>::max();
  bool addr_given = false;
  std::string elastic_nnodes;  // --nnodes MIN:MAX
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.size() < 2 || a[0] != '-') break;  // the program
    if (a == "-h" || a == "--help") {
      o.help = true;
      return o;
    }
    if (a == "--print-env" || a == "--print_env") {
      o.print_env = true;
      return o;
    }
    std::string name = a, value;
    bool has_value = false;
    if (auto eq = a.find('='); eq != std::string::npos) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      has_value = true;
    }
    name = canonical(name);
    auto flag = [&](bool& field, bool v) {
      if (has_value) throw ConfigError("fsdp-run: option " + name + " takes no value, got '" + value + "'");
      field = v;
    };
    auto take = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= args.size()) throw ConfigError("fsdp-run: option " + name + " needs a value");
      return args[++i];
    };
    if (name == "--nproc-per-node") {
      o.nproc_per_node = parse_int(name, take(), 1, 4096, "an integer in 1..4096");
    } else if (name == "--nnodes") {
      const std::string v = take();
      if (v.find(':') != std::string::npos) {
        elastic_nnodes = v;  // refused below, with the torchrun command that runs it
      } else {
        o.nnodes = parse_int(name, v, 1, 65536, "a fixed number of nodes, an integer >= 1 (no MIN:MAX)");
      }
    } else if (name == "--node-rank") {
      o.node_rank = parse_int(name, take(), 0, kIntMax, "an integer >= 0");
    } else if (name == "--master-addr") {
      o.master_addr = take();
      addr_given = true;
      if (o.master_addr.empty()) throw ConfigError("fsdp-run: --master-addr is empty: expected a host name or address");
      if (o.master_addr == "0.0.0.0" || o.master_addr == "::" || o.master_addr == "[::]") {
        o.warnings.push_back("fsdp-run: warning: --master-addr " + o.master_addr +
                             ": rank 0's store will listen on every network interface, so it is reachable from every "
                             "network this host is on; give one address of this host to limit it");
      }
    } else if (name == "--master-port") {
      o.master_port = parse_int(name, take(), 0, 65535, "a TCP port in 0..65535 (0: pick a free one)");
    } else if (name == "--max-restarts") {
      o.max_restarts = parse_int(name, take(), 0, 1000, "an integer in 0..1000");
    } else if (name == "--log-dir") {
      o.log_dir = take();
      if (o.log_dir.empty()) throw ConfigError("fsdp-run: --log-dir is empty: expected a directory");
    } else if (name == "--stop-grace-s") {
      o.stop_grace = std::chrono::seconds(parse_int(name, take(), 0, 3600, "whole seconds in 0..3600"));
    } else if (name == "--allocator") {
      o.allocator = take();
      allocator_library(o.allocator);  // a bad name is an error here, not at launch
    } else if (name == "--no-rank-prefix") {
      flag(o.rank_prefix, false);
    } else if (name == "--standalone") {
      bool ignored = false;
      flag(ignored, true);
    } else {
      throw ConfigError("fsdp-run: unknown option '" + a + "' (see fsdp-run --help)");
    }
  }
  o.command.assign(args.begin() + static_cast<long>(i), args.end());
  if (o.command.empty()) {
    throw ConfigError("fsdp-run: no program given: expected 'fsdp-run [options] -- program [args...]'");
  }
  if (!elastic_nnodes.empty()) {
    throw ConfigError("fsdp-run: --nnodes=" + elastic_nnodes +
                      ": fsdp-run runs a fixed number of nodes; an elastic job is torchrun's (its c10d rendezvous "
                      "re-forms the group when a node is lost or joins, and fsdp-train resumes from its newest "
                      "checkpoint, resharded). On every node run:\n  " +
                      torchrun_command(o, elastic_nnodes, std::max(o.max_restarts, 3), addr_given) +
                      "\n(docs/launching.md)");
  }
  if (o.node_rank >= o.nnodes) {
    throw ConfigError("fsdp-run: --node-rank=" + std::to_string(o.node_rank) +
                      " is out of range: expected 0 <= node-rank < nnodes=" + std::to_string(o.nnodes));
  }
  if (o.nnodes > 1 && o.master_port == 0) {
    throw ConfigError("fsdp-run: --master-port is required with --nnodes=" + std::to_string(o.nnodes) +
                      ": every node must use the same port");
  }
  if (o.nnodes > 1 && !addr_given) {
    throw ConfigError("fsdp-run: --master-addr is required with --nnodes=" + std::to_string(o.nnodes) +
                      ": expected the address of the node that runs rank 0");
  }
  if (o.nnodes > 1 && o.max_restarts > 0) {
    throw ConfigError("fsdp-run: --max-restarts needs --nnodes 1: fsdp-run has no elastic rendezvous to restart the "
                      "groups of several nodes together; torchrun's has. On every node run:\n  " +
                      torchrun_command(o, std::to_string(o.nnodes), o.max_restarts, addr_given) +
                      "\n(docs/launching.md)");
  }
  return o;
}

int print_env(const EnvLookup& lookup, std::ostream& out, std::ostream& err) {
  try {
    out << describe(read_dist_env(lookup));
    return 0;
  } catch (const ConfigError& e) {
    err << "fsdp-run --print-env: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace fsdp::launch
