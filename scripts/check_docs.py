#!/usr/bin/env python3
"""Checks that the README stays a front door and that the user docs speak of
features, not of this project's issue tracker:

- README.md has fewer than 200 lines;
- README.md and docs/*.md name no issue number: neither "issue 12",
  "Issues 3", "issue-4" or "issue #7" (any case), nor "#12" standing alone
  in prose (inside a `code span` or a "quoted message" it is program output,
  such as a collective's sequence number, and passes).
  CHANGELOG.md, at the repository's root, is the one place that may cite them.
  Another project's issue, written as GitHub writes it (`pytorch/pytorch#12345`),
  is not this project's and passes.

    scripts/check_docs.py [REPO]     exit status 0: all true; 1: a problem (each listed as FILE:LINE)

Run by CTest (Docs.ReadmeIsShortAndDocsCiteNoIssues); tests/scripts/check_docs_test.py
shows that it finds each kind of problem.
"""
import os
import re
import sys

from check_layers import report  # the same report and exit status

README = "README.md"
DOCS = "docs"
MAX_README_LINES = 200  # the README must stay under this

# "issue 12", "issues 3", "issue-4", "issue #7", "Issue 37's"; not "tissue 5".
ISSUE_WORD = re.compile(r"\bissues?[ -]?#?\d+", re.IGNORECASE)
# "#12" alone; not "owner/repo#12", "page#12", "&#123;" or a colour like "#00ff00".
ISSUE_HASH = re.compile(r"(?<![\w/&#])#\d+(?![\w])")
# Code spans and double-quoted messages: program output, not citations.
QUOTED = re.compile(r"`[^`]*`|\"[^\"]*\"|\u201c[^\u201d]*\u201d")


def pages(repo):
    """README.md, then docs/*.md in name order, as paths relative to repo."""
    docs = os.path.join(repo, DOCS)
    names = sorted(n for n in os.listdir(docs) if n.endswith(".md")) if os.path.isdir(docs) else []
    return [README] + [f"{DOCS}/{n}" for n in names]


def main(repo):
    problems = []
    for page in pages(repo):
        path = os.path.join(repo, page)
        if not os.path.isfile(path):
            problems.append(f"{page}: missing")
            continue
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
        if page == README and len(lines) >= MAX_README_LINES:
            problems.append(f"{page}:{len(lines)}: the README has {len(lines)} lines; it must stay under "
                            f"{MAX_README_LINES} (move details into docs/)")
        for n, line in enumerate(lines, 1):
            found = [m.group(0) for m in ISSUE_WORD.finditer(line)] + [m.group(0) for m in ISSUE_HASH.finditer(QUOTED.sub("", line))]
            for f in found:
                start = max(0, line.find(f) - 40)
                problems.append(f"{page}:{n}: names an issue number ('{f}' in \"...{line[start:start + 100]}...\"): "
                                "say what the feature does instead (CHANGELOG.md may cite issues)")
    return report("check_docs", problems, f"{README} is under {MAX_README_LINES} lines, and it and "
                  f"{len(pages(repo)) - 1} pages of {DOCS}/ name no issue number")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")))
