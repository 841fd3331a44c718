#!/usr/bin/env python3
"""torch's own fully_shard (FSDP2) as the reference for fsdp-cpp's
(tests/fsdp2/fully_shard_test.cpp): the same model, the same initial values
and batches (made on both sides by the same ATen operations), trained over
Gloo on CPU with one thread per rank and torch.optim.AdamW.

    fully_shard_oracle.py DIR WORLD CASE...

Starts WORLD processes; each runs every CASE in turn and writes
DIR/CASE.rRANK.bin: the loss of each step, then the local shard of every
parameter after the last step (named_parameters order), as little-endian
float32. A case is a name and its settings, joined by '+':
  base        blocks sharded, then the root; reshard_after_forward unset
  raf0        reshard_after_forward=False everywhere
  raf2        reshard_after_forward=2 everywhere (a group of 2 inside the shard group)
  bf16        MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)
  bf16p       MixedPrecisionPolicy(param_dtype=bfloat16): no reduce_dtype
  lora        embedding, head and the blocks' linears frozen; LoRA adapters train
  accum       two micro-batches per step, the first without gradient sync
  prefetch    explicit forward and backward prefetch lists, an async
              unshard of the root before each forward, and unshard() then
              reshard() after each step
  hsdp        a 2-D mesh (replicate=2, shard=WORLD/2)
  noar        two micro-batches per step, the first without the all-reduce
              across replicas (set_requires_all_reduce(False); with hsdp)
  sum         set_gradient_divide_factor(WORLD) with force-sum reduction
  clip        clip_grad_norm_(max_norm=0.5) before each step; the norm is
              written after the step's loss
  group       the two blocks sharded as one group: fully_shard([b0, b1])
  ends        the embedding and the head sharded as one group:
              fully_shard([emb, head]) (the first and the last module to run)
  tied        the head's weight is the embedding's (head.weight = emb.weight,
              after the initial values); listed once, as emb.weight
e.g. "base", "bf16+raf0".
"""
import os
import struct
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

VOCAB, DIM, HIDDEN, RANK_LORA = 11, 8, 13, 2
GLOBAL_BATCH, SEQ, STEPS = 12, 3, 3
LR, WEIGHT_DECAY = 0.01, 0.1


def values_of(shape, a, b):
    """sin(arange * a + b) * 0.5, made in float64 and rounded to float32."""
    n = 1
    for s in shape:
        n *= s
    return torch.arange(n, dtype=torch.float64).mul(a).add(b).sin().mul(0.5).to(torch.float32).reshape(shape)


