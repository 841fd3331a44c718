"""Writes module state dicts with Python's torch.save, for
tests/checkpoint/torch_pickle_test.cpp (RawStateDict.*), which loads them into
fsdp-cpp models.

    write_state_dict.py SPEC.json DIR

SPEC.json lists the C++ model's state: [[key, [sizes...], is_buffer], ...].
A Python module with exactly those names is built and filled with values the
C++ side recomputes: element i of the j-th tensor is (i % 97) * 0.25 + j
(exact in float32). The j == 0 tensor is stored transposed (not contiguous),
and the 2nd and 3rd tensors share one storage (the 3rd at an offset), so the
files hold views, as real state dicts do. Files written into DIR:

    raw.pt       torch.save(module.state_dict())        (an OrderedDict)
    p4.pt        the same with pickle_protocol=4         (MEMOIZE, FRAME, ...)
    param.pt     {key: nn.Parameter}                     (_rebuild_parameter)
    bf16.pt      the state dict in bfloat16
    missing.pt   without the last key
    extra.pt     with an extra key "extra_key"
    shape.pt     the first tensor with another shape
    nested.pt    {"model": state_dict}                   (a checkpoint, not a state dict)
    object.pt    {key: tensor, "args": argparse.Namespace()}
    legacy.pt    torch.save(..., _use_new_zipfile_serialization=False)
    script.pt    torch.jit.save of a scripted module     (a TorchScript archive)

and training checkpoints as plain PyTorch writes them, for RawStateDict's
PythonCheckpoint tests: {"model": state_dict, "optimizer": AdamW's
state_dict() (parameters numbered 0, 1, ...), "step": 3, "hp": {"lr": 0.1,
"name": "x"}}, the optimizer after one step with the gradient of the j-th
tensor set to value(shape, j) / 100 (lr 0.1, weight_decay 0):

    adamw.pt     that checkpoint
    maximize.pt  the same with maximize=True   (LibTorch's AdamW cannot)
    adam.pt      the same from torch.optim.Adam (decoupled_weight_decay=False)
"""
import argparse
import json
import os
import sys

import torch


def value(shape, j):
    n = 1
    for s in shape:
        n *= s
    return ((torch.arange(n, dtype=torch.float32) % 97) * 0.25 + j).reshape(shape)


def build(spec):
    root = torch.nn.Module()
    shared = None
    for j, (key, shape, is_buffer) in enumerate(spec):
        *path, leaf = key.split(".")
        m = root
        for p in path:
            if p not in m._modules:
                m.add_module(p, torch.nn.Module())
            m = m._modules[p]
        v = value(shape, j)
        if j == 0 and len(shape) == 2:
            v = v.t().contiguous().t()  # same values, column-major
            assert not v.is_contiguous()
        if j == 1:
            shared = torch.cat([v.flatten(), value(spec[2][1], 2).flatten()])
            v = shared[: v.numel()].view(shape)
        if j == 2:
            v = shared[shared.numel() - v.numel():].view(shape)
        if is_buffer:
            m.register_buffer(leaf, v)
        else:
            m.register_parameter(leaf, torch.nn.Parameter(v, requires_grad=True))
    return root


def main(spec_path, d):
    with open(spec_path) as f:
        spec = json.load(f)
    module = build(spec)
    sd = module.state_dict()
    keys = list(sd)
    assert keys == [k for k, _, _ in spec], (keys, spec)
    assert not sd[keys[0]].is_contiguous() and sd[keys[2]].storage_offset() == sd[keys[1]].numel()
    torch.save(sd, os.path.join(d, "raw.pt"))
    torch.save(sd, os.path.join(d, "p4.pt"), pickle_protocol=4)
    torch.save({k: torch.nn.Parameter(v.clone()) for k, v in sd.items() if v.is_floating_point()} |
               {k: v for k, v in sd.items() if not v.is_floating_point()}, os.path.join(d, "param.pt"))
    torch.save({k: v.to(torch.bfloat16) for k, v in sd.items()}, os.path.join(d, "bf16.pt"))
    missing = sd.copy()
    del missing[keys[-1]]
    torch.save(missing, os.path.join(d, "missing.pt"))
    extra = sd.copy()
    extra["extra_key"] = torch.zeros(3)
    torch.save(extra, os.path.join(d, "extra.pt"))
    shape = sd.copy()
    shape[keys[0]] = torch.zeros(2, 2)
    torch.save(shape, os.path.join(d, "shape.pt"))
    torch.save({"model": sd}, os.path.join(d, "nested.pt"))
    torch.save({keys[0]: sd[keys[0]], "args": argparse.Namespace(lr=0.1)}, os.path.join(d, "object.pt"))
    torch.save(sd, os.path.join(d, "legacy.pt"), _use_new_zipfile_serialization=False)
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), os.path.join(d, "script.pt"))
    if int(torch.__version__.split(".")[0]) >= 2:  # maximize and decoupled_weight_decay are torch 2.x's
        for name, cls, extra in (("adamw.pt", torch.optim.AdamW, {}), ("maximize.pt", torch.optim.AdamW, {"maximize": True}),
                                 ("adam.pt", torch.optim.Adam, {})):
            torch.save(training_checkpoint(spec, sd, cls, extra), os.path.join(d, name))
    print(f"write_state_dict: {len(keys)} tensors, torch {torch.__version__}")


def training_checkpoint(spec, sd, cls, extra):
    copy = build(spec)
    params = list(copy.parameters())
    optimizer = cls(params, lr=0.1, weight_decay=0.0, **extra)
    index = {k: j for j, (k, _, _) in enumerate(spec)}
    for name, p in copy.named_parameters():
        p.grad = value(list(p.shape), index[name]) / 100
    optimizer.step()
    return {"model": sd, "optimizer": optimizer.state_dict(), "step": 3, "hp": {"lr": 0.1, "name": "x"}}


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
