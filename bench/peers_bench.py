"""The Python peers of fsdp-bench: the same GPT (fsdp/models/gpt.h, written
again here in PyTorch), the same per-rank batch, optimizer and timing, under
PyTorch's DDP, FSDP1 (FullyShardedDataParallel) or FSDP2 (fully_shard), or
in one process. Prints one JSON line from rank 0 with the fields fsdp-bench
prints (step_s, tokens_per_s, peak_rss_mb per rank, loss).

  torchrun --standalone --nproc-per-node 2 bench/peers_bench.py --mode ddp|fsdp1|fsdp2 [shape flags]
  python bench/peers_bench.py --mode local [shape flags]

bench/compare.sh runs it beside fsdp-bench.
"""
import argparse
import json
import math
import os
import resource
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """Pre-norm block: x + attn(ln1(x)), then x + mlp(ln2(x)); causal attention."""

    def __init__(self, dim, heads, layers):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.fc_proj = nn.Linear(4 * dim, dim)
        with torch.no_grad():  # GPT-2's initialisation, as fsdp-cpp's model
            for lin in (self.qkv, self.proj, self.fc, self.fc_proj):
                nn.init.normal_(lin.weight, 0.0, 0.02)
                nn.init.zeros_(lin.bias)
            scaled = 0.02 / math.sqrt(2.0 * layers)
            nn.init.normal_(self.proj.weight, 0.0, scaled)
            nn.init.normal_(self.fc_proj.weight, 0.0, scaled)

    def forward(self, x):
        B, T, C = x.shape
        H = self.heads
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, ctx, dim, layers, heads):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(ctx, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads, layers) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        with torch.no_grad():
            nn.init.normal_(self.tok.weight, 0.0, 0.02)
            nn.init.normal_(self.pos.weight, 0.0, 0.02)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        return F.linear(self.ln_f(self.blocks(x)), self.tok.weight)  # tied output projection


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", required=True, choices=["local", "ddp", "fsdp1", "fsdp2"])
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    vocab = 256
    distributed = a.mode != "local"
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    torch.manual_seed(0)
    net = GPT(vocab, a.ctx, a.dim, a.layers, a.heads)
    params = sum(p.numel() for p in net.parameters())
    if a.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(net)
    elif a.mode == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        model = FSDP(net, auto_wrap_policy=ModuleWrapPolicy({Block}), sharding_strategy=ShardingStrategy.FULL_SHARD,
                     device_id=torch.device("cpu"))
    elif a.mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for block in net.blocks:
            fully_shard(block)
        model = fully_shard(net)
    else:
        model = net
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    times, loss = [], None
    for step in range(a.warmup + a.steps):
        g = torch.Generator().manual_seed(1000 + step * 131 + rank)
        data = torch.randint(0, vocab, (a.batch, a.ctx + 1), generator=g)
        x, y = data[:, :-1], data[:, 1:]
        if distributed:
            dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, vocab).float(), y.reshape(-1))
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        if step >= a.warmup:
            times.append(dt)
    times.sort()
    median = times[len(times) // 2] if times else 0.0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    all_rss = [rss]
    if distributed:
        all_rss = [None] * world
        dist.all_gather_object(all_rss, round(rss, 1))
    if rank == 0:
        print(json.dumps({"strategy": f"torch-{a.mode}", "torch": torch.__version__, "world": world, "params": params,
                          "dim": a.dim, "layers": a.layers, "heads": a.heads, "ctx": a.ctx, "batch_per_rank": a.batch,
                          "step_s": round(median, 4),
                          "tokens_per_s": round(a.batch * a.ctx * world / median, 1) if median > 0 else 0,
                          "peak_rss_mb": all_rss, "loss": round(loss.item(), 5)}), flush=True)
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    os._exit(0)  # see tests/python/clean_exit.py: torch's teardown may abort a rank under load


if __name__ == "__main__":
    main()
