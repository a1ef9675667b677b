"""``bench.ab``: a benchmark run against a revision and the working tree in turns, each side
importing its own code, with each figure's ratios."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.procs

REPO = Path(__file__).resolve().parents[1]


def _ab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.ab", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_each_side_runs_its_own_code_and_every_figure_gets_its_ratios() -> None:
    got = _ab(
        "--pairs", "2", "--base", "HEAD", "--grep", "local disk", "--", "bench.bench_commit", "1"
    )
    assert got.returncode == 0, got.stderr
    out = got.stdout.splitlines()
    before = next(line for line in out if line.startswith("before imports"))
    after = next(line for line in out if line.startswith("after imports"))
    assert "fp-ab-" in before and before.endswith("/tree/storage")  # (HEAD's worktree)
    assert after.endswith(f"{REPO}/storage")
    compared = [line for line in out if line.startswith(("before: ", "after:  "))]
    assert len(compared) == 4 and all("local disk" in line for line in compared)
    ratios = [line for line in out if "after/before" in line]
    # (each figure's two ratios; a figure equal in both pairs is left out as a constant)
    assert 1 <= len(ratios) <= 2 and all(
        len(r.split("after/before ")[1].split(",")[0].split()) == 2 for r in ratios
    )
    assert not [
        line
        for line in subprocess.run(
            ["git", "-C", str(REPO), "worktree", "list"], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        if "fp-ab-" in line
    ]  # (removed)


def test_bad_arguments_are_refused_in_one_line() -> None:
    got = _ab("--pairs", "0", "--", "bench.bench_commit", "1")
    assert got.returncode == 2 and "--pairs must be at least 1, not 0" in got.stderr
    got = _ab("--pairs", "1")
    assert got.returncode == 2 and "name the benchmark module after --" in got.stderr
    got = _ab("--grep", "(", "--", "bench.bench_commit", "1")
    assert got.returncode == 2 and "--grep '(' is not a regular expression" in got.stderr
    got = _ab("--base", "no-such-revision", "--", "bench.bench_commit", "1")
    assert got.returncode == 1
    assert got.stderr.startswith("bench.ab: checking out 'no-such-revision' failed: ")
    assert len(got.stderr.strip().splitlines()) == 1 and "Traceback" not in got.stderr


def test_each_figure_is_named_by_the_words_around_it() -> None:
    """A figure keeps its name in the report where an argument shifts the numbers before
    it in the line (``--behind 15`` made ``number 5`` the count of topics, no longer the
    CPU); digits inside a word (``p50``) are part of a name, not a figure."""
    from bench.ab import labels, report

    line = (
        "10 consumers started 15 s behind, 1000 msg/s: 109 us CPU, 0.024 commits; "
        "send-to-receipt p50 5881.1 ms, p99 9000 ms"
    )
    assert labels(line) == [
        "consumers started",
        "started … s behind",
        "msg/s",
        "us CPU",
        "commits",
        "p50 … ms",
        "p99 … ms",
    ]
    faster = line.replace("109 us", "98.1 us")
    out = report(
        [[(line, [10, 15, 1000, 109, 0.024, 5881.1, 9000])]],
        [[(faster, [10, 15, 1000, 98.1, 0.024, 5881.1, 9000])]],
    )
    assert out[2] == "  number 4 'us CPU' (109 -> 98.1): after/before 0.90, median 0.90"
