#include "fsdp/dist/process_group.h"

#include <ATen/ATen.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <type_traits>
#include <utility>

#ifdef FSDP_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "fsdp/error.h"
#include "store_listen.h"

namespace fsdp::dist {

// c10d's collectives live on ProcessGroup in LibTorch 1.x and on Backend in 2.x.
#if TORCH_VERSION_MAJOR >= 2
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif

namespace {

std::string format_ms(std::chrono::milliseconds ms) {
  std::ostringstream os;
  if (ms.count() % 1000 == 0) {
    os << ms.count() / 1000 << "s";
  } else {
    os << ms.count() << "ms";
  }
  return os.str();
}

// Text of an exception without c10's backtrace.
std::string reason(const std::exception& e) {
  if (auto* ce = dynamic_cast<const c10::Error*>(&e)) {
    std::string s = ce->what_without_backtrace();
    return s;
  }
  return e.what();
}

void check(bool cond, const std::string& msg) {
  if (!cond) throw ConfigError(msg);
}

bool is_low_precision(at::ScalarType s) { return s == at::kBFloat16 || s == at::kHalf; }

bool supported_dtype(at::ScalarType s) {
  switch (s) {
    case at::kFloat: case at::kDouble: case at::kBFloat16: case at::kHalf:
    case at::kLong: case at::kInt: case at::kByte: case at::kChar: case at::kBool:
      return true;
    default:
      return false;
  }
}

// Gloo in LibTorch 1.13 moves no bfloat16, int16 or bool; data movement only
// copies bytes, so move them as float16 / uint8 of the same bytes.
at::Tensor wire(const at::Tensor& t, Backend backend) {
  if (backend != Backend::kGloo) return t;
  if (t.scalar_type() == at::kBFloat16) return t.view(at::kHalf);
  if (t.scalar_type() == at::kBool) return t.view(at::kByte);
  return t;
}

// c10d's Gloo group implements the one-tensor all-gather and reduce-scatter
// itself from LibTorch 2.15 on (all_gather_single / reduce_scatter_single,
// which Backend forwards to from the older _allgather_base /
// _reduce_scatter_base names). 1.13's ProcessGroupGloo declares
// _allgather_base only to throw, so only the new names count. Whether
// ProcessGroupGloo declares one is read off the class that owns the member
// (an inherited default belongs to the base class).
template <class C, class R, class... A>
C owner_of(R (C::*)(A...));

#define FSDP_DECLARES(trait, member)                                                                       \
  template <class G, class = void>                                                                       \
  struct trait : std::false_type {};                                                                     \
  template <class G>                                                                                     \
  struct trait<G, std::void_t<decltype(owner_of(&G::member))>>                                           \
      : std::is_same<decltype(owner_of(&G::member)), G> {};
FSDP_DECLARES(DeclaresAllGatherSingle, all_gather_single)
FSDP_DECLARES(DeclaresReduceScatterSingle, reduce_scatter_single)
#undef FSDP_DECLARES

constexpr bool kGlooAllGather = DeclaresAllGatherSingle<c10d::ProcessGroupGloo>::value;
constexpr bool kGlooReduceScatter = DeclaresReduceScatterSingle<c10d::ProcessGroupGloo>::value;

// The one-tensor collectives under this LibTorch's name for them (NCCL's
// _allgather_base before 2.15).
template <class B>
c10::intrusive_ptr<c10d::Work> all_gather_single(B& pg, at::Tensor& out, at::Tensor& in) {
  if constexpr (DeclaresAllGatherSingle<B>::value || kGlooAllGather) {
    return pg.all_gather_single(out, in);
  } else {
    return pg._allgather_base(out, in);
  }
}

template <class B>
c10::intrusive_ptr<c10d::Work> reduce_scatter_single(B& pg, at::Tensor& out, at::Tensor& in,
                                                     const c10d::ReduceScatterOptions& opts) {
  if constexpr (DeclaresReduceScatterSingle<B>::value || kGlooReduceScatter) {
    return pg.reduce_scatter_single(out, in, opts);
  } else {
    return pg._reduce_scatter_base(out, in, opts);
  }
}

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

}  // namespace

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
  }
  return "?";
}

