// Making process groups (fsdp/distributed/process_group.h): the rendezvous on a
// c10d store (rank 0's TCPStore, or torchrun's agent's store under a
// per-attempt prefix), the backend (Gloo bound to the interface that routes
// to MASTER_ADDR, or NCCL), subgroups and device meshes. The collectives are
// process_group.cpp.
#include "fsdp/distributed/process_group.h"

#include <ATen/ATen.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>

#ifdef FSDP_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "fsdp/error.h"
#include "process_group_impl.h"
#include "store_client.h"
#include "store_listen.h"

namespace fsdp::dist {

namespace {

// The address of the local interface that routes to `host` (how the Gloo
// device is bound so that peers can reach it); empty when it can't be found.
std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr) return "";
  std::string out;
  int fd = socket(res->ai_family, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET6_ADDRSTRLEN] = {0};
      const void* addr = local.ss_family == AF_INET
                             ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                             : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (inet_ntop(local.ss_family, addr, buf, sizeof(buf)) != nullptr) out = buf;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return out;
}

std::shared_ptr<::gloo::transport::Device> make_gloo_device(const std::string& master_addr) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  if (master_addr.empty()) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  std::string local = local_address_towards(master_addr);
  if (local.empty()) return c10d::ProcessGroupGloo::createDefaultDevice();
  return c10d::ProcessGroupGloo::createDeviceForHostname(local);
}

Backend resolve_backend(Backend requested) {
  if (requested == Backend::kAuto) {
#ifdef FSDP_WITH_NCCL
    return at::hasCUDA() ? Backend::kNccl : Backend::kGloo;
#else
    return Backend::kGloo;
#endif
  }
  if (!backend_available(requested)) {
    throw ConfigError(std::string("backend '") + backend_name(requested) +
                      "' is not built into this fsdp-cpp (LibTorch without NCCL): "
                      "expected one of: auto, gloo");
  }
  return requested;
}

// The error of a rendezvous that did not complete: group, rank, where and
// timeout, then why.
CollectiveError rendezvous_error(const std::string& name, int rank, int size, const std::string& where,
                                 std::chrono::milliseconds timeout, const std::string& why) {
  return CollectiveError("fsdp: rendezvous of group '" + name + "' (rank " + std::to_string(rank) + " of " +
                             std::to_string(size) + where + ", timeout " + format_ms(timeout) + ") failed: " + why,
                         "rendezvous");
}

// The first missing ranks of a rendezvous ("1, 2, 5" or "1, 2, ..., 16,
// ..."), found in bounded time whatever the world size: `missing` ranks of
// `size` have not set their "joined/<r>" key. One check() asks for many keys
// at once and is true only when all are there, so the ranks are bisected
// from 0 upwards, about 2 log2(1024) round trips per rank listed; the search
// stops after 16 ranks, 4096 round trips or 2 seconds. (It used to ask once
// per rank: 6.9 s for WORLD_SIZE=300000, minutes for more; issue 37, item 13.)
constexpr int64_t kListedInFull = 16;  // more missing ranks than this: their count is added

std::string first_missing(const c10::intrusive_ptr<c10d::Store>& store, int size, int64_t missing) {
  constexpr int kBatch = 1024;
  constexpr int64_t kRoundTrips = 4096;
  const auto stop = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  int64_t trips = 0;
  std::vector<int> found;
  auto keys = [](int lo, int hi) {
    std::vector<std::string> k;
    for (int r = lo; r < hi; ++r) k.push_back("joined/" + std::to_string(r));
    return k;
  };
  auto spent = [&] {
    return found.size() >= static_cast<size_t>(std::min(kListedInFull, missing)) || trips >= kRoundTrips ||
           std::chrono::steady_clock::now() >= stop;
  };
  // Appends the missing ranks of [lo, hi), lowest first, until spent().
  std::function<void(int, int)> bisect = [&](int lo, int hi) {
    if (spent()) return;
    ++trips;
    if (store->check(keys(lo, hi))) return;
    if (hi - lo == 1) {
      found.push_back(lo);
      return;
    }
    const int mid = lo + (hi - lo) / 2;
    bisect(lo, mid);
    bisect(mid, hi);
  };
  int next = 0;  // the ranks below it were searched
  while (next < size && !spent()) {
    const int hi = next + std::min(kBatch, size - next);
    bisect(next, hi);
    if (!spent()) next = hi;
  }
  std::string out;
  for (int r : found) out += (out.empty() ? "" : ", ") + std::to_string(r);
  if (static_cast<int64_t>(found.size()) < missing) {
    if (found.empty()) {
      out = next > 0 ? "none among ranks 0.." + std::to_string(next - 1) + " (the search stopped there)"
                     : std::string("not listed (the search stopped)");
    } else {
      out += ", ...";
    }
  }
  return out;
}

