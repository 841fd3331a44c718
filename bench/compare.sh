#!/usr/bin/env bash
# fsdp-cpp beside PyTorch, in one invocation, on this machine: the same GPT
# shape, per-rank batch, AdamW, one thread per rank, float32, world 2.
# Alternates the runs (ROUNDS rounds of every run), then prints a table of
# medians with ratios. Needs build/ (scripts/build.sh) and .venv/ (scripts/deps.sh).
#
#   bench/compare.sh                 # default model (width 256, 4 layers, ctx 128, batch 8)
#   bench/compare.sh 100m            # width 1024, 8 layers, 8 heads, batch 2
#   ROUNDS=3 STEPS=5 bench/compare.sh
#   ONLY='FSDP' bench/compare.sh     # only the runs whose name matches (grep -E)
#
# Every JSON record goes to $OUT (default build/compare-<shape>.jsonl) as well.
set -euo pipefail
cd "$(dirname "$0")/.."
shape=${1:-default}
rounds=${ROUNDS:-3}
steps=${STEPS:-6}
warmup=${WARMUP:-2}
case "$shape" in
  default) args=(--dim 256 --layers 4 --heads 4 --ctx 128 --batch 8) ;;
  100m) args=(--dim 1024 --layers 8 --heads 8 --ctx 128 --batch 2); steps=${STEPS:-3}; warmup=${WARMUP:-1} ;;
  *) echo "compare.sh: unknown shape '$shape' (expected default or 100m)" >&2; exit 2 ;;
esac
out=${OUT:-build/compare-$shape.jsonl}
run=build/bin/fsdp-run
bench=build/bin/fsdp-bench
py=.venv/bin/python
for f in "$run" "$bench" "$py"; do
  [[ -x $f ]] || { echo "compare.sh: $f is missing: run scripts/build.sh (and scripts/deps.sh) first" >&2; exit 2; }
done
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
: > "$out"

# name | command; each prints one JSON line.
# fsdp-run preloads tcmalloc by default (--allocator auto); the Python peers
# run with glibc's malloc as PyTorch does, and DDP once more with tcmalloc
# preloaded, so that the allocator's share of the difference shows.
runs=(
  "fsdp-cpp FULL_SHARD|$run --nproc-per-node 2 --no-rank-prefix -- $bench --strategy FULL_SHARD"
  "fsdp-cpp FSDP2 (fully_shard)|$run --nproc-per-node 2 --no-rank-prefix -- $bench --engine fsdp2 --strategy FULL_SHARD"
  "fsdp-cpp FULL_SHARD, glibc malloc|$run --nproc-per-node 2 --no-rank-prefix --allocator system -- $bench --strategy FULL_SHARD"
  "fsdp-cpp SHARD_GRAD_OP|$run --nproc-per-node 2 --no-rank-prefix -- $bench --strategy SHARD_GRAD_OP"
  "fsdp-cpp NO_SHARD|$run --nproc-per-node 2 --no-rank-prefix -- $bench --strategy NO_SHARD"
  "fsdp-cpp 1 process|$run --nproc-per-node 1 --no-rank-prefix -- $bench --strategy local"
  "PyTorch DDP|.venv/bin/torchrun --standalone --nproc-per-node 2 bench/peers_bench.py --mode ddp"
  "PyTorch DDP, tcmalloc|env LD_PRELOAD=libtcmalloc_minimal.so.4 .venv/bin/torchrun --standalone --nproc-per-node 2 bench/peers_bench.py --mode ddp"
  "PyTorch FSDP1|.venv/bin/torchrun --standalone --nproc-per-node 2 bench/peers_bench.py --mode fsdp1"
  "PyTorch FSDP2|.venv/bin/torchrun --standalone --nproc-per-node 2 bench/peers_bench.py --mode fsdp2"
  "PyTorch 1 process|$py bench/peers_bench.py --mode local"
)
if [[ -n ${ONLY:-} ]]; then
  kept=()
  for entry in "${runs[@]}"; do
    if grep -Eq -- "$ONLY" <<< "${entry%%|*}"; then kept+=("$entry"); fi
  done
  runs=("${kept[@]}")
fi
for ((r = 1; r <= rounds; r++)); do
  for entry in "${runs[@]}"; do
    name=${entry%%|*}
    cmd=${entry#*|}
    echo "round $r/$rounds: $name" >&2
    line=$($cmd "${args[@]}" --steps "$steps" --warmup "$warmup" 2>/dev/null | grep '^{' | tail -1 || true)
    [[ -n $line ]] || line='{"failed":true}'
    printf '{"run":"%s","round":%d,"result":%s}\n' "$name" "$r" "$line" >> "$out"
  done
done
"$py" - "$out" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["run"], []).append(r["result"])
def med(name, key):
    vals = [x[key] for x in by.get(name, []) if key in x]
    return statistics.median(vals) if vals else None
def peak(name):
    vals = [max(x["peak_rss_mb"]) for x in by.get(name, []) if "peak_rss_mb" in x]
    return statistics.median(vals) if vals else None
ddp = med("PyTorch DDP", "tokens_per_s")
fsdp_best = max([v for v in (med("PyTorch FSDP1", "tokens_per_s"), med("PyTorch FSDP2", "tokens_per_s")) if v] or [0]) or None
ddp_rss = peak("PyTorch DDP")
first = next(iter(by.values()))[0]
print(f"# shape: width {first.get('dim')}, {first.get('layers')} layers, {first.get('heads')} heads, "
      f"ctx {first.get('ctx')}, batch {first.get('batch_per_rank')} per rank; {len(rows) // len(by)} rounds; medians")
print("| run | step s (each round) | tokens/s | × PyTorch DDP | × best PyTorch FSDP | peak RSS MiB/rank | RSS × DDP |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for name, res in by.items():
    steps = ", ".join(f"{x['step_s']:.3f}" if "step_s" in x else "failed" for x in res)
    tps, rss = med(name, "tokens_per_s"), peak(name)
    f = lambda v, d=2: "–" if v is None else f"{v:.{d}f}"
    print(f"| {name} | {steps} | {f(tps, 0)} | {f(tps / ddp if tps and ddp else None)} | "
          f"{f(tps / fsdp_best if tps and fsdp_best else None)} | {f(rss, 0)} | {f(rss / ddp_rss if rss and ddp_rss else None)} |")
EOF
