"""The Python side of the checkpoint interop tests (issue 18), on CPU over Gloo.

  interop.py check-full DIR [--lightning]
      loads DIR/full.pt (written by tests/checkpoint/interop_helper_main.cpp) with
      torch.load(weights_only=True), checks that its optimizer state has the
      layout and types torch's own AdamW gives, resumes the GPT
      (python/fsdp_gpt.py) under torch FSDP (FSDP.optim_state_dict_to_load) or,
      with --lightning, Lightning Fabric's FSDP strategy (fabric.load), trains
      on DIR/expected.json's batches and checks its losses within 1e-5.
  interop.py check-sharded DIR [--lightning]
      the same for the DCP directory DIR/sharded (`interop_helper save DIR
      sharded`): its .metadata holds exactly the keys of PyTorch's own
      get_state_dict layout, with the same shapes; the GPT resumes under torch
      FSDP (get_state_dict, dcp.load, set_state_dict) or Lightning's
      fabric.load (DCP plus meta.pt) and continues with C++'s losses.
  interop.py write-full DIR --mode lightning|fsdp|torch-save
      trains the GPT 3 steps, saves DIR/full.pt the named way (Lightning's
      full state_dict_type; torch FSDP's full state dicts; plain
      torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 3})),
      trains 2 more and writes DIR/expected.json for `interop_helper resume`.
  interop.py write-sharded DIR --mode lightning|fsdp
      the same into the DCP directory DIR/sharded: Lightning's sharded
      state_dict_type (fabric.save: DCP, step in meta.pt), or dcp.save of
      {"model", "optimizer"} from get_state_dict plus "step".

World 1: run it alone; world 2: under torchrun (writing full: --mode fsdp only). Exits 1 naming what differs.
"""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import fsdp_gpt  # noqa: E402
from clean_exit import leave  # noqa: E402

CONFIG = {"vocab_size": 64, "context": 16, "dim": 32, "layers": 2, "heads": 4}
OPTIMIZER = {"lr": 1e-3, "weight_decay": 0.01}
SAVED_STEP, STEPS, BATCH, SEED, READER_SEED, TOLERANCE = 3, 5, 4, 1234, 99, 1e-5


class Failure(Exception):
    pass


def world():
    return dist.get_world_size() if dist.is_initialized() else 1


def rank():
    return dist.get_rank() if dist.is_initialized() else 0


def world_of_launcher():
    return int(os.environ.get("WORLD_SIZE", "1"))


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


# --- check-full: C++ -> Python


def reference_entry():
    """What torch's own AdamW keeps per parameter after a step."""
    p = torch.zeros(2, requires_grad=True)
    opt = torch.optim.AdamW([p])
    p.grad = torch.ones(2)
    opt.step()
    return describe(opt.state_dict()["state"][0])


def describe(entry):
    """A state entry's fields by name: (type, dtype, dim); the dim only of `step` (the others are the param's)."""
    return {k: (type(v), v.dtype, v.dim() if k == "step" else None) for k, v in entry.items()}


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
        got = describe(entry)
        if got != want:
            raise Failure(f"optimizer state of {name!r}: {got}, torch's AdamW keeps {want}")
        if entry["step"].item() != step or tuple(entry["exp_avg"].shape) != shapes[name]:
            raise Failure(f"optimizer state of {name!r}: step {entry['step'].item()} (expected {step}), "
                          f"exp_avg shape {tuple(entry['exp_avg'].shape)} (expected {shapes[name]})")
    reference = new_optimizer(model, hyper).state_dict()["param_groups"]
    got = [{k: (type(v), v) for k, v in g.items() if k != "params"} for g in groups]
    want = [{k: (type(v), v) for k, v in g.items() if k != "params"} for g in reference]
    if got != want:
        raise Failure(f"param_groups {got} differ from torch's AdamW's {want}")
    if [g["params"] for g in groups] != [names]:
        raise Failure(f"param_groups' params {[g['params'] for g in groups]}, expected {[names]}")
    if list(ckpt["model"]) != list(model.state_dict()):
        raise Failure(f"model keys {list(ckpt['model'])} differ from the GPT's {list(model.state_dict())}")


