#!/usr/bin/env python3
"""torch's own FullyShardedDataParallel (FSDP1) as the reference for
fsdp-cpp's (tests/core/fsdp1_oracle_test.cpp), with gradient clipping: the
same model, initial values and batches (made on both sides by the same ATen
operations), trained over Gloo on CPU with one thread per rank,
torch.optim.AdamW, and FullyShardedDataParallel.clip_grad_norm_ before each
step.

    fsdp1_oracle.py DIR WORLD CASE...

Starts WORLD processes; each runs every CASE in turn and writes
DIR/CASE.rRANK.bin: per step the loss, then the norm clip_grad_norm_
returned, then after the last step every tensor of model.parameters() (the
flat parameters' local shards, padding included; with use_orig_params each
original parameter's local part), as little-endian float32. A case is a name
and its settings, joined by '+':
  flat      use_orig_params=False (one FlatParameter per unit)
  orig      use_orig_params=True (the original parameters' sharded views)
  noshard   every unit NO_SHARD (torch then calls nn.utils.clip_grad_norm_)
  mixed     the blocks NO_SHARD, the root FULL_SHARD (their norms are added
            after the all-reduce)
  inf       norm_type=inf (default 2)
  p1        norm_type=1
  aligned   sizes whose every parameter is a multiple of 16 bytes (without
            it the sizes are odd, and with use_orig_params torch pads each
            original parameter to a 16-byte start in its FlatParameter)
e.g. "flat", "orig+aligned+inf".
"""
import math
import os
import struct
import sys
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

GLOBAL_BATCH, SEQ, STEPS = 12, 3, 3
LR, WEIGHT_DECAY, MAX_NORM = 0.01, 0.1, 0.1


def sizes(flags):
    """(vocab, dim, hidden): odd by default, multiples of 4 with 'aligned'."""
    return (12, 8, 12) if "aligned" in flags else (11, 8, 13)


def values_of(shape, a, b):
    """sin(arange * a + b) * 0.5, made in float64 and rounded to float32."""
    n = 1
    for s in shape:
        n *= s
    return torch.arange(n, dtype=torch.float64).mul(a).add(b).sin().mul(0.5).to(torch.float32).reshape(shape)


class Block(torch.nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = torch.nn.Linear(dim, hidden)
        self.fc2 = torch.nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.fc2(torch.tanh(self.fc1(x)))


class TinyLM(torch.nn.Module):
    def __init__(self, vocab, dim, hidden, aligned):
        super().__init__()
        self.offset = torch.nn.Parameter(torch.zeros(1, dim))
        self.mix = torch.nn.Parameter(torch.zeros(4 if aligned else 2))
        self.emb = torch.nn.Embedding(vocab, dim)
        self.b0 = Block(dim, hidden)
        self.b1 = Block(dim, hidden)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens):
        h = self.emb(tokens).mean(1) + self.offset
        h = self.b1(self.b0(h))
        h = h * self.mix[0] + self.mix[1]
        return self.head(h)


def make_model(flags):
    vocab, dim, hidden = sizes(flags)
    model = TinyLM(vocab, dim, hidden, "aligned" in flags)
    with torch.no_grad():
        for i, (_, p) in enumerate(model.named_parameters()):
            p.copy_(values_of(list(p.shape), 0.37 + 0.1 * i, 0.2 * i))
    return model


def batch(step, rank, world, vocab):
    """Global batch `step`: this rank's rows."""
    i = torch.arange(GLOBAL_BATCH).reshape(-1, 1)
    j = torch.arange(SEQ).reshape(1, -1)
    tokens = (i * 7 + j * 3 + step * 5 + 1) % vocab
    target = (torch.arange(GLOBAL_BATCH) * 5 + step * 2) % vocab
    n = GLOBAL_BATCH // world
    return tokens[rank * n:(rank + 1) * n], target[rank * n:(rank + 1) * n]


def run_case(case, rank, world, out_dir):
    flags = set(case.split("+"))
    known = {"flat", "orig", "noshard", "mixed", "inf", "p1", "aligned"}
    if flags - known:
        raise SystemExit(f"fsdp1_oracle.py: unknown case flags {sorted(flags - known)}; known: {sorted(known)}")
    norm_type = math.inf if "inf" in flags else 1.0 if "p1" in flags else 2.0
    kwargs = {"use_orig_params": "orig" in flags, "device_id": torch.device("cpu")}
    model = make_model(flags)
    if "mixed" in flags:
        model.b0 = FSDP(model.b0, sharding_strategy=ShardingStrategy.NO_SHARD, **kwargs)
        model.b1 = FSDP(model.b1, sharding_strategy=ShardingStrategy.NO_SHARD, **kwargs)
        model = FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD, **kwargs)
    else:
        strategy = ShardingStrategy.NO_SHARD if "noshard" in flags else ShardingStrategy.FULL_SHARD
        model = FSDP(model, sharding_strategy=strategy, auto_wrap_policy=ModuleWrapPolicy({Block}), **kwargs)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    out = []
    for step in range(STEPS):
        opt.zero_grad()
        tokens, target = batch(step, rank, world, sizes(flags)[0])
        loss = torch.nn.functional.cross_entropy(model(tokens), target)
        loss.backward()
        out.append(loss.detach().float())
        out.append(model.clip_grad_norm_(MAX_NORM, norm_type).float())
        opt.step()
    with open(os.path.join(out_dir, f"{case}.r{rank}.bin"), "wb") as f:
        for x in out:
            f.write(struct.pack("<f", x.item()))
        for p in model.parameters():
            f.write(p.detach().float().contiguous().numpy().astype("<f4").tobytes())


def worker(rank, world, out_dir, cases):
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")  # NO_SHARD's deprecation, FSDP1's
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method="file://" + os.path.join(out_dir, "store"))
    try:
        for case in cases:
            run_case(case, rank, world, out_dir)
    finally:
        dist.destroy_process_group()


def main():
    if len(sys.argv) < 4:
        raise SystemExit("usage: fsdp1_oracle.py DIR WORLD CASE...")
    out_dir, world, cases = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    mp.spawn(worker, args=(world, out_dir, cases), nprocs=world, join=True)


if __name__ == "__main__":
    main()
