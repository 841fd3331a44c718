#!/usr/bin/env bash
# What watching a run costs (issue 30): the default model at world 2,
# FULL_SHARD, side by side, alternating round by round:
#   1. fsdp-bench without and with --tensorboard (rank 0 logs 6 scalars
#      every step, the worst case; the bench times the log calls apart from
#      the step, and reports them as tensorboard_log_s_per_step);
#   2. fsdp-train with --logger jsonl and with the default
#      --logger tensorboard,jsonl (logging every --log-every 10 steps):
#      the median step time from metrics.jsonl's elapsed_s.
# Prints a table of medians; every record goes to build/logging_cost.jsonl.
#   ROUNDS=3 bench/logging_cost.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
run=build/bin/fsdp-run
bench=build/bin/fsdp-bench
train=build/bin/fsdp-train
out=${OUT:-build/logging_cost.jsonl}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
: > "$out"
for ((r = 1; r <= rounds; r++)); do
  for mode in off tensorboard; do
    echo "round $r/$rounds: fsdp-bench, logging $mode" >&2
    extra=()
    [[ $mode == tensorboard ]] && extra=(--tensorboard "$tmp/bench-$r")
    line=$($run --nproc-per-node 2 --no-rank-prefix -- $bench --steps 20 --warmup 2 "${extra[@]}" 2>/dev/null |
      grep '^{' | tail -1 || true)
    [[ -n $line ]] || line='{"failed":true}'
    printf '{"tool":"fsdp-bench","logging":"%s","round":%d,"result":%s}\n' "$mode" "$r" "$line" >> "$out"
  done
  for loggers in jsonl tensorboard,jsonl; do
    echo "round $r/$rounds: fsdp-train, --logger $loggers" >&2
    dir="$tmp/train-$r-${loggers//,/-}"
    $run --nproc-per-node 2 --no-rank-prefix -- $train --steps 60 --out "$dir" --logger "$loggers" >/dev/null 2>&1
    python3 - "$dir/metrics.jsonl" "$loggers" "$r" >> "$out" <<'EOF'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"step"')]
# A step's time: the difference of elapsed_s between consecutive lines (the
# first step, with the lazy initialisation, left out).
steps = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(lines, lines[1:])]
print(json.dumps({"tool": "fsdp-train", "logging": sys.argv[2], "round": int(sys.argv[3]),
                  "result": {"step_s": statistics.median(steps), "steps": len(steps)}}))
EOF
  done
done
python3 - "$out" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| tool | logging | step s (rounds) | median step s | log s per step (median) |")
print("| --- | --- | --- | --- | --- |")
for tool, modes in (("fsdp-bench", ("off", "tensorboard")), ("fsdp-train", ("jsonl", "tensorboard,jsonl"))):
    for mode in modes:
        res = [x["result"] for x in rows if x["tool"] == tool and x["logging"] == mode and "step_s" in x["result"]]
        steps = ", ".join(f"{x['step_s']:.4f}" for x in res) or "failed"
        med = f"{statistics.median(x['step_s'] for x in res):.4f}" if res else "–"
        logs = [x["tensorboard_log_s_per_step"] for x in res if "tensorboard_log_s_per_step" in x]
        log = f"{statistics.median(logs) * 1e6:.1f} µs" if logs else "–"
        print(f"| {tool} | {mode} | {steps} | {med} | {log} |")
EOF