ReduceOp parse_reduce_op(const std::string& name, const std::string& what) {
  std::string n;
  for (char c : name) n += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (n == "mean") return ReduceOp::kAvg;
  for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
    if (n == to_string(op)) return op;
  }
  throw ConfigError(what + ": reduce op '" + name + "' is unknown: expected one of sum, avg (or mean), max");
}

ChunkRange chunk_range(int64_t numel, int world, int rank) {
  check(world >= 1 && rank >= 0 && rank < world && numel >= 0,
        "chunk_range: expected numel >= 0 and 0 <= rank < world, got numel=" + std::to_string(numel) +
            " world=" + std::to_string(world) + " rank=" + std::to_string(rank));
  const int64_t c = (numel + world - 1) / world;
  const int64_t begin = std::min(numel, c * rank);
  const int64_t end = std::min(numel, c * (rank + 1));
  return ChunkRange{begin, end - begin};
}

// ---------------------------------------------------------------------------
// Work

struct Work::State {
  c10::intrusive_ptr<c10d::Work> work;  // null: nothing to wait for
  std::function<void()> finish;         // local completion (copy out, reduce)
  std::string op;
  std::string where;                    // "#3 on group 'world' (rank 0 of 2, ...)"
  std::chrono::milliseconds timeout{0};
  std::mutex mu;
  bool done = false;
  std::exception_ptr error;
};

Work::Work() = default;
Work::~Work() = default;
Work::Work(const Work&) = default;
Work& Work::operator=(const Work&) = default;
Work::Work(std::shared_ptr<State> state) : state_(std::move(state)) {}

namespace {

CollectiveError collective_error(const std::string& op, const std::string& where, const std::string& why) {
  return CollectiveError("fsdp: collective " + op + " " + where + " failed: " + why +
                             " (every rank of the group must call the same collectives in the "
                             "same order; a rank that is missing, dead or out of order causes this)",
                         op);
}

}  // namespace

void Work::wait() {
  if (!state_) return;
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->error) std::rethrow_exception(state_->error);
  if (state_->done) return;
  try {
    // The backend enforces the timeout itself; the bound here is a safety net.
    if (state_->work) state_->work->wait(state_->timeout + std::chrono::seconds(30));
    if (state_->finish) state_->finish();
  } catch (const std::exception& e) {
    state_->error = std::make_exception_ptr(collective_error(state_->op, state_->where, reason(e)));
    state_->work.reset();
    state_->finish = nullptr;
    std::rethrow_exception(state_->error);
  }
  state_->done = true;
  state_->work.reset();
  state_->finish = nullptr;
}

bool Work::is_completed() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->done || state_->error) return true;
  return !state_->work || state_->work->isCompleted();
}

// ---------------------------------------------------------------------------
// ProcessGroup

