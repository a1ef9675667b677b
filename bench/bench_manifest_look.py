"""Reading a topic manifest's new records: CPU per look of a reader, per catch-up of a writer.

Run: ``python -m bench.bench_manifest_look [--writers 10] [--records 1000] [--rounds 5]
[--fixture DIR] [--live]``. Issue #27's dispatcher looks at a partition's manifest each time a
commit lands in it (1-3 records since its last look, written by up to 10 gateway processes), and a
gateway's commit first folds the records the other gateways appended since its own last
commit. This times exactly that path (``ManagedLedger.state`` and a commit's read of its
base: the journal's scan, the decoding of full records, the folding of delta records):

1. A fixture is written once: ``--writers`` gateway processes, each one producer on one topic
   (dedup on, explicit sequence ids, KeyBased batching, as ``bench_iot``'s gateways), send
   until the topic's manifest holds ``--records`` records (the real records of that
   workload: one entry per commit, delta records with a full head every 256 versions).
   ``--live`` writes instead what ``bench_live_app --keybased`` writes to each of its topics:
   one producer (named, KeyBased batching, explicit sequence ids, dedup off), so each record
   grows the open ledger's one fragment and sets no ``dedup`` name.
2. Each round copies the fixture and replays its first journal segment: the segment is
   emptied to its first 40 records, then its bytes are written back 1-3 records at a time
   (a seeded random choice); after each step a reader (``ManagedLedger.state()``) looks, and
   a second store of the same folder catches up as a writer does (a commit whose change
   aborts: the locked read of the base, its folds and the private copy, nothing written).

It prints the thread CPU time per look and per catch-up (mean of each round, and the records
per step), the figures to compare between checkouts: the same file run with another tree
(``PYTHONPATH`` or a copy of this file) on the same ``--fixture`` replays the same bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from filepulsar.storage import open_blob_store
from filepulsar.storage.ledger import ManagedLedger
from filepulsar.storage.manifest import ManifestState, ManifestStore
from filepulsar.storage.names import TopicName
from filepulsar.storage.versioned import Abort
from filepulsar.storage.versioned.journal import Journal
from filepulsar.storage.versioned.record import Record

TOPIC = "persistent://public/default/gw-0"
_MANIFEST = "topics/persistent/public/default/gw-0/manifest"
_SEGMENT = "00000000000000000000.journal"
_START = 40  # records already there when a round starts

_GATEWAY = """
import random, sys, time
from filepulsar import Client
from bench.bench_iot import gateway_producers
root, g, rate, n = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
client = Client(root)
p = gateway_producers(client, [sys.argv[5]], g)[0]
seq = p.last_sequence_id() + 1
rng = random.Random(g)
sys.stdout.write("ready\\n"); sys.stdout.flush(); sys.stdin.readline()
t0 = time.perf_counter()
for i in range(n):
    pause = t0 + i / rate - time.perf_counter()
    if pause > 0:
        time.sleep(pause)
    p.send_async(b"x" * 64, None, partition_key=str(rng.randrange(100000)), sequence_id=seq)
    seq += 1
p.flush(); p.close(); client.close()
"""


def write_fixture(root: str, writers: int, records: int, dedup: bool = True) -> None:
    """``writers`` gateway processes publishing to one topic until its manifest holds about
    ``records`` records (one commit per message at this rate); ``dedup``: the namespace's
    (off: as ``bench_live_app``'s producer writes, at 100 msg/s)."""
    from filepulsar.admin import Admin

    admin = Admin(root)
    if dedup:
        admin.namespaces().set_deduplication_status("public/default", True)
    admin.topics().create_non_partitioned_topic(TOPIC)
    each = records // writers + 1
    # msg/s per gateway: entries of one message, as issue #27's
    rate = 10.0 if dedup else 100.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _GATEWAY, root, str(g), str(rate), str(each), TOPIC],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for g in range(writers)
    ]
    for p in procs:
        assert p.stdout is not None
        if p.stdout.readline().strip() != "ready":
            raise RuntimeError("a gateway did not start")
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
        if p.wait() != 0:
            raise RuntimeError("a gateway failed")


def _abort(state: ManifestState) -> None:
    raise Abort(None)