// Waits until every rank of the group has announced itself in `store`, so
// that a missing rank is reported by number instead of as a socket timeout.
// `while_waiting` (may be empty) runs on each pass of the wait.
void join(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout,
          const std::string& name, const std::string& rendezvous_where, const std::function<void()>& while_waiting) {
  auto fail = [&](const std::string& why) {
    return rendezvous_error(name, rank, size, rendezvous_where, timeout, why);
  };
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  try {
    store->set("joined/" + std::to_string(rank), std::vector<uint8_t>{1});
    store->add("joined", 1);
    auto pause = std::chrono::milliseconds(1);
    int64_t joined = 0;
    while ((joined = store->add("joined", 0)) < size) {
      if (while_waiting) while_waiting();
      if (std::chrono::steady_clock::now() >= deadline) {
        const int64_t missing = size - joined;
        throw fail(std::to_string(joined) + " of " + std::to_string(size) + " ranks joined; missing rank(s): " +
                   first_missing(store, size, missing) + " (" +
                   (missing > kListedInFull ? std::to_string(missing) + " missing; " : std::string()) +
                   "every rank must start and agree on the world size and address)");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
  } catch (const CollectiveError&) {
    throw;
  } catch (const std::exception& e) {
    throw fail(reason(e));
  }
}

// Creates the backend over `store`; wraps rendezvous failures.
std::unique_ptr<ProcessGroup::Impl> make_impl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                              int size, Backend backend, int local_rank,
                                              std::chrono::milliseconds timeout, const std::string& name,
                                              std::shared_ptr<::gloo::transport::Device> gloo_device,
                                              const std::string& rendezvous_where,
                                              std::chrono::milliseconds join_timeout,
                                              const std::function<void()>& while_joining = nullptr) {
  join(store, rank, size, join_timeout, name, rendezvous_where, while_joining);
  auto impl = std::make_unique<ProcessGroup::Impl>();
  impl->store = store;
  impl->backend = backend;
  impl->rank = rank;
  impl->size = size;
  impl->local_rank = local_rank;
  impl->name = name;
  impl->timeout = timeout;
  try {
    if (backend == Backend::kGloo) {
      impl->gloo_device = std::move(gloo_device);
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      opts->devices.push_back(impl->gloo_device);
      impl->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
    } else {
#ifdef FSDP_WITH_NCCL
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = timeout;
      impl->pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
      impl->device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
#endif
    }
  } catch (const std::exception& e) {
    throw rendezvous_error(name, rank, size, rendezvous_where, timeout,
                           reason(e) +
                               " (every rank must start and join; check that all ranks run and "
                               "agree on the world size and address)");
  }
  return impl;
}

// LibTorch 2.x's TCPStoreOptions::masterListenFd, where this LibTorch has it.
template <class Options, class = void>
struct HasListenFd : std::false_type {};
template <class Options>
struct HasListenFd<Options, std::void_t<decltype(std::declval<Options&>().masterListenFd)>> : std::true_type {};

template <class Options>
void pass_listen_socket(Options& so, detail::ListenOnly& listen_only) {
  if constexpr (HasListenFd<Options>::value) so.masterListenFd = listen_only.listen_socket();
}

}  // namespace

InitOptions InitOptions::from_env(const DistEnv& env) {
  InitOptions o;
  o.rank = env.rank;
  o.world_size = env.world_size;
  o.local_rank = env.local_rank;
  o.master_addr = env.master_addr;
  o.master_port = env.master_port;
  o.backend = env.backend;
  o.timeout = env.timeout;
  o.rendezvous_timeout = env.rendezvous_timeout;
  o.store_host = env.store_host;
  return o;
}

