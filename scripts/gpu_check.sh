#!/usr/bin/env bash
# The GPU checks, in one run on a machine with a CUDA GPU and PyTorch 2.x
# (its CUDA LibTorch, NCCL, CMake config): builds fsdp-cpp against that
# LibTorch, runs the CUDA test suite (tests/gpu/gpu_test.cpp), trains the GPT
# with fsdp-train on the GPU in float16 and bfloat16 mixed precision, and
# runs the 2-rank smoke test over Gloo with torch 2.x. Needs .gpu/ from
# scripts/gpu_bundle.sh. Logs and results go to $OUT (default /tmp/gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
JOBS=$(nproc)
DEPS=$PWD/.gpu
B=build-gpu
step() { echo "== $(date +%T) $*"; }

step machine
nvidia-smi -L
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available(), "nccl", torch.cuda.nccl.version())'
TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
TORCH_INCLUDE=$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "include"))')
ls "$TORCH_INCLUDE" | tr '\n' ' '; echo
GLOO_FLAGS=""
[ -d "$TORCH_INCLUDE/gloo" ] || GLOO_FLAGS="-isystem $DEPS/gloo-include"
echo "gloo headers: ${GLOO_FLAGS:-from the wheel}"
command -v nvcc && export CUDACXX=$(command -v nvcc)
# The wheel's NCCL (nvidia-nccl-*): its header for c10d's ProcessGroupNCCL.hpp, its library.
SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])')
NCCL_H=$(find "$SITE/nvidia" -name nccl.h 2>/dev/null | head -1)
NCCL_SO=$(find "$SITE/nvidia" -name 'libnccl.so*' 2>/dev/null | head -1)
echo "nccl.h: ${NCCL_H:-none}; libnccl: ${NCCL_SO:-none}"
EXTRA_FLAGS="$GLOO_FLAGS"
[ -n "$NCCL_H" ] && EXTRA_FLAGS="$EXTRA_FLAGS -isystem $(dirname "$NCCL_H")"
for d in /usr/local/cuda/include "$SITE"/nvidia/cu13/include "$SITE"/nvidia/cuda_runtime/include; do
  [ -f "$d/cuda_runtime_api.h" ] && EXTRA_FLAGS="$EXTRA_FLAGS -isystem $d" && break
done
echo "extra flags: $EXTRA_FLAGS"

step googletest
cmake -S "$DEPS/googletest" -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF \
  -DCMAKE_INSTALL_PREFIX=/tmp/deps >"$OUT/gtest.log" 2>&1 &&
  cmake --build /tmp/gtest-build -j "$JOBS" --target install >>"$OUT/gtest.log" 2>&1 || { tail -20 "$OUT/gtest.log"; exit 1; }

step configure
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DFSDP_LIBTORCH=find -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;/tmp/deps;$DEPS/prefix" \
  -DZLIB_INCLUDE_DIR="$DEPS/prefix/include" -DZLIB_LIBRARY="$DEPS/prefix/lib/libz.a" \
  -DCMAKE_CXX_FLAGS="$EXTRA_FLAGS" -DFSDP_EXTRA_LIBS="$NCCL_SO" ${FSDP_CMAKE_ARGS:-} 2>&1 | tee "$OUT/configure.log" | grep -E "fsdp:|Error|error" 
[ -f $B/build.ninja ] || { tail -40 "$OUT/configure.log"; exit 1; }

step build
cmake --build $B -j "$JOBS" --target fsdp_gpu_tests fsdp-train fsdp-run fsdp-smoke -- -k 0 >"$OUT/build.log" 2>&1
build_rc=$?
grep -E "error|FAILED" "$OUT/build.log" | head -60
[ $build_rc -eq 0 ] || { echo "build failed ($build_rc)"; exit 1; }

step gpu tests
timeout 300 $B/bin/fsdp_gpu_tests --gtest_output=json:"$OUT/gpu_tests.json" 2>&1 | tee "$OUT/gpu_tests.log" |
  grep -E "^\[ |Failure|error|Expected|Which|max diff|Segmentation" | head -80
if ! grep -q "PASSED" "$OUT/gpu_tests.log" || grep -q "FAILED" "$OUT/gpu_tests.log"; then
  step "gpu tests again, each failing or unfinished one under cuda-gdb (backtrace)"
  for t in $($B/bin/fsdp_gpu_tests --gtest_list_tests | awk '/^[^ ]/{s=$1} /^  /{print s $1}'); do
    grep -q "OK \] $t " "$OUT/gpu_tests.log" && continue
    echo "--- $t"
    timeout 200 cuda-gdb -batch -ex run -ex bt --args $B/bin/fsdp_gpu_tests --gtest_filter="$t" 2>&1 |
      grep -vE "^\[New Thread|^\[Thread .* exited|^\[Detaching|^\[Inferior" | tail -45
  done
fi

step fsdp-train on the GPU
for p in 16-mixed bf16-mixed; do
  timeout 150 $B/bin/fsdp-run --nproc-per-node 1 -- $B/bin/fsdp-train --preset default --steps 200 --precision $p \
    --out /tmp/run-$p --log-every 50 2>&1 | tee "$OUT/train-$p.log" | tail -5
done
$B/bin/fsdp-run --nproc-per-node 1 --no-rank-prefix -- $B/bin/fsdp-train generate --checkpoint /tmp/run-bf16-mixed/checkpoints/step-00000200 --prompt "the old man " 2>&1 | tail -3
step "fsdp-train 100m preset, 20 steps (throughput)"
timeout 150 $B/bin/fsdp-run --nproc-per-node 1 -- $B/bin/fsdp-train --preset 100m --steps 20 --precision bf16-mixed --out /tmp/run-100m --log-every 5 --eval-every 0 2>&1 | tee "$OUT/train-100m.log" | tail -4

step smoke over Gloo on 2 ranks, torch 2.x
FSDP_BACKEND=gloo timeout 120 $B/bin/fsdp-run --nproc-per-node 2 -- $B/bin/fsdp-smoke 2>&1 | tail -4
step "rendezvous with torch 2.x's TCPStore (the store listens on MASTER_ADDR only)"
if cmake --build $B --target fsdp_dist_tests >"$OUT/build-dist.log" 2>&1; then
  timeout 120 $B/bin/fsdp_dist_tests --gtest_filter='Rendezvous.*' 2>&1 | grep -E "^\[ |Failure|Which|warning" | head -20
else
  grep -E "error" "$OUT/build-dist.log" | head -20
fi
step "NCCL with 2 ranks on one GPU (NCCL is expected to refuse)"
FSDP_BACKEND=nccl FSDP_TIMEOUT_S=20 timeout 60 $B/bin/fsdp-run --nproc-per-node 2 -- $B/bin/fsdp-smoke 2>&1 | tail -6
step done
