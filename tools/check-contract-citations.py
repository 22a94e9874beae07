#!/usr/bin/env python3
"""List citations of decider-contract ids that docs/decider-contract.md does not define.

    python3 tools/check-contract-citations.py [--list] [--root DIR]

The code and docs cite the rules of decider-ai 1.10.0 that onepass follows as `decider-contract R2.1.2`,
`decider-contract §7`, `(decider-contract §1.10, R6.3)`, and, further on in the same file, as bare `R4.2.1` or `§2.2`.
Every tracked text file that names `decider-contract` is scanned, and every `R<n>.<n>...` and `§<n>...` in it counts
as a citation (the ids of the contract are the only such ids in the repository). An id resolves when
docs/decider-contract.md has a heading with that number (`### 1.10 ...`: §1.10, also cited as R1.10) or a rule with
that id (a paragraph opening `**R1.1.1**`). Prints each unresolved citation as `file:line: id` and exits 1 if there is
one; `--list` also prints every citation with where it resolves.

Also printed, without failing: mentions of a `decider-contract.md` path that is absolute or does not end in
`docs/decider-contract.md` (a reader of the repository cannot open it).

Pure Python 3.8+, no dependencies; the files are those git tracks plus untracked ones it does not ignore (or a walk of
the tree outside a checkout).
"""
import argparse
import os
import re
import subprocess
import sys

DOC = "docs/decider-contract.md"
SKIP_DIRS = {".git", "target", "testdata", "node_modules"}

# An id: R followed by two or more dot-separated numbers, or § followed by one or more. The look-arounds keep `R2.1.2`
# out of longer tokens (`XR2.1`, `R2.1.2.` at the end of a sentence is fine: the trailing dot is not a digit).
ID = re.compile(r"(?<![A-Za-z0-9_])(R)(\d+(?:\.\d+)+)(?![\d])|(§) ?(\d+(?:\.\d+)*)(?![\d])")
HEADING = re.compile(r"^#{1,6}\s+§?(\d+(?:\.\d+)*)\.?\s")
RULE = re.compile(r"^\s*(?:[-*]\s+)?\*\*R(\d+(?:\.\d+)+)\*\*")
PATH = re.compile(r"[^\s`'\"()<>\[\]]*decider-contract\.md")


def tracked_files(root):
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root, check=True, capture_output=True).stdout
        return [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if x not in SKIP_DIRS]
            files += [os.path.relpath(os.path.join(d, n), root) for n in names]
        return files


def read_text(path):
    """The file's text, or None for a binary, unreadable or very large file."""
    try:
        if os.path.getsize(path) > 4 << 20:
            return None
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def defined_ids(text):
    """{number: where} for the doc's headings and rules; a number is the dotted digits without R or §."""
    ids = {}
    for n, line in enumerate(text.splitlines(), 1):
        m = HEADING.match(line)
        if m:
            ids.setdefault(m.group(1), f"heading, line {n}")
        m = RULE.match(line)
        if m:
            ids.setdefault(m.group(1), f"rule, line {n}")
    return ids


def citations(text):
    """[(line, id as written, number)] for every id in the text."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in ID.finditer(line):
            if m.group(1):
                out.append((n, "R" + m.group(2), m.group(2)))
            else:
                out.append((n, "§" + m.group(4), m.group(4)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="repository root (default: the one holding this script)")
    ap.add_argument("--list", action="store_true", help="print every citation with where it resolves")
    args = ap.parse_args()

    doc_text = read_text(os.path.join(args.root, DOC))
    if doc_text is None:
        print(f"error: cannot read {DOC} under {args.root}", file=sys.stderr)
        return 2
    defined = defined_ids(doc_text)

    total, files, missing, stray_paths = 0, 0, [], []
    for rel in sorted(tracked_files(args.root)):
        if rel == os.path.relpath(__file__, args.root):
            continue  # this script's docstring holds examples, not citations
        text = read_text(os.path.join(args.root, rel))
        if text is None or "decider-contract" not in text:
            continue
        files += 1
        for n, line in enumerate(text.splitlines(), 1):
            for m in PATH.finditer(line):
                path = m.group(0)
                if "/" in path and (path.startswith("/") or not path.endswith(DOC)):
                    stray_paths.append(f"{rel}:{n}: {path}")
        for n, written, number in citations(text):
            total += 1
            where = defined.get(number)
            if where is None:
                missing.append(f"{rel}:{n}: {written}")
            elif args.list:
                print(f"{rel}:{n}: {written} -> {DOC} {where}")

    for m in missing:
        print(m)
    print(f"{total} citations in {files} files, {len(defined)} ids defined in {DOC}, {len(missing)} missing")
    if stray_paths:
        print(f"note: {len(stray_paths)} mentions of a decider-contract.md path outside the repository:")
        for p in stray_paths:
            print(f"  {p}")
    return 1 if missing else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        sys.exit(0)
