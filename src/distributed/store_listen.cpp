#include "store_listen.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "fsdp/error.h"

namespace fsdp::dist::detail {

struct ListenTarget {
  sockaddr_storage addr{};
  socklen_t len = 0;
  int port = 0;
  bool applied = false;
};

namespace {

// Set by a ListenOnly of this thread; read by bind() below.
thread_local ListenTarget* t_target = nullptr;

bool is_wildcard_on(const sockaddr* a, socklen_t len, int port) {
  if (a->sa_family == AF_INET && len >= static_cast<socklen_t>(sizeof(sockaddr_in))) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(a);
    return in->sin_addr.s_addr == htonl(INADDR_ANY) && ntohs(in->sin_port) == port;
  }
  if (a->sa_family == AF_INET6 && len >= static_cast<socklen_t>(sizeof(sockaddr_in6))) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a);
    return IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr) && ntohs(in6->sin6_port) == port;
  }
  return false;
}

int libc_bind(int fd, const sockaddr* a, socklen_t len) {
  using Bind = int (*)(int, const sockaddr*, socklen_t);
  // The next bind() after this one: libc's, or a preloaded library's.
  static const Bind next = reinterpret_cast<Bind>(dlsym(RTLD_NEXT, "bind"));
  if (next != nullptr) return next(fd, a, len);
  return static_cast<int>(::syscall(SYS_bind, fd, a, len));
}

}  // namespace

ListenOnly::ListenOnly(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    throw ConfigError("fsdp: the rendezvous address '" + host + "' (MASTER_ADDR) does not resolve: " +
                      gai_strerror(rc) + ": expected a host name or an address of rank 0's host");
  }
  target_ = std::make_unique<ListenTarget>();
  ListenTarget* target = target_.get();
  std::memcpy(&target->addr, res->ai_addr, res->ai_addrlen);
  target->len = res->ai_addrlen;
  target->port = port;
  freeaddrinfo(res);
  char buf[INET6_ADDRSTRLEN] = {0};
  if (target->addr.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&target->addr);
    in->sin_port = htons(static_cast<uint16_t>(port));
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&target->addr);
    in6->sin6_port = htons(static_cast<uint16_t>(port));
    inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof buf);
  }
  numeric_ = buf;
  outer_ = t_target;
  t_target = target;
}

ListenOnly::~ListenOnly() {
  t_target = outer_;
}

int ListenOnly::listen_socket() {
  const ListenTarget& t = *target_;
  const int fd = ::socket(t.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "socket() for " + numeric_);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (libc_bind(fd, reinterpret_cast<const sockaddr*>(&t.addr), t.len) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    const int err = errno;
    ::close(fd);
    throw std::system_error(err, std::generic_category(),
                            "listening on " + numeric_ + ":" + std::to_string(t.port));
  }
  target_->applied = true;
  return fd;
}

bool ListenOnly::applied() const { return target_->applied; }

}  // namespace fsdp::dist::detail

#ifdef FSDP_INTERPOSE_BIND
// See store_listen.h. Outside a ListenOnly this is libc's bind(). Defined
// only where LibTorch's TCPStore takes no listening socket (CMakeLists.txt).
extern "C" int bind(int fd, const sockaddr* addr, socklen_t len) noexcept {
  using fsdp::dist::detail::t_target;
  if (t_target != nullptr && addr != nullptr && fsdp::dist::detail::is_wildcard_on(addr, len, t_target->port)) {
    const sockaddr_storage& want = t_target->addr;
    int rc = -1;
    if (addr->sa_family == want.ss_family) {
      rc = fsdp::dist::detail::libc_bind(fd, reinterpret_cast<const sockaddr*>(&want), t_target->len);
    } else if (addr->sa_family == AF_INET6) {
      // An IPv4 address on the server's IPv6 socket: its IPv4-mapped form
      // (::ffff:a.b.c.d), which a dual-stack socket accepts.
      sockaddr_in6 mapped{};
      mapped.sin6_family = AF_INET6;
      mapped.sin6_port = reinterpret_cast<const sockaddr_in&>(want).sin_port;
      mapped.sin6_addr.s6_addr[10] = 0xff;
      mapped.sin6_addr.s6_addr[11] = 0xff;
      std::memcpy(&mapped.sin6_addr.s6_addr[12], &reinterpret_cast<const sockaddr_in&>(want).sin_addr, 4);
      rc = fsdp::dist::detail::libc_bind(fd, reinterpret_cast<const sockaddr*>(&mapped), sizeof mapped);
    } else {
      errno = EADDRNOTAVAIL;  // an IPv6 address on an IPv4 socket: the server tries the other family
    }
    if (rc == 0) t_target->applied = true;
    return rc;
  }
  return fsdp::dist::detail::libc_bind(fd, addr, len);
}
#endif  // FSDP_INTERPOSE_BIND
