"""How the Python peers of the tests leave: the group torn down by every
rank together, then no interpreter teardown.

Under load, torch 2.15 on CPU sometimes aborts a rank while the interpreter
finalises ("terminate called without an active exception", seen in CI after
the peer had finished and reported its result): Gloo's worker threads still
own work objects while the interpreter dies (pytorch/pytorch#190489,
#179291). That abort would fail a test whose result is already known, so
every peer's result is checked and printed before leave(), and leave()
exits with os._exit."""
import os
import sys

import torch.distributed as dist


def leave(code=0):
    """Exits the process with `code`. On success (code 0) with a group up,
    every rank first meets at a barrier, so no rank tears the group down
    while another still talks to it; a failing rank leaves at once (its
    peers then fail on their own collectives instead of waiting here)."""
    if code == 0 and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
