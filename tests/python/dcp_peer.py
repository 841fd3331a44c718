"""The Python side of the DCP interop tests (tests/checkpoint/dcp_test.cpp):
torch.distributed.checkpoint (DCP) checkpoints written by PyTorch and read by
fsdp-cpp, and the other way round. SPEC.json lists the C++ model's state:
[[key, [sizes...], is_buffer], ...]; a Python module with exactly those names
is built (plain at world 1, FSDP2 fully_shard per top-level child at world 2
under torchrun, over Gloo on CPU), with AdamW as the C++ tests use it
(lr 0.01, weight_decay 0.1).

    dcp_peer.py save SPEC.json DIR
        two AdamW steps from seeded values, then dcp.save of
        {"model": ..., "optimizer": ..., "step": 5, "tag": "py"} in the layout of
        get_state_dict, into DIR/py_dcp; rank 0 writes what it saved, as full
        tensors, to DIR/py_expected.pt.
    dcp_peer.py lightning-save SPEC.json DIR
        the same with Lightning Fabric's FSDP strategy (FSDP1, sharded) at
        world 1 on CPU: fabric.save writes DIR/py_dcp (DCP plus meta.pt, which
        holds step and tag).
    dcp_peer.py check-full SPEC.json DIR
        DIR/cpp_full.pt (fsdp-cpp's full checkpoint, saved after loading
        DIR/py_dcp) holds exactly DIR/py_expected.pt's tensors and values.
    dcp_peer.py load SPEC.json DIR
        dcp.load of DIR/cpp_dcp (written by fsdp-cpp) into the model's state
        dict and get_state_dict's optimizer layout; every tensor equals
        DIR/cpp_full.pt's (the same state, saved by fsdp-cpp in the full
        format); at world 1 also dcp_to_torch_save.
"""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from clean_exit import leave


def build(spec, seed):
    torch.manual_seed(seed)
    root = torch.nn.Module()
    for key, shape, is_buffer in spec:
        *path, leaf = key.split(".")
        m = root
        for p in path:
            if p not in m._modules:
                m.add_module(p, torch.nn.Module())
            m = m._modules[p]
        v = torch.randn(shape)
        if is_buffer:
            m.register_buffer(leaf, v)
        else:
            m.register_parameter(leaf, torch.nn.Parameter(v))
    return root


def setup(spec, seed):
    if not dist.is_initialized():
        if "RANK" in os.environ:
            dist.init_process_group("gloo")
        else:
            dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    model = build(spec, seed)
    if dist.get_world_size() > 1:
        from torch.distributed.fsdp import fully_shard
        for child in model.children():
            fully_shard(child)
        fully_shard(model)
    optim = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    return model, optim


def full(v):
    """A DTensor's full tensor, any other value as it is."""
    if hasattr(v, "full_tensor"):
        return v.full_tensor()
    if isinstance(v, dict):
        return {k: full(x) for k, x in v.items()}
    if isinstance(v, list):
        return [full(x) for x in v]
    return v


def save(spec, d):
    model, optim = setup(spec, seed=3)
    for i in range(2):
        for p in model.parameters():
            g = torch.sin(torch.arange(p.numel(), dtype=torch.float32).reshape(p.shape) * (i + 1) + 0.3)
            p.grad = g if not hasattr(p, "device_mesh") else \
                torch.distributed.tensor.distribute_tensor(g, p.device_mesh, p.placements)
        optim.step()
        optim.zero_grad()
    msd, osd = get_state_dict(model, optim)
    state = {"model": msd, "optimizer": osd, "step": 5, "tag": "py"}
    dcp.save(state, checkpoint_id=os.path.join(d, "py_dcp"))
    expected = full(state)
    if dist.get_rank() == 0:
        torch.save(expected, os.path.join(d, "py_expected.pt"))


