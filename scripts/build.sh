#!/usr/bin/env bash
# Configures and builds everything with every core, against the LibTorch that
# FSDP_LIBTORCH names (CMakeLists.txt): wheel (default; the torch 2.x in .venv,
# into build/) or debian (Debian's LibTorch 1.13, into build-debian/).
# FSDP_BUILD_DIR overrides the folder; FSDP_CMAKE_ARGS adds CMake arguments
# (e.g. -DFSDP_WITH_NCCL=ON). ccache makes a rebuild cheap. Extra arguments go
# to `cmake --build` (e.g. --target fsdp-train).
set -euo pipefail
cd "$(dirname "$0")/.."
libtorch=${FSDP_LIBTORCH:-wheel}
case "$libtorch" in
  wheel) dir=build ;;
  debian) dir=build-debian ;;
  *) echo "build: FSDP_LIBTORCH is '$libtorch'; expected wheel or debian" >&2; exit 2 ;;
esac
dir=${FSDP_BUILD_DIR:-$dir}
# shellcheck disable=SC2086  # FSDP_CMAKE_ARGS is a list of arguments
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}" -DFSDP_LIBTORCH="$libtorch" ${FSDP_CMAKE_ARGS:-} >/dev/null
cmake --build "$dir" -j"$(nproc)" "$@"
