#!/usr/bin/env python3
"""scripts/check_docs.py finds each kind of problem: it is run on a small
repository made here (a README, two pages of docs/ and a CHANGELOG.md that
cites issues), into which one problem at a time is written, and must fail
naming the file and line; the unchanged copy, and mentions that are not this
project's issue numbers, must pass.

    tests/scripts/check_docs_test.py REPO
"""
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(REPO, "scripts", "check_docs.py")

CLEAN = {
    "README.md": "# project\n\nWhat it is.\n\n## Status\n\n| feature | status |\n| --- | --- |\n| a | done |\n",
    "docs/a.md": "# A\n\nHow a works.\n",
    "docs/b.md": "# B\n\nHow b works.\n",
    "CHANGELOG.md": "# Changelog\n\n## Issue 38\n\nIssue 37's follow-up; see #12 and issues 3-4.\n",
}


def make(tree, files):
    for rel, text in files.items():
        path = os.path.join(tree, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    os.makedirs(os.path.join(tree, "scripts"), exist_ok=True)
    for s in ("check_docs.py", "check_layers.py"):
        shutil.copy(os.path.join(REPO, "scripts", s), os.path.join(tree, "scripts", s))


def check(tree):
    r = subprocess.run([sys.executable, os.path.join(tree, "scripts", "check_docs.py"), tree],
                       capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def main():
    failures = []
    long_readme = CLEAN["README.md"] + "".join(f"line {i}\n" for i in range(200 - 9))
    # (what, the files changed, what the report must say; None: it must pass)
    cases = [
        ("nothing", {}, None),
        ("a README of 199 lines", {"README.md": long_readme.rsplit("line", 1)[0]}, None),
        ("a README of 200 lines", {"README.md": long_readme}, "README.md:200: the README has 200 lines"),
        ("'issue N' in the README", {"README.md": CLEAN["README.md"] + "Done in issue 31.\n"},
         "README.md:10: names an issue number ('issue 31'"),
        ("'Issues N' in a doc", {"docs/b.md": "# B\n\nSee Issues 3 and 4.\n"},
         "docs/b.md:3: names an issue number ('Issues 3'"),
        ("'issue-N' in a doc", {"docs/a.md": "# A\n\nthe issue-4 measurement\n"},
         "docs/a.md:3: names an issue number ('issue-4'"),
        ("'issue #N' in a heading", {"docs/a.md": "## Headers (issue #31)\n"},
         "docs/a.md:1: names an issue number ('issue #31'"),
        ("'#N' alone in a doc", {"docs/b.md": "# B\n\nFixed in #37.\n"},
         "docs/b.md:3: names an issue number ('#37'"),
        ("what is not this project's issue", {"docs/a.md": "# A\n\nA tissue 5 cm; pytorch/pytorch#12345; "
                                              "colour #00ff00; `#540`; \"collective all_gather #7 failed\".\n"},
         None),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for i, (what, changes, expected) in enumerate(cases):
            tree = os.path.join(tmp, str(i))
            make(tree, {**CLEAN, **changes})
            rc, out = check(tree)
            if expected is None:
                if rc != 0:
                    failures.append(f"{what}: expected to pass, got {rc}:\n{out}")
            elif rc != 1 or expected not in out:
                failures.append(f"{what}: expected exit 1 naming '{expected}', got {rc}:\n{out}")
    for f in failures:
        print("check_docs_test: " + f)
    if not failures:
        print(f"check_docs_test: clean pages pass, and each of {sum(1 for c in cases if c[2])} kinds of problem "
              "is found with its file:line")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
