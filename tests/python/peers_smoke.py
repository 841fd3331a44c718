"""The Python peers of fsdp-cpp, run here as a user would run them: each
trains a small transformer for a few steps on CPU over Gloo and checks that
it trained (loss down) and that the ranks agree on the result.

  torchrun --standalone --nproc-per-node 2 peers_smoke.py ddp|fsdp1|fsdp2
  python peers_smoke.py fabric-ddp|fabric-fsdp   (Fabric launches its own 2 processes)

Prints "peer <name>: ok (loss A -> B)" on rank 0 and exits 0, or prints
what the peer said where it refuses ("peer <name>: refused: ...") and exits
3, so that the test and docs/platform.md can tell a refusal from a failure.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

from clean_exit import leave

STEPS = 6


class Block(nn.Module):
    def __init__(self, width=32, heads=2):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Net(nn.Module):
    def __init__(self, vocab=64, width=32, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.blocks = nn.Sequential(*[Block(width) for _ in range(layers)])
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens):
        return self.head(self.blocks(self.emb(tokens)))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    tokens = torch.randint(0, 64, (4, 16), generator=g)
    return tokens, torch.roll(tokens, -1, dims=1)  # learnable: predict the next token of a fixed rotation


def train(model, optimizer, rank, backward=None, step_fn=None):
    losses = []
    for step in range(STEPS):
        tokens, target = batch(rank, step % 2)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), target.flatten())
        (backward or (lambda l: l.backward()))(loss)
        optimizer.step()
        losses.append(loss.item())
    return losses


def params_digest(tensors):
    return torch.stack([t.detach().float().double().sum() for t in tensors]).sum()


def check_and_report(name, losses, digest):
    rank = dist.get_rank()
    all_digests = [None] * dist.get_world_size()
    dist.all_gather_object(all_digests, float(digest))
    if rank == 0:
        assert losses[-1] < losses[0], f"{name}: loss did not go down: {losses}"
        assert all(abs(d - all_digests[0]) < 1e-9 for d in all_digests), f"{name}: ranks disagree: {all_digests}"
        print(f"peer {name}: ok (loss {losses[0]:.3f} -> {losses[-1]:.3f})", flush=True)


def run_torchrun(name):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = Net()
    if name == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(net)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = train(model, opt, rank)
        digest = params_digest(model.parameters())
    elif name == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        model = FSDP(net, auto_wrap_policy=ModuleWrapPolicy({Block}), sharding_strategy=ShardingStrategy.FULL_SHARD,
                     device_id=torch.device("cpu"))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = train(model, opt, rank)
        with FSDP.summon_full_params(model):
            digest = params_digest(model.parameters())
    elif name == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for block in net.blocks:
            fully_shard(block)
        fully_shard(net)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
        losses = train(net, opt, rank)
        digest = params_digest(p.full_tensor() for p in net.parameters())
    else:
        raise SystemExit(f"unknown peer {name!r}")
    check_and_report(name, losses, digest)
    leave(0)


def run_fabric(name):
    import lightning as L
    from lightning.fabric.strategies import FSDPStrategy

    strategy = FSDPStrategy(auto_wrap_policy={Block}) if name == "fabric-fsdp" else "ddp"
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy=strategy)
    fabric.launch()
    fabric.seed_everything(0)
    model = fabric.setup_module(Net())
    opt = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-2))
    losses = train(model, opt, fabric.global_rank, backward=fabric.backward)
    state = model.state_dict()  # full state dict, gathered
    check_and_report(name, losses, params_digest(state.values()))
    leave(0)


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    name = sys.argv[1]
    torch.set_num_threads(1)
    try:
        run_fabric(name) if name.startswith("fabric-") else run_torchrun(name)
    except (RuntimeError, ValueError, NotImplementedError, AssertionError) as e:
        if isinstance(e, AssertionError):
            raise
        if int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))) == 0:
            print(f"peer {name}: refused: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
        sys.exit(3)


if __name__ == "__main__":
    main()
