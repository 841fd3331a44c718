// src/launch/env_impl.h — what env.cpp and slurm.cpp share while reading the
// job's environment (private to launch): the reader that records each
// variable it consults, the integer parser, and the SLURM reader that
// read_dist_env dispatches to. No collectives; no side effects.
#pragma once

#include <algorithm>
#include <limits>
#include <optional>
#include <string>

#include "fsdp/error.h"
#include "fsdp/launch/env.h"

namespace fsdp::launch::detail {

inline constexpr long kMaxInt = std::numeric_limits<int>::max();

// Parses a whole decimal integer in [lo, hi]; throws ConfigError naming the variable.
long parse_int(const std::string& name, const std::string& value, long lo, long hi, const std::string& expected);

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

// ceil(world / local): the node count where the launcher does not say
// (in 64 bits: WORLD_SIZE=2147483647 made it 0).
int nodes_of(int world, int local);

// SLURM_NTASKS is set and SLURM_JOB_NAME is not "bash" or "interactive"
// (slurm.cpp).
bool is_slurm_job(Reader& in);

// srun: the rank, world, node count and address from SLURM_* (env.h; slurm.cpp).
void read_slurm(Reader& in, DistEnv& env);

}  // namespace fsdp::launch::detail
