"""Opens the checkpoints tests/checkpoint/checkpoint_helper_main.cpp wrote, in
Python with PyTorch only: the full one with torch.load (plain and
weights_only), the sharded one with python/fsdp_checkpoint.py; both must hold
the same entries, equal tensors, the values saved, and parameters whose sums
match what the C++ side computed."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import fsdp_checkpoint  # noqa: E402


def same(a, b, where):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def check_python_native(full):
    """The full checkpoint is what PyTorch FSDP and Lightning write: the model
    an OrderedDict, the optimizer FSDP's name-keyed form with torch's own types
    and keys (torch 2.x AdamW's), state in model parameter order."""
    import collections
    assert type(full["model"]) is collections.OrderedDict, type(full["model"])
    opt = full["optimizer"]
    group = opt["param_groups"][0]
    want = ["lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach", "capturable",
            "differentiable", "fused", "decoupled_weight_decay", "params"]
    assert list(group) == want, list(group)
    assert isinstance(group["betas"], tuple) and len(group["betas"]) == 2, group["betas"]
    assert all(isinstance(group[k], bool) for k in ("amsgrad", "maximize", "capturable", "differentiable")), group
    assert group["decoupled_weight_decay"] is True and group["foreach"] is None and group["fused"] is None, group
    assert list(opt["state"]) == [k for k in full["model"] if k in opt["state"]], "state not in model order"
    for param, fields in opt["state"].items():
        assert list(fields)[0] == "step", (param, list(fields))
        assert fields["step"].dtype == torch.float32 and fields["step"].dim() == 0, (param, fields["step"])
    if int(torch.__version__.split(".")[0]) >= 2:  # an AdamW of this torch loads it as it is
        model = torch.nn.Module()
        for k, t in full["model"].items():
            if k in group["params"]:
                model.register_parameter(k.replace(".", "_"), torch.nn.Parameter(t.clone()))
        names = [k for k in full["model"] if k in group["params"]]
        adamw = torch.optim.AdamW(list(model.parameters()))
        sd = {"state": {i: opt["state"][n] for i, n in enumerate(names) if n in opt["state"]},
              "param_groups": [dict(group, params=list(range(len(names))))]}
        adamw.load_state_dict(sd)
        assert adamw.state_dict()["param_groups"][0]["betas"] == group["betas"]


def main(d):
    full = torch.load(os.path.join(d, "full.pt"), weights_only=False)  # the default from torch 2.6 on is True
    # weights_only=True (no code runs on load): PyTorch 1.13's safe unpickler
    # lacks the float opcode (hyper-parameters, float values); 2.x has it.
    major = int(torch.__version__.split(".")[0])
    try:
        safe = torch.load(os.path.join(d, "full.pt"), weights_only=True)
        same(full, safe, "weights_only")
    except Exception as e:  # noqa: BLE001
        if major >= 2 or "Unsupported operand 71" not in str(e):
            raise
    # The sharded layout's reader gives the index's form: the same tensors
    # and values, param groups as stored numbers.
    sharded = fsdp_checkpoint.load(os.path.join(d, "sharded"))
    same(full["model"], sharded["model"], "full vs sharded: model")
    same(full["optimizer"]["state"], sharded["optimizer"]["state"], "full vs sharded: optimizer state")
    for k in ("step", "lr", "name", "ok", "rng"):
        same(full[k], sharded[k], f"full vs sharded: {k}")
    check_python_native(full)
    assert full["step"] == 7 and full["lr"] == 0.5 and full["name"] == "gpt" and full["ok"] is True, full
    assert torch.equal(full["rng"], torch.arange(5))
    assert full["config"] == {"model": {"dim": 7}, "run": {"lr": 0.25}}, full["config"]  # dotted names nest
    model = full["model"]
    assert model["emb.weight"].shape == (11, 7) and model["emb.weight"].dtype == torch.float32
    with open(os.path.join(d, "expected.json")) as f:
        sums = json.load(f)
    for k, s in sums.items():
        assert abs(model[k].sum().item() - s) < 1e-4, (k, model[k].sum().item(), s)
    opt = full["optimizer"]
    assert set(opt) == {"state", "param_groups"}
    assert opt["state"]["emb.weight"]["exp_avg"].shape == (11, 7)
    assert int(opt["state"]["emb.weight"]["step"]) == 2
    assert abs(opt["param_groups"][0]["lr"] - 0.01) < 1e-12
    assert sorted(opt["param_groups"][0]["params"]) == sorted(sums)
    check_damaged_index(os.path.join(d, "sharded"))
    print("ok:", len(model), "model tensors,", len(opt["state"]), "optimizer states")


def check_damaged_index(sharded):
    """An index edited after the save (a value changed) fails its own checksum in the Python reader too."""
    import shutil
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "ckpt")
        shutil.copytree(sharded, copy)
        name = os.path.join(copy, "fsdp_index.json")
        with open(name) as f:
            text = f.read()
        assert '"checksum": "crc32:' in text, "fsdp-cpp's index carries its checksum"
        with open(name, "w") as f:
            f.write(text.replace('"value": 7', '"value": 8', 1))
        try:
            fsdp_checkpoint.load(copy)
        except fsdp_checkpoint.CheckpointError as e:
            assert "checksum mismatch" in str(e), e
        else:
            raise AssertionError("a changed index loaded")


if __name__ == "__main__":
    main(sys.argv[1])
