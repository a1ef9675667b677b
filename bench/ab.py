"""One benchmark, two versions of the code, interleaved: the figures of a change against the
code before it, measured in the same session.

Run::

    python -m bench.ab [--base REV] [--pairs N] [--grep REGEX] -- MODULE [ARGS...]

e.g. ``python -m bench.ab --pairs 3 --grep "us|ms" -- bench.bench_live_app 10 20 30 1000
--keybased``. It checks out ``REV`` (default ``HEAD~1``) in a temporary git worktree and runs
``python -m MODULE ARGS`` ``N`` times (default 3) on each side in turns (the code before
first, then the working tree, and again): run to run noise on a shared host is often larger
than a change's effect, and interleaving spreads the host's changes over both sides. From
each run's output it keeps the lines matching ``REGEX`` (default: every line holding a
number), takes every number of each, and prints, line by line, the last run's line of each
side and each number's ratio (working tree / before) in every pair, with their median; each
number is named by its place in the line and the words around it (``number 6 'us CPU'``).

Each side runs with its own packages: its tree's installed layout as links (``make links``:
``.pkg/filepulsar/storage`` -> ``storage/``, ...), then the tree itself (``bench``), put first
on ``sys.path`` by a ``sitecustomize`` of this tool's, which also drops the editable install's
import hook, in a folder holding no package. Subprocesses the benchmark starts inherit the
environment, so a side's whole run is that side's code; a ``sitecustomize`` of your own on
``PYTHONPATH`` does not run. Needs a git checkout and ``make``; the worktree is removed at
the end.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: A number (a figure), not digits inside a word (``p50``, ``Key_Shared2``).
NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?")

_SITE = """\
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path[:0] = [{pkg!r}, {tree!r}]
"""


def _git_or_make(argv: list[str], what: str) -> None:
    """Run ``argv`` (git or make); a failure ends the tool with one line saying ``what``
    failed and why."""
    got = subprocess.run(argv, capture_output=True, text=True)
    if got.returncode != 0:
        why = (got.stderr.strip() or got.stdout.strip()).splitlines() or ["no output"]
        raise SystemExit(f"bench.ab: {what} failed: {why[-1]}")


def checkout(rev: str, into: Path) -> Path:
    """A worktree of ``rev`` at ``into``."""
    _git_or_make(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(into), rev],
        f"checking out {rev!r}",
    )
    return into


def layout(tree: Path, into: Path) -> Path:
    """The site folder (made under ``into``) that makes a Python process import ``tree``'s
    code: the installed layout's links the Makefile makes (``make links``: ``tree/.pkg``),
    then the tree itself (``bench``), first on ``sys.path``."""
    _git_or_make(["make", "-C", str(tree), "--quiet", "links"], f"make links in {tree}")
    site = into / "site"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(_SITE.format(pkg=str(tree / ".pkg"), tree=str(tree)))
    return site


def run(args: list[str], *, site: Path, cwd: Path) -> str:
    """The output (stdout then stderr) of ``python ARGS`` (``-m MODULE ...``, ``-c CODE``),
    importing the code ``site`` names (from :func:`layout`), in ``cwd`` (a folder holding no
    package)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    got = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True)
    if got.returncode != 0:
        raise SystemExit(
            f"bench.ab: python {' '.join(args)} exited with {got.returncode}:\n{got.stderr[-2000:]}"
        )
    return got.stdout + got.stderr


def where(site: Path, cwd: Path) -> str:
    """The folder a process with ``site`` imports ``filepulsar.storage`` from."""
    code = (
        "import os, filepulsar.storage as s; print(os.path.dirname(os.path.realpath(s.__file__)))"
    )
    return run(["-c", code], site=site, cwd=cwd).strip()


def figures(output: str, grep: re.Pattern[str]) -> list[tuple[str, list[float]]]:
    """The lines of ``output`` that ``grep`` matches and hold a number, each with its
    numbers."""
    out = []
    for line in output.splitlines():
        if grep.search(line):
            nums = [float(n.replace(",", "")) for n in NUMBER.findall(line)]
            if nums:
                out.append((line.strip(), nums))
    return out


