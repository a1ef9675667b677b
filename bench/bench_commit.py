"""The commit engine's own cost (storage/versioned/): CPU per commit and per idle ``latest()``.

Run: ``python -m bench.bench_commit [ROUNDS]`` (or ``make bench``). One small state (20 items of
JSON) is committed through :class:`~filepulsar.storage.versioned.VersionedStore` on
``memory://`` (the blob engine: put-if-absent of version files, no disk) and on a local disk
(the journal engine: a record, its flush and its mark), then read back with nothing new.

CPU time (user + system of this process), not wall time: a commit on a disk waits for its
flush, which other processes' load moves by an order of magnitude; the engine's work does not
wait. The best of ``ROUNDS`` runs is kept. The script uses only ``VersionedStore``'s public
calls, so the same file run against an older tree (same command, other checkout) gives the
figure to compare with, measured in the same session.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from filepulsar.storage import open_blob_store
from filepulsar.storage.versioned import VersionedStore


class _Items:
    """A small versioned state: the last 20 items appended, and the protocol's fields."""

    def __init__(self, items: list[int] | None = None) -> None:
        self.items = items or []
        self.version = 0
        self.updated_ms = 0
        self.commit_id = ""
        self.prev_commit_id = ""

    def encode(self) -> bytes:
        fields = [self.items[-20:], self.version, self.updated_ms, self.commit_id]
        return json.dumps([*fields, self.prev_commit_id]).encode()

    @classmethod
    def decode(cls, raw: bytes, where: str) -> _Items:
        items, version, updated, commit_id, prev = json.loads(raw)
        s = cls(items)
        s.version, s.updated_ms, s.commit_id, s.prev_commit_id = version, updated, commit_id, prev
        return s

    def copy(self) -> _Items:
        s = _Items(list(self.items))
        s.version, s.updated_ms = self.version, self.updated_ms
        s.commit_id, s.prev_commit_id = self.commit_id, self.prev_commit_id
        return s


def _cpu_us(fn: Callable[[int], object], n: int, rounds: int) -> float:
    """The best of ``rounds`` runs of ``n`` calls: CPU microseconds per call."""
    best = float("inf")
    for _ in range(rounds):
        t = time.process_time()
        for i in range(n):
            fn(i)
        best = min(best, (time.process_time() - t) / n * 1e6)
    return best


def measure(root: str, n: int, rounds: int) -> dict[str, float]:
    """CPU µs per commit and per idle ``latest()`` of one state under ``root``."""
    vs = VersionedStore(open_blob_store(root), "bench/state", _Items.decode, what="bench")
    vs.create(_Items())
    for i in range(20):  # (past the first segment's start and the first GC)
        vs.commit(lambda s, i=i: s.items.append(i))
    commit = _cpu_us(lambda i: vs.commit(lambda s: s.items.append(i)), n, rounds)
    latest = _cpu_us(lambda i: vs.latest(), n * 5, rounds)
    return {"commit_cpu_us": commit, "latest_cpu_us": latest}


def run(rounds: int = 5) -> list[dict[str, Any]]:
    """Rows for ``bench.run``."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fp-bench-commit-") as d:
        kinds = {
            "memory:// (version files)": (f"memory://bench-commit-{time.time_ns()}", 1000),
            "local disk (journal)": (d, 200),
        }
        for kind, (root, n) in kinds.items():
            r = measure(root, n, rounds)
            rows.append({"name": f"commit CPU, {kind}", "value": r["commit_cpu_us"], "unit": "us"})
            rows.append(
                {"name": f"idle latest() CPU, {kind}", "value": r["latest_cpu_us"], "unit": "us"}
            )
    return rows


if __name__ == "__main__":
    for row in run(int(sys.argv[1]) if len(sys.argv) > 1 else 5):
        print(f"{row['name']:<45} {row['value']:8.2f} {row['unit']}")