ProcessGroupPtr init_process_group(const InitOptions& o) {
  check(o.world_size >= 1, "init_process_group: world_size=" + std::to_string(o.world_size) +
                               " is invalid: expected >= 1");
  check(o.rank >= 0 && o.rank < o.world_size,
        "init_process_group: rank=" + std::to_string(o.rank) + " is out of range: expected 0 <= rank < world_size=" +
            std::to_string(o.world_size));
  check(o.timeout.count() > 0, "init_process_group: timeout must be positive, got " + format_ms(o.timeout));
  check(o.rendezvous_timeout.count() > 0,
        "init_process_group: rendezvous_timeout must be positive, got " + format_ms(o.rendezvous_timeout));
  check(!o.group_name.empty(), "init_process_group: group_name must not be empty");
  const Backend backend = resolve_backend(o.backend);

  c10::intrusive_ptr<c10d::Store> store = o.store;
  std::string where;
  if (!store && o.world_size == 1) {
    store = c10::make_intrusive<c10d::HashStore>();  // nobody to meet
  } else if (!store) {
    check(!o.master_addr.empty(),
          "init_process_group: master_addr is empty: expected the address of rank 0 (MASTER_ADDR), "
          "or a store");
    check(o.master_port >= 1 && o.master_port <= 65535,
          "init_process_group: master_port=" + std::to_string(o.master_port) +
              " is not a TCP port: expected 1..65535");
    const bool launcher = o.store_host == StoreHost::kLauncher;
    where = std::string(launcher ? " through the launcher's TCPStore at " : " through the TCPStore at ") +
            o.master_addr + ":" + std::to_string(o.master_port);
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(o.master_port);
    so.isServer = o.rank == 0 && !launcher;
    so.numWorkers = static_cast<std::size_t>(o.world_size);
    so.waitWorkers = false;  // join() below waits, and names the missing ranks
    so.timeout = o.rendezvous_timeout;  // connecting; collectives' own once joined
    // Rank 0's store listens on master_addr only, not on every interface:
    // through a socket made here where LibTorch takes one (2.x), else by
    // redirecting its server's wildcard bind (1.13).
    std::optional<detail::ListenOnly> listen_only;
    if (so.isServer) listen_only.emplace(o.master_addr, o.master_port);
    try {
      if (listen_only) {
        // On this thread: 1.13's bind() redirection is per thread (store_listen.h).
        pass_listen_socket(so, *listen_only);
        store = c10::make_intrusive<c10d::TCPStore>(o.master_addr, so);
      } else {
        // TCPStore's own connect gives up after so.timeout; the grace lets its
        // error (nothing listens there) come before this one.
        const auto grace = std::min<std::chrono::milliseconds>(o.rendezvous_timeout, std::chrono::seconds(5));
        store = connect_client(o.master_addr, so, o.rendezvous_timeout + grace, launcher ? "the launcher" : "rank 0");
      }
    } catch (const Unanswered& e) {
      throw rendezvous_error(o.group_name, o.rank, o.world_size, where, o.rendezvous_timeout, e.what());
    } catch (const std::exception& e) {
      throw rendezvous_error(
          o.group_name, o.rank, o.world_size, where, o.rendezvous_timeout,
          reason(e) + (listen_only ? " (rank 0 serves the store on " + listen_only->address() +
                                         " only: is that an address of this host, is the port "
                                         "free, and did every rank start?)"
                       : launcher  ? std::string(" (is the launcher running, and MASTER_ADDR/MASTER_PORT its store's?)")
                                   : std::string(" (is rank 0 running and MASTER_ADDR/MASTER_PORT right?)")));
    }
    if (listen_only && !listen_only->applied()) {
      TORCH_WARN("fsdp: rank 0's rendezvous store on port ", o.master_port, " listens on every interface, not only on ",
                 listen_only->address(), ": this LibTorch's TCPStore bound it where fsdp-cpp cannot redirect it");
    }
  }
  // In a launcher's store, this attempt's keys live under a prefix of their own.
  c10::intrusive_ptr<c10d::Store> base = store;
  std::function<void()> while_joining;
  if (!o.store && o.world_size > 1 && o.store_host == StoreHost::kLauncher) {
    std::string attempt;
    if (o.rank == 0) {
      attempt = "fsdp/" + random_hex();
      while_joining = answer_hellos(store, o.world_size, attempt);
    } else {
      std::optional<std::string> answer;
      try {
        answer = await_attempt_prefix(store, o.rank, o.rendezvous_timeout);
      } catch (const std::exception& e) {
        throw rendezvous_error(o.group_name, o.rank, o.world_size, where, o.rendezvous_timeout, reason(e));
      }
      if (!answer) {
        throw rendezvous_error(o.group_name, o.rank, o.world_size, where, o.rendezvous_timeout,
                               "rank 0 did not hand out this attempt's key prefix (is rank 0 running, and are all "
                               "ranks of one attempt?)");
      }
      attempt = *answer;
    }
    where += ", keys under '" + attempt + "/'";
    base = c10::make_intrusive<c10d::PrefixStore>(attempt, store);
  }
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(o.group_name, base);
  std::shared_ptr<::gloo::transport::Device> device;
  if (backend == Backend::kGloo) device = make_gloo_device(o.store ? "" : o.master_addr);
  auto group = std::make_shared<ProcessGroup>(make_impl(prefixed, o.rank, o.world_size, backend, o.local_rank,
                                                        o.timeout, o.group_name, std::move(device), where,
                                                        o.rendezvous_timeout, while_joining));
  store->setTimeout(o.timeout);  // every rank has joined: store waits from now on are the collectives'
  return group;
}

