// Test hosts on this machine: n network namespaces, host i at 10.77.0.<i+1>,
// each joined by a veth pair to one bridge (a switch, in a namespace of its
// own), as n machines on one network. Needs root (CAP_NET_ADMIN) and the ip
// tool, as CI has; `why_not` says why not otherwise (the tests skip with it).
// Everything is removed at destruction. Names carry this process's pid, so
// tests running side by side do not meet.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace fsdp::testing {

class TestHosts {
 public:
  explicit TestHosts(int n) : id_(std::to_string(::getpid())) {
    switch_ = "fsdp-sw-" + id_;
    std::vector<std::string> cmds{"ip netns add " + switch_, "ip -n " + switch_ + " link add br0 type bridge",
                                  "ip -n " + switch_ + " link set br0 up"};
    for (int i = 0; i < n; ++i) {
      const std::string ns = name(i), host_end = "fh" + id_ + "-" + std::to_string(i),
                        switch_end = "fs" + id_ + "-" + std::to_string(i);
      names_.push_back(ns);
      links_.push_back(host_end);
      for (const std::string& c :
           {"ip netns add " + ns, "ip link add " + host_end + " type veth peer name " + switch_end,
            "ip link set " + host_end + " netns " + ns, "ip link set " + switch_end + " netns " + switch_,
            "ip -n " + switch_ + " link set " + switch_end + " master br0",
            "ip -n " + switch_ + " link set " + switch_end + " up",
            "ip -n " + ns + " addr add " + address(i) + "/24 dev " + host_end,
            "ip -n " + ns + " link set " + host_end + " up", "ip -n " + ns + " link set lo up"}) {
        cmds.push_back(c);
      }
    }
    for (const auto& c : cmds) {
      if (std::system((c + " >/dev/null 2>&1").c_str()) != 0) {
        why_not = "cannot make " + std::to_string(n) + " test hosts with ip netns here (needs root and the ip tool): `" +
                  c + "` failed";
        return;
      }
    }
  }
  ~TestHosts() {  // deleting a namespace deletes its ends of the veth pairs
    for (const auto& ns : names_) std::system(("ip netns del " + ns + " >/dev/null 2>&1").c_str());
    std::system(("ip netns del " + switch_ + " >/dev/null 2>&1").c_str());
    for (const auto& l : links_) std::system(("ip link del " + l + " >/dev/null 2>&1").c_str());  // if never moved
  }
  TestHosts(const TestHosts&) = delete;
  TestHosts& operator=(const TestHosts&) = delete;

  std::string why_not;  // empty when the hosts are up

  static std::string address(int i) { return "10.77.0." + std::to_string(i + 1); }
  // `command` run on host i.
  std::vector<std::string> on(int i, const std::vector<std::string>& command) const {
    std::vector<std::string> cmd{"ip", "netns", "exec", names_.at(i)};
    cmd.insert(cmd.end(), command.begin(), command.end());
    return cmd;
  }
  // Host i's cable pulled: its link goes down.
  bool cut(int i) const {
    return std::system(("ip -n " + names_.at(i) + " link set " + links_.at(i) + " down").c_str()) == 0;
  }

 private:
  std::string name(int i) const { return "fsdp-h" + std::to_string(i) + "-" + id_; }
  std::string id_, switch_;
  std::vector<std::string> names_, links_;
};

}  // namespace fsdp::testing
