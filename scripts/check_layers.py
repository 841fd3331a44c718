#!/usr/bin/env python3
"""Checks that fsdp-cpp's modules include only the modules below them, and
that its files and folders stay under their sizes (docs/architecture.md).

A module is a folder: `include/fsdp/<module>/` holds its public headers and
`src/<module>/` its implementation and private headers. The one exception is
the header-only module `error` (`include/fsdp/error.h`). Any other header
directly in `include/fsdp/` is an umbrella or a forwarding header: it may hold
only comments, `#pragma` and `#include` lines, and no file of a module may
include it. A module's sub-folders (src/tokenizers/normalizers/,
src/formats/dcp/, include/fsdp/core/detail/) are part of the module, and a
unit (rule 2) is named by its file's name wherever in the module it lies:
include/fsdp/formats/safetensors.h and src/formats/safetensors/safetensors.cpp
are one unit, so file names stay distinct across a module's sub-folders.

    scripts/check_layers.py [REPO]     exit status 0: clean; 1: a violation (listed)

Five rules, over every `#include "..."` and every file in include/fsdp/ and src/:
1. A file includes only files of its own module or of a module its module
   may use (LAYERS below, lowest first).
2. No import runs back up inside a module either: a header and the source
   file of the same name (`x.h`, `x.cpp`, public or private) are one unit,
   and the units of a module include each other without a cycle. A private
   helper that includes its module's public header while that header's
   source includes the helper is such a cycle. A private `x_impl.h` is the
   private half of unit x (its pimpl), not a unit of its own.
3. A folder under include/fsdp/ or src/ that LAYERS does not name is a
   violation: a new module gets its place in LAYERS first.
4. Private headers stay private. A header under `src/<module>/` is its
   module's own: a file of another module may not include it (it uses the
   module's public headers, include/fsdp/<module>/, where a narrow door such
   as include/fsdp/core/detail/unit_view.h is made for it), no public header
   includes a private one (a user's build could not find it), and the thin
   mains in tools/, examples/ and bench/ include public headers only.
5. Files and folders stay small enough to read: every .cpp under src/ has
   at most MAX_SOURCE_LINES lines, every header under include/fsdp/ and src/
   at most MAX_HEADER_LINES, and no folder under include/fsdp/ or src/ holds
   more than MAX_FOLDER_FILES files (those directly in it). Each file or
   folder over is listed with its count: split it by responsibility (a
   module's sub-folders, such as src/tokenizers/normalizers/, are part of
   the module).
"""
import os
import re
import sys

