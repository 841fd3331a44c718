// src/distributed/process_group_impl.h — the private half of fsdp::dist::ProcessGroup
// (fsdp/distributed/process_group.h): the c10d objects a group holds
// (ProcessGroup::Impl), a collective's pending state (Work::State), and the
// checks and messages that the rendezvous (rendezvous.cpp) and the
// collectives (process_group.cpp) share. Private to dist.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/version.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>

#include "fsdp/distributed/process_group.h"
#include "fsdp/error.h"

namespace fsdp::dist {

// c10d's collectives live on ProcessGroup in LibTorch 1.x and on Backend in 2.x.
#if TORCH_VERSION_MAJOR >= 2
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif

namespace detail {

inline std::string format_ms(std::chrono::milliseconds ms) {
  std::ostringstream os;
  if (ms.count() % 1000 == 0) {
    os << ms.count() / 1000 << "s";
  } else {
    os << ms.count() << "ms";
  }
  return os.str();
}

// Text of an exception without c10's backtrace.
inline std::string reason(const std::exception& e) {
  if (auto* ce = dynamic_cast<const c10::Error*>(&e)) {
    std::string s = ce->what_without_backtrace();
    return s;
  }
  return e.what();
}

inline void check(bool cond, const std::string& msg) {
  if (!cond) throw ConfigError(msg);
}

inline bool is_low_precision(at::ScalarType s) { return s == at::kBFloat16 || s == at::kHalf; }

inline bool supported_dtype(at::ScalarType s) {
  switch (s) {
    case at::kFloat: case at::kDouble: case at::kBFloat16: case at::kHalf:
    case at::kLong: case at::kInt: case at::kByte: case at::kChar: case at::kBool:
      return true;
    default:
      return false;
  }
}

// A collective that failed or timed out, naming it and where it ran.
inline CollectiveError collective_error(const std::string& op, const std::string& where, const std::string& why) {
  return CollectiveError("fsdp: collective " + op + " " + where + " failed: " + why +
                             " (every rank of the group must call the same collectives in the "
                             "same order; a rank that is missing, dead or out of order causes this)",
                         op);
}


}  // namespace detail

// The files of dist use the helpers above unqualified.
using namespace detail;  // NOLINT(google-build-using-namespace): a private header of dist only

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

}  // namespace fsdp::dist
