#!/bin/sh
# The Hugging Face benchmarks of docs/performance.md ("Hugging Face models"),
# side by side in one run at world 2:
#   1. the load of a Llama-3.2-1B-shaped and a SmolLM2-135M-shaped model
#      (bfloat16, made by transformers: bench/hf_peers.py make) by fsdp-cpp
#      (fsdp-hf-load) and by PyTorch's from_pretrained + fully_shard and DCP's
#      HuggingFaceStorageReader: seconds and peak RSS per rank;
#   2. training tokens/s of the 135M one in float32: fsdp-train --model hf:DIR
#      --engine fsdp2 against transformers under torch's fully_shard, the same
#      shapes (context, batch, steps), the same optimizer.
#
#   bench/hf_models.sh [WORK_DIR]   (default /tmp/fsdp-hf-bench; needs ~3.5 GB there)
set -eu
cd "$(dirname "$0")/.."
work=${1:-/tmp/fsdp-hf-bench}
py=.venv/bin/python
torchrun=.venv/bin/torchrun
bin=build/bin
mkdir -p "$work"
[ -f "$work/llama1b/config.json" ] && [ -f "$work/smol135m/config.json" ] || $py bench/hf_peers.py make "$work"
for model in smol135m llama1b; do
  echo "== load $model at world 2 (bfloat16)"
  $bin/fsdp-run --nproc-per-node 2 -- $bin/fsdp-hf-load "$work/$model" --dtype bfloat16 2>&1 | grep '^{\|"peer"' || true
  for how in from_pretrained dcp; do
    $torchrun --standalone --nproc-per-node 2 bench/hf_peers.py load "$work/$model" $how 2>&1 | grep '"peer"' || true
  done
done
context=256 batch=4 steps=12
echo "== training smol135m: context $context, batch $batch per rank, $steps steps, float32, world 2"
$py -c "import numpy as np; np.random.default_rng(0).integers(0, 49152, 2_000_000, dtype=np.uint16).tofile('$work/tokens.bin')"
rm -rf "$work/run"
$bin/fsdp-run --nproc-per-node 2 -- $bin/fsdp-train --model "hf:$work/smol135m" --data "$work/tokens.bin" \
  --data-format uint16 --context $context --batch $batch --steps $steps --engine fsdp2 --eval-every 0 \
  --logger jsonl --log-every 1000 --out "$work/run" >/dev/null
$py - "$work/run/metrics.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]  # as the peer: the steps after the first two
rate = len(rows) / sum(1 / r["tokens_per_s"] for r in rows)  # the same tokens each step: their total over the time
print(json.dumps({"peer": "fsdp-train --engine fsdp2", "tokens_per_s": round(rate)}))
EOF
$torchrun --standalone --nproc-per-node 2 bench/hf_peers.py train "$work/smol135m" $context $batch $steps 2>&1 | grep '"peer"'
