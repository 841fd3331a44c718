// Makes rank 0's TCPStore listen only on MASTER_ADDR instead of on every
// interface. LibTorch's TCPStore takes no listen address: its server binds
// the wildcard address (0.0.0.0 or ::) of its port, so the store of a run
// meant for one machine is reachable from the whole network.
//
// LibTorch 2.x takes a socket that already listens (TCPStoreOptions::
// masterListenFd): listen_socket() makes one on the address. LibTorch 1.13
// has nothing of the kind, so there, while a ListenOnly lives, a bind() of
// the wildcard address on `port` made by *this thread* binds `host`'s
// address instead: the first address getaddrinfo gives, in its IPv4-mapped
// form (::ffff:a.b.c.d) on an IPv6 socket; an IPv6 address on an IPv4
// socket fails with EADDRNOTAVAIL, so the server falls through to its other
// socket. Every other bind() - other ports, other threads, any specific
// address - goes to libc's bind() unchanged. The library defines bind() for
// this (see store_listen.cpp) only when built against such a LibTorch
// (FSDP_INTERPOSE_BIND, set by CMakeLists.txt): with 2.x no symbol of libc's
// is interposed on the user's process. Where it is defined, an executable
// linked with fsdp exports it, so LibTorch's call resolves to it. Whether it
// took effect is reported by applied(), so a caller can say so when it did
// not.
#pragma once

#include <memory>
#include <string>

namespace fsdp::dist::detail {

struct ListenTarget;

class ListenOnly {
 public:
  // Resolves `host` (a name or a numeric address). Throws ConfigError naming
  // `host` when it does not resolve.
  ListenOnly(const std::string& host, int port);
  ~ListenOnly();
  ListenOnly(const ListenOnly&) = delete;
  ListenOnly& operator=(const ListenOnly&) = delete;

  // A TCP socket bound to the address and port and listening, for
  // TCPStoreOptions::masterListenFd (whose server then owns it); counts as
  // applied(). Throws std::system_error (the port is taken, the address is
  // not this host's) naming the address and port.
  int listen_socket();

  // True once listen_socket() made the socket, or a wildcard bind on the
  // port was redirected to the address.
  bool applied() const;
  // The numeric address listened on, e.g. "127.0.0.1".
  const std::string& address() const { return numeric_; }

 private:
  std::string numeric_;
  std::unique_ptr<ListenTarget> target_;  // what bind() reads while this is the thread's innermost ListenOnly
  ListenTarget* outer_ = nullptr;         // the enclosing one's, restored at destruction
};

}  // namespace fsdp::dist::detail
