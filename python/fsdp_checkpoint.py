#!/usr/bin/env python3
"""Opens fsdp-cpp checkpoints in Python (needs only PyTorch).

A full checkpoint is PyTorch's own format: ``torch.load(path)`` (also with
``weights_only=True``) gives ``{entry: value}``. A sharded checkpoint is a
directory (docs/checkpoint-format.md): a torch.distributed.checkpoint (DCP)
directory, which ``torch.distributed.checkpoint.load`` reads with torch 2.x,
or fsdp-cpp's earlier layout; ``load(path)`` assembles either (through
fsdp-cpp's index, ``fsdp_index.json`` or ``index.json``, whose chunks are
raw bytes with CRC-32s; also on torch 1.x) into a dict of the same tensors
and values, in the index's forms:

    models      {key: tensor}
    optimizers  {"state": {param: {field: tensor}}, "param_groups": [{"params": [...], option: number}]}
                (options as the index stores them: "betas.0", bools as 0 / 1)
    values      int, float, bool, str or tensor, under their dotted names

Usage: python3 fsdp_checkpoint.py PATH [--save OUT.pt]
"""
import json
import math
import os
import sys
import zlib

import torch

FORMAT_VERSION = 1
DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
    "uint8": torch.uint8, "bool": torch.bool,
}


class CheckpointError(ValueError):
    pass


def _read_tensors(path, index, verify):
    files = set(index["files"])
    tensors = {}
    for key, t in index["tensors"].items():
        dtype = DTYPES[t["dtype"]]
        out = torch.empty(t["shape"], dtype=dtype)
        covered = 0
        for c in t["chunks"]:
            name = c["file"]
            if name not in files or os.path.basename(name) != name or name in (".", ".."):
                raise CheckpointError(f"{path}: tensor {key!r}: chunk file {name!r} is not a data file of the checkpoint")
            with open(os.path.join(path, name), "rb") as f:
                f.seek(c["offset"])
                data = f.read(c["nbytes"])
            if len(data) != c["nbytes"]:
                raise CheckpointError(f"{path}/{name} is truncated (tensor {key!r})")
            if verify and zlib.crc32(data) != c["crc32"]:
                raise CheckpointError(f"checksum mismatch in {path}/{name} for tensor {key!r}")
            numel = math.prod(c["sizes"])
            if numel:
                piece = torch.frombuffer(bytearray(data), dtype=dtype).reshape(c["sizes"])
                out[tuple(slice(o, o + s) for o, s in zip(c["offsets"], c["sizes"]))] = piece
            covered += numel
        if covered < out.numel():
            raise CheckpointError(f"{path}: the chunks of tensor {key!r} do not cover it")
        tensors[key] = out
    return tensors


def _value(entry):
    v = entry["value"]
    if entry["type"] == "float" and isinstance(v, str):
        return float(v)  # "nan", "inf", "-inf"
    return v


def _float_json(v):
    """A float as nlohmann::json writes it: Python's shortest round-trip digits, which agree with its form
    except from 1e15 to 1e16, where Python writes 16 digits before the point and nlohmann an exponent."""
    text = repr(v)
    if "e" in text or not 1e15 <= abs(v) < 1e16:
        return text
    sign = "-" if text.startswith("-") else ""
    whole, frac = text.lstrip("-").split(".")
    digits = (whole + frac).rstrip("0")
    rest = digits[1:]
    return f"{sign}{digits[0]}{'.' + rest if rest else ''}e+{len(whole) - 1:02d}"


def _compact_json(v):
    """JSON as fsdp-cpp's writer (nlohmann::json's dump()) writes it compactly, in the given order."""
    if isinstance(v, float):
        return _float_json(v)
    if isinstance(v, list):
        return "[" + ",".join(_compact_json(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + _compact_json(x) for k, x in v.items()) + "}"
    return json.dumps(v, ensure_ascii=False)  # str, int, bool, None


def check_index(index, where):
    """The index's own checksum (absent in indexes written before fsdp-cpp recorded it): "crc32:<hex>" of the
    compact JSON of every other field, in the file's order."""
    if "checksum" not in index:
        return
    rest = {k: v for k, v in index.items() if k != "checksum"}
    computed = "crc32:%08x" % (zlib.crc32(_compact_json(rest).encode("utf-8")) & 0xFFFFFFFF)
    if index["checksum"] != computed:
        raise CheckpointError(f"{where}: checksum mismatch: the index records {index['checksum']}, its contents "
                              f"have {computed} (the index is damaged)")


def load_sharded(path, verify=True):
    """Assembles the sharded checkpoint directory `path` into a dict of entries (verify: the index's checksum
    and every chunk's CRC-32 are checked)."""
    name = "fsdp_index.json" if os.path.exists(os.path.join(path, ".metadata")) else "index.json"
    with open(os.path.join(path, name)) as f:
        index = json.load(f)
    if index.get("format") != "fsdp-cpp" or index.get("kind") != "sharded":
        raise CheckpointError(f"{path}/{name} is not an fsdp-cpp sharded checkpoint index")
    if verify:
        check_index(index, f"{path}/{name}")
    if index["version"] > FORMAT_VERSION:
        raise CheckpointError(f"{path}: format version {index['version']} is newer than this script ({FORMAT_VERSION})")
    tensors = _read_tensors(path, index, verify)
    result = {}
    for e in index["entries"]:
        name, kind = e["name"], e["type"]
        if kind == "model":
            result[name] = {k: tensors[f"{name}/{k}"] for k in e["keys"]}
        elif kind == "optimizer":
            state = {}
            for k in e["keys"]:
                param, field = k.rsplit(".", 1)
                state.setdefault(param, {})[field] = tensors[f"{name}/{k}"]
            groups = [dict(params=g["params"], **g["options"]) for g in e["param_groups"]]
            result[name] = {"state": state, "param_groups": groups}
        elif kind == "tensor":
            result[name] = tensors[name]
        else:
            result[name] = _value(e)
    return result


def load(path, verify=True):
    """Either format: a directory is sharded, a file is full (torch.load)."""
    if os.path.isdir(path):
        return load_sharded(path, verify)
    return torch.load(path, map_location="cpu")


def _main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    ckpt = load(argv[0])
    if len(argv) >= 3 and argv[1] == "--save":
        torch.save(ckpt, argv[2])
        print(f"wrote {argv[2]}")
        return 0
    for name, value in ckpt.items():
        if isinstance(value, dict):
            print(f"{name}: {len(value)} entries")
        elif isinstance(value, torch.Tensor):
            print(f"{name}: tensor {tuple(value.shape)} {value.dtype}")
        else:
            print(f"{name}: {value!r}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
