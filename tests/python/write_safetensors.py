"""Writes module state dicts with Hugging Face's safetensors.torch.save_file
(the safetensors package, requirements.txt), for
tests/checkpoint/safetensors_python_test.cpp, which loads them into fsdp-cpp models.

    write_safetensors.py SPEC.json DIR

SPEC.json and the values are write_state_dict.py's (element i of the j-th
tensor is (i % 97) * 0.25 + j). save_file wants contiguous tensors that share
no memory, so each is a contiguous copy. Files written into DIR:

    f32.safetensors      the state dict, float32, metadata {"format": "pt"}
    bf16.safetensors     the state dict in bfloat16
    mixed.safetensors    the j-th tensor in float16, float64, bfloat16, float32 (j % 4)
    missing.safetensors  without the last key
    extra.safetensors    with an extra key "extra_key"
    shape.safetensors    the first tensor with another shape
"""
import json
import os
import sys

import safetensors
import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from write_state_dict import build  # noqa: E402  (the same module, the same values)


def main(spec_path, d):
    with open(spec_path) as f:
        spec = json.load(f)
    sd = {k: v.detach().contiguous().clone() for k, v in build(spec).state_dict().items()}
    keys = list(sd)
    assert keys == [k for k, _, _ in spec], (keys, spec)
    meta = {"format": "pt"}
    save_file(sd, os.path.join(d, "f32.safetensors"), metadata=meta)
    save_file({k: v.to(torch.bfloat16) for k, v in sd.items()}, os.path.join(d, "bf16.safetensors"), metadata=meta)
    mixed = [torch.float16, torch.float64, torch.bfloat16, torch.float32]
    save_file({k: v.to(mixed[j % 4]) for j, (k, v) in enumerate(sd.items())}, os.path.join(d, "mixed.safetensors"))
    missing = dict(sd)
    del missing[keys[-1]]
    save_file(missing, os.path.join(d, "missing.safetensors"), metadata=meta)
    save_file(dict(sd, extra_key=torch.zeros(3)), os.path.join(d, "extra.safetensors"), metadata=meta)
    save_file(dict(sd, **{keys[0]: torch.zeros(2, 2)}), os.path.join(d, "shape.safetensors"), metadata=meta)
    print(f"write_safetensors: {len(keys)} tensors, safetensors {safetensors.__version__}, torch {torch.__version__}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
