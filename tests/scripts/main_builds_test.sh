#!/usr/bin/env bash
# The main job builds only what it runs: scripts/main.sh names its targets,
# builds those, and their dependency closure (a dry run of the build in this
# build folder) compiles the library and the two tools but no test.
# Usage: scripts/main_builds_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 build=$2
main="$src/scripts/main.sh"
targets=$(sed -n 's/^targets="\(.*\)"$/\1/p' "$main")
[ -n "$targets" ] || { echo "FAIL: $main names no targets (targets=\"...\")"; exit 1; }
grep -q '^scripts/build.sh --target \$targets$' "$main" || { echo "FAIL: $main does not build only \$targets"; exit 1; }
for t in $targets; do
  grep -q "^$t:" "$build/Makefile" || { echo "FAIL: '$t' is not a target of $build"; exit 1; }
done
# shellcheck disable=SC2086
plan=$(cmake --build "$build" --target $targets -- -n -B 2>&1)
echo "$plan" | grep -q 'tools/fsdp_train.cpp' || { echo "FAIL: the dry run does not compile fsdp-train:"; echo "$plan" | tail; exit 1; }
if echo "$plan" | grep -E '_test\.cpp|gtest' | head -3 | grep -q .; then
  echo "FAIL: the main job's build compiles tests:"; echo "$plan" | grep -E '_test\.cpp|gtest' | head -3; exit 1
fi
echo "ok: main.sh builds $targets; no test is compiled"
