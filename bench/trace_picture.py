#!/usr/bin/env python3
"""Draw one SVG timeline of a training step from per-rank Kineto Chrome traces.

    trace_picture.py --out picture.svg [--title T] [--step N] trace_rank0.json trace_rank1.json ...

Each input is a Chrome trace JSON as written by LibTorch's Kineto profiler (or
torch.profiler's export_chrome_trace).  Only complete ("ph":"X") events whose name
starts with "fsdp::" are used.  Every rank is aligned on the start of its
"fsdp::step N" span (default N: the first step recorded in every trace) and only
that step, plus a small margin, is drawn: one band per rank, one row per thread
that has fsdp:: spans, nested spans stacked as sub-rows.  Standard library only;
the output depends only on the inputs and arguments.
"""
import argparse
import json
import math
import os
import re
import sys
from xml.sax.saxutils import escape

PHASES = [  # (name prefix after "fsdp::", legend label, fill colour)
    ("forward", "forward", "#4e79a7"),
    ("backward", "backward", "#f28e2b"),
    ("all_gather.issue", "all-gather issue", "#a0cbe8"),
    ("all_gather.wait", "all-gather wait", "#59a14f"),
    ("reduce_scatter.issue", "reduce-scatter issue", "#d4a6c8"),
    ("reduce_scatter.wait", "reduce-scatter wait", "#b07aa1"),
    ("all_reduce.issue", "all-reduce issue", "#ff9da7"),
    ("all_reduce.wait", "all-reduce wait", "#e15759"),
    ("prefetch", "prefetch", "#edc948"),
    ("optimizer.step", "optimizer step", "#9c755f"),
]
OTHER_COLOUR = "#bab0ac"
STEP_RE = re.compile(r"^fsdp::step (\d+)$")

W, LEFT, RIGHT, TOP = 1000, 96, 16, 40  # canvas width, margins (px)
ROW_H, GAP, BAND_GAP = 15, 1, 12        # sub-row height, gap, gap between ranks
FONT = "font-family='Helvetica,Arial,sans-serif'"


def spans(trace_path):
    """fsdp:: host-side spans of one trace: sorted list of (name, ts_us, dur_us, tid)."""
    with open(trace_path) as f:
        data = json.load(f)
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    out = []
    for e in events:
        name = e.get("name")
        if e.get("ph") != "X" or not isinstance(name, str) or not name.startswith("fsdp::"):
            continue
        if e.get("cat") == "gpu_user_annotation":  # GPU-stream copy of a CPU scope
            continue
        out.append((name, float(e["ts"]), float(e.get("dur", 0.0)), e.get("tid", 0)))
    out.sort(key=lambda s: (s[1], -s[2], str(s[3]), s[0]))
    return out


def trace_rank(path, index):
    """Rank of a trace: Kineto's distributedInfo, else 'rank<k>' in the file name, else index."""
    try:
        with open(path) as f:
            info = json.load(f).get("distributedInfo") or {}
        if "rank" in info:
            return int(info["rank"])
    except (ValueError, AttributeError):
        pass
    m = re.search(r"rank[_-]?(\d+)", os.path.basename(path))
    return int(m.group(1)) if m else index


def phase_of(name):
    body = name[len("fsdp::"):]
    for i, (prefix, _, colour) in enumerate(PHASES):
        if body == prefix or body.startswith(prefix + " "):
            return i, colour, body[len(prefix):].strip()
    return -1, OTHER_COLOUR, body


def steps_of(sp):
    """{step number: (ts, dur)} for the fsdp::step spans (first occurrence wins)."""
    res = {}
    for name, ts, dur, _ in sp:
        m = STEP_RE.match(name)
        if m and dur > 0 and int(m.group(1)) not in res:
            res[int(m.group(1))] = (ts, dur)
    return res


def layout(sp):
    """Assign nesting depth per thread: {tid: [(depth, name, start, dur), ...]}."""
    rows = {}
    for name, ts, dur, tid in sp:
        stack = rows.setdefault(tid, ([], []))[0]
        while stack and stack[-1] <= ts + 1e-3:
            stack.pop()
        rows[tid][1].append((len(stack), name, ts, dur))
        stack.append(ts + dur)
    return {tid: v[1] for tid, v in rows.items()}


def nice_step(span, target=10):
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)


def fmt(v):
    return ("%.3f" % v).rstrip("0").rstrip(".")