def check_sharded_layout(path, config, hyper):
    """The DCP directory's .metadata names exactly the keys PyTorch's get_state_dict layout gives the same GPT
    and AdamW ({"model": ..., "optimizer": ..., "step"}), each tensor with the same shape."""
    model = new_model(config, READER_SEED)
    opt = new_optimizer(model, hyper)
    model(torch.zeros(1, 1, dtype=torch.long)).sum().backward()
    opt.step()  # AdamW's state exists only after a step
    msd, osd = get_state_dict(model, opt)
    want = {}
    for name, v in msd.items():
        want[f"model.{name}"] = tuple(v.shape)
    for fqn, fields in osd["state"].items():
        for field, v in fields.items():
            want[f"optimizer.state.{fqn}.{field}"] = tuple(v.shape)
    for i, group in enumerate(osd["param_groups"]):
        for option in group:
            want[f"optimizer.param_groups.{i}.{option}"] = None
    got = {}
    for key, md in dcp.FileSystemReader(path).read_metadata().state_dict_metadata.items():
        got[key] = tuple(md.size) if hasattr(md, "size") else None
    for value in ("step", "history"):  # the values beside the state dicts (Lightning reads them from meta.pt)
        if value not in got:
            raise Failure(f"{path}/.metadata has no item '{value}'")
        del got[value]
    if got != want:
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        shapes = sorted(k for k in set(got) & set(want) if got[k] != want[k])
        raise Failure(f"{path}/.metadata: keys missing {missing}, unexpected {extra}, other shapes {shapes} "
                      "(expected get_state_dict's layout)")


def check(directory, form, lightning):
    expected = read_expected(directory)
    if form == "full":
        path = os.path.join(directory, "full.pt")
        ckpt = torch.load(path, weights_only=True)  # what a user does first; fails on non-weights_only content
        check_layout(ckpt, expected["config"], expected["optimizer"], expected["step"])
    else:
        path, ckpt = os.path.join(directory, "sharded"), None
        check_sharded_layout(path, expected["config"], expected["optimizer"])
    mode = "lightning" if lightning else "fsdp"
    job = Job(mode, expected["config"], expected["optimizer"], READER_SEED, saving=False)
    step, history = job.load(path, ckpt)
    if step != expected["step"]:
        raise Failure(f"{path}: step {step!r}, expected {expected['step']}")
    want = torch.tensor(expected["history"], dtype=torch.float64)
    if not isinstance(history, torch.Tensor) or history.dtype != torch.float64 or not torch.equal(history, want):
        raise Failure(f"{path}: history {history!r}, expected the tensor {want!r}")
    for i, (tokens, want) in enumerate(zip(expected["batches"], expected["losses"])):
        loss = job.step(torch.tensor(tokens))
        at = expected["step"] + 1 + i
        if not abs(loss - want) <= TOLERANCE:  # NaN fails too
            raise Failure(f"step {at}: loss {loss:.9g} after loading {path}, C++ had {want:.9g}")
        if rank() == 0:
            print(f"interop: step {at} loss {loss:.9g} (C++ {want:.9g}) ok", flush=True)


# --- write-full: Python -> C++


def write(directory, form, mode):
    path = os.path.join(directory, "full.pt" if form == "full" else "sharded")
    job = Job(mode, CONFIG, OPTIMIZER, SEED, saving=True, sharded=form == "sharded")
    gen = torch.Generator().manual_seed(SEED)
    batches, losses, history = [], [], []
    for step in range(1, STEPS + 1):
        tokens = torch.randint(0, CONFIG["vocab_size"], (BATCH, CONFIG["context"] + 1), generator=gen)
        loss = job.step(tokens)
        if step > SAVED_STEP:
            batches.append(tokens.tolist())
            losses.append(loss)
        else:
            history.append(loss)
        if step == SAVED_STEP:
            job.save(path, step, torch.tensor(history, dtype=torch.float64))
    if rank() == 0:
        with open(os.path.join(directory, "expected.json"), "w") as f:
            json.dump({"config": CONFIG, "optimizer": OPTIMIZER, "step": SAVED_STEP, "world_size": world(),
                       "batches": batches, "losses": losses, "history": history}, f)
        print(f"interop: wrote {path} ({mode}, world {world()}), losses {losses}", flush=True)


# --- the Python job: the GPT with AdamW, trained, saved and loaded the way a mode says


