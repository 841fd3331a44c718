#!/usr/bin/env python3
"""scripts/check_layers.py finds each kind of violation: it is run on
a copy of the repository's include/ and src/ into which one violation at a
time is written, and must fail naming it; the unchanged copy must pass.

    tests/scripts/check_layers_test.py REPO
"""
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(REPO, "scripts", "check_layers.py")


def check(tree):
    r = subprocess.run([sys.executable, SCRIPT, tree], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def append(path, text):
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def main():
    failures = []
    # (what, the file a line is appended to (made if missing; or a list of
    # files), the line, what the report must say)
    cases = [
        ("an include that points up", "src/core/utils.cpp", '#include "fsdp/strategy/strategy.h"',
         "src/core/utils.cpp (core) includes include/fsdp/strategy/strategy.h (strategy)"),
        ("a private helper that imports its module's public header back", "src/checkpoint/parts.h",
         '#include "fsdp/checkpoint/checkpoint_io.h"',
         "import back up (a cycle among units, x.h with x.cpp): checkpoint:checkpoint_io, checkpoint:parts"),
        ("a folder that is no module", "src/extras/x.cpp", "", "src/extras/: a folder that is no module"),
        ("code in a top-level forwarding header", "include/fsdp/strategy.h", "namespace fsdp { int x; }",
         "a top-level header holds only includes"),
        ("a module file that includes a top-level umbrella header", "src/state_dict/boxes.cpp", '#include "fsdp/fsdp.h"',
         "src/state_dict/boxes.cpp (state_dict) includes include/fsdp/fsdp.h, a top-level umbrella or forwarding header"),
        ("a module that reaches into a lower module's private header", "src/state_dict/boxes.cpp",
         '#include "../core/flat_param.h"',
         "src/state_dict/boxes.cpp (state_dict) includes src/core/flat_param.h, a private header of core"),
        ("a public header that includes a private one, even its own module's", "include/fsdp/core/options.h",
         '#include "../../../src/core/flat_param.h"',
         "include/fsdp/core/options.h (public) includes src/core/flat_param.h, a private header of core"),
        ("a tool that includes a private header", "tools/fsdp_smoke.cpp", '#include "../src/core/flat_param.h"',
         "tools/fsdp_smoke.cpp includes src/core/flat_param.h, a private header of core"),
        # The sizes: a new file of exactly one line over its limit (the line
        # appended, with a newline before and after it, holds the others).
        ("a source file over 500 lines", "src/text/long.cpp", "\n" * 499,
         "src/text/long.cpp: 501 lines, over the 500 a source file may have"),
        ("a header over 300 lines", "include/fsdp/text/long.h", "\n" * 299,
         "include/fsdp/text/long.h: 301 lines, over the 300 a header may have"),
        ("a folder of more than 25 files", [f"src/text/many/f{i}.cpp" for i in range(26)], "",
         "src/text/many/: 26 files, over the 25 a folder may hold"),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for i, (what, path, line, expected) in enumerate([("nothing", None, None, None)] + cases):
            tree = os.path.join(tmp, str(i))
            for top in ("include", "src", "scripts", "tools", "examples", "bench"):
                shutil.copytree(os.path.join(REPO, top), os.path.join(tree, top))
            for p in [path] if isinstance(path, str) else path or []:  # a case may write several files
                os.makedirs(os.path.dirname(os.path.join(tree, p)), exist_ok=True)
                append(os.path.join(tree, p), "\n" + line + "\n")
            rc, out = check(tree)
            if expected is None:
                if rc != 0:
                    failures.append(f"the unchanged tree fails: {out}")
            elif rc != 1 or expected not in out:
                failures.append(f"{what}: expected exit 1 naming '{expected}', got {rc}:\n{out}")
    for f in failures:
        print("check_layers_test: " + f)
    if not failures:
        print(f"check_layers_test: the unchanged tree passes, and each of {len(cases)} kinds of violation is found")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