struct ProcessGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;  // this group's (prefixed) store
  c10::intrusive_ptr<C10dBackend> pg;
  std::shared_ptr<::gloo::transport::Device> gloo_device;
  Backend backend = Backend::kGloo;
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  std::string name;
  std::chrono::milliseconds timeout{kDefaultTimeout};
  at::Device device{at::kCPU};
  uint64_t seq = 0;
  uint64_t groups_created = 0;
  std::atomic<uint64_t> bytes_sent{0};

  std::string where(uint64_t n) const {
    return "#" + std::to_string(n) + " on group '" + name + "' (rank " + std::to_string(rank) +
           " of " + std::to_string(size) + ", backend " + backend_name(backend) + ", timeout " +
           format_ms(timeout) + ")";
  }

  // Issues one collective. `issue` returns the backend's work (or null when
  // there is nothing to move); `finish` runs in wait() after it completed.
  Work issue(const char* op, const std::function<c10::intrusive_ptr<c10d::Work>()>& issue_fn,
             std::function<void()> finish = nullptr) {
    auto state = std::make_shared<Work::State>();
    state->op = op;
    state->where = where(++seq);
    state->timeout = timeout;
    try {
      state->work = issue_fn ? issue_fn() : c10::intrusive_ptr<c10d::Work>();
    } catch (const ConfigError&) {
      throw;
    } catch (const std::exception& e) {
      throw collective_error(op, state->where, reason(e));
    }
    state->finish = std::move(finish);
    return Work(std::move(state));
  }

  // any_device: the tensor may live elsewhere; it travels through a copy on
  // `device` (see on_device).
  void check_tensor(const char* op, const char* role, const at::Tensor& t, bool any_device = false) const {
    std::string prefix = std::string(op) + ": " + role;
    check(t.defined(), prefix + " is an undefined tensor");
    check(t.is_contiguous(), prefix + " must be contiguous");
    check(any_device || t.device().type() == device.type(),
          prefix + " is on " + t.device().str() + ", expected " + device.str() + " for backend " +
              backend_name(backend));
    check(supported_dtype(t.scalar_type()),
          prefix + " has unsupported dtype " + std::string(c10::toString(t.scalar_type())));
  }

  // `t` itself when it lives on the backend's device type, else a copy there.
  at::Tensor on_device(const at::Tensor& t) const {
    return t.device().type() == device.type() ? t : t.to(device);
  }

  // The output and input of a two-tensor collective: valid, and one dtype.
  void check_pair(const char* op, const at::Tensor& output, const at::Tensor& input) const {
    check_tensor(op, "output", output);
    check_tensor(op, "input", input);
    check(output.scalar_type() == input.scalar_type(),
          std::string(op) + ": output dtype " + c10::toString(output.scalar_type()) + " differs from input dtype " +
              c10::toString(input.scalar_type()));
  }

  // `chunk` must hold this rank's chunk of a buffer of `whole` elements.
  void check_chunk(const char* op, const char* chunk_role, const at::Tensor& chunk, const char* whole_role,
                   int64_t whole) const {
    const int64_t expected = chunk_range(whole, size, rank).numel;
    check(chunk.numel() == expected,
          std::string(op) + ": " + chunk_role + " has " + std::to_string(chunk.numel()) + " elements, expected " +
              std::to_string(expected) + " (rank " + std::to_string(rank) + "'s chunk of an " + whole_role + " of " +
              std::to_string(whole) + " over " + std::to_string(size) + " ranks)");
  }

  void check_reduce(const char* op, const at::Tensor& t, ReduceOp rop) const {
    check(t.scalar_type() != at::kBool, std::string(op) + ": cannot reduce bool tensors");
    check(rop != ReduceOp::kAvg || at::isFloatingType(t.scalar_type()),
          std::string(op) + ": ReduceOp::kAvg needs a floating-point tensor, got " +
              c10::toString(t.scalar_type()));
  }
};

namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  return op == ReduceOp::kMax ? c10d::ReduceOp(c10d::ReduceOp::MAX) : c10d::ReduceOp(c10d::ReduceOp::SUM);
}

