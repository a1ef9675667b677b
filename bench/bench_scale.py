"""Scale benchmarks (issue 14): costs that must not grow with a topic's history.

Three topics are built with 10, 1,000 and 10,000 closed ledgers (one entry each; the history
is written through the storage API directly -- one data blob, one index per ledger, one
manifest commit -- which is what thousands of rollovers would have left, minutes faster).
Then, one step on each topic in turn, so the machine's other load falls on every topic alike:

1. commit cost: the latency of ``Producer.send()`` (batching off: one commit per message);
2. consumer fetch cost: a Shared subscription's ``fetch`` + ``acknowledge`` of a message just
   published (two subscription commits and a read of the newest entry);
3. Spark trigger cost: the driver-side work of one micro-batch of one new message, as Spark
   calls it (``latestOffset``, ``partitions``, ``read``, ``commit`` of the stream reader;
   without the JVM, whose share of a trigger does not depend on the topic).

Figures are medians; the ratios compare 10,000 (and 1,000) closed ledgers against 10. Goal
(issue 14): <= 1.2. Run: ``python -m bench.bench_scale`` (or ``make bench``).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
import uuid
from typing import Any

SIZES = (10, 1_000, 10_000)
ROUNDS = 12
PER_ROUND = 15
TOPIC = "scale"


def build_history(root: str, closed: int) -> None:
    """A topic whose manifest lists ``closed`` closed ledgers of one entry each."""
    from filepulsar.storage import ManagedLedger, Producer, TopicName, open_blob_store, paths
    from filepulsar.storage.ledger import encode_index
    from filepulsar.storage.manifest import Fragment, LedgerInfo, ManifestState
    from filepulsar.storage.policies import set_topic_policies

    store = open_blob_store(root)
    set_topic_policies(store, TOPIC, retention_time_minutes=-1, retention_size_mb=-1)
    with Producer(store, TOPIC, batching_enabled=False) as p:
        p.send(b"x" * 100)
    topic = TopicName.parse(TOPIC)
    ml = ManagedLedger(store, topic)
    frag = ml.state().ledgers[-1].fragments[0]  # type: ignore[index]
    indexes = []
    for i in range(closed):
        f = Fragment(
            frag.blob, 0, 1, frag.offset, frag.length, 1, frag.min_publish, frag.max_publish
        )
        key = paths.ledger_index(topic, i, 1, uuid.uuid4().hex)
        # Plain file writes (no fsync per file): the history is set-up, not measured.
        path = os.path.join(root, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(encode_index(i, [f]))
        indexes.append(key[len(paths.topic_dir(topic)) + 1 :])

    def change(state: ManifestState) -> None:
        now = ml.clock()
        state.ledgers = [
            LedgerInfo(i, 1, 1, frag.length, now, now, frag.min_publish, frag.max_publish, None, ix)
            for i, ix in enumerate(indexes)
        ]
        state.next_ledger_id = closed

    ml.manifest.commit(change)


def _median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1000


def run() -> list[dict[str, Any]]:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from filepulsar.connector.source import FilePulsarStreamReader
    from filepulsar.storage import Producer, TopicName, open_blob_store
    from filepulsar.storage.subscription import SubscriptionConsumer

    base = tempfile.mkdtemp(prefix="fp-bench-scale-")
    try:
        roots = {n: os.path.join(base, f"h{n}") for n in SIZES}
        t0 = time.perf_counter()
        for n, root in roots.items():
            build_history(root, n)
        build_s = time.perf_counter() - t0
        stores = {n: open_blob_store(roots[n]) for n in SIZES}
        producers = {n: Producer(stores[n], TOPIC, batching_enabled=False) for n in SIZES}
        consumers = {
            n: SubscriptionConsumer(stores[n], TopicName.parse(TOPIC), "bench", sub_type="Shared")
            for n in SIZES
        }
        readers = {
            n: FilePulsarStreamReader(
                {"path": roots[n], "topic": TOPIC, "startingOffsets": "latest"},
                None,  # type: ignore[arg-type]
            )
            for n in SIZES
        }
        starts = {n: readers[n].initialOffset() for n in SIZES}
        send: dict[int, list[float]] = {n: [] for n in SIZES}
        fetch: dict[int, list[float]] = {n: [] for n in SIZES}
        trig: dict[int, list[float]] = {n: [] for n in SIZES}
        for r in range(ROUNDS + 1):  # round 0 warms caches up and is not counted
            for _ in range(PER_ROUND):
                for n in SIZES:  # one step on each topic in turn: load falls on all alike
                    p, c, rd = producers[n], consumers[n], readers[n]
                    a = time.perf_counter()
                    p.send(b"y" * 100)
                    b = time.perf_counter()
                    ds = c.fetch(10)
                    c.acknowledge([(d.position, -1, 1) for d in ds])
                    e = time.perf_counter()
                    assert len(ds) == 1, ds
                    end = rd.latestOffset(starts[n], ReadAllAvailable())
                    rows = 0
                    for part in rd.partitions(starts[n], end):
                        rows += sum(batch.num_rows for batch in rd.read(part))
                    rd.commit(end)
                    starts[n] = end
                    g = time.perf_counter()
                    assert rows == 1, rows
                    if r:
                        send[n].append(b - a)
                        fetch[n].append(e - b)
                        trig[n].append(g - e)
        for n in SIZES:
            producers[n].close()
            consumers[n].close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out: list[dict[str, Any]] = [
        {
            "name": "scale: building 10 + 1,000 + 10,000 closed ledgers",
            "value": build_s,
            "unit": "s",
        }
    ]
    for what, data in (
        ("commit cost (send() latency)", send),
        ("consumer fetch + ack cost", fetch),
        ("Spark trigger cost (driver, 1-message batch)", trig),
    ):
        for n in SIZES:
            out.append(
                {
                    "name": f"scale: {what} at {n:,} closed ledgers",
                    "value": _median_ms(data[n]),
                    "unit": "ms",
                }
            )
        for n in SIZES[1:]:
            out.append(
                {
                    "name": f"scale: {what}, {n:,} / 10 closed ledgers",
                    "value": statistics.median(data[n]) / statistics.median(data[SIZES[0]]),
                    "unit": "ratio",
                    "goal": "<= 1.2",
                }
            )
    return out


if __name__ == "__main__":
    for row in run():
        print(row)
