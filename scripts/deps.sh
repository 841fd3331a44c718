#!/usr/bin/env bash
# Installs what fsdp-cpp needs to build and test on Debian 12, if missing:
# LibTorch (CPU) with c10d, Gloo's headers, an optimized BLAS (Debian's
# default reference BLAS makes LibTorch about 20x slower), GoogleTest, CMake,
# CLI11, nlohmann-json and zlib (checkpoints), python3-torch (the tests
# open checkpoints in Python), clang with its libFuzzer and sanitizer
# runtimes (the checkpoint-parser fuzzers), and iproute2 (the two-host
# fault tests make network namespaces).
set -euo pipefail

packages=(cmake g++ make libtorch-dev libgloo-dev libopenblas0-pthread libgtest-dev libcli11-dev
          nlohmann-json3-dev zlib1g-dev python3-torch clang libclang-rt-14-dev iproute2)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi
# libopenblas0-pthread registers itself as libblas.so.3; make sure it is the one used.
blas=$(update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | awk '/^Value:/{print $2}')
case "$blas" in
  *openblas*) ;;
  *) echo "deps: warning: libblas.so.3 is '$blas', not OpenBLAS; LibTorch will be slow" >&2 ;;
esac
