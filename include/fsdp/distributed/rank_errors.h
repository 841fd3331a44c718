// fsdp/distributed/rank_errors.h — failures that every rank learns about, keeping
// their kind. A step that may fail on some ranks only (reading a file,
// writing one) runs under capture(); a collective then agrees on the
// outcome, and every rank throws the same error: a ConfigError stays a
// ConfigError and a CollectiveError a CollectiveError (anything else is an
// Error). The checkpoint writers, the strategy and fsdp-train use it; so can
// a training loop of one's own:
//   fsdp::dist::agree(group, fsdp::dist::capture([&] { read_my_data(); }), "reading the data");
// Calls marked [collective] must be made by every rank of the group, in the
// same order; the others are local.
#pragma once

#include <string>
#include <vector>

#include "fsdp/distributed/process_group.h"

namespace fsdp::dist {

// A captured failure, as it travels between ranks: empty for none, else a
// letter for its kind, then its message.
using Failure = std::string;

// The failure of the exception being handled (call it in a catch block).
Failure current_failure();

// Runs f; returns its failure, or an empty one.
template <class F>
Failure capture(F&& f) {
  try {
    f();
    return {};
  } catch (...) {
    return current_failure();
  }
}

// A failure's message, without its kind.
std::string failure_message(const Failure& failure);

// Throws `failure` (not empty) as its kind, its message prefixed by `prefix`.
[[noreturn]] void rethrow(const Failure& failure, const std::string& prefix = "");

// `failure` with `prefix` before its message, its kind kept.
Failure prefixed(const Failure& failure, const std::string& prefix);

// One rank's outcome as one string, to send: its payload, or its failure.
std::string outcome(const std::string& payload, const Failure& failure);
bool outcome_failed(const std::string& outcome);
Failure outcome_failure(const std::string& outcome);       // (outcome_failed)
std::string outcome_payload(const std::string& outcome);   // (!outcome_failed)

// [collective: all_gather over `group`] Every rank learns whether every rank
// succeeded; if one failed, every rank throws the lowest failed rank's error
// ("<what> failed on rank <r>: ..." on the others, unchanged on that rank).
void agree(ProcessGroup& group, const Failure& mine, const std::string& what);

// [collective: all_gather over `group`] Every rank's `payload`, or, if a rank
// failed, that error on every rank, "<what> failed on rank <r>: " before it
// (on that rank too).
std::vector<std::string> gather_agreed(ProcessGroup& group, const std::string& payload, const Failure& mine,
                                       const std::string& what);

// [collective: all_gather over `group`] Every rank's `payload` (a failed
// rank's: empty), and in `failure` the lowest failed rank's failure with
// "rank <r>: " before its message, or none. Nothing is thrown: for a step
// that must still run on some rank before the outcome is agreed (agree_from).
std::vector<std::string> gather_outcomes(ProcessGroup& group, const std::string& payload, const Failure& mine,
                                         Failure& failure);

// [collective: broadcast from `root`] The root's failure, thrown on every
// rank with `prefix`; nothing if it succeeded.
void agree_from(ProcessGroup& group, int root, const Failure& failure, const std::string& prefix);

// [collective: broadcast from `root`] The root's failure on every rank, not
// thrown (for a rank that must undo something first); empty if it succeeded.
// A failing broadcast itself throws its CollectiveError.
Failure failure_from(ProcessGroup& group, int root, const Failure& failure);

}  // namespace fsdp::dist
