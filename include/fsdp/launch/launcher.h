// fsdp/launch/launcher.h — fsdp-run, a launcher compatible with torchrun's flags.
//
// Starts nproc_per_node worker processes of one program on this node, each with
// the environment torchrun gives (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,
// TORCHELASTIC_MAX_RESTARTS) plus OMP_NUM_THREADS and OPENBLAS_NUM_THREADS
// (cores / local workers, at least 1) unless the caller set them. It
// supervises them:
//   - each worker line is printed with a "[rankN]: " prefix (optional), and
//     copied to <log_dir>/attempt_<k>/rank_<N>.log when log_dir is set; a
//     log file that cannot be written (a full disk) is named once on the
//     launcher's stderr with the reason, and not written further: the output
//     still reaches the console, and the job's course and exit status do not
//     change (nor do they when a restart cannot create its log files; the
//     first attempt fails if it cannot);
//   - when a worker fails (non-zero exit or signal), the others get SIGTERM,
//     then SIGKILL after `stop_grace`; the failure is reported by rank, pid and
//     exit code or signal name; the group restarts up to max_restarts times;
//   - SIGINT/SIGTERM/SIGHUP to the launcher are forwarded to every worker's
//     process group (a second one kills at once); workers die with the
//     launcher (PR_SET_PDEATHSIG), and nothing a worker started in its process
//     group outlives it.
//
// Needs no LibTorch. Not thread-safe (owns SIGCHLD/SIGINT/SIGTERM/SIGHUP while
// launch() runs).
#pragma once

#include <chrono>
#include <ostream>
#include <string>
#include <vector>

#include "fsdp/launch/env.h"

namespace fsdp::launch {

struct LaunchOptions {
  int nproc_per_node = 1;           // --nproc-per-node
  int nnodes = 1;                   // --nnodes
  int node_rank = 0;                // --node-rank
  std::string master_addr = "127.0.0.1";  // --master-addr (required when nnodes > 1)
  int master_port = 0;              // --master-port; 0: a free port (nnodes == 1 only)
  int max_restarts = 0;             // --max-restarts (nnodes == 1 only)
  bool rank_prefix = true;          // --no-rank-prefix turns it off
  std::string log_dir;              // --log-dir; empty: no log files
  std::chrono::milliseconds stop_grace{5000};  // --stop-grace-s: SIGTERM -> SIGKILL
  // --allocator: "auto" (the default: tcmalloc where Debian's
  // libtcmalloc-minimal4 is installed, else glibc's malloc), "system"
  // (glibc's malloc) or jemalloc, tcmalloc, mimalloc (Debian's libjemalloc2,
  // libtcmalloc-minimal4, libmimalloc2.0), preloaded into every worker
  // (LD_PRELOAD). launch() throws ConfigError when a library named
  // explicitly is not installed. Why tcmalloc: docs/performance.md.
  std::string allocator = "auto";
  bool help = false;                // --help / -h
  // --print-env: print what fsdp-cpp reads from this process's environment
  // (describe of read_dist_env: the cluster environment, rank,
  // world, local rank and size, nodes, master address and port, the
  // variables read) and exit; no program is needed.
  bool print_env = false;
  std::vector<std::string> warnings;  // for stderr (e.g. --master-addr 0.0.0.0)
  std::vector<std::string> command; // program and its arguments
};

// The shared library --allocator NAME preloads ("" for "system"; for
// "auto", tcmalloc's where it is installed, else ""); throws ConfigError for
// an unknown name.
std::string allocator_library(const std::string& name);

// Usage text for --help.
std::string usage();

// Parses the arguments after argv[0]. Options take "--name value" or
// "--name=value"; '-' and '_' are interchangeable in names (torchrun accepts
// both). The program starts after "--" or at the first non-option argument.
// Throws fsdp::ConfigError naming the option, its value and what was expected.
LaunchOptions parse_launch_args(const std::vector<std::string>& args);

// `fsdp-run --print-env`: describe(read_dist_env(lookup)) on `out`; returns
// 0, or 2 with the ConfigError's message on `err` when the environment cannot
// form a job (a scheduler's world without an address, a bad value).
int print_env(const EnvLookup& lookup, std::ostream& out, std::ostream& err);

// Runs the worker group until every worker has ended; returns the launcher's
// exit status: 0 when all workers succeeded; the failed worker's exit code (or
// 128 + signal number) after the last allowed restart; 128 + signal number
// when the launcher itself was interrupted. Throws fsdp::ConfigError for
// options that parse but cannot be used, fsdp::Error when a system call fails.
int launch(const LaunchOptions& options);

}  // namespace fsdp::launch
