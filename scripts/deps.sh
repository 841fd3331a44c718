#!/usr/bin/env bash
# Installs what fsdp-cpp needs to build and test on Debian 12, if missing.
#
# Debian's packages: Debian's LibTorch 1.13 (CPU) with c10d and Python's
# python3-torch (the LibTorch picked by FSDP_LIBTORCH=debian), Gloo's headers
# (the torch wheel has none), an optimized BLAS (Debian's default reference
# BLAS makes LibTorch about 20x slower), GoogleTest, CMake, ccache, CLI11,
# nlohmann-json and zlib (checkpoints), clang with its libFuzzer and
# sanitizer runtimes (the checkpoint-parser fuzzers), iproute2 (the two-host
# fault tests make network namespaces), python3-venv, and the allocators
# `fsdp-run --allocator` preloads (jemalloc, tcmalloc, mimalloc: the trial in
# docs/performance.md), and Open MPI's mpirun (openmpi-bin: the mpirun launch
# tests, docs/launching.md), doxygen (the API reference, scripts/doxygen.sh),
# and PCRE2, ICU, SentencePiece and pkg-config (fsdp::tokenizers:
# tokenizer.json's regular expressions, NFC, tokenizer.model).
#
# PyPI, into .venv/ (ignored by git): requirements.txt's pinned torch 2.x (its
# LibTorch is the default build), lightning, the peers, and tensorboard (the
# reader the logger tests check event files with). The torch wheel is
# a CUDA build; CUDA libraries that this machine's CUDA toolkit already has
# are not downloaded again (scripts/lean_requirements.py), and
# `import torch` is checked before the venv counts as installed. The wheels
# and pip's resolution are kept in a cache (FSDP_WHEEL_CACHE, default
# ~/.cache/fsdp-cpp; pip's own HTTP cache stores nothing behind this machine's
# PyPI proxy), so a rebuilt venv asks PyPI nothing and takes about 25 s.
# FSDP_LIBTORCH=debian skips the venv.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake g++ make ccache libtorch-dev libgloo-dev libopenblas0-pthread libgtest-dev libcli11-dev
          nlohmann-json3-dev zlib1g-dev python3-torch python3-venv clang libclang-rt-14-dev iproute2
          libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0 openmpi-bin doxygen libpcre2-dev libicu-dev
          libsentencepiece-dev pkg-config)
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

[ "${FSDP_LIBTORCH:-wheel}" = debian ] && exit 0

# --- .venv: torch 2.x, lightning, safetensors ----------------------------------
venv=.venv
stamp=$venv/.fsdp-requirements
want=$(sha256sum requirements.txt scripts/lean_requirements.py | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] &&
   "$venv/bin/python" -c 'import torch, lightning, safetensors, tensorboard, transformers, tokenizers, sentencepiece, peft' 2>/dev/null; then
  exit 0
fi
echo "deps: making $venv (requirements.txt: $(grep -E '^[a-z]' requirements.txt | tr '\n' ' '))"
start=$SECONDS
rm -rf "$venv"
/usr/bin/python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
cache=${FSDP_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fsdp-cpp}
resolved=$cache/resolved-$want  # this requirements.txt, resolved and split, once per machine
pip_install() { "${pip[@]}" install -q --no-compile --no-deps --no-index --find-links "$cache/wheels" -r "$1"; }
if [ ! -f "$resolved/keep.txt" ]; then
  mkdir -p "$cache/wheels" "$resolved.tmp"
  "${pip[@]}" install -q --dry-run --ignore-installed --report "$resolved.tmp/report.json" -r requirements.txt
  "$venv/bin/python" scripts/lean_requirements.py "$resolved.tmp/report.json" "$resolved.tmp/keep.txt" "$resolved.tmp/skip.txt"
  "${pip[@]}" download -q --no-deps --only-binary=:all: -d "$cache/wheels" -r "$resolved.tmp/keep.txt"
  rm -rf "$resolved" && mv "$resolved.tmp" "$resolved"
fi
pip_install "$resolved/keep.txt"
if ! "$venv/bin/python" -c 'import torch' 2>"$venv/import.log"; then
  echo "deps: torch does not load with this machine's CUDA libraries ($(tail -n 1 "$venv/import.log")); installing the left-out wheels"
  "${pip[@]}" download -q --no-deps --only-binary=:all: -d "$cache/wheels" -r "$resolved/skip.txt"
  pip_install "$resolved/skip.txt"
fi
"$venv/bin/python" -c 'import torch, lightning; print(f"deps: torch {torch.__version__}, lightning {lightning.__version__}")'
echo "deps: $venv ready in $((SECONDS - start)) s ($(du -sh "$venv" | cut -f1))"
echo "$want" >"$stamp"