# Modules, lowest first, with the modules each may include. The folder of a
# module is its name, under include/fsdp/ and under src/.
LAYERS = [
    ("error", []),
    ("fault_points", []),
    # Byte strings (paths) in JSON: Python's surrogateescape. Standard library only.
    ("text", []),
    # Hugging Face's tokenizers (tokenizer.json, SentencePiece): standard
    # library, PCRE2, ICU, sentencepiece and nlohmann-json; no LibTorch.
    ("tokenizers", ["error"]),
    # fsdp-run and the job's environment as launchers describe it
    # (torchrun, SLURM, MPI): standard library only, no LibTorch.
    ("launch", ["error", "text"]),
    # Metrics loggers and the profiler: files and LibTorch's own profiler.
    ("observability", ["error", "text"]),
    # File formats below checkpoints, FSDP-free: PyTorch's pickles (torch.save,
    # DCP), safetensors, fsdp-cpp's own index records, atomic files.
    ("formats", ["error", "text"]),
    # Optimizers equal to torch.optim's, bit for bit (LibTorch's own differ):
    # LibTorch only.
    ("optim", ["error"]),
    # LoRA as PEFT applies it: LoraConfig, the seam a linear module inherits,
    # inject_lora's pass over a built model. LibTorch's modules only; its
    # files (PEFT's adapter directory) are hf's.
    ("peft", ["error"]),
    ("distributed", ["error", "text", "launch"]),
    # DTensor's contract: the N-D mesh, placements, a tensor laid out over a
    # mesh (or its boxes), and box arithmetic; below both engines, the state
    # dicts and checkpoints.
    ("dtensor", ["error", "text", "launch", "distributed"]),
    ("core", ["error", "text", "launch", "distributed", "dtensor"]),
    # FSDP2: fully_shard's per-parameter sharding, beside core's FSDP1, on
    # core's forward interposition (fsdp::Unit) and the comm layer.
    ("fsdp2", ["error", "text", "launch", "distributed", "dtensor", "core"]),
    ("state_dict", ["error", "text", "optim", "launch", "distributed", "dtensor", "core", "fsdp2"]),
    ("checkpoint", ["error", "fault_points", "text", "formats", "launch", "distributed", "dtensor", "core", "fsdp2", "state_dict"]),
    ("strategy", ["error", "fault_points", "text", "formats", "launch", "observability", "distributed", "dtensor", "core", "fsdp2", "state_dict", "checkpoint"]),
    # config.json is read through formats' regular-file check (no FIFO waits).
    ("models", ["error", "formats", "peft", "launch", "distributed", "dtensor", "core"]),
    # Hugging Face model directories in and out (config, weights, export) for
    # the models: on the checkpoint storage seam.
    ("hf", ["error", "text", "formats", "peft", "launch", "distributed", "dtensor", "core", "fsdp2", "state_dict", "checkpoint", "models"]),
    # fsdp-train's run directory: its lock, the run's identity (run.json),
    # the job's start, where a resume continues, the checkpoints' rotation.
    ("run", ["error", "text", "launch", "distributed", "dtensor", "core", "fsdp2", "state_dict", "checkpoint", "strategy"]),
    ("train", ["error", "text", "formats", "optim", "peft", "launch", "observability", "distributed", "dtensor", "core", "fsdp2", "state_dict", "checkpoint", "strategy", "models", "hf", "tokenizers", "run"]),
]
TOP_LEVEL_MODULES = {"include/fsdp/error.h": "error"}
# Folders of deprecated forwarding headers (old paths of a renamed module):
# their headers are treated like the top-level forwarding headers.
FORWARDING_FOLDERS = {"include/fsdp/dist"}

# The thin mains: they may include public headers only (rule 4).
MAINS = ("tools", "examples", "bench")

# Rule 5: the most lines of a source file under src/ and of a header, and
# the most files directly in one folder.
MAX_SOURCE_LINES = 500
MAX_HEADER_LINES = 300
MAX_FOLDER_FILES = 25

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
FORWARDING_LINE = re.compile(r'^\s*(//.*|#\s*pragma\b.*|#\s*include\s+[<"][^>"]+[>"]\s*(//.*)?)?$')


def module_of(path):
    """(module, unit) of a repository path; module "" for a top-level header, None outside any module."""
    if path in TOP_LEVEL_MODULES:
        return TOP_LEVEL_MODULES[path], path
    parts = path.split("/")
    if parts[:2] == ["include", "fsdp"]:
        rest = parts[2:]
    elif parts[0] == "src":
        rest = parts[1:]
    else:
        return None, None
    if len(rest) == 1 or os.path.dirname(path) in FORWARDING_FOLDERS:
        return "", path  # an umbrella or forwarding header
    stem = os.path.splitext(rest[-1])[0]
    if stem.endswith("_impl"):  # x_impl.h: the private half of unit x (its Impl, as in the pimpl idiom)
        stem = stem[: -len("_impl")]
    return rest[0], rest[0] + ":" + stem


def is_private(path):
    """Whether a repository path is a private header or source: a module's file under src/."""
    return path.startswith("src/")


def resolve(repo, src, inc):
    """The repository path an include names: beside the file, or under include/."""
    for base in (os.path.dirname(src), "include"):
        p = os.path.normpath(os.path.join(base, inc))
        if os.path.isfile(os.path.join(repo, p)):
            return p
    return None


