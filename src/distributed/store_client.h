// src/distributed/store_client.h — a rank's side of the rendezvous store
// (private to distributed): connecting to a TCPStore within a bound, and
// agreeing a fresh key prefix for this attempt in a launcher's store
// (StoreHost::kLauncher). Used by rendezvous.cpp's init_process_group.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

namespace fsdp::dist::detail {

// Thrown by connect_client: the store at the address took the connection
// and never answered. Its text names the address and what to check.
struct Unanswered : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A client's TCPStore, connected and answering, within `bound`; throws
// Unanswered, naming host:port and whether anything accepts connections
// there, when the store neither answers nor fails by then (its own errors
// are rethrown). `who` is the store's server ("rank 0", "the launcher").
// The connection runs on a thread of its own, left behind detached when it
// has not finished by `bound` (store_client.cpp says why).
c10::intrusive_ptr<c10d::Store> connect_client(const std::string& host, const c10d::TCPStoreOptions& so,
                                               std::chrono::milliseconds bound, const std::string& who);

// A random 64-bit value in hex: a nonce no earlier attempt used.
std::string random_hex();

// A rank other than 0: the key prefix of this attempt, which rank 0 hands
// it through `base` (store_client.cpp describes the exchange); nullopt when
// rank 0 did not answer within `timeout`.
std::optional<std::string> await_attempt_prefix(const c10::intrusive_ptr<c10d::Store>& base, int rank,
                                                std::chrono::milliseconds timeout);

// Rank 0's side: a function that makes one bounded pass over the other
// ranks' hellos, answering each new one with `prefix`; call it while
// waiting for the ranks to join.
std::function<void()> answer_hellos(const c10::intrusive_ptr<c10d::Store>& base, int size, const std::string& prefix);

}  // namespace fsdp::dist::detail
