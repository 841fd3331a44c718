#!/usr/bin/env python3
"""torch's own answer to "which chunk of a DTensor does this rank hold" as
the reference for fsdp-cpp's fsdp::local_chunk (tests/dtensor/dtensor_test.cpp):
torch.distributed.tensor._utils._compute_local_shape_and_global_offset (what
compute_local_shape_and_global_offset and DCP's chunk metadata use) for
every coordinate of a table of global shapes, mesh shapes and placements.

    dtensor_chunks.py

Prints one line per case and coordinate:
    G=<global shape> M=<mesh shape> C=<coordinate> P=<placements> : L=<local shape> O=<global offset>
with comma-separated numbers and placements S<dim> (Shard), R (Replicate)
and P (Partial, sum).
"""
import itertools

from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

SHAPES = [(5, 3), (7,), (2, 5), (0, 4), (3, 4, 5), (1,), (8, 6)]
MESHES = [(2,), (3,), (4,), (2, 2), (2, 3), (3, 2)]


def placements_for(ndim, mesh_ndim):
    one = [Replicate(), Partial()] + [Shard(d) for d in range(ndim)]
    return itertools.product(one, repeat=mesh_ndim)


def name(p):
    if isinstance(p, Shard):
        return "S%d" % p.dim
    return "P" if isinstance(p, Partial) else "R"


def nums(xs):
    return ",".join(str(int(x)) for x in xs)


for shape in SHAPES:
    for mesh in MESHES:
        for ps in placements_for(len(shape), len(mesh)):
            for coord in itertools.product(*[range(n) for n in mesh]):
                local, offset = _compute_local_shape_and_global_offset(shape, mesh, list(coord), list(ps))
                print("G=%s M=%s C=%s P=%s : L=%s O=%s" % (nums(shape), nums(mesh), nums(coord),
                                                          ",".join(name(p) for p in ps), nums(local), nums(offset)))
