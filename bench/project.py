"""Projects FULL_SHARD's step time at larger worlds from the bytes a rank sends.

Each rank of a ring all-gather or reduce-scatter sends (N-1)/N of the
buffer, so FULL_SHARD sends 3 (N-1)/N x params x bytes per element per
step (two all-gathers, one reduce-scatter): almost constant in N. The
time a step spends communicating is bytes / link bandwidth plus the rings'
latency, (N-1) hops per collective. With communication overlapped the step
takes max(compute, communication); without, their sum.

  python3 bench/project.py --params 100e6 --compute-s 3.0 --link-gbytes 12.5 \
      [--measured-bytes 2:BYTES ...] [--units 9] [--hop-latency-us 20]

--measured-bytes takes fsdp-bench's bytes_sent_per_step at a world size
(N:BYTES, repeatable): the script checks them against the formula and
prints the ratio, so the projection rests on what the runtime really sent.
"""
import argparse


def bytes_per_rank(params, elem_bytes, world):
    return 3 * (world - 1) / world * params * elem_bytes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, required=True, help="model parameters")
    ap.add_argument("--elem-bytes", type=int, default=4, help="bytes per element on the wire (4: float32, 2: bf16)")
    ap.add_argument("--compute-s", type=float, required=True, help="compute time of one step of one rank")
    ap.add_argument("--link-gbytes", type=float, required=True, help="per-rank link bandwidth, GB/s each way")
    ap.add_argument("--units", type=int, default=9, help="FSDP units (collectives per step = 3 x units)")
    ap.add_argument("--hop-latency-us", type=float, default=20.0, help="latency of one ring hop")
    ap.add_argument("--measured-bytes", action="append", default=[], metavar="N:BYTES",
                    help="bytes_sent_per_step measured at world N for the same model")
    a = ap.parse_args()
    for m in a.measured_bytes:
        n, b = m.split(":")
        want = bytes_per_rank(a.params, a.elem_bytes, int(n))
        print(f"measured at world {n}: {float(b) / 1e6:.1f} MB per rank and step; formula {want / 1e6:.1f} MB "
              f"(ratio {float(b) / want:.3f})")
    print(f"# {a.params / 1e6:.0f} M parameters, {a.elem_bytes} B per element, compute {a.compute_s:.2f} s per step, "
          f"link {a.link_gbytes:g} GB/s, {a.units} units, {a.hop_latency_us:g} us per ring hop")
    print("| ranks | MB sent per rank and step | communication s | step s, overlapped | step s, not overlapped |"
          " efficiency (overlapped) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for n in (8, 16, 32, 64, 128, 256, 512, 1024):
        sent = bytes_per_rank(a.params, a.elem_bytes, n)
        comm = sent / (a.link_gbytes * 1e9) + 3 * a.units * (n - 1) * a.hop_latency_us * 1e-6
        over = max(a.compute_s, comm)
        print(f"| {n} | {sent / 1e6:.0f} | {comm:.3f} | {over:.3f} | {a.compute_s + comm:.3f} | "
              f"{a.compute_s / over:.2f} |")


if __name__ == "__main__":
    main()