def draw(ranks, step, title):
    """ranks: sorted list of (rank, spans aligned to step start in ms, step dur ms)."""
    longest = max(d for _, _, d in ranks)
    margin = 0.03 * longest
    t0, t1 = -margin, longest + margin
    plot_w = W - LEFT - RIGHT
    X = lambda t: LEFT + (t - t0) / (t1 - t0) * plot_w  # noqa: E731
    body, y = [], TOP + 8
    for rank, sp, sdur in ranks:
        # this rank's step only: spans overlapping [step start - margin, step end + margin]
        lo, hi = -margin, min(sdur + margin, t1)
        visible = [s for s in sp if s[1] + s[2] > lo and s[1] < hi and not STEP_RE.match(s[0])]
        rows = layout(visible)
        # main thread (the one holding the step span) first, then by tid
        main = next((s[3] for s in sp if s[0] == "fsdp::step %d" % step), None)
        tids = sorted(rows, key=lambda t: (t != main, str(t)))
        band_h = sum((max(d for d, *_ in rows[t]) + 1) * (ROW_H + GAP) + 4 for t in tids) or ROW_H
        body.append("<rect x='%g' y='%g' width='%g' height='%g' fill='#f4f4f4'/>"
                    % (X(0), y - 2, X(sdur) - X(0), band_h + 2))
        body.append("<text x='8' y='%g' font-size='12' font-weight='bold' %s>rank %d</text>"
                    % (y + 11, FONT, rank))
        body.append("<text x='8' y='%g' font-size='9' fill='#555' %s>step %.2f ms</text>"
                    % (y + 23, FONT, sdur))
        for ti, tid in enumerate(tids):
            depth = max(d for d, *_ in rows[tid]) + 1
            if len(tids) > 1:
                body.append("<text x='%d' y='%g' font-size='9' fill='#555' text-anchor='end' %s>%s</text>"
                            % (LEFT - 4, y + 11, FONT, "main" if tid == main else "tid %s" % tid))
            for d, name, ts, dur in rows[tid]:
                a, b = X(max(ts, lo)), X(min(ts + dur, hi))
                ry = y + d * (ROW_H + GAP)
                _, colour, unit = phase_of(name)
                body.append("<rect x='%.2f' y='%g' width='%.2f' height='%d' fill='%s' stroke='#fff' "
                            "stroke-width='0.5'><title>%s  %s ms</title></rect>"
                            % (a, ry, max(b - a, 0.6), ROW_H, colour, escape(name), fmt(dur)))
                if unit and b - a >= 5.2 * len(unit) + 4:
                    body.append("<text x='%.2f' y='%g' font-size='9' text-anchor='middle' fill='#111' %s>%s</text>"
                                % ((a + b) / 2, ry + ROW_H - 4, FONT, escape(unit)))
            y += depth * (ROW_H + GAP) + 4
            if ti + 1 < len(tids):
                body.append("<line x1='%d' x2='%d' y1='%g' y2='%g' stroke='#ccc' stroke-dasharray='2,2'/>"
                            % (LEFT, W - RIGHT, y - 2, y - 2))
        y = max(y, TOP + 8) + BAND_GAP
    plot_bottom = y - BAND_GAP + 4
    # time axis with gridlines
    axis, tick = [], nice_step(t1 - t0)
    axis.append("<line x1='%d' x2='%d' y1='%g' y2='%g' stroke='#333'/>" % (LEFT, W - RIGHT, plot_bottom, plot_bottom))
    k = math.ceil(t0 / tick)
    while k * tick <= t1 + 1e-9:
        x = X(k * tick)
        axis.append("<line x1='%.2f' x2='%.2f' y1='%d' y2='%g' stroke='#e2e2e2'/>" % (x, x, TOP, plot_bottom))
        axis.append("<line x1='%.2f' x2='%.2f' y1='%g' y2='%g' stroke='#333'/>" % (x, x, plot_bottom, plot_bottom + 4))
        axis.append("<text x='%.2f' y='%g' font-size='10' text-anchor='middle' %s>%s</text>"
                    % (x, plot_bottom + 15, FONT, fmt(k * tick)))
        k += 1
    axis.append("<text x='%g' y='%g' font-size='10' text-anchor='middle' %s>ms since start of fsdp::step %d</text>"
                % (LEFT + plot_w / 2, plot_bottom + 29, FONT, step))
    # legend
    legend, lx, ly = [], LEFT, plot_bottom + 46
    for _, label, colour in PHASES:
        wlab = 14 + 5.6 * len(label) + 14
        if lx + wlab > W - RIGHT:
            lx, ly = LEFT, ly + 16
        legend.append("<rect x='%g' y='%g' width='10' height='10' fill='%s'/>" % (lx, ly - 9, colour))
        legend.append("<text x='%g' y='%g' font-size='10' %s>%s</text>" % (lx + 14, ly, FONT, label))
        lx += wlab
    caption = ("Step %d; each rank's clock aligned on the start of its fsdp::step %d span (shaded). "
               "Rows: threads; stacked sub-rows: nested spans." % (step, step))
    height = ly + 26
    parts = ["<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' viewBox='0 0 %d %d'>"
             % (W, height, W, height),
             "<rect width='100%' height='100%' fill='#fff'/>",
             "<text x='%d' y='24' font-size='15' font-weight='bold' %s>%s</text>" % (LEFT, FONT, escape(title))]
    parts += axis + body + legend
    parts.append("<text x='%d' y='%g' font-size='10' fill='#444' %s>%s</text>" % (LEFT, ly + 20, FONT, escape(caption)))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output SVG path")
    ap.add_argument("--title", default=None, help="title line (default: derived)")
    ap.add_argument("--step", type=int, default=None, help="step number N of 'fsdp::step N' to draw")
    ap.add_argument("traces", nargs="+", help="per-rank Chrome trace JSON files")
    args = ap.parse_args(argv)
    loaded = [(trace_rank(p, i), p, spans(p)) for i, p in enumerate(args.traces)]
    common = None
    for _, _, sp in loaded:
        ks = set(steps_of(sp))
        common = ks if common is None else common & ks
    if not common:
        sys.exit("trace_picture: no fsdp::step N span common to all traces")
    # default: the first step whose complete span is in every trace (a step that was
    # already running when the profiler started has no fsdp::step event at all)
    step = args.step if args.step is not None else min(common)
    if step not in common:
        sys.exit("trace_picture: fsdp::step %d not in every trace (have %s)" % (step, sorted(common)))
    ranks = []
    for rank, _, sp in loaded:
        s0, sdur = steps_of(sp)[step]
        ranks.append((rank, [(n, (ts - s0) / 1e3, d / 1e3, tid) for n, ts, d, tid in sp], sdur / 1e3))
    ranks.sort(key=lambda r: r[0])
    title = args.title or "FSDP step %d timeline, %d rank%s" % (step, len(ranks), "s" * (len(ranks) != 1))
    svg = draw(ranks, step, title)
    with open(args.out, "w") as f:
        f.write(svg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
