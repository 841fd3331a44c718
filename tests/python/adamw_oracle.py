#!/usr/bin/env python3
"""torch.optim.AdamW as the reference for fsdp::optim::AdamW
(tests/optim/adamw_test.cpp): the same parameters and gradients, made on
both sides by the same ATen operations (values_of below), stepped with
torch's own AdamW (the default, single-tensor path on CPU); writes every
parameter and its state after the last step as raw little-endian float32.

    adamw_oracle.py DIR SHAPES [NAME STEPS LR BETA1 BETA2 EPS WEIGHT_DECAY AMSGRAD]...

One run per case, each into DIR/NAME.bin. SHAPES: "3x4,5,1x7": one
parameter per shape. Parameter 1 has no gradient at odd steps (torch skips
it: its step count stays). NAME.bin holds, parameter by parameter: its
values, exp_avg, exp_avg_sq (and max_exp_avg_sq with amsgrad), and its
step count as one float32.
"""
import sys

import torch


def values_of(shape, a, b):
    """sin(arange * a + b) * 0.5, made in float64 and rounded to float32."""
    n = 1
    for s in shape:
        n *= s
    return torch.arange(n, dtype=torch.float64).mul(a).add(b).sin().mul(0.5).to(torch.float32).reshape(shape)


def main():
    torch.set_num_threads(1)
    out_dir, shapes = sys.argv[1:3]
    shapes = [[int(d) for d in s.split("x")] for s in shapes.split(",")]
    cases = sys.argv[3:]
    if not cases or len(cases) % 8:
        sys.exit("adamw_oracle.py: expected DIR SHAPES and groups of 8: NAME STEPS LR BETA1 BETA2 EPS WEIGHT_DECAY AMSGRAD")
    for k in range(0, len(cases), 8):
        run(out_dir + "/" + cases[k] + ".bin", shapes, *cases[k + 1:k + 8])


def run(out, shapes, steps, lr, beta1, beta2, eps, wd, amsgrad):
    steps = int(steps)
    params = [torch.nn.Parameter(values_of(s, 0.37 + i, 0.1 * i)) for i, s in enumerate(shapes)]
    opt = torch.optim.AdamW(params, lr=float(lr), betas=(float(beta1), float(beta2)), eps=float(eps),
                            weight_decay=float(wd), amsgrad=amsgrad == "1")
    for t in range(steps):
        for i, (p, s) in enumerate(zip(params, shapes)):
            skip = i == 1 and t % 2 == 1
            # gradients across several magnitudes: 1e-3 ... 10
            p.grad = None if skip else values_of(s, 0.11 * (t + 1) + 0.7 * i, 0.3 * t).mul(10.0 ** (t % 5 - 3))
        opt.step()
    with open(out, "wb") as f:
        for p in params:
            st = opt.state[p]
            parts = [p.detach(), st["exp_avg"], st["exp_avg_sq"]]
            if amsgrad == "1":
                parts.append(st["max_exp_avg_sq"])
            parts.append(st["step"].reshape(1).to(torch.float32))
            for x in parts:
                f.write(x.contiguous().numpy().astype("<f4").tobytes())


if __name__ == "__main__":
    main()