def labels(line: str) -> list[str]:
    """Each number of ``line`` named by the word before it and the words after it, up to the
    next number or punctuation (``consumers … us``, ``us CPU``, ``p50 … ms``): a figure's
    name in the report, which stays with it where an argument shifts the numbers before it."""
    found = list(NUMBER.finditer(line))
    out = []
    prev = 0
    for m, nxt in zip(found, [*found[1:], None], strict=True):
        before = line[prev : m.start()].split()
        word = before[-1].strip(",;:()[]") if before and before[-1][-1] not in ",;:([" else ""
        text = line[m.end() : nxt.start() if nxt is not None else len(line)]
        words = re.split(r"[,;:()\[\]]", text, maxsplit=1)[0].split()
        words = list(itertools.takewhile(lambda w: not any(ch.isdigit() for ch in w), words))
        after = " ".join(words[:3])
        out.append(f"{word} … {after}".strip(" …") if word and after else word or after)
        prev = m.end()
    return out


def report(
    before: list[list[tuple[str, list[float]]]], after: list[list[tuple[str, list[float]]]]
) -> list[str]:
    """Line by line: the last run's line of each side, then each number's ratio (after /
    before) in every pair and their median."""
    lines: list[str] = []
    rows = min(len(r) for r in before + after)
    for k in range(rows):
        lines.append(f"before: {before[-1][k][0]}")
        lines.append(f"after:  {after[-1][k][0]}")
        cols = min(len(r[k][1]) for r in before + after)
        names = labels(after[-1][k][0])
        for c in range(cols):
            ratios = [
                a[k][1][c] / b[k][1][c] for a, b in zip(after, before, strict=True) if b[k][1][c]
            ]
            if not ratios or all(a[k][1][c] == b[k][1][c] for a, b in zip(after, before)):
                continue  # (a constant: a count, a parameter)
            pairs = " ".join(f"{r:.2f}" for r in ratios)
            name = f" {names[c]!r}" if c < len(names) and names[c] else ""
            lines.append(
                f"  number {c + 1}{name} ({before[-1][k][1][c]:g} -> {after[-1][k][1][c]:g}): "
                f"after/before {pairs}, median {statistics.median(ratios):.2f}"
            )
    return lines


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="HEAD~1", help="the revision to compare with")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--grep", default=r"\d", help="the output lines to compare (a regex)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- MODULE [ARGS...]")
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("name the benchmark module after --, e.g. -- bench.bench_commit 3")
    if args.pairs < 1:
        ap.error(f"--pairs must be at least 1, not {args.pairs}")
    try:
        grep = re.compile(args.grep)
    except re.error as e:
        ap.error(f"--grep {args.grep!r} is not a regular expression: {e}")
    tmp = Path(tempfile.mkdtemp(prefix="fp-ab-"))
    try:
        sites = {
            "before": layout(checkout(args.base, tmp / "tree"), tmp / "before"),
            "after": layout(REPO, tmp / "after"),
        }
        (tmp / "run").mkdir()
        for side, site in sites.items():
            print(f"{side} imports filepulsar.storage from {where(site, tmp / 'run')}")
        before: list[list[tuple[str, list[float]]]] = []
        after: list[list[tuple[str, list[float]]]] = []
        for i in range(args.pairs):
            for side, got in (("before", before), ("after", after)):
                print(f"pair {i + 1}: {side} ...", flush=True)
                output = run(["-m", *cmd], site=sites[side], cwd=tmp / "run")
                got.append(figures(output, grep))
        print(f"{' '.join(cmd)}: {args.base} (before) against the working tree (after)")
        print("\n".join(report(before, after)))
    finally:
        if (tmp / "tree").exists():
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tmp / "tree")],
                check=False,
            )
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