// The error of a rendezvous that did not complete: group, rank, where and
// timeout, then why.
CollectiveError rendezvous_error(const std::string& name, int rank, int size, const std::string& where,
                                 std::chrono::milliseconds timeout, const std::string& why) {
  return CollectiveError("fsdp: rendezvous of group '" + name + "' (rank " + std::to_string(rank) + " of " +
                             std::to_string(size) + where + ", timeout " + format_ms(timeout) + ") failed: " + why,
                         "rendezvous");
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
    while (store->add("joined", 0) < size) {
      if (while_waiting) while_waiting();
      if (std::chrono::steady_clock::now() >= deadline) {
        std::string missing;
        int listed = 0, count = 0;
        for (int r = 0; r < size; ++r) {
          if (store->check({"joined/" + std::to_string(r)})) continue;
          ++count;
          if (listed++ < 16) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
        if (listed > 16) missing += ", ...";
        throw fail(std::to_string(size - count) + " of " + std::to_string(size) +
                   " ranks joined; missing rank(s): " + missing +
                   " (every rank must start and agree on the world size and address)");
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

// A random 64-bit value in hex: a nonce no earlier attempt used.
std::string random_hex() {
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
               static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
               (static_cast<uint64_t>(::getpid()) << 17);
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string to_text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

// The key prefix of this attempt in a launcher's store (StoreHost::kLauncher).
//
// torchrun's agent (torch 2.x, TORCHELASTIC_USE_AGENT_STORE=True) serves one
// TCPStore for the whole job: it outlives restarts and rendezvous rounds, so
// the keys that an earlier attempt's workers wrote (their Gloo addresses, the
// join counter) are still there when a restarted attempt starts. Measured
// with torch 2.15: its own Python workers, which use the same keys in every
// attempt ("default_pg/..."), failed 2 of 3 restarts with "Gloo
// connectFullMesh failed ... Connection refused" (the dead attempt's
// address). TORCHELASTIC_RESTART_COUNT is no fix for several nodes: each
// agent counts its own restarts (an agent that joined later counts fewer),
// and a restart for a joining node (num_nodes_waiting) counts none at all.
//
// So the ranks agree on a fresh prefix through the store itself: rank 0
// draws a random one (prefix), each other rank r draws a random nonce, sets
// "fsdp/attempt/hello/<r>" to it and waits until "fsdp/attempt/ack/<r>" reads
// "<nonce> <prefix>"; rank 0 answers every hello it has not answered yet
// until all ranks have joined under the prefix (join's while_waiting, below).
// An answer to a stale hello (a dead attempt's) is never read; a stale
// answer never carries a live rank's nonce. It relies on what torchrun
// guarantees: the workers of an attempt start after every worker of the
// attempt before has been stopped, and each rank is one process.
// Returns the prefix on ranks other than 0 (nullopt when rank 0 did not
// answer within `timeout`); rank 0 calls answer_hellos.
std::optional<std::string> await_attempt_prefix(const c10::intrusive_ptr<c10d::Store>& base, int rank,
                                                std::chrono::milliseconds timeout) {
  const std::string nonce = random_hex();
  const std::string ack = "fsdp/attempt/ack/" + std::to_string(rank);
  base->set("fsdp/attempt/hello/" + std::to_string(rank), std::vector<uint8_t>(nonce.begin(), nonce.end()));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  while (true) {
    if (base->check({ack})) {
      const std::string v = to_text(base->get(ack));
      if (v.size() > nonce.size() + 1 && v.compare(0, nonce.size() + 1, nonce + " ") == 0) {
        return v.substr(nonce.size() + 1);
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

// Rank 0's side: one pass over the hellos of ranks 1..size-1.
std::function<void()> answer_hellos(const c10::intrusive_ptr<c10d::Store>& base, int size, const std::string& prefix) {
  auto answered = std::make_shared<std::vector<std::string>>(static_cast<size_t>(size));
  return [base, size, prefix, answered] {
    for (int r = 1; r < size; ++r) {
      const std::string hello = "fsdp/attempt/hello/" + std::to_string(r);
      if (!base->check({hello})) continue;
      std::string nonce = to_text(base->get(hello));
      if (nonce == (*answered)[r]) continue;
      const std::string v = nonce + " " + prefix;
      base->set("fsdp/attempt/ack/" + std::to_string(r), std::vector<uint8_t>(v.begin(), v.end()));
      (*answered)[r] = std::move(nonce);
    }
  };
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
      if (listen_only) pass_listen_socket(so, *listen_only);
      store = c10::make_intrusive<c10d::TCPStore>(o.master_addr, so);
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

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() {
#if defined(FSDP_WITH_NCCL) && (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2))
  // PyTorch 2.x's NCCL group runs watchdog threads until it is shut down
  // (destroy_process_group() in Python); ending them here, before the group's
  // memory goes, is what that call does.
  if (impl_ && impl_->backend == Backend::kNccl && impl_->pg) {
    try {
      static_cast<c10d::ProcessGroupNCCL*>(impl_->pg.get())->shutdown();
    } catch (const std::exception&) {
      // shutting down a broken group: nothing more to do
    }
  }
#endif
}

int ProcessGroup::rank() const { return impl_->rank; }
int ProcessGroup::size() const { return impl_->size; }
const std::string& ProcessGroup::name() const { return impl_->name; }
Backend ProcessGroup::backend() const { return impl_->backend; }
std::chrono::milliseconds ProcessGroup::timeout() const { return impl_->timeout; }
at::Device ProcessGroup::device() const { return impl_->device; }
uint64_t ProcessGroup::sequence_number() const { return impl_->seq; }
uint64_t ProcessGroup::bytes_sent() const { return impl_->bytes_sent.load(); }
bool ProcessGroup::native_all_gather() const {
  return impl_->backend == Backend::kNccl || (impl_->backend == Backend::kGloo && kGlooAllGather);
}
bool ProcessGroup::native_reduce_scatter() const {
  return impl_->backend == Backend::kNccl || (impl_->backend == Backend::kGloo && kGlooReduceScatter);
}

Work ProcessGroup::all_gather(const at::Tensor& output, const at::Tensor& input) {
  const char* op = "all_gather";
  impl_->check_pair(op, output, input);
  const int n = impl_->size;
  const int64_t total = output.numel();
  impl_->check_chunk(op, "input", input, "output", total);
  at::Tensor out = output.view({-1});
  at::Tensor in = input.view({-1});
  const int64_t c = (total + n - 1) / n;
  if (n == 1 || c == 0) {
    return impl_->issue(op, nullptr, [out, in] { out.copy_(in); });
  }
  const Backend b = impl_->backend;
  impl_->bytes_sent += static_cast<uint64_t>((n - 1) * c * output.element_size());
  if (total == c * n && native_all_gather()) {
    return impl_->issue(op, [&] {
      at::Tensor o = wire(out, b), i = wire(in, b);
      return all_gather_single(*impl_->pg, o, i);
    });
  }
  // Gloo (or uneven sizes): gather equal chunks of c elements into a padded
  // buffer; when the output is exactly n*c long, into the output itself.
  const bool direct = total == c * n;
  at::Tensor staging = direct ? out : at::empty({c * n}, out.options());
  at::Tensor padded_in = in;
  if (in.numel() != c) {
    padded_in = at::zeros({c}, in.options());
    padded_in.narrow(0, 0, in.numel()).copy_(in);
  }
  std::function<void()> finish;
  if (!direct) finish = [out, staging, total] { out.copy_(staging.narrow(0, 0, total)); };
  return impl_->issue(
      op,
      [&] {
        std::vector<at::Tensor> outs;
        at::Tensor w = wire(staging, b);
        for (int r = 0; r < n; ++r) outs.push_back(w.narrow(0, r * c, c));
        std::vector<std::vector<at::Tensor>> outputs{outs};
        std::vector<at::Tensor> inputs{wire(padded_in, b)};
        return impl_->pg->allgather(outputs, inputs);
      },
      std::move(finish));
}

Work ProcessGroup::reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp rop) {
  const char* op = "reduce_scatter";
  impl_->check_pair(op, output, input);
  impl_->check_reduce(op, input, rop);
  const int n = impl_->size;
  const int64_t total = input.numel();
  impl_->check_chunk(op, "output", output, "input", total);
  const ChunkRange mine = chunk_range(total, n, impl_->rank);
  at::Tensor out = output.view({-1});
  at::Tensor in = input.view({-1});
  if (n == 1 || total == 0) {
    return impl_->issue(op, nullptr, [out, in] { out.copy_(in); });
  }
  const Backend b = impl_->backend;
  impl_->bytes_sent += static_cast<uint64_t>((total - mine.numel) * input.element_size());
  // The backend's own reduce-scatter for equal chunks: NCCL's for every
  // dtype (16-bit floats reduced by NCCL itself, as PyTorch's FSDP does),
  // Gloo's (LibTorch 2.15 on) for 32- and 64-bit numbers. Neither is asked
  // for an average (a sum, divided here). Gloo's 16-bit floats take the path
  // below, which accumulates them in float32.
  const bool native_dtype =
      in.scalar_type() != at::kBool && (b == Backend::kNccl || !is_low_precision(in.scalar_type()));
  if (native_reduce_scatter() && total == n * mine.numel && native_dtype) {
    std::function<void()> finish;
    if (rop == ReduceOp::kAvg) finish = [out, n] { out.div_(n); };
    return impl_->issue(
        op,
        [&] {
          c10d::ReduceScatterOptions opts;
          opts.reduceOp = to_c10d(rop == ReduceOp::kAvg ? ReduceOp::kSum : rop);
          at::Tensor o = out, i = in;
          return reduce_scatter_single(*impl_->pg, o, i, opts);
        },
        std::move(finish));
  }
  // Received rows: one chunk from each rank, reduced locally (in float32 for
  // 16-bit floats, so the result does not depend on the order of arrival).
  const int64_t k = mine.numel;
  at::Tensor staging = at::empty({n * k}, in.options());
  auto finish = [out, staging, n, k, rop] {
    at::Tensor rows = staging.view({n, k});
    if (is_low_precision(rows.scalar_type())) rows = rows.to(at::kFloat);
    at::Tensor red = rop == ReduceOp::kMax ? std::get<0>(rows.max(0)) : rows.sum(0);
    if (rop == ReduceOp::kAvg) red = red / n;
    out.copy_(red);
  };
  return impl_->issue(
      op,
      [&] {
        std::vector<int64_t> in_splits(n), out_splits(n, k);
        for (int r = 0; r < n; ++r) in_splits[r] = chunk_range(total, n, r).numel;
        at::Tensor o = wire(staging, b), i = wire(in, b);
        return impl_->pg->alltoall_base(o, i, out_splits, in_splits);
      },
      finish);
}

Work ProcessGroup::all_reduce(const at::Tensor& tensor, ReduceOp rop) {
  const char* op = "all_reduce";
  impl_->check_tensor(op, "tensor", tensor, /*any_device=*/true);
  impl_->check_reduce(op, tensor, rop);
  const int n = impl_->size;
  if (n == 1 || tensor.numel() == 0) return impl_->issue(op, nullptr);
  // 16-bit floats travel as float32 so that the sum is accumulated in float32;
  // a tensor on another device travels through a copy on the backend's.
  at::Tensor dev = impl_->on_device(tensor);
  at::Tensor buf = is_low_precision(dev.scalar_type()) ? dev.to(at::kFloat) : dev;
  impl_->bytes_sent += static_cast<uint64_t>(2 * (n - 1) * buf.numel() * buf.element_size() / n);
  std::function<void()> finish;
  if (rop == ReduceOp::kAvg || !buf.is_same(tensor)) {
    finish = [tensor, buf, n, rop] {
      if (rop == ReduceOp::kAvg) buf.div_(n);
      if (!buf.is_same(tensor)) tensor.copy_(buf);
    };
  }
  return impl_->issue(
      op,
      [&] {
        std::vector<at::Tensor> ts{buf};
        c10d::AllreduceOptions opts;
        opts.reduceOp = to_c10d(rop);
        return impl_->pg->allreduce(ts, opts);
      },
      std::move(finish));
}

void ProcessGroup::all_gather_unbuffered(const at::Tensor& output, const at::Tensor& input) {
  const int n = impl_->size;
  const int64_t total = output.numel();
  const int64_t c = (total + n - 1) / n;
  if (n == 1 || c * n != total || input.numel() != c || !output.is_contiguous()) {
    all_gather(output, input).wait();
    return;
  }
  at::Tensor out = output.view({-1});
  {
    at::NoGradGuard no_grad;
    out.narrow(0, static_cast<int64_t>(impl_->rank) * c, c).copy_(input.reshape({-1}));
  }
  for (int r = 0; r < n; ++r) broadcast(out.narrow(0, static_cast<int64_t>(r) * c, c), r).wait();
}

Work ProcessGroup::broadcast(const at::Tensor& tensor, int root) {
  const char* op = "broadcast";
  impl_->check_tensor(op, "tensor", tensor, /*any_device=*/true);
  check(root >= 0 && root < impl_->size, std::string(op) + ": root=" + std::to_string(root) +
                                             " is out of range: expected 0 <= root < " + std::to_string(impl_->size));
  if (impl_->size == 1 || tensor.numel() == 0) return impl_->issue(op, nullptr);
  impl_->bytes_sent += static_cast<uint64_t>(tensor.numel() * tensor.element_size());
  at::Tensor dev = impl_->on_device(tensor);
  std::function<void()> finish;
  if (!dev.is_same(tensor)) finish = [tensor, dev] { tensor.copy_(dev); };
  return impl_->issue(
      op,
      [&] {
        std::vector<at::Tensor> ts{wire(dev, impl_->backend)};
        c10d::BroadcastOptions opts;
        opts.rootRank = root;
        return impl_->pg->broadcast(ts, opts);
      },
      std::move(finish));
}

void ProcessGroup::barrier() {
  if (impl_->size == 1) {
    impl_->issue("barrier", nullptr).wait();
    return;
  }
  impl_->issue("barrier", [&] {
    c10d::BarrierOptions opts;
    if (impl_->device.is_cuda()) opts.device_ids = {impl_->device.index()};  // NCCL: not a guess from the rank
    return impl_->pg->barrier(opts);
  }).wait();
}

std::string ProcessGroup::broadcast_bytes(const std::string& data, int root) {
  const auto cpu_long = at::TensorOptions().dtype(at::kLong);
  at::Tensor len = at::full({1}, static_cast<int64_t>(data.size()), cpu_long).to(impl_->device);
  broadcast(len, root).wait();
  const int64_t n = len.cpu().item<int64_t>();
  at::Tensor buf = at::empty({n}, at::TensorOptions().dtype(at::kByte));
  if (impl_->rank == root && n > 0) std::memcpy(buf.data_ptr(), data.data(), static_cast<size_t>(n));
  buf = buf.to(impl_->device);
  broadcast(buf, root).wait();
  buf = buf.cpu();
  return std::string(static_cast<const char*>(buf.data_ptr()), static_cast<size_t>(n));
}

std::vector<std::string> ProcessGroup::all_gather_bytes(const std::string& data) {
  const int n = impl_->size;
  const auto dev = impl_->device;
  at::Tensor lens = at::empty({n}, at::TensorOptions().dtype(at::kLong).device(dev));
  at::Tensor mine = at::full({1}, static_cast<int64_t>(data.size()), at::TensorOptions().dtype(at::kLong)).to(dev);
  all_gather(lens, mine).wait();
  lens = lens.cpu();
  const int64_t longest = lens.max().item<int64_t>();
  at::Tensor padded = at::zeros({longest}, at::TensorOptions().dtype(at::kByte));
  if (!data.empty()) std::memcpy(padded.data_ptr(), data.data(), data.size());
  at::Tensor all = at::empty({longest * n}, at::TensorOptions().dtype(at::kByte).device(dev));
  all_gather(all, padded.to(dev)).wait();
  all = all.cpu();
  std::vector<std::string> out(n);
  const char* base = static_cast<const char*>(all.data_ptr());
  for (int r = 0; r < n; ++r) {
    out[r].assign(base + r * longest, static_cast<size_t>(lens[r].item<int64_t>()));
  }
  return out;
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
  for (int i = 0; i < replicate_size; ++i) {
    std::vector<int> ranks;
    for (int j = 0; j < shard_size; ++j) ranks.push_back(i * shard_size + j);
    auto g = group->new_group(ranks, group->name() + "/shard" + std::to_string(i));
    if (g) mesh.shard_group = g;
  }
  for (int j = 0; j < shard_size; ++j) {
    std::vector<int> ranks;
    for (int i = 0; i < replicate_size; ++i) ranks.push_back(i * shard_size + j);
    auto g = group->new_group(ranks, group->name() + "/replicate" + std::to_string(j));
    if (g) mesh.replicate_group = g;
  }
  return mesh;
}

}  // namespace fsdp::dist
