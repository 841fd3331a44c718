#!/usr/bin/env bash
# Runs the fsdp-bench measurements recorded in docs/performance.md, one JSON
# line each, on this machine (2 ranks, one thread per rank).
set -euo pipefail
cd "$(dirname "$0")/.."
run=build/bin/fsdp-run
bench=build/bin/fsdp-bench
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
steps=${STEPS:-10}
echo "# default GPT (4 layers, width 256, 4 heads, context 128, batch 8 per rank), world 2"
for s in FULL_SHARD SHARD_GRAD_OP NO_SHARD HYBRID_SHARD; do
  $run --nproc-per-node 2 --no-rank-prefix -- $bench --strategy $s --steps "$steps" --warmup 2
done
$run --nproc-per-node 2 --no-rank-prefix -- $bench --strategy FULL_SHARD --forward-prefetch --steps "$steps" --warmup 2
$run --nproc-per-node 2 --no-rank-prefix -- $bench --strategy FULL_SHARD --bf16 --steps "$steps" --warmup 2
echo "# single process, same per-rank batch, one thread"
$run --nproc-per-node 1 --no-rank-prefix -- $bench --strategy local --steps "$steps" --warmup 2
echo "# ~100M parameters (14 layers, width 768, 12 heads, context 128, batch 4 per rank), AdamW, world 2"
for s in FULL_SHARD NO_SHARD; do
  $run --nproc-per-node 2 --no-rank-prefix -- $bench --strategy $s --dim 768 --layers 14 --heads 12 --batch 4 --steps 2 --warmup 1
done
echo "# activation checkpointing (issue 4): 8 layers, width 512, 8 heads, context 256, batch 8 per rank, FULL_SHARD, world 2"
for ck in "" "--activation-checkpointing"; do
  $run --nproc-per-node 2 --no-rank-prefix -- $bench --strategy FULL_SHARD --dim 512 --layers 8 --heads 8 --ctx 256 --batch 8 --steps 2 --warmup 1 $ck
done
echo "# checkpoints (issue 6): ~100M parameters, AdamW, world 2, both formats"
ckpt_dir=$(mktemp -d)
$run --nproc-per-node 2 --no-rank-prefix -- $bench --strategy FULL_SHARD --dim 768 --layers 14 --heads 12 --batch 4 --steps 1 --warmup 1 --checkpoint "$ckpt_dir/ckpt"
rm -rf "$ckpt_dir"
