#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
scripts/fuzz.sh build  # the checkpoint-parser fuzzers (clang + ASan), run briefly by CTest
cd build
ctest -j"$(nproc)" --output-on-failure --timeout 300 "$@"
