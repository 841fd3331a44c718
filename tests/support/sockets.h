// Test helper: which local addresses listen on a TCP port, read from the
// kernel's socket tables (/proc/<pid>/net/tcp and tcp6, which show the
// network namespace of that process). No LibTorch.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace fsdp::testing {

// The addresses of the sockets in LISTEN state on `port`, e.g. {"127.0.0.1"}.
// An IPv4-mapped IPv6 address is given in its IPv4 form; the wildcard
// addresses read "0.0.0.0" and "::". `proc` is "/proc/self" or "/proc/<pid>".
inline std::set<std::string> tcp_listeners(int port, const std::string& proc = "/proc/self") {
  std::set<std::string> out;
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream in(proc + table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const auto colon = local.find(':');
      if (state != "0A" || colon == std::string::npos) continue;  // 0A: LISTEN
      if (std::strtol(local.substr(colon + 1).c_str(), nullptr, 16) != port) continue;
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
      out.insert(buf);
    }
  }
  return out;
}

}  // namespace fsdp::testing
