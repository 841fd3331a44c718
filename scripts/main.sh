#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs a 2-rank smoke job
# through fsdp-run (rendezvous over TCPStore, Gloo collectives checked).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
exec build/bin/fsdp-run --nproc-per-node 2 -- build/bin/fsdp-smoke "$@"
