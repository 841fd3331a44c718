#!/usr/bin/env python3
"""Checks that the C++ snippets of the README and of docs/ are code of the
examples that CI builds and runs: every ```cpp block of README.md, and every
```cpp block of docs/*.md that has one, is preceded by a marker line naming a
region of a file under examples/,

    <!-- snippet: examples/FILE.cpp#NAME -->

and in that file the block's text sits between the lines

    // [readme:NAME]
    // [/readme]

The block must equal the region line for line, after the region's common
indentation is removed (a snippet may sit inside a function) and trailing
whitespace is ignored.

    scripts/check_readme_snippets.py [REPO]     exit status 0: every block matches; 1: a problem (listed)

A mismatch prints a unified diff naming the page's line and the example's
file:line. A README block without a marker, a marker without a block, a
missing file or region, a region left open, nested or named twice, and a
region of examples/ that no block of README.md or docs/*.md shows (the two
would drift apart) are problems too. (docs/ may hold ```cpp blocks without a
marker: sketches that are not whole examples, as porting.md's steps.)
"""
import difflib
import os
import re
import sys

from check_layers import report  # the same report and exit status

README = "README.md"
DOCS = "docs"
EXAMPLES = "examples"

FENCE_OPEN = re.compile(r"^(\s*)(`{3,}|~{3,})\s*(\S*)")
MARKER = re.compile(r"^\s*<!--\s*snippet:\s*(\S+?)#([\w.-]+)\s*-->\s*$")
REGION_OPEN = re.compile(r"^\s*//\s*\[readme:([\w.-]+)\]\s*$")
REGION_CLOSE = re.compile(r"^\s*//\s*\[/readme\]\s*$")


def readme_blocks(lines):
    """The README's fenced blocks: (language, first code line (1-based),
    code lines, marker (path, name) or None, marker line), and markers
    followed by no ```cpp block (as (path, name, line))."""
    blocks, stray = [], []
    pending = None  # (path, name, line) of a marker awaiting its block
    i = 0
    while i < len(lines):
        line = lines[i]
        m = MARKER.match(line)
        if m:
            if pending:
                stray.append(pending)
            pending = (m.group(1), m.group(2), i + 1)
            i += 1
            continue
        f = FENCE_OPEN.match(line)
        if f:
            indent, fence, lang = f.groups()
            j = i + 1
            while j < len(lines) and not (lines[j].strip().startswith(fence[0] * len(fence))
                                          and lines[j].strip().strip(fence[0]) == ""):
                j += 1
            code = [l[len(indent):] if l.startswith(indent) else l.lstrip() for l in lines[i + 1:j]]
            marker = pending if lang == "cpp" else None
            if pending and lang != "cpp":
                stray.append(pending)
            blocks.append((lang, i + 2, code, marker))
            pending = None
            i = j + 1
            continue
        if line.strip() and pending:
            stray.append(pending)
            pending = None
        i += 1
    if pending:
        stray.append(pending)
    return blocks, stray


def regions(path, lines, problems):
    """name -> (first code line (1-based), dedented code lines) of a file's regions."""
    found, open_name, start, body = {}, None, 0, []
    for n, line in enumerate(lines, 1):
        m = REGION_OPEN.match(line)
        if m:
            if open_name is not None:
                problems.append(f"{path}:{n}: region '{m.group(1)}' opens inside region '{open_name}' "
                                f"(line {start - 1}): regions do not nest")
                continue
            open_name, start, body = m.group(1), n + 1, []
            continue
        if REGION_CLOSE.match(line):
            if open_name is None:
                problems.append(f"{path}:{n}: // [/readme] closes no region")
                continue
            if open_name in found:
                problems.append(f"{path}:{start - 1}: region '{open_name}' is named twice in the file")
            found[open_name] = (start, dedent(body))
            open_name = None
            continue
        if open_name is not None:
            body.append(line)
    if open_name is not None:
        problems.append(f"{path}:{start - 1}: region '{open_name}' is never closed (// [/readme])")
    return found


