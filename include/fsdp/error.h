// fsdp/error.h — the exception types fsdp-cpp throws.
//
// Every error a user can cause (bad configuration, bad arguments, bad files) is
// a ConfigError whose message names what was wrong, where, and what was
// expected. A collective that fails or times out is a CollectiveError naming
// the collective, its group, its sequence number and the timeout.
// Header-only; needs nothing but the standard library.
#pragma once

#include <stdexcept>
#include <string>

namespace fsdp {

// Base of all fsdp-cpp errors.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Bad configuration, arguments or environment. The message says which
// setting, its value, and what was expected.
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& what) : Error(what) {}
};

// A collective failed: a peer timed out, died, or the backend refused it.
// `collective()` is the operation's name (e.g. "all_gather").
class CollectiveError : public Error {
 public:
  CollectiveError(const std::string& what, std::string collective)
      : Error(what), collective_(std::move(collective)) {}
  const std::string& collective() const { return collective_; }

 private:
  std::string collective_;
};

}  // namespace fsdp
