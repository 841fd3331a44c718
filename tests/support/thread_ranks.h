// Test helper: runs one function per rank, each rank a thread of this process
// with its own ProcessGroup, all meeting through one c10d HashStore.
#pragma once

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "fsdp/distributed/process_group.h"

namespace fsdp::testing {

// A non-owning pointer to a group owned by the test harness (run_ranks).
inline dist::ProcessGroupPtr borrow(dist::ProcessGroup& pg) {
  return std::shared_ptr<dist::ProcessGroup>(&pg, [](dist::ProcessGroup*) {});
}

// Calls fn(group) on `world` threads; rethrows the first exception a rank
// threw, after every thread ended. `timeout` is each group's collective timeout.
inline void run_ranks(int world, const std::function<void(dist::ProcessGroup&)>& fn,
                      std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  std::mutex mu;
  std::exception_ptr first;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        dist::InitOptions o;
        o.rank = r;
        o.world_size = world;
        o.store = store;
        o.timeout = timeout;
        auto pg = dist::init_process_group(o);
        fn(*pg);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace fsdp::testing