ProcessGroupPtr init_process_group_from_env() {
  return init_process_group(InitOptions::from_env(read_dist_env()));
}

ProcessGroupPtr ProcessGroup::new_group(const std::vector<int>& ranks, const std::string& name) {
  const uint64_t id = impl_->groups_created++;
  const std::string what = "new_group on group '" + impl_->name + "'";
  check(!ranks.empty(), what + ": the rank list is empty");
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    check(sorted[i] >= 0 && sorted[i] < impl_->size,
          what + ": rank " + std::to_string(sorted[i]) + " is out of range: expected 0 <= rank < " +
              std::to_string(impl_->size));
    check(i == 0 || sorted[i] != sorted[i - 1], what + ": rank " + std::to_string(sorted[i]) + " is listed twice");
  }
  auto it = std::find(ranks.begin(), ranks.end(), impl_->rank);
  if (it == ranks.end()) return nullptr;
  const int sub_rank = static_cast<int>(it - ranks.begin());
  const std::string sub_name = name.empty() ? impl_->name + "/" + std::to_string(id) : name;
  auto store = c10::make_intrusive<c10d::PrefixStore>("group" + std::to_string(id), impl_->store);
  return std::make_shared<ProcessGroup>(make_impl(store, sub_rank, static_cast<int>(ranks.size()), impl_->backend,
                                                  impl_->local_rank, impl_->timeout, sub_name, impl_->gloo_device,
                                                  "", impl_->timeout));
}

DeviceMesh init_device_mesh(const ProcessGroupPtr& group, int replicate_size, int shard_size) {
  check(group != nullptr, "init_device_mesh: group is null");
  check(replicate_size >= 1 && shard_size >= 1 && replicate_size * shard_size == group->size(),
        "init_device_mesh: a (replicate=" + std::to_string(replicate_size) + ", shard=" + std::to_string(shard_size) +
            ") mesh needs " + std::to_string(replicate_size * shard_size) + " ranks, but group '" + group->name() +
            "' has " + std::to_string(group->size()));
  DeviceMesh mesh;
  mesh.replicate_size = replicate_size;
  mesh.shard_size = shard_size;
  mesh.replicate_index = group->rank() / shard_size;
  mesh.shard_index = group->rank() % shard_size;
  auto groups = mesh_groups(group, {replicate_size, shard_size}, {"replicate", "shard"});
  mesh.replicate_group = groups[0];
  mesh.shard_group = groups[1];
  return mesh;
}

std::vector<ProcessGroupPtr> mesh_groups(const ProcessGroupPtr& group, const std::vector<int>& shape,
                                         const std::vector<std::string>& names) {
  check(group != nullptr, "init_device_mesh: group is null");
  std::string dims;
  int64_t ranks = 1;
  bool positive = true;
  for (size_t d = 0; d < shape.size(); ++d) {
    dims += (d ? ", " : "") + (d < names.size() ? names[d] + "=" : std::string()) + std::to_string(shape[d]);
    ranks *= shape[d];
    positive = positive && shape[d] >= 1;
  }
  check(names.size() == shape.size(), "init_device_mesh: " + std::to_string(shape.size()) + " dimensions (" + dims +
                                          ") but " + std::to_string(names.size()) + " names");
  check(!shape.empty() && positive && ranks == group->size(),
        "init_device_mesh: a (" + dims + ") mesh needs " + std::to_string(ranks) + " ranks, but group '" +
            group->name() + "' has " + std::to_string(group->size()));
  const int nd = static_cast<int>(shape.size());
  std::vector<int> stride(nd, 1);
  for (int d = nd - 2; d >= 0; --d) stride[d] = stride[d + 1] * shape[d + 1];
  std::vector<ProcessGroupPtr> out(nd);
  for (int d = nd - 1; d >= 0; --d) {
    // The sub-groups of dimension d: one per coordinate of the other
    // dimensions, enumerated row-major; its ranks vary coordinate d.
    const int count = group->size() / shape[d];
    for (int i = 0; i < count; ++i) {
      int base = 0, rest = i;
      for (int e = nd - 1; e >= 0; --e) {
        if (e == d) continue;
        base += (rest % shape[e]) * stride[e];
        rest /= shape[e];
      }
      std::vector<int> members;
      for (int c = 0; c < shape[d]; ++c) members.push_back(base + c * stride[d]);
      auto g = group->new_group(members, group->name() + "/" + names[d] + std::to_string(i));
      if (g) out[d] = g;
    }
  }
  return out;
}

}  // namespace fsdp::dist
