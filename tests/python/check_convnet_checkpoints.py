"""Opens the checkpoints examples/convnet_resume.cpp wrote, with PyTorch only:
DIR/full.pt with torch.load (weights_only), DIR/sharded with
torch.distributed.checkpoint's dcp.load (torch 2.x; on torch 1.x, through
python/fsdp_checkpoint.py). Both must hold the same model keys (the
unwrapped model's names: no FSDP prefix, no flat parameter), the same shapes
and values, BatchNorm's buffers, the frozen block, and the step.

Usage: python3 check_convnet_checkpoints.py DIR
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import fsdp_checkpoint  # noqa: E402

WANT = {  # name: shape, from examples/convnet_resume.cpp
    "blocks.0.conv.weight": (8, 3, 3, 3), "blocks.0.bn.weight": (8,), "blocks.0.bn.running_mean": (8,),
    "blocks.1.conv.weight": (8, 8, 3, 3), "blocks.1.bn.running_var": (8,), "blocks.1.bn.num_batches_tracked": (),
    "blocks.2.conv.weight": (16, 8, 3, 3), "head.weight": (4, 16), "head.bias": (4,),
}


def sharded_model(path, like):
    if int(torch.__version__.split(".")[0]) < 2:
        return fsdp_checkpoint.load(path)["model"], fsdp_checkpoint.load(path)["step"]
    import torch.distributed.checkpoint as dcp
    state = {"model": {k: torch.empty_like(v) for k, v in like.items()}, "step": 0}
    dcp.load(state, checkpoint_id=path)  # no process group: one process reads it all
    keys = {k for k in dcp.FileSystemReader(path).read_metadata().state_dict_metadata if k.startswith("model.")}
    assert keys == {"model." + k for k in like}, sorted(keys ^ {"model." + k for k in like})
    return state["model"], state["step"]


def main(d):
    full = torch.load(os.path.join(d, "full.pt"), weights_only=True)
    model = full["model"]
    for name, shape in WANT.items():
        assert name in model, f"full.pt lacks {name}: {sorted(model)}"
        assert tuple(model[name].shape) == shape, (name, tuple(model[name].shape), shape)
    assert not any("flat_param" in k or "_fsdp" in k for k in model), sorted(model)
    assert full["step"] == 3, full["step"]
    sharded, step = sharded_model(os.path.join(d, "sharded"), model)
    assert step == 3, step
    assert set(sharded) == set(model), sorted(set(sharded) ^ set(model))
    for k, v in model.items():
        assert sharded[k].shape == v.shape and sharded[k].dtype == v.dtype, (k, sharded[k].shape, v.shape)
        assert torch.equal(sharded[k], v), f"{k} differs between the formats"
    assert int(model["blocks.1.bn.num_batches_tracked"]) > 0  # the frozen block's BatchNorm still counts
    print(f"ok: {len(model)} model tensors agree in full.pt and sharded (torch {torch.__version__})")


if __name__ == "__main__":
    main(sys.argv[1])
