#!/usr/bin/env bash
# Configures into build/ and builds everything with every core.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}" >/dev/null
cmake --build build -j"$(nproc)"