class Job:
    """mode "fsdp": torch FSDP (transformer policy on GPTBlock, use_orig_params) at torchrun's world or 1;
    "lightning": Lightning Fabric's FSDP strategy, full (or with `sharded`, sharded) state_dict_type, on CPU
    at torchrun's world or 1 (docs/python-formats.md §4: a subclass passes Fabric's GPU-only check, the model
    comes wrapped with device_id=cpu); "torch-save": the plain module (world 1). Saves and loads are full
    checkpoints, or with `sharded` DCP directories."""

    def __init__(self, mode, config, hyper, seed, saving, sharded=False):
        self.mode, self.fabric, self.sharded = mode, None, sharded
        model = new_model(config, seed)
        if mode == "torch-save" and sharded:
            raise Failure("--mode torch-save writes a full checkpoint only")
        if mode == "lightning":
            if world_of_launcher() > 1 and saving and not sharded:
                raise Failure("Lightning saves full checkpoints at world 1 only here: at world > 1 on CPU, torch "
                              "2.15's FSDP.optim_state_dict under Lightning's offload_to_cpu=True writes exp_avg_sq "
                              "as exp_avg (see full_state_dicts)")
            import lightning as L
            from lightning.fabric.strategies import FSDPStrategy

            class CPUFSDP(FSDPStrategy):
                pass

            strategy = CPUFSDP(state_dict_type="sharded" if sharded else "full")
            self.fabric = L.Fabric(accelerator="cpu", devices=world_of_launcher(), strategy=strategy)
            self.fabric.launch()
            self.model = self.fabric.setup_module(wrap(model))
            self.opt = self.fabric.setup_optimizers(new_optimizer(self.model, hyper))
        elif mode == "fsdp":
            init_world()
            self.model = wrap(model)
            self.opt = new_optimizer(self.model, hyper)
        else:
            if "WORLD_SIZE" in os.environ:
                raise Failure("--mode torch-save uses an unwrapped model: run it alone (world 1)")
            self.model, self.opt = model, new_optimizer(model, hyper)

    def step(self, tokens):
        """One step on this rank's rows of the global batch [B, T + 1]; the mean loss over the ranks."""
        local = tokens.size(0) // world()
        mine = tokens[rank() * local:(rank() + 1) * local]
        self.opt.zero_grad()
        loss = fsdp_gpt.gpt_loss(self.model(mine[:, :-1]), mine[:, 1:])
        self.fabric.backward(loss) if self.fabric else loss.backward()
        self.opt.step()
        total = loss.detach().double().reshape(1)
        if dist.is_initialized():
            dist.all_reduce(total)
        return total.item() / world()

    def save(self, path, step, history):
        """Saves the model, the optimizer, `step` and the tensor value `history`."""
        if self.mode == "lightning":
            self.fabric.save(path, {"model": self.model, "optimizer": self.opt, "step": step, "history": history})
        elif self.mode == "fsdp" and self.sharded:
            msd, osd = get_state_dict(self.model, self.opt)
            dcp.save({"model": msd, "optimizer": osd, "step": step, "history": history}, checkpoint_id=path)
        elif self.mode == "fsdp":
            with full_state_dicts(self.model, rank0_only=True):
                state = {"model": self.model.state_dict(), "optimizer": FSDP.optim_state_dict(self.model, self.opt),
                         "step": step, "history": history}
            if rank() == 0:
                torch.save(state, path)
            dist.barrier()
        else:
            torch.save({"model": self.model.state_dict(), "optimizer": self.opt.state_dict(), "step": step,
                        "history": history}, path)

    def load(self, path, ckpt):
        """Loads `path` (a full checkpoint, whose torch.load is `ckpt`, or a DCP directory) the mode's way;
        returns its step and its tensor value "history"."""
        if self.mode == "lightning":
            state = {"model": self.model, "optimizer": self.opt, "step": None, "history": None}
            self.fabric.load(path, state)
            return state["step"], state["history"]
        if os.path.isdir(path):  # DCP at any world size: PyTorch's own recipe
            msd, osd = get_state_dict(self.model, self.opt)  # initialises AdamW's state, for its layout
            state = {"model": msd, "optimizer": osd, "step": None, "history": torch.zeros(SAVED_STEP, dtype=torch.float64)}
            dcp.load(state, checkpoint_id=path)
            set_state_dict(self.model, self.opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
            return state["step"], state["history"]
        with full_state_dicts(self.model, rank0_only=False):  # every rank loads
            self.model.load_state_dict(ckpt["model"])
            osd = FSDP.optim_state_dict_to_load(self.model, self.opt, ckpt["optimizer"])
        self.opt.load_state_dict(osd)
        return ckpt["step"], ckpt["history"]


def full_state_dicts(model, rank0_only):
    """FSDP's full state dicts. offload_to_cpu=False: in torch 2.15, FSDP.optim_state_dict at world > 1 on CPU
    with offload_to_cpu=True returns exp_avg holding exp_avg_sq's values (_optim_utils.py
    _allgather_orig_param_states gathers every state into one reused buffer and keeps views of it, which
    .cpu() does not copy on CPU); without offloading it clones them."""
    return FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=rank0_only),
                                FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=rank0_only))


def read_expected(directory):
    with open(os.path.join(directory, "expected.json")) as f:
        return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for form in ("full", "sharded"):
        reader = sub.add_parser(f"check-{form}")
        reader.add_argument("dir")
        reader.add_argument("--lightning", action="store_true")
        writer = sub.add_parser(f"write-{form}")
        writer.add_argument("dir")
        modes = ["lightning", "fsdp"] + (["torch-save"] if form == "full" else [])
        writer.add_argument("--mode", choices=modes, required=True)
    args = parser.parse_args()
    action, form = args.command.split("-")
    try:
        if action == "check":
            check(args.dir, form, args.lightning)
        else:
            write(args.dir, form, args.mode)
    except Failure as e:
        print(f"interop: rank {rank()}: {e}", file=sys.stderr, flush=True)
        return 1
    if rank() == 0:
        print(f"interop: {args.command} at world {world()}: ok", flush=True)
    return 0


if __name__ == "__main__":
    leave(main())
