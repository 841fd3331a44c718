// fsdp/run/rotation.h — a run's checkpoints over time: each save (after
// removing what killed saves left), pruning to the newest K of the run,
// and what --overwrite removes. Rank 0 does the file work; only while it
// holds the run directory's lock (run_lock.h: no other writer is alive).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/strategy/strategy_base.h"
#include "fsdp/run/run_directory.h"
#include "fsdp/run/run_identity.h"

namespace fsdp::run {

// [collective; rank 0 holding RunLock] Rank 0 first removes the
// temporary files of killed saves (remove_dead_temporaries), then `state`
// is saved as checkpoint_path(step), then rank 0 removes all but the
// newest `keep` checkpoints of `run` (and incomplete ones older than
// `step`); another run's checkpoints stay. Every rank returns after all.
void save_and_rotate(const RunDirectory& directory, const Strategy& strategy, const CheckpointState& state,
                     int64_t step, int keep, const RunIdentity& run);

// [local; only while holding RunLock] What --overwrite removes: run.json,
// metrics.jsonl, train.log, loss.svg and the loggers' files
// (events.out.tfevents.*, csv/version_N/{metrics.csv,hparams.yaml},
// profile/rank_N.pt.trace.json) (regular files only), the
// temporaries of killed saves, and the checkpoints in checkpoints/ that
// inspect as the run's own (the run id of `had`, the directory's run.json;
// without one, those written by fsdp-train before run identities, which
// record none). Anything else stays: other runs' checkpoints, incomplete
// or unreadable ones, files fsdp-train never writes (a user's
// checkpoints/my_model/weights.bin). Returns the paths it kept, sorted.
std::vector<std::string> remove_own_files(const RunDirectory& directory, const std::optional<RunIdentity>& had);

// [local; only while holding RunLock] Removes what killed saves left:
// checkpoints/step-*.tmp-* (a full save's file) and *.tmp-* files inside
// checkpoints/step-*/ (a sharded save's). No save of this job may be in
// flight. Returns the paths removed.
std::vector<std::string> remove_dead_temporaries(const RunDirectory& directory);

}  // namespace fsdp::run
