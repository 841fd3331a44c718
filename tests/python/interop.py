"""The Python side of the full-checkpoint interop tests (issue 18), on CPU over Gloo.

  interop.py check-full DIR [--lightning]
      loads DIR/full.pt (written by tests/fsdp/interop_helper_main.cpp) with
      torch.load(weights_only=True), checks that its optimizer state has the
      layout and types torch's own AdamW gives, resumes the GPT
      (python/fsdp_gpt.py) under torch FSDP (FSDP.optim_state_dict_to_load) or,
      with --lightning, Lightning Fabric's FSDP strategy (fabric.load), trains
      on DIR/expected.json's batches and checks its losses within 1e-5.
  interop.py write-full DIR --mode lightning|fsdp|torch-save
      trains the GPT 3 steps, saves DIR/full.pt the named way (Lightning's
      full state_dict_type; torch FSDP's full state dicts; plain
      torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 3})),
      trains 2 more and writes DIR/expected.json for `interop_helper resume`.

World 1: run it alone; world 2 (fsdp modes only): under torchrun. Exits 1 naming what differs.
"""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import fsdp_gpt  # noqa: E402

CONFIG = {"vocab_size": 64, "context": 16, "dim": 32, "layers": 2, "heads": 4}
OPTIMIZER = {"lr": 1e-3, "weight_decay": 0.01}
SAVED_STEP, STEPS, BATCH, SEED, READER_SEED, TOLERANCE = 3, 5, 4, 1234, 99, 1e-5


class Failure(Exception):
    pass


def world():
    return dist.get_world_size() if dist.is_initialized() else 1


def rank():
    return dist.get_rank() if dist.is_initialized() else 0


def init_world():
    """torchrun's world, or a world of 1 (torch FSDP needs a process group)."""
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def wrap(model):
    return FSDP(model, auto_wrap_policy=ModuleWrapPolicy({fsdp_gpt.GPTBlock}), device_id=torch.device("cpu"),
                use_orig_params=True)


def new_model(config, seed):
    """The GPT with initial weights from `seed`: readers use another seed than writers, so that only the
    checkpoint can carry the writer's weights."""
    torch.manual_seed(seed)
    return fsdp_gpt.GPT(fsdp_gpt.GPTConfig(**config))


def new_optimizer(model, hyper):
    return torch.optim.AdamW(model.parameters(), lr=hyper["lr"], weight_decay=hyper["weight_decay"])


def train_step(model, opt, tokens, backward=lambda loss: loss.backward()):
    """One step on this rank's rows of the global batch [B, T + 1]; the mean loss over the ranks."""
    local = tokens.size(0) // world()
    mine = tokens[rank() * local:(rank() + 1) * local]
    opt.zero_grad()
    loss = fsdp_gpt.gpt_loss(model(mine[:, :-1]), mine[:, 1:])
    backward(loss)
    opt.step()
    total = loss.detach().double().reshape(1)
    if dist.is_initialized():
        dist.all_reduce(total)
    return total.item() / world()


def full_state_dicts(model):
    """FSDP's full-state-dict context, every rank loading and saving alike."""
    return FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=False),
                                FullOptimStateDictConfig(rank0_only=False))


# --- check-full: C++ -> Python


def reference_entry():
    """What torch's own AdamW keeps per parameter after a step: (key, type, dtype, dim) in order."""
    p = torch.zeros(2, requires_grad=True)
    opt = torch.optim.AdamW([p])
    p.grad = torch.ones(2)
    opt.step()
    return [(k, type(v), v.dtype, v.dim() if k == "step" else None) for k, v in opt.state_dict()["state"][0].items()]


def check_layout(ckpt, config, hyper, step):
    """The optimizer state dict is what torch writes: name-keyed state in the model's parameter order, each
    entry as torch's AdamW keeps it, and param_groups equal to those of an AdamW with the same settings."""
    model = new_model(config, READER_SEED)
    names = [n for n, _ in model.named_parameters()]
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    state, groups = ckpt["optimizer"]["state"], ckpt["optimizer"]["param_groups"]
    if sorted(state) != sorted(names):
        raise Failure(f"optimizer state keys {sorted(state)}, expected the model's parameters {sorted(names)}")
    if list(state) != names:
        at = next(i for i, (a, b) in enumerate(zip(state, names)) if a != b)
        raise Failure(f"optimizer state is not in the model's parameter order: entry {at} is {list(state)[at]!r}, "
                      f"the model's parameter {at} is {names[at]!r}")
    want = reference_entry()
    for name, entry in state.items():
        got = [(k, type(v), v.dtype, v.dim() if k == "step" else None) for k, v in entry.items()]
        if got != want:
            raise Failure(f"optimizer state of {name!r}: {got}, torch's AdamW keeps {want}")
        if entry["step"].item() != step or tuple(entry["exp_avg"].shape) != shapes[name]:
            raise Failure(f"optimizer state of {name!r}: step {entry['step'].item()} (expected {step}), "
                          f"exp_avg shape {tuple(entry['exp_avg'].shape)} (expected {shapes[name]})")
    reference = new_optimizer(model, hyper).state_dict()["param_groups"]
    got = [[(k, type(v), v) for k, v in g.items() if k != "params"] for g in groups]
    want = [[(k, type(v), v) for k, v in g.items() if k != "params"] for g in reference]
    if got != want:
        raise Failure(f"param_groups {got} differ from torch's AdamW's {want}")
    if [g["params"] for g in groups] != [names]:
        raise Failure(f"param_groups' params {[g['params'] for g in groups]}, expected {[names]}")
    if list(ckpt["model"]) != list(model.state_dict()):
        raise Failure(f"model keys {list(ckpt['model'])} differ from the GPT's {list(model.state_dict())}")


