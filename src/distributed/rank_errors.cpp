#include "fsdp/distributed/rank_errors.h"

#include <exception>

#include "fsdp/error.h"

namespace fsdp::dist {

namespace {

// Kinds: 'C' ConfigError, 'K' CollectiveError ("K<collective>\n<message>"), 'E' anything else.
constexpr char kConfig = 'C';
constexpr char kCollective = 'K';
constexpr char kOther = 'E';

}  // namespace

Failure current_failure() {
  try {
    throw;
  } catch (const ConfigError& e) {
    return kConfig + std::string(e.what());
  } catch (const CollectiveError& e) {
    return kCollective + e.collective() + "\n" + e.what();
  } catch (const std::exception& e) {
    return kOther + std::string(e.what());
  } catch (...) {
    return kOther + std::string("an exception that is not a std::exception");
  }
}

std::string failure_message(const Failure& failure) {
  if (failure.empty()) return "";
  if (failure[0] == kCollective) {
    const auto nl = failure.find('\n');
    return nl == std::string::npos ? failure.substr(1) : failure.substr(nl + 1);
  }
  return failure.substr(1);
}

void rethrow(const Failure& failure, const std::string& prefix) {
  const std::string what = prefix + failure_message(failure);
  if (!failure.empty() && failure[0] == kConfig) throw ConfigError(what);
  if (!failure.empty() && failure[0] == kCollective) {
    throw CollectiveError(what, failure.substr(1, failure.find('\n') - 1));
  }
  throw Error(what);
}

Failure prefixed(const Failure& failure, const std::string& prefix) {
  if (failure.empty()) return failure;
  if (failure[0] == kCollective) {
    const auto nl = failure.find('\n');
    return failure.substr(0, nl + 1) + prefix + failure.substr(nl + 1);
  }
  return failure.substr(0, 1) + prefix + failure.substr(1);
}

std::string outcome(const std::string& payload, const Failure& failure) {
  return failure.empty() ? "+" + payload : "-" + failure;
}
bool outcome_failed(const std::string& outcome) { return !outcome.empty() && outcome[0] == '-'; }
Failure outcome_failure(const std::string& outcome) { return outcome_failed(outcome) ? outcome.substr(1) : Failure(); }
std::string outcome_payload(const std::string& outcome) { return outcome.empty() ? outcome : outcome.substr(1); }

namespace {

// The lowest failed rank's failure among gathered outcomes, with `prefix(r)`
// before it (except on that rank, unless prefix_own).
template <class Prefix>
Failure first_failure(const std::vector<std::string>& all, int rank, bool prefix_own, Prefix prefix) {
  for (size_t r = 0; r < all.size(); ++r) {
    if (!outcome_failed(all[r])) continue;
    const bool own = static_cast<int>(r) == rank;
    return prefixed(outcome_failure(all[r]), own && !prefix_own ? "" : prefix(r));
  }
  return {};
}

auto failed_on(const std::string& what) {
  return [what](size_t r) { return what + " failed on rank " + std::to_string(r) + ": "; };
}

std::vector<std::string> payloads(std::vector<std::string> all) {
  for (auto& p : all) p = outcome_failed(p) ? std::string() : outcome_payload(p);
  return all;
}

}  // namespace

void agree(dist::ProcessGroup& group, const Failure& mine, const std::string& what) {
  const auto all = group.all_gather_bytes(outcome("", mine));
  const Failure f = first_failure(all, group.rank(), /*prefix_own=*/false, failed_on(what));
  if (!f.empty()) rethrow(f);
}

std::vector<std::string> gather_agreed(dist::ProcessGroup& group, const std::string& payload, const Failure& mine,
                                       const std::string& what) {
  auto all = group.all_gather_bytes(outcome(payload, mine));
  const Failure f = first_failure(all, group.rank(), /*prefix_own=*/true, failed_on(what));
  if (!f.empty()) rethrow(f);
  return payloads(std::move(all));
}

std::vector<std::string> gather_outcomes(dist::ProcessGroup& group, const std::string& payload, const Failure& mine,
                                         Failure& failure) {
  auto all = group.all_gather_bytes(outcome(payload, mine));
  failure = first_failure(all, group.rank(), /*prefix_own=*/true,
                          [](size_t r) { return "rank " + std::to_string(r) + ": "; });
  return payloads(std::move(all));
}

Failure failure_from(dist::ProcessGroup& group, int root, const Failure& failure) {
  return group.broadcast_bytes(failure, root);
}

void agree_from(dist::ProcessGroup& group, int root, const Failure& failure, const std::string& prefix) {
  const Failure f = failure_from(group, root, failure);
  if (!f.empty()) rethrow(f, prefix);
}

}  // namespace fsdp::dist
