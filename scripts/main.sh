#!/usr/bin/env bash
# The main job: installs what is missing, builds, trains the default GPT on 2
# ranks through fsdp-run (about a minute and a half on 2 cores; the run
# directory is runs/latest: metrics.jsonl and checkpoints/), then generates
# text from the final checkpoint. Extra arguments go to fsdp-train (e.g.
# --preset tiny, --steps 50, --state-dict-type full, --resume).
# FSDP_LIBTORCH=debian builds and runs against Debian's LibTorch 1.13
# (build-debian/) instead of the torch wheel's 2.x (build/).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
# Only the two programs it runs (and the library they link), not the tests.
targets="fsdp-run fsdp-train"
# shellcheck disable=SC2086  # a list of targets
scripts/build.sh --target $targets
bin=build/bin
[ "${FSDP_LIBTORCH:-wheel}" = debian ] && bin=build-debian/bin
out=runs/latest
# Each run of the main job starts over in runs/latest (fsdp-train refuses a
# new run into a used directory otherwise), unless asked to resume.
start=(--overwrite)
for arg in "$@"; do
  case "$arg" in --resume | --resume-from | --resume-from=* | --overwrite) start=() ;; esac
done
$bin/fsdp-run --nproc-per-node 2 -- $bin/fsdp-train --out "$out" --log-every 25 ${start[@]+"${start[@]}"} "$@"
ckpt=$(ls -d "$out"/checkpoints/step-???????? | tail -n 1)
echo "--- generated from $ckpt:"
$bin/fsdp-run --nproc-per-node 1 --no-rank-prefix -- $bin/fsdp-train generate --checkpoint "$ckpt" --prompt "the old man "
