#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs the whole
# suite (CTest) on each LibTorch that fsdp-cpp supports:
#   1. LibTorch 2.x from the torch wheel (.venv, requirements.txt) into build/:
#      a CUDA build, so this is also the CUDA variant - the library with NCCL,
#      the tools and tests/gpu compile, and the GPU tests skip without a GPU -
#      plus the Python peers (PyTorch DDP/FSDP, Lightning Fabric);
#   2. Debian's LibTorch 1.13 (CPU) into build-debian/: the same suite but for
#      the peers, which need torch 2.x.
# The checkpoint-parser fuzzers (clang + ASan) are built once, into
# build-fuzz/, and run briefly by CTest in the first pass. The API reference
# (Doxygen, scripts/doxygen.sh) is built first, into build/doc: a warning
# fails the run.
# FSDP_LIBTORCH=wheel or FSDP_LIBTORCH=debian runs that one alone. Extra
# arguments go to both ctest runs (e.g. -R TestFSDPStateDict).
set -euo pipefail
cd "$(dirname "$0")/.."
which=${FSDP_LIBTORCH:-both}
case "$which" in
  both | wheel | debian) ;;
  *) echo "test: FSDP_LIBTORCH is '$which'; expected wheel, debian or unset (both)" >&2; exit 2 ;;
esac
step() { echo "=== $(date +%T) $*"; }
step deps
scripts/deps.sh
step "docs: the API reference (Doxygen, no warnings)"
scripts/doxygen.sh build/doc
scripts/fuzz.sh build  # the checkpoint-parser fuzzers (clang + ASan), run briefly by CTest
if [ "$which" != debian ]; then
  step "build: LibTorch 2.x (the torch wheel), CUDA variant included"
  FSDP_LIBTORCH=wheel FSDP_CMAKE_ARGS=-DFSDP_WITH_NCCL=ON scripts/build.sh
  step "tests: LibTorch 2.x"
  (cd build && ctest -j"$(nproc)" --output-on-failure --timeout 300 "$@")
fi
if [ "$which" != wheel ]; then
  step "build: Debian's LibTorch 1.13"
  FSDP_LIBTORCH=debian scripts/build.sh
  step "tests: Debian's LibTorch 1.13"
  (cd build-debian && ctest -j"$(nproc)" --output-on-failure --timeout 300 -E '^Fuzz\.' "$@")
fi
step done
