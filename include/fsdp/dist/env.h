// fsdp/dist/env.h — the process's place in the job, read from the environment
// exactly as torchrun (and fsdp-run) set it.
//
// Variables read:
//   RANK, WORLD_SIZE            required once any launcher variable (these six)
//                               is set; 0 <= RANK < WORLD_SIZE. With none of
//                               them set the process runs alone: rank 0 of 1
//                               (no launcher needed, as in torch.distributed)
//   LOCAL_RANK, LOCAL_WORLD_SIZE optional; default RANK / WORLD_SIZE
//   MASTER_ADDR, MASTER_PORT    required when WORLD_SIZE > 1 (the TCPStore
//                               of rank 0, which listens on MASTER_ADDR only,
//                               so it must be an address of rank 0's host);
//                               port in 1..65535
//   FSDP_BACKEND                optional: "auto" (default), "gloo", "nccl"
//   FSDP_TIMEOUT_S              optional: collective timeout in seconds
//                               (default 1800, like PyTorch)
//   FSDP_RENDEZVOUS_TIMEOUT_S   optional: how long init_process_group waits
//                               for every rank to join, in seconds (default
//                               180); the error names the missing ranks
// No collectives; no side effects. Header-only dependencies: the standard library.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>

namespace fsdp::dist {

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

// The default timeout of every collective: 30 minutes, PyTorch's default.
inline constexpr std::chrono::milliseconds kDefaultTimeout{30 * 60 * 1000};

// The default bound on rendezvous (every rank joining the world group): 3
// minutes, so that a rank that never starts is named within minutes.
inline constexpr std::chrono::milliseconds kDefaultRendezvousTimeout{3 * 60 * 1000};

// A process's place in the job, as torchrun describes it.
struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;  // empty only when world_size == 1
  int master_port = 0;      // 0 only when world_size == 1
  Backend backend = Backend::kAuto;
  std::chrono::milliseconds timeout = kDefaultTimeout;
  std::chrono::milliseconds rendezvous_timeout = kDefaultRendezvousTimeout;
  bool launched = false;  // false: no launcher variable was set (world 1)
};

// Reads a variable; std::nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// Reads the process environment (getenv).
EnvLookup process_env();

// Reads and validates the variables above through `lookup`. Throws
// ConfigError naming the variable, its value and what was expected, e.g.
//   "RANK=3 is out of range: expected 0 <= RANK < WORLD_SIZE=2".
DistEnv read_dist_env(const EnvLookup& lookup = process_env());

}  // namespace fsdp::dist