@contextlib.contextmanager
def fixture_copy(fixture: str, start: int) -> Iterator[tuple[str, int, bytes, list[Record]]]:
    """A copy of ``fixture`` whose first journal segment holds its first ``start`` records
    (zeros after them, as preallocated): yields the copy's root, that segment open for
    writing, its bytes in the fixture and its records (to write back as they land)."""
    journal = Journal(os.path.join(fixture, _MANIFEST), lambda key: None, "fixture")
    recs = [r for r in journal.records() if r.segment == 0]
    journal.close()
    with open(os.path.join(fixture, _MANIFEST, _SEGMENT), "rb") as f:
        orig = f.read()
    work = tempfile.mkdtemp(prefix="fp-bench-manifest-look-")
    try:
        root = os.path.join(work, "root")
        shutil.copytree(fixture, root)
        fd = os.open(os.path.join(root, _MANIFEST, _SEGMENT), os.O_RDWR)
        try:
            os.ftruncate(fd, 0)
            os.ftruncate(fd, len(orig))
            os.pwrite(fd, orig[: recs[start].end], 0)
            yield root, fd, orig, recs
        finally:
            os.close(fd)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def reader_and_writer(root: str) -> tuple[ManagedLedger, ManifestStore]:
    """A reader and a writer of the topic under ``root``, each having read its manifest."""
    store = open_blob_store(root)
    topic = TopicName.parse(TOPIC)
    reader = ManagedLedger(store, topic)
    writer = ManifestStore(store, topic)
    reader.state()
    writer.commit(_abort)
    return reader, writer


def replay(fixture: str, seed: int = 7) -> dict[str, Any]:
    """One round (see the module's docstring): CPU s of each look and catch-up."""
    with fixture_copy(fixture, _START) as (root, fd, orig, recs):
        at = recs[_START].end
        reader, writer = reader_and_writer(root)
        rng = random.Random(seed)
        i = _START
        looks: list[float] = []
        catches: list[float] = []
        steps: list[int] = []
        while True:
            k = rng.choice((1, 2, 3))
            if i + k >= len(recs):
                break
            end = recs[i + k].end
            os.pwrite(fd, orig[at:end], at)  # (k records land, marked)
            at, i = end, i + k
            c0 = time.thread_time()
            got = reader.state()
            c1 = time.thread_time()
            base, _ = writer.commit(_abort)
            c2 = time.thread_time()
            want = recs[i].version
            if got.version != want or base.version != want:
                raise AssertionError(f"read {got.version}/{base.version}, not {want}")
            looks.append(c1 - c0)
            catches.append(c2 - c1)
            steps.append(k)
    return {"looks": looks, "catches": catches, "steps": steps}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m bench.bench_manifest_look",
        description=(__doc__ or "").split("\n\n")[0],
    )
    ap.add_argument("--writers", type=int, default=10)
    ap.add_argument("--records", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--fixture", help="a fixture folder: written there if absent, else replayed as it is"
    )
    ap.add_argument(
        "--live",
        action="store_true",
        help="write the fixture as bench_live_app --keybased's producer writes (one writer)",
    )
    args = ap.parse_args(argv)
    made = None
    fixture = args.fixture
    if fixture is None:
        made = fixture = tempfile.mkdtemp(prefix="fp-bench-manifest-fixture-")
        os.rmdir(fixture)
    try:
        if not os.path.exists(fixture):
            if args.live:
                write_fixture(fixture, 1, args.records, dedup=False)
            else:
                write_fixture(fixture, args.writers, args.records)
        rounds = [replay(fixture) for _ in range(args.rounds)]
    finally:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
    look_us = [sum(r["looks"]) / len(r["looks"]) * 1e6 for r in rounds]
    catch_us = [sum(r["catches"]) / len(r["catches"]) * 1e6 for r in rounds]
    # (Medians too: a look the scheduler interrupted finds its caches cold, whatever it does.)
    look_med = [statistics.median(r["looks"]) * 1e6 for r in rounds]
    catch_med = [statistics.median(r["catches"]) * 1e6 for r in rounds]
    steps = rounds[0]["steps"]
    print(
        json.dumps(
            {
                "looks": len(steps),
                "records_per_look": round(sum(steps) / len(steps), 2),
                "look_us": [round(x, 1) for x in look_us],
                "catch_up_us": [round(x, 1) for x in catch_us],
                "look_us_median": [round(x, 1) for x in look_med],
                "catch_up_us_median": [round(x, 1) for x in catch_med],
                "look_us_best": round(min(look_us), 1),
                "catch_up_us_best": round(min(catch_us), 1),
            }
        )
    )


if __name__ == "__main__":
    main()