def load_torch_fsdp(path, model, opt):
    ckpt = torch.load(path, weights_only=True)
    with full_state_dicts(model):
        model.load_state_dict(ckpt["model"])
        osd = FSDP.optim_state_dict_to_load(model, opt, ckpt["optimizer"])
    opt.load_state_dict(osd)
    return ckpt["step"]


def check_full(directory, lightning):
    expected = read_expected(directory)
    path = os.path.join(directory, "full.pt")
    ckpt = torch.load(path, weights_only=True)  # what a user does first; fails on non-weights_only content
    check_layout(ckpt, expected["config"], expected["optimizer"], expected["step"])
    if lightning:
        fabric, model, opt = lightning_job(expected["config"], expected["optimizer"], READER_SEED)
        state = {"model": model, "optimizer": opt, "step": None}
        fabric.load(path, state)
        step, backward = state["step"], fabric.backward
    else:
        init_world()
        model = wrap(new_model(expected["config"], READER_SEED))
        opt = new_optimizer(model, expected["optimizer"])
        step, backward = load_torch_fsdp(path, model, opt), lambda loss: loss.backward()
    if step != expected["step"]:
        raise Failure(f"{path}: step {step!r}, expected {expected['step']}")
    for i, (tokens, want) in enumerate(zip(expected["batches"], expected["losses"])):
        loss = train_step(model, opt, torch.tensor(tokens), backward)
        at = expected["step"] + 1 + i
        if abs(loss - want) > TOLERANCE:
            raise Failure(f"step {at}: loss {loss:.9g} after loading {path}, C++ had {want:.9g}")
        if rank() == 0:
            print(f"interop: step {at} loss {loss:.9g} (C++ {want:.9g}) ok", flush=True)


# --- write-full: Python -> C++


def lightning_job(config, hyper, seed):
    """Fabric's FSDP strategy on CPU (docs/python-formats.md §4): a subclass passes its GPU-only check, and the
    model comes already wrapped with device_id=cpu."""
    import lightning as L
    from lightning.fabric.strategies import FSDPStrategy

    class CPUFSDP(FSDPStrategy):
        pass

    fabric = L.Fabric(accelerator="cpu", devices=1, strategy=CPUFSDP(state_dict_type="full"))
    fabric.launch()
    model = fabric.setup_module(wrap(new_model(config, seed)))
    opt = fabric.setup_optimizers(new_optimizer(model, hyper))
    return fabric, model, opt


def save_fsdp(path, model, opt, step):
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=True),
                              FullOptimStateDictConfig(rank0_only=True)):
        state = {"model": model.state_dict(), "optimizer": FSDP.optim_state_dict(model, opt), "step": step}
    if rank() == 0:
        torch.save(state, path)
    dist.barrier()


def write_full(directory, mode):
    path = os.path.join(directory, "full.pt")
    backward = lambda loss: loss.backward()  # noqa: E731
    if mode == "lightning":
        fabric, model, opt = lightning_job(CONFIG, OPTIMIZER, SEED)
        backward = fabric.backward
        save = lambda step: fabric.save(path, {"model": model, "optimizer": opt, "step": step})  # noqa: E731
    elif mode == "fsdp":
        init_world()
        model = wrap(new_model(CONFIG, SEED))
        opt = new_optimizer(model, OPTIMIZER)
        save = lambda step: save_fsdp(path, model, opt, step)  # noqa: E731
    else:
        if "WORLD_SIZE" in os.environ:
            raise Failure("--mode torch-save saves an unwrapped model: run it alone (world 1)")
        model = new_model(CONFIG, SEED)
        opt = new_optimizer(model, OPTIMIZER)
        save = lambda step: torch.save(  # noqa: E731
            {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, path)
    gen = torch.Generator().manual_seed(SEED)
    batches, losses = [], []
    for step in range(1, STEPS + 1):
        tokens = torch.randint(0, CONFIG["vocab_size"], (BATCH, CONFIG["context"] + 1), generator=gen)
        loss = train_step(model, opt, tokens, backward)
        if step > SAVED_STEP:
            batches.append(tokens.tolist())
            losses.append(loss)
        if step == SAVED_STEP:
            save(step)
    if rank() == 0:
        with open(os.path.join(directory, "expected.json"), "w") as f:
            json.dump({"config": CONFIG, "optimizer": OPTIMIZER, "step": SAVED_STEP, "world_size": world(),
                       "batches": batches, "losses": losses}, f)
        print(f"interop: wrote {path} ({mode}, world {world()}), losses {losses}", flush=True)


def read_expected(directory):
    with open(os.path.join(directory, "expected.json")) as f:
        return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check-full")
    check.add_argument("dir")
    check.add_argument("--lightning", action="store_true")
    write = sub.add_parser("write-full")
    write.add_argument("dir")
    write.add_argument("--mode", choices=["lightning", "fsdp", "torch-save"], required=True)
    args = parser.parse_args()
    try:
        if args.command == "check-full":
            check_full(args.dir, args.lightning)
        else:
            write_full(args.dir, args.mode)
    except Failure as e:
        print(f"interop: rank {rank()}: {e}", file=sys.stderr, flush=True)
        return 1
    if rank() == 0:
        print(f"interop: {args.command} at world {world()}: ok", flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
