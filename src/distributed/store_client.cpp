// A rank's side of the rendezvous store (store_client.h): connecting within
// a bound, and the attempt's key prefix in a launcher's store.
#include "store_client.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "process_group_impl.h"

namespace fsdp::dist::detail {

namespace {

// Whether a TCP connection to host:port is accepted within a second (said
// of a store that did not answer: stopped or hung, or not there at all).
bool accepts_connections(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || res == nullptr) return false;
  bool ok = false;
  const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    if (::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
      ok = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof err;
      ok = ::poll(&p, 1, 1000) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
    ::close(fd);
  }
  freeaddrinfo(res);
  return ok;
}

std::string to_text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

}  // namespace

// A client's TCPStore, connected and answering, within `bound`; throws
// Unanswered, naming host:port and whether anything accepts connections
// there, when the store neither answers nor fails by then (its own errors
// are rethrown). `who` is the store's server ("rank 0", "the launcher").
//
// TCPStore's own timeout does not bound this: LibTorch 2.x's constructor
// pings the server and waits for the answer in a blocking recv with no
// timeout, and 1.13's constructor returns at once but its first request
// (join's add) waits the same way. So a listener that accepts and never
// answers (rank 0 stopped with SIGSTOP after its store listens, or another
// program on the port) held a rank forever (issue 37, item 12). The
// connection and one round trip (a check of a key, which writes nothing)
// run on a thread of their own; when they have not finished by `bound`,
// the caller gives up and the thread is left behind, detached: it owns
// nothing of the caller's, and it ends when the peer closes or the process
// exits.
c10::intrusive_ptr<c10d::Store> connect_client(const std::string& host, const c10d::TCPStoreOptions& so,
                                               std::chrono::milliseconds bound, const std::string& who) {
  struct Pending {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    c10::intrusive_ptr<c10d::Store> store;
    std::exception_ptr error;
  };
  auto pending = std::make_shared<Pending>();
  std::thread([pending, host, so] {
    c10::intrusive_ptr<c10d::Store> store;
    std::exception_ptr error;
    try {
      store = c10::make_intrusive<c10d::TCPStore>(host, so);
      store->check({"fsdp/connected"});  // one round trip: 1.13's constructor makes none
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(pending->m);
    pending->store = std::move(store);
    pending->error = error;
    pending->done = true;
    pending->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(pending->m);
  if (!pending->cv.wait_for(lock, bound, [&] { return pending->done; })) {
    lock.unlock();
    const std::string at = host + ":" + std::to_string(so.port);
    throw Unanswered("no TCPStore answered at " + at + " within " + format_ms(bound) +
                     (accepts_connections(host, so.port)
                          ? ": something there takes connections but sends no reply (is " + who +
                                " stopped or hung, or is another program listening on MASTER_PORT?)"
                          : ": nothing accepts connections there (is " + who +
                                " running, and MASTER_ADDR/MASTER_PORT its store's?)"));
  }
  if (pending->error) std::rethrow_exception(pending->error);
  return pending->store;
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

// Rank 0's side: one pass over the hellos of at most 1024 ranks of
// 1..size-1, round robin, so that a pass takes bounded time whatever the
// world size (join checks its deadline between passes; a pass over every
// rank took 2,000,000 round trips for WORLD_SIZE=2000000).
std::function<void()> answer_hellos(const c10::intrusive_ptr<c10d::Store>& base, int size, const std::string& prefix) {
  const int per_pass = std::min(size - 1, 1024);
  auto answered = std::make_shared<std::unordered_map<int, std::string>>();  // rank -> the nonce answered
  auto next = std::make_shared<int>(1);
  return [base, size, prefix, per_pass, answered, next] {
    for (int i = 0; i < per_pass; ++i) {
      const int r = *next;
      *next = r + 1 < size ? r + 1 : 1;
      const std::string hello = "fsdp/attempt/hello/" + std::to_string(r);
      if (!base->check({hello})) continue;
      std::string nonce = to_text(base->get(hello));
      auto it = answered->find(r);
      if (it != answered->end() && it->second == nonce) continue;
      const std::string v = nonce + " " + prefix;
      base->set("fsdp/attempt/ack/" + std::to_string(r), std::vector<uint8_t>(v.begin(), v.end()));
      (*answered)[r] = std::move(nonce);
    }
  };
}

}  // namespace fsdp::dist::detail
