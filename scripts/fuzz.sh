#!/usr/bin/env bash
# Fuzzes the parsers of checkpoint files, and tokenizer.json's, with libFuzzer
# under AddressSanitizer (clang; scripts/deps.sh installs it). Targets
# (tests/fuzz/checkpoint_fuzz.cpp, and tokenizer_fuzz.cpp):
#   index    the JSON index of either format
#   full     a whole full checkpoint file (zip reader, index, records, checksums)
#   sharded  a whole sharded checkpoint directory (index and data files)
#   pickle   the pickle of a torch.save file (module state dicts from Python)
#   safetensors  a safetensors file (Hugging Face's weights: header, tensors, loading)
#   dcp      a DCP directory's .metadata (the unpickler's DCP mode)
#   hf_config  a Hugging Face model's config.json (tests/fuzz/hf_fuzz.cpp)
#   hf_index   a model.safetensors.index.json beside real shards (hf_fuzz.cpp)
#   tokenizer  a tokenizer.json (fsdp::tokenizers' reader, then encode and
#            decode; tests/fuzz/tokenizer_fuzz.cpp, no LibTorch)
# Each run starts from real checkpoints its target writes (the seed corpus;
# for tokenizer, small tokenizer.json files in real models' layouts).
#
#   scripts/fuzz.sh build               configure and build build-fuzz/
#   scripts/fuzz.sh run TARGET SECONDS  fuzz one target (the test suite runs each for seconds)
#   scripts/fuzz.sh all SECONDS         build, then fuzz every target (e.g. 3600 for a long run)
#
# A finding (crash, ASan report, hang over 20 s, allocation over 1 GiB, or an
# exception other than the fsdp::Error that names bad bytes) stops the run
# with exit status 1 and leaves the input in build-fuzz/findings/TARGET/;
# replay it with build-fuzz/bin/fuzz_TARGET FILE.
set -euo pipefail
cd "$(dirname "$0")/.."
B=build-fuzz
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:alloc_dealloc_mismatch=0:abort_on_error=1:symbolize=1}"

build() {
  command -v clang++ >/dev/null || { echo "fuzz: clang++ is missing (scripts/deps.sh installs clang)" >&2; exit 1; }
  # Against Debian's LibTorch (CPU only, no CUDA libraries under ASan): the
  # parsers under test are fsdp-cpp's own and the same for every LibTorch.
  cmake -S . -B $B -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ -DFSDP_FUZZ=ON -DFSDP_LIBTORCH=debian >/dev/null
  cmake --build $B -j"$(nproc)" --target fuzz_index fuzz_full fuzz_sharded fuzz_pickle fuzz_safetensors fuzz_dcp \
    fuzz_tokenizer fuzz_hf_config fuzz_hf_index
}

run() {
  local target=$1 seconds=$2
  local bin=$B/bin/fuzz_$target
  [ -x "$bin" ] || { echo "fuzz: $bin is not built: run scripts/fuzz.sh build" >&2; exit 77; }
  local corpus=$B/corpus/$target findings=$B/findings/$target
  rm -rf "$corpus"
  mkdir -p "$corpus" "$findings"
  echo "fuzz: $target for ${seconds}s"
  FSDP_FUZZ_SEEDS="$corpus" OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$bin" "$corpus" \
    -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -malloc_limit_mb=1024 \
    -artifact_prefix="$findings/" -print_final_stats=1 2>&1 | grep -vE "^#[0-9]+\s+(NEW|REDUCE|pulse)" || {
    echo "fuzz: $target found an input that breaks the parser: see $findings/" >&2
    exit 1
  }
}

case "${1:-}" in
  build) build ;;
  run) run "$2" "$3" ;;
  all)
    build
    for t in index full sharded pickle safetensors dcp tokenizer hf_config hf_index; do run "$t" "${2:-60}"; done
    ;;
  *)
    sed -n '2,25p' "$0"
    exit 2
    ;;
esac