def lightning_save(spec, d):
    """Lightning Fabric's FSDP strategy, sharded, at world 1 on CPU (the
    CPUFSDP recipe of docs/python-formats.md §4): its dcp.save plus meta.pt."""
    from lightning.fabric import Fabric
    from lightning.fabric.strategies import FSDPStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    class CPUFSDP(FSDPStrategy):
        pass

    fabric = Fabric(accelerator="cpu", devices=1, strategy=CPUFSDP(state_dict_type="sharded"))
    fabric.launch()
    module = FSDP(build(spec, seed=3), device_id=torch.device("cpu"), use_orig_params=True)
    model = fabric.setup_module(module)
    optim = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1))
    for i in range(2):
        loss = sum((p * torch.sin(torch.arange(p.numel(), dtype=torch.float32).reshape(p.shape) * (i + 1) + 0.3)).sum()
                   for p in model.parameters())
        fabric.backward(loss)
        optim.step()
        optim.zero_grad()
    fabric.save(os.path.join(d, "py_dcp"), {"model": model, "optimizer": optim, "step": 5, "tag": "py"})
    with FSDP.state_dict_type(module, torch.distributed.fsdp.StateDictType.FULL_STATE_DICT):
        msd = module.state_dict()
        osd = FSDP.optim_state_dict(module, optim.optimizer if hasattr(optim, "optimizer") else optim)
    torch.save({"model": msd, "optimizer": osd, "step": 5, "tag": "py"}, os.path.join(d, "py_expected.pt"))
    assert os.path.exists(os.path.join(d, "py_dcp", "meta.pt"))


def same(a, b, where):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{where}: {type(b)}"
        assert a.shape == b.shape, f"{where}: shape {tuple(a.shape)} != {tuple(b.shape)}"
        assert torch.equal(a.to(b.dtype), b), f"{where}: values differ"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def check_full(spec, d):
    got = torch.load(os.path.join(d, "cpp_full.pt"), weights_only=False)
    want = torch.load(os.path.join(d, "py_expected.pt"), weights_only=False)
    assert set(got["model"]) == set(want["model"]), (sorted(got["model"]), sorted(want["model"]))
    for k, v in want["model"].items():
        same(got["model"][k], v, f"model.{k}")
    ws, gs = want["optimizer"]["state"], got["optimizer"]["state"]
    assert set(ws) == set(gs), (sorted(ws), sorted(gs))
    for p, fields in ws.items():
        for f, v in fields.items():
            if f == "step":
                assert float(gs[p][f]) == float(v), (p, gs[p][f], v)
            else:
                same(gs[p][f], v, f"optimizer.state.{p}.{f}")
    for g, w in zip(got["optimizer"]["param_groups"], want["optimizer"]["param_groups"]):
        assert abs(g["lr"] - w["lr"]) < 1e-12 and abs(g["weight_decay"] - w["weight_decay"]) < 1e-12, (g, w)
        assert sorted(g["params"]) == sorted(w["params"])
    assert got["step"] == 5 and got["tag"] == "py", (got["step"], got["tag"])
    print("ok: fsdp-cpp loaded", len(want["model"]), "model tensors and", len(ws), "optimizer states")


def load(spec, d):
    model, optim = setup(spec, seed=11)  # other values: everything must come from the checkpoint
    msd, osd = get_state_dict(model, optim)  # initialises AdamW's state, for its layout
    state = {"model": msd, "optimizer": osd, "step": 0}
    dcp.load(state, checkpoint_id=os.path.join(d, "cpp_dcp"))
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    msd, osd = get_state_dict(model, optim)
    want = torch.load(os.path.join(d, "cpp_full.pt"), weights_only=True)
    assert state["step"] == want["step"], (state["step"], want["step"])
    msd, osd = full(msd), full(osd)
    for k, v in want["model"].items():
        same(msd[k], v, f"model.{k}")
    for p, fields in want["optimizer"]["state"].items():
        for f, v in fields.items():
            if f == "step":
                assert float(osd["state"][p][f]) == float(v), (p, osd["state"][p][f], v)
            else:
                same(osd["state"][p][f], v, f"optimizer.state.{p}.{f}")
    if dist.get_world_size() == 1:
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
        out = os.path.join(d, "dcp_to_torch_save.pt")
        dcp_to_torch_save(os.path.join(d, "cpp_dcp"), out)
        conv = torch.load(out, weights_only=False)
        for k, v in want["model"].items():
            same(conv["model"][k], v, f"dcp_to_torch_save model.{k}")
        for p, fields in want["optimizer"]["state"].items():
            same(conv["optimizer"]["state"][p]["exp_avg"], fields["exp_avg"], f"dcp_to_torch_save {p}.exp_avg")
    print("ok: PyTorch loaded", len(want["model"]), "model tensors and", len(want["optimizer"]["state"]),
          "optimizer states at world", dist.get_world_size())


if __name__ == "__main__":
    mode, spec_path, d = sys.argv[1:4]
    with open(spec_path) as f:
        spec = json.load(f)
    {"save": save, "lightning-save": lightning_save, "check-full": check_full, "load": load}[mode](spec, d)
    leave(0)
