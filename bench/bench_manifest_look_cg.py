"""Instructions per look of a reader, or per catch-up of a writer, counted by callgrind on
``bench_manifest_look``'s fixture (where thread CPU time is too noisy to tell 5% apart).

Run (one count; the figure is (count of N steps - count of 0 steps) / N)::

    PYTHONHASHSEED=0 PYTHONPATH=. valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        --collect-atstart=no --toggle-collect=map_next \\
        .venv/bin/python -m bench.bench_manifest_look_cg FIXTURE {look,catch} N

``FIXTURE`` is a folder ``python -m bench.bench_manifest_look --fixture FIXTURE`` wrote. The
manifest holds the fixture's records up to the 300th; then ``N`` steps (N=200: the numbers in
the commits) each write 1-3 more records (seeded, as the bench's rounds) and time one
``ManagedLedger.state()`` (``look``) or one writer's aborted commit (``catch``). Only those
calls are counted: each runs under a ``map`` (callgrind collects inside ``map_next`` only;
imports run a few too, the same count with any ``N``: hence the count of 0 steps subtracted).
To count another checkout on the same bytes, run this file by its path from that tree,
with its python: ``cd TREE && PYTHONHASHSEED=0 PYTHONPATH=. valgrind ... .venv/bin/python
PATH/TO/bench_manifest_look_cg.py FIXTURE look N``.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile

from bench.bench_manifest_look import _MANIFEST, _SEGMENT, TOPIC, _abort
from filepulsar.storage import open_blob_store
from filepulsar.storage.ledger import ManagedLedger
from filepulsar.storage.manifest import ManifestStore
from filepulsar.storage.names import TopicName
from filepulsar.storage.versioned.journal import Journal

_START = 300  # records there before the first step


def main(argv: list[str]) -> None:
    fixture, mode, steps = argv[0], argv[1], int(argv[2])
    journal = Journal(os.path.join(fixture, _MANIFEST), lambda key: None, "fixture")
    recs = [r for r in journal.records() if r.segment == 0]
    journal.close()
    with open(os.path.join(fixture, _MANIFEST, _SEGMENT), "rb") as f:
        orig = f.read()
    work = tempfile.mkdtemp(prefix="fp-bench-manifest-look-cg-")
    try:
        root = os.path.join(work, "root")
        shutil.copytree(fixture, root)
        fd = os.open(os.path.join(root, _MANIFEST, _SEGMENT), os.O_RDWR)
        try:
            os.ftruncate(fd, 0)
            os.ftruncate(fd, len(orig))
            at, i = recs[_START].end, _START
            os.pwrite(fd, orig[:at], 0)
            store = open_blob_store(root)
            topic = TopicName.parse(TOPIC)
            reader = ManagedLedger(store, topic)
            writer = ManifestStore(store, topic)
            reader.state()
            writer.commit(_abort)

            def look(_: int) -> None:
                reader.state()

            def catch(_: int) -> None:
                writer.commit(_abort)

            timed = look if mode == "look" else catch
            rng = random.Random(7)
            for k in [rng.choice((1, 2, 3)) for _ in range(steps)]:
                end = recs[i + k].end
                os.pwrite(fd, orig[at:end], at)  # (k records land, marked)
                at, i = end, i + k
                list(map(timed, (k,)))  # (counted: see the module's docstring)
        finally:
            os.close(fd)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
