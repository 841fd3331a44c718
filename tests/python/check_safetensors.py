"""Checks a safetensors file that `fsdp-ckpt export` / fsdp::export_safetensors
wrote against the full checkpoint it came from, in Python: Hugging Face's
safetensors.torch.load_file must give exactly the checkpoint's model entry as
torch.load(weights_only=True) gives it (same keys, dtypes, shapes and values),
and safe_open its metadata. For tests/checkpoint/safetensors_python_test.cpp.

    check_safetensors.py EXPORTED.safetensors FULL_CHECKPOINT.pt ENTRY

Prints "check_safetensors: ok N tensors" and exits 0, or names the difference
and exits 1.
"""
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file


def main(exported, full, entry):
    got = load_file(exported)
    want = torch.load(full, weights_only=True)[entry]
    problems = []
    if sorted(got) != sorted(want):
        problems.append(f"keys differ: {sorted(got)} vs {sorted(want)}")
    for k in sorted(set(got) & set(want)):
        g, w = got[k], want[k]
        if g.dtype != w.dtype or g.shape != w.shape or not torch.equal(g, w):
            problems.append(f"{k}: {g.dtype} {tuple(g.shape)} vs {w.dtype} {tuple(w.shape)}, equal={torch.equal(g, w)}")
    with safe_open(exported, framework="pt") as f:
        meta = f.metadata()
    if meta.get("format") != "pt" or meta.get("producer") != "fsdp-cpp" or meta.get("fsdp_entry") != entry:
        problems.append(f"metadata: {meta}")
    if problems:
        print("check_safetensors: MISMATCH\n  " + "\n  ".join(problems))
        return 1
    print(f"check_safetensors: ok {len(got)} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
