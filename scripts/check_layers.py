#!/usr/bin/env python3
"""Checks that fsdp-cpp's modules include only the modules below them
(docs/architecture.md): every `#include "..."` of a file in include/fsdp/ or
src/ must name a file of its own module or of a module its module may use,
and the headers of one module must not include each other in a cycle.

    scripts/check_layers.py [REPO]     exit status 0: clean; 1: a violation (listed)

A file that belongs to no module is a violation too: add new files to
MODULES. KNOWN lists the upward includes that existed when the check was
introduced (issue 17 removes them); the check fails on any other, and also
when a known one is gone, so that the list only shrinks.
"""
import fnmatch
import os
import re
import sys

# Modules, lowest first, each with the files it owns (globs, relative to the
# repository) and the modules it may include.
MODULES = [
    ("error", ["include/fsdp/error.h"], []),
    ("fault_points", ["src/fsdp/fault_points.*"], []),
    # The environment reader (fsdp/dist/env.h) is standard-library C++ under
    # dist's folders, a module of its own so that launch (fsdp-run
    # --print-env, no LibTorch) can use it; listed before dist, whose globs
    # would take it.
    ("env", ["include/fsdp/dist/env.h", "src/dist/env.cpp"], ["error"]),
    # Metrics loggers (TensorBoard, CSV, JSON lines) and the profiler: files
    # and LibTorch's own profiler, nothing of FSDP's.
    ("loggers", ["include/fsdp/loggers.h", "src/fsdp/loggers.cpp", "src/fsdp/logger_files.h", "src/fsdp/json_lines.h",
                 "src/fsdp/tensorboard_*"], ["error"]),
    ("profiler", ["include/fsdp/profiler.h", "src/fsdp/profiler.cpp"], ["error"]),
    ("dist", ["include/fsdp/dist/*", "src/dist/*"], ["error", "env"]),
    ("launch", ["include/fsdp/launch/*", "src/launch/*"], ["error", "env"]),
    ("core", ["include/fsdp/fsdp.h", "include/fsdp/unit_list.h", "include/fsdp/detail/unit.h", "src/fsdp/autograd_node.h",
              "src/fsdp/buffer_pool.*", "src/fsdp/flat_param.*", "src/fsdp/unit.*", "src/fsdp/trace_span.h", "src/fsdp/empty_init.*",
              "src/fsdp/wrap.cpp", "src/fsdp/utils.cpp"], ["error", "env", "dist"]),
    ("activation_checkpointing", ["include/fsdp/checkpoint.h", "src/fsdp/checkpoint.cpp"],
     ["error", "env", "dist", "core"]),
    ("shard_geometry", ["include/fsdp/sharded_tensor.h", "src/fsdp/sharded_tensor.cpp", "src/fsdp/shard_geometry.*"],
     ["error", "env", "dist", "core"]),
    ("state_dict_options", ["include/fsdp/state_dict_options.h", "src/fsdp/state_dict_options.cpp",
                            "src/fsdp/state_dict_settings.h"],
     ["error", "env", "dist", "core"]),
    ("model_index", ["src/fsdp/model_index.*"], ["error", "env", "dist", "core", "shard_geometry", "state_dict_options"]),
    ("state_dict", ["include/fsdp/state_dict.h", "src/fsdp/state_dict.cpp", "src/fsdp/state_dict_visit.h",
                    "src/fsdp/gather_state_dict.cpp"],
     ["error", "env", "dist", "core", "shard_geometry", "state_dict_options", "model_index"]),
    ("optim_state_dict", ["include/fsdp/optim_state_dict.h", "src/fsdp/optim_state_dict.cpp",
                          "src/fsdp/optim_state_dict_visit.h", "src/fsdp/optimizer_kinds.*"],
     ["error", "env", "dist", "core", "shard_geometry", "state_dict_options", "model_index", "state_dict"]),
    ("checkpoint_files", ["src/fsdp/rank_errors.*", "src/fsdp/torch_pickle.*", "src/fsdp/pickle_writer.*", "src/fsdp/ckpt_*",
                          "include/fsdp/checkpoint_io.h", "src/fsdp/checkpoint_io.cpp"],
     ["error", "fault_points", "env", "dist", "core", "shard_geometry", "state_dict_options", "model_index", "state_dict",
      "optim_state_dict"]),
    ("strategy", ["include/fsdp/strategy.h", "src/fsdp/strategy.cpp"],
     ["error", "fault_points", "env", "loggers", "dist", "core", "activation_checkpointing", "shard_geometry", "state_dict_options",
      "state_dict", "optim_state_dict", "checkpoint_files"]),
    ("models", ["include/fsdp/models/*", "src/models/*"], ["error", "env", "dist", "core"]),
    ("train", ["include/fsdp/train/*", "src/train/*"],
     ["error", "env", "loggers", "profiler", "dist", "core", "activation_checkpointing", "shard_geometry", "state_dict_options", "state_dict",
      "optim_state_dict", "checkpoint_files", "strategy", "models"]),
]

# (from, to): upward includes that predate the check; issue 17 removes them.
KNOWN = set()

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def module_of(path):
    for name, globs, _ in MODULES:
        if any(fnmatch.fnmatch(path, g) for g in globs):
            return name
    return None


def resolve(repo, src, inc):
    """The repository path an include names: beside the file, or under include/."""
    for base in (os.path.dirname(src), "include"):
        p = os.path.normpath(os.path.join(base, inc))
        if os.path.isfile(os.path.join(repo, p)):
            return p
    return None


def main(repo):
    allowed = {name: set(deps) | {name} for name, _, deps in MODULES}
    files = []
    for top in ("include/fsdp", "src"):
        for d, _, names in os.walk(os.path.join(repo, top)):
            for n in names:
                if n.endswith((".h", ".cpp")):
                    files.append(os.path.relpath(os.path.join(d, n), repo))
    problems, seen_known, edges = [], set(), {}
    for f in sorted(files):
        mod = module_of(f)
        if mod is None:
            problems.append(f"{f}: belongs to no module (add it to MODULES in scripts/check_layers.py)")
            continue
        with open(os.path.join(repo, f), encoding="utf-8") as fh:
            text = fh.read()
        for inc in INCLUDE.findall(text):
            target = resolve(repo, f, inc)
            if target is None:
                continue  # a system or third-party header
            tmod = module_of(target)
            edges.setdefault(f, set()).add(target)
            if tmod in allowed[mod]:
                continue
            if (f, target) in KNOWN:
                seen_known.add((f, target))
                continue
            problems.append(f"{f} ({mod}) includes {target} ({tmod}): {mod} may use only {sorted(allowed[mod])}")
    for gone in sorted(KNOWN - seen_known):
        problems.append(f"{gone[0]} no longer includes {gone[1]}: remove it from KNOWN in scripts/check_layers.py")
    # Include cycles among headers (within a module: across modules a cycle
    # needs an upward include, reported above).
    state = {}

    def visit(f, stack):
        state[f] = 1
        stack.append(f)
        for t in sorted(edges.get(f, ())):
            if state.get(t) == 1:
                problems.append("include cycle: " + " -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t, stack)
        stack.pop()
        state[f] = 2

    for f in sorted(edges):
        if f not in state:
            visit(f, [])
    for p in problems:
        print("check_layers: " + p)
    if not problems:
        print(f"check_layers: {len(files)} files, {sum(len(v) for v in edges.values())} includes: every module "
              f"includes only those below it ({len(KNOWN)} known exceptions, issue 17)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")))
