#!/usr/bin/env bash
# The allocator trial: fsdp-bench FULL_SHARD at world 2 under glibc's malloc
# and under Debian's jemalloc, tcmalloc and mimalloc (fsdp-run --allocator),
# alternating round by round, on the default model and the 100 M one.
# Prints a table of medians; every record goes to build/allocators.jsonl.
#   ROUNDS=2 bench/allocators.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-2}
run=build/bin/fsdp-run
bench=build/bin/fsdp-bench
out=${OUT:-build/allocators.jsonl}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
: > "$out"
for ((r = 1; r <= rounds; r++)); do
  for shape in default 100m; do
    case $shape in
      default) args=(--steps 8 --warmup 2) ;;
      100m) args=(--dim 1024 --layers 8 --heads 8 --batch 2 --steps 3 --warmup 1) ;;
    esac
    for alloc in system jemalloc tcmalloc mimalloc; do
      echo "round $r/$rounds: $shape, $alloc" >&2
      line=$($run --nproc-per-node 2 --no-rank-prefix --allocator "$alloc" -- $bench "${args[@]}" 2>/dev/null |
        grep '^{' | tail -1 || true)
      [[ -n $line ]] || line='{"failed":true}'
      printf '{"shape":"%s","allocator":"%s","round":%d,"result":%s}\n' "$shape" "$alloc" "$r" "$line" >> "$out"
    done
  done
done
python3 - "$out" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| model | allocator | step s (rounds) | median step s | peak RSS MiB/rank (median of the larger rank) |")
print("| --- | --- | --- | --- | --- |")
for shape in ("default", "100m"):
    for alloc in ("system", "jemalloc", "tcmalloc", "mimalloc"):
        res = [r["result"] for r in rows if r["shape"] == shape and r["allocator"] == alloc]
        ok = [x for x in res if "step_s" in x]
        steps = ", ".join(f"{x['step_s']:.3f}" for x in ok) or "failed"
        med = f"{statistics.median(x['step_s'] for x in ok):.3f}" if ok else "–"
        rss = f"{statistics.median(max(x['peak_rss_mb']) for x in ok):.0f}" if ok else "–"
        print(f"| {shape} | {alloc} | {steps} | {med} | {rss} |")
EOF
