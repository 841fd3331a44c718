#include "fsdp/dist/env.h"

#include <cerrno>
#include <cstdlib>
#include <limits>

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

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

namespace {

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

std::string require(const EnvLookup& lookup, const std::string& name, const std::string& hint) {
  auto v = lookup(name);
  if (!v) {
    throw ConfigError("environment variable " + name + " is not set: expected " + hint +
                      " (torchrun and fsdp-run set it; with none of RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, "
                      "MASTER_ADDR, MASTER_PORT set, the process runs alone as rank 0 of 1)");
  }
  return *v;
}

}  // namespace

DistEnv read_dist_env(const EnvLookup& lookup) {
  constexpr long kMaxInt = std::numeric_limits<int>::max();
  DistEnv env;
  auto read_options = [&] {
    if (auto v = lookup("FSDP_BACKEND")) {
      env.backend = parse_backend(*v, "FSDP_BACKEND");
    }
    if (auto v = lookup("FSDP_TIMEOUT_S")) {
      env.timeout = std::chrono::seconds(
          parse_int("FSDP_TIMEOUT_S", *v, 1, 7 * 24 * 3600, "a timeout in whole seconds, 1..604800"));
    }
    if (auto v = lookup("FSDP_RENDEZVOUS_TIMEOUT_S")) {
      env.rendezvous_timeout = std::chrono::seconds(parse_int("FSDP_RENDEZVOUS_TIMEOUT_S", *v, 1, 7 * 24 * 3600,
                                                              "a timeout in whole seconds, 1..604800"));
    }
  };
  // No launcher: a single process, as torch.distributed and Lightning run one.
  bool any = false;
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    any = any || lookup(name).has_value();
  }
  if (!any) {
    read_options();
    return env;
  }
  env.launched = true;
  env.world_size = static_cast<int>(parse_int(
      "WORLD_SIZE", require(lookup, "WORLD_SIZE", "the number of ranks, e.g. WORLD_SIZE=2"), 1,
      kMaxInt, "an integer >= 1"));
  const std::string ws = std::to_string(env.world_size);
  env.rank = static_cast<int>(parse_int("RANK",
                                        require(lookup, "RANK", "this process's rank, e.g. RANK=0"),
                                        0, env.world_size - 1,
                                        "0 <= RANK < WORLD_SIZE=" + ws));
  if (auto v = lookup("LOCAL_WORLD_SIZE")) {
    env.local_world_size = static_cast<int>(
        parse_int("LOCAL_WORLD_SIZE", *v, 1, env.world_size, "1 <= LOCAL_WORLD_SIZE <= WORLD_SIZE=" + ws));
  } else {
    env.local_world_size = env.world_size;
  }
  if (auto v = lookup("LOCAL_RANK")) {
    env.local_rank = static_cast<int>(
        parse_int("LOCAL_RANK", *v, 0, env.local_world_size - 1,
                  "0 <= LOCAL_RANK < LOCAL_WORLD_SIZE=" + std::to_string(env.local_world_size)));
  } else {
    env.local_rank = env.rank % env.local_world_size;
  }
  if (env.world_size > 1 || lookup("MASTER_ADDR") || lookup("MASTER_PORT")) {
    env.master_addr = require(lookup, "MASTER_ADDR", "the address of rank 0, e.g. MASTER_ADDR=127.0.0.1");
    if (env.master_addr.empty()) {
      throw ConfigError("MASTER_ADDR is empty: expected the address of rank 0, e.g. 127.0.0.1");
    }
    env.master_port = static_cast<int>(parse_int(
        "MASTER_PORT", require(lookup, "MASTER_PORT", "the TCP port of rank 0's store, e.g. 29500"),
        1, 65535, "a TCP port number in 1..65535"));
  }
  read_options();
  return env;
}

}  // namespace fsdp::dist