def find_cycles(edges):
    """Strongly connected components of more than one node (Tarjan), each as a sorted list."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in edges.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def size_problems(path, text):
    """Rule 5 for one file of include/fsdp/ or src/: its lines against the limit of its kind."""
    lines = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
    if path.endswith(".h") and lines > MAX_HEADER_LINES:
        return [f"{path}: {lines} lines, over the {MAX_HEADER_LINES} a header may have (split it by responsibility)"]
    if path.endswith(".cpp") and path.startswith("src/") and lines > MAX_SOURCE_LINES:
        return [f"{path}: {lines} lines, over the {MAX_SOURCE_LINES} a source file may have "
                "(split it by responsibility)"]
    return []


def main(repo):
    names = [name for name, _ in LAYERS]
    allowed = {name: set(deps) | {name} for name, deps in LAYERS}
    problems = []
    for name, deps in LAYERS:
        for d in deps:
            if d not in names[: names.index(name)]:
                problems.append(f"LAYERS: {name} uses {d}, which is not listed below it")
    files = []
    for top in ("include/fsdp", "src"):
        for d, dirs, fnames in os.walk(os.path.join(repo, top)):
            rel = os.path.relpath(d, repo)
            depth = rel.split("/")
            if rel != top and len(depth) == len(top.split("/")) + 1 and depth[-1] not in names \
                    and rel not in FORWARDING_FOLDERS:
                problems.append(f"{rel}/: a folder that is no module (add it to LAYERS in scripts/check_layers.py)")
            if len(fnames) > MAX_FOLDER_FILES:
                problems.append(f"{rel}/: {len(fnames)} files, over the {MAX_FOLDER_FILES} a folder may hold "
                                "(split it by responsibility into sub-folders or a module of its own)")
            for n in fnames:
                if n.endswith((".h", ".cpp")):
                    files.append(os.path.relpath(os.path.join(d, n), repo))
    file_edges, unit_edges, count = {}, {}, 0
    for f in sorted(files):
        mod, unit = module_of(f)
        with open(os.path.join(repo, f), encoding="utf-8") as fh:
            text = fh.read()
        problems += size_problems(f, text)
        if mod == "":
            for i, line in enumerate(text.split("\n"), 1):
                if not FORWARDING_LINE.match(line):
                    problems.append(f"{f}:{i}: a top-level header holds only includes (an umbrella or forwarding header); "
                                    "code belongs in a module's folder")
                    break
            continue
        for inc in INCLUDE.findall(text):
            target = resolve(repo, f, inc)
            if target is None:
                continue  # a system or third-party header
            count += 1
            tmod, tunit = module_of(target)
            file_edges.setdefault(f, set()).add(target)
            if tmod == "":
                problems.append(f"{f} ({mod}) includes {target}, a top-level umbrella or forwarding header: "
                                "include the module's own header")
                continue
            if tmod not in allowed[mod]:
                problems.append(f"{f} ({mod}) includes {target} ({tmod}): {mod} may use only {sorted(allowed[mod])}")
            if is_private(target) and not is_private(f):
                problems.append(f"{f} (public) includes {target}, a private header of {tmod}: "
                                "a public header includes public headers only")
            elif is_private(target) and tmod != mod:
                problems.append(f"{f} ({mod}) includes {target}, a private header of {tmod}: "
                                f"use {tmod}'s public headers (include/fsdp/{tmod}/)")
            if tunit != unit:
                unit_edges.setdefault(unit, set()).add(tunit)
    for top in MAINS:
        for d, dirs, fnames in os.walk(os.path.join(repo, top)):
            for n in sorted(fnames):
                if not n.endswith((".h", ".cpp")):
                    continue
                f = os.path.relpath(os.path.join(d, n), repo)
                with open(os.path.join(repo, f), encoding="utf-8") as fh:
                    text = fh.read()
                for inc in INCLUDE.findall(text):
                    target = resolve(repo, f, inc)
                    if target is not None and is_private(target):
                        count += 1
                        problems.append(f"{f} includes {target}, a private header of {module_of(target)[0]}: "
                                        "tools, examples and benchmarks use the public API (include/fsdp/)")
    for comp in find_cycles(file_edges):
        problems.append("include cycle among files: " + ", ".join(comp))
    for comp in find_cycles(unit_edges):
        problems.append("import back up (a cycle among units, x.h with x.cpp): " + ", ".join(comp))
    return report("check_layers", problems, f"{len(files)} files in {len(names)} modules, {count} includes: every "
                  "module includes only those below it, no unit imports back up, no private header is reached from outside its "
                  f"module, and no source file is over {MAX_SOURCE_LINES} lines, no header over {MAX_HEADER_LINES}, "
                  f"no folder over {MAX_FOLDER_FILES} files")


def report(tool, problems, summary):
    """Prints each problem, or `summary` when there is none, after `tool: `;
    the exit status: 1 with problems, else 0. (scripts/check_readme_snippets.py uses it too.)"""
    for p in problems:
        print(f"{tool}: {p}")
    if not problems:
        print(f"{tool}: {summary}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")))
