// Test helper: which local addresses listen on a TCP port, read from the
// kernel's socket tables (/proc/<pid>/net/tcp and tcp6, which show the
// network namespace of that process). No LibTorch.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fsdp::testing {

struct TcpListener {
  std::string address;  // "127.0.0.1"; an IPv4-mapped IPv6 address in its IPv4 form; "0.0.0.0" or "::" for any
  int port = 0;
  std::string inode;  // the socket's inode, as in /proc/<pid>/fd's "socket:[inode]" links
};

// Every TCP socket in LISTEN state in the network namespace of `proc`
// ("/proc/self" or "/proc/<pid>").
inline std::vector<TcpListener> tcp_listen_sockets(const std::string& proc = "/proc/self") {
  std::vector<TcpListener> out;
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream in(proc + table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
      const auto colon = local.find(':');
      if (state != "0A" || colon == std::string::npos) continue;  // 0A: LISTEN
      const std::string hex = local.substr(0, colon);
      // The kernel prints each 32-bit word of the address in host byte order.
      unsigned char bytes[16] = {0};
      const size_t words = hex.size() / 8;
      for (size_t w = 0; w < words && w < 4; ++w) {
        const auto word = static_cast<uint32_t>(std::strtoul(hex.substr(w * 8, 8).c_str(), nullptr, 16));
        std::memcpy(bytes + 4 * w, &word, 4);
      }
      char buf[INET6_ADDRSTRLEN] = {0};
      in6_addr a6{};
      std::memcpy(&a6, bytes, 16);
      if (words == 1) inet_ntop(AF_INET, bytes, buf, sizeof buf);
      else if (IN6_IS_ADDR_V4MAPPED(&a6)) inet_ntop(AF_INET, bytes + 12, buf, sizeof buf);
      else inet_ntop(AF_INET6, bytes, buf, sizeof buf);
      out.push_back({buf, static_cast<int>(std::strtol(local.substr(colon + 1).c_str(), nullptr, 16)), inode});
    }
  }
  return out;
}

// The addresses listening on `port` in the network namespace of `proc`, e.g. {"127.0.0.1"}.
inline std::set<std::string> tcp_listeners(int port, const std::string& proc = "/proc/self") {
  std::set<std::string> out;
  for (const auto& l : tcp_listen_sockets(proc)) {
    if (l.port == port) out.insert(l.address);
  }
  return out;
}

// The addresses (with ports, "127.0.0.1:29500") this process listens on.
inline std::set<std::string> own_tcp_listeners() {
  std::set<std::string> mine;  // socket inodes of this process's descriptors
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(fd.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) mine.insert(target.substr(8, target.size() - 9));
  }
  std::set<std::string> out;
  for (const auto& l : tcp_listen_sockets()) {
    if (mine.count(l.inode)) out.insert(l.address + ":" + std::to_string(l.port));
  }
  return out;
}

// A loopback TCP port that was free a moment ago.
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace fsdp::testing
