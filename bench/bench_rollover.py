"""Rollover cost and catalog space (issue 31, defect 4): a producer on a local disk whose every
send closes a ledger (``ledger_max_entries=1``), then sends into one open ledger on that
topic.

Run: ``python -m bench.bench_rollover [rollovers] [folder]`` (default 2,000, in the system's
temporary folder; a folder on tmpfs, ``/dev/shm``, leaves out the disk's flushes). Prints the
wall and CPU time per rollover (a send that closes a ledger: data, ledger index, catalog,
manifest head), the catalog's files and bytes on disk before and after the orphan sweep, the
bytes per closed ledger, and the time per send that rolls nothing over afterwards (the head
then names every catalog segment: what an ordinary commit pays for the catalog's layout).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from filepulsar.storage import Producer, create_topic, set_topic_policies
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.retention import sweep_orphans

CATALOG = Path("topics/persistent/public/default/roll/catalog")


def _catalog(root: str) -> tuple[int, int]:
    files = list((Path(root) / CATALOG).iterdir())
    return len(files), sum(f.stat().st_size for f in files)


def measure(rollovers: int, sends: int = 2000, folder: str | None = None) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="fp-roll-", dir=folder)
    try:
        store = open_blob_store(root)
        set_topic_policies(store, "roll", ledger_max_entries=1)
        create_topic(store, "roll")
        with Producer(store, "roll", batching_enabled=False) as p:
            p.send(b"x" * 50)
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(rollovers):
                p.send(b"x" * 50)  # closes the ledger the previous send filled
            roll_s, roll_cpu = time.perf_counter() - t0, time.process_time() - c0
        files, size = _catalog(root)
        set_topic_policies(store, "roll", ledger_max_entries=1_000_000)
        with Producer(store, "roll", batching_enabled=False) as p:
            p.send(b"x" * 50)
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(sends):
                p.send(b"x" * 50)
            send_s, send_cpu = time.perf_counter() - t0, time.process_time() - c0
        # An hour on: only the versions a reader may still load protect a segment.
        sweep_orphans(store, "roll", min_age_ms=0, now=int(time.time() * 1000) + 3600_000)
        swept_files, swept_size = _catalog(root)
        return {
            "rollovers": rollovers,
            "ms_per_rollover": roll_s * 1000 / rollovers,
            "cpu_ms_per_rollover": roll_cpu * 1000 / rollovers,
            "catalog_files": files,
            "catalog_bytes": size,
            "catalog_bytes_per_ledger": size / rollovers,
            "swept_files": swept_files,
            "swept_bytes": swept_size,
            "ms_per_send_after": send_s * 1000 / sends,
            "cpu_ms_per_send_after": send_cpu * 1000 / sends,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run() -> list[dict[str, Any]]:
    """Rows for ``bench.run``."""
    r = measure(2000)
    return [
        {
            "name": "rollover (send closing a ledger), 2,000 in a row",
            "value": r["ms_per_rollover"],
            "unit": "ms",
        },
        {
            "name": "catalog bytes on disk per closed ledger, 2,000 rollovers, before the sweep",
            "value": r["catalog_bytes_per_ledger"],
            "unit": "B",
        },
        {
            "name": "send into the open ledger after 2,000 rollovers",
            "value": r["ms_per_send_after"],
            "unit": "ms",
        },
    ]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    r = measure(n, folder=sys.argv[2] if len(sys.argv) > 2 else None)
    print(
        f"{r['rollovers']} rollovers: {r['ms_per_rollover']:.3f} ms each "
        f"({r['cpu_ms_per_rollover']:.3f} ms CPU); catalog "
        f"{r['catalog_files']} files, {r['catalog_bytes'] / 1e6:.2f} MB "
        f"({r['catalog_bytes_per_ledger']:.0f} B per ledger); after the sweep "
        f"{r['swept_files']} files, {r['swept_bytes'] / 1e6:.3f} MB; then a send into the open "
        f"ledger {r['ms_per_send_after']:.3f} ms ({r['cpu_ms_per_send_after']:.3f} ms CPU)"
    )


if __name__ == "__main__":
    main()