class Block(torch.nn.Module):
    def __init__(self, lora):
        super().__init__()
        if lora:
            self.lora_a = torch.nn.Parameter(torch.zeros(RANK_LORA, DIM))
            self.lora_b = torch.nn.Parameter(torch.zeros(HIDDEN, RANK_LORA))
        self.lora = lora
        self.fc1 = torch.nn.Linear(DIM, HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        h = self.fc1(x)
        if self.lora:
            h = h + torch.nn.functional.linear(torch.nn.functional.linear(x, self.lora_a), self.lora_b)
        return x + self.fc2(torch.tanh(h))


class TinyLM(torch.nn.Module):
    def __init__(self, lora):
        super().__init__()
        self.offset = torch.nn.Parameter(torch.zeros(1, DIM))
        self.mix = torch.nn.Parameter(torch.zeros(2))
        self.emb = torch.nn.Embedding(VOCAB, DIM)
        self.b0 = Block(lora)
        self.b1 = Block(lora)
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        h = self.emb(tokens).mean(1) + self.offset
        h = self.b1(self.b0(h))
        h = h * self.mix[0] + self.mix[1]
        return self.head(h)


def make_model(lora):
    model = TinyLM(lora)
    with torch.no_grad():
        for i, (name, p) in enumerate(model.named_parameters()):
            p.copy_(values_of(list(p.shape), 0.37 + 0.1 * i, 0.2 * i))
            if lora and "lora" not in name:
                p.requires_grad_(False)
    return model


def batch(step, micro, rank, world):
    """Global batch `step` (micro-batch `micro`): this rank's rows."""
    t = step * 2 + micro
    i = torch.arange(GLOBAL_BATCH).reshape(-1, 1)
    j = torch.arange(SEQ).reshape(1, -1)
    tokens = (i * 7 + j * 3 + t * 5 + 1) % VOCAB
    target = (torch.arange(GLOBAL_BATCH) * 5 + t * 2) % VOCAB
    n = GLOBAL_BATCH // world
    return tokens[rank * n:(rank + 1) * n], target[rank * n:(rank + 1) * n]


def run_case(case, rank, world, out_dir):
    flags = set(case.split("+"))
    known = {"base", "raf0", "raf2", "bf16", "bf16p", "lora", "accum", "prefetch", "hsdp", "sum", "clip", "noar", "group", "ends", "tied"}
    if flags - known:
        raise SystemExit(f"fully_shard_oracle.py: unknown case flags {sorted(flags - known)}; known: {sorted(known)}")
    if "hsdp" in flags:
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cpu", (world,))
    kwargs = {"mesh": mesh}
    if "raf0" in flags:
        kwargs["reshard_after_forward"] = False
    if "raf2" in flags:
        kwargs["reshard_after_forward"] = 2
    if "bf16" in flags:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if "bf16p" in flags:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    model = make_model("lora" in flags)
    if "tied" in flags:
        model.head.weight = model.emb.weight
    if "ends" in flags:
        fully_shard([model.emb, model.head], **kwargs)
    if "group" in flags:
        fully_shard([model.b0, model.b1], **kwargs)
    else:
        fully_shard(model.b0, **kwargs)
        fully_shard(model.b1, **kwargs)
    fully_shard(model, **kwargs)
    if "prefetch" in flags:
        model.set_modules_to_forward_prefetch([model.b0])
        model.b0.set_modules_to_forward_prefetch([model.b1])
        model.b1.set_modules_to_backward_prefetch([model.b0])
    if "sum" in flags:
        for m in (model, model.b0, model.b1):
            m.set_gradient_divide_factor(float(world))
            m.set_force_sum_reduction_for_comms(True)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        micros = 2 if flags & {"accum", "noar"} else 1
        for micro in range(micros):
            if "accum" in flags:
                model.set_requires_gradient_sync(micro == micros - 1)
            if "noar" in flags:
                model.set_requires_all_reduce(micro == micros - 1)
            if "prefetch" in flags:
                model.unshard(async_op=True)
            tokens, target = batch(step, micro, rank, world)
            loss = torch.nn.functional.cross_entropy(model(tokens), target)
            loss.backward()
            losses.append(loss.detach().float())
        if "clip" in flags:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
            losses.append(norm.full_tensor().float())
        opt.step()
        if "prefetch" in flags:
            model.unshard()  # gathers the stepped shards, which reshard() shows again
            model.reshard()
    with open(os.path.join(out_dir, f"{case}.r{rank}.bin"), "wb") as f:
        for loss in losses:
            f.write(struct.pack("<f", loss.item()))
        for _, p in model.named_parameters():
            f.write(p.to_local().detach().float().contiguous().numpy().astype("<f4").tobytes())


def worker(rank, world, out_dir, cases):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method="file://" + os.path.join(out_dir, "store"))
    try:
        for case in cases:
            run_case(case, rank, world, out_dir)
    finally:
        dist.destroy_process_group()


def main():
    if len(sys.argv) < 4:
        raise SystemExit("usage: fully_shard_oracle.py DIR WORLD CASE...")
    out_dir, world, cases = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    mp.spawn(worker, args=(world, out_dir, cases), nprocs=world, join=True)


if __name__ == "__main__":
    main()