def dedent(lines):
    lines = [l.rstrip() for l in lines]
    indents = [l[:len(l) - len(l.lstrip())] for l in lines if l]
    common = os.path.commonprefix(indents) if indents else ""
    return [l[len(common):] for l in lines]


HUNK = re.compile(r"^@@ -(\d+)((?:,\d+)?) \+(\d+)((?:,\d+)?) @@")


def at_lines(diff_line, readme_offset, example_offset):
    """A hunk header with the files' own line numbers (difflib counts from the snippets' first lines)."""
    m = HUNK.match(diff_line)
    if not m:
        return diff_line
    return (f"@@ -{int(m.group(1)) + readme_offset}{m.group(2)} +{int(m.group(3)) + example_offset}{m.group(4)} @@"
            + diff_line[m.end():])


def pages(repo):
    """README.md, then docs/*.md, as (relative path, lines)."""
    names = [README] + sorted(os.path.join(DOCS, n).replace(os.sep, "/")
                              for n in (os.listdir(os.path.join(repo, DOCS))
                                        if os.path.isdir(os.path.join(repo, DOCS)) else [])
                              if n.endswith(".md"))
    for name in names:
        with open(os.path.join(repo, name), encoding="utf-8") as fh:
            yield name, fh.read().splitlines()


def main(repo):
    problems = []
    # Every region of every example, so that unused ones are found too.
    files = {}
    for d, _, names in os.walk(os.path.join(repo, EXAMPLES)):
        for n in sorted(names):
            if n.endswith((".cpp", ".h")):
                rel = os.path.relpath(os.path.join(d, n), repo).replace(os.sep, "/")
                with open(os.path.join(repo, rel), encoding="utf-8") as fh:
                    files[rel] = regions(rel, fh.read().splitlines(), problems)

    used, checked = set(), 0
    for page, lines in pages(repo):
        blocks, stray = readme_blocks(lines)
        for path, name, line in stray:
            problems.append(f"{page}:{line}: snippet marker {path}#{name} is not followed by a ```cpp block")
        for lang, line, code, marker in blocks:
            if lang != "cpp":
                continue
            if marker is None:
                if page == README:
                    problems.append(f"{page}:{line - 1}: ```cpp block has no "
                                    "<!-- snippet: examples/FILE.cpp#NAME --> line before it")
                continue
            checked += 1
            path, name, marker_line = marker
            path = os.path.normpath(path).replace(os.sep, "/")
            if path not in files:
                if os.path.isfile(os.path.join(repo, path)):
                    with open(os.path.join(repo, path), encoding="utf-8") as fh:
                        files[path] = regions(path, fh.read().splitlines(), problems)
                else:
                    problems.append(f"{page}:{marker_line}: {path} (snippet {name}) does not exist")
                    continue
            if name not in files[path]:
                problems.append(f"{page}:{marker_line}: {path} has no region '{name}' (// [readme:{name}])")
                continue
            used.add((path, name))
            start, region = files[path][name]
            block = [l.rstrip() for l in code]
            if block != region:
                diff = difflib.unified_diff(block, region, f"{page}:{line}", f"{path}:{start}", lineterm="")
                problems.append(f"{page}:{line}: the block differs from {path}#{name} (-{page}, +example):\n"
                                + "\n".join(at_lines(d, line - 1, start - 1) for d in diff))
    for path in sorted(files):
        for name, (start, _) in sorted(files[path].items()):
            if (path, name) not in used:
                problems.append(f"{path}:{start - 1}: region '{name}' is shown by no ```cpp block of {README} "
                                f"or {DOCS}/*.md (add <!-- snippet: {path}#{name} --> before one, or remove the region)")
    return report("check_readme_snippets", problems, f"{checked} marked ```cpp blocks of {README} and {DOCS}/*.md "
                  f"equal their regions in {len({p for p, _ in used})} example files ({len(used)} regions, none unused)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")))
