#!/usr/bin/env bash
# Gathers, from this Debian machine's packages (scripts/deps.sh installs them),
# what scripts/gpu_check.sh needs on a GPU machine that has PyTorch (CUDA
# LibTorch, CMake, Ninja) but none of our other build inputs and no network:
# GoogleTest's sources, the nlohmann-json and CLI11 headers with their CMake
# configs, zlib, and Gloo's headers (for c10d's ProcessGroupGloo.hpp, in case
# the wheel lacks them). Writes .gpu/ (ignored by git), about 6 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu
mkdir -p .gpu/prefix/include .gpu/prefix/share/cmake .gpu/prefix/lib .gpu/gloo-include
cp -r /usr/src/googletest .gpu/googletest
cp -r /usr/include/nlohmann /usr/include/CLI /usr/include/zlib.h /usr/include/zconf.h .gpu/prefix/include/
cp -r /usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11 .gpu/prefix/share/cmake/
cp /usr/lib/x86_64-linux-gnu/libz.a .gpu/prefix/lib/
cp -r /usr/include/gloo .gpu/gloo-include/
du -sh .gpu
