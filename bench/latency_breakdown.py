"""Where the time of one ``send()`` -> ``receive()`` goes (issue 14), for the 100 msg/s case
of ``bench.bench_latency``: timestamps taken by wrapping the functions on the path (no change
to the library), in the producer and in a consumer process, on the shared monotonic clock.

Run: ``python -m bench.latency_breakdown [n]``. Prints, at the median over ``n`` messages,
the time from ``send()`` start to each step, and the bare peer of ``bench.bench_latency``.
Not part of ``make bench``: a diagnostic, not a figure with a goal.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

from bench.bench_latency import _bare_peer, _paced, _q, _result, _spawn

_PROBES = r"""
import functools, os, time
from filepulsar.storage import manifest, ledger
from filepulsar.storage.versioned import watch
from filepulsar.storage.blobstore import local as blobstore_local
from filepulsar.connector.client.consumer import receiver_queue as client_queue

EVENTS = []

def probe(owner, name, label, before=None):
    fn = getattr(owner, name)
    @functools.wraps(fn)
    def wrapped(*a, **k):
        if before:
            EVENTS.append((before, time.monotonic_ns()))
        r = fn(*a, **k)
        EVENTS.append((label, time.monotonic_ns()))
        return r
    setattr(owner, name, wrapped)
"""

_CONSUMER = (
    _PROBES
    + r"""
import json, sys
from filepulsar.connector.client import Client
probe(watch.CommitWaiter, "wait", "woken")
probe(blobstore_local.LocalBlobStore, "get", "manifest read")
probe(manifest.ManifestState, "decode", "manifest decoded")
probe(ledger.ManagedLedger, "_read_entries_at", "entry read")
probe(client_queue, "_messages", "messages built")
from filepulsar.storage import reader, subscription
probe(subscription.SubscriptionConsumer, "fetch", "fetch done")
probe(reader.ChunkAssembler, "feed", "table built")
probe(client_queue.ReceiverQueue, "_enqueue", "enqueued")
root, n, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
client = Client(root)
c = client.subscribe("lat", "s")
print("READY", flush=True)
rows = []
for i in range(n + warm):
    EVENTS.clear()
    m = c.receive()
    now = time.monotonic_ns()
    sent = int(m.data()[:20])
    ev = {}
    for label, t in EVENTS:
        if t >= sent:
            ev[label] = (t - sent) / 1e6  # the last of each after the send started
    ev["receive() returns"] = (now - sent) / 1e6
    rows.append(ev)
    if i % 50 == 49 or i == n + warm - 1:
        c.acknowledge_cumulative(m)
print("RESULT " + json.dumps(rows[warm:]), flush=True)
client.close()
"""
)


def _producer_side(root: str, n: int, rate: float) -> tuple[list[dict[str, float]], Any]:
    ns: dict[str, Any] = {}
    exec(_PROBES, ns)  # the probe helpers, shared with the consumer's code
    from filepulsar.connector.client import Client
    from filepulsar.storage import manifest, writer
    from filepulsar.storage.blobstore import local as blobstore_local

    probe, events = ns["probe"], ns["EVENTS"]
    probe(blobstore_local.Appender, "sync", "data fsync done")
    probe(blobstore_local.LocalBlobStore, "_write_tmp", "manifest tmp written+fsync")
    probe(blobstore_local.os, "fsync", "fsync done")
    probe(blobstore_local.os, "link", "manifest linked")
    probe(blobstore_local, "_fsync_dir", "folder fsync done")
    probe(manifest.ManifestState, "encode", "manifest encoded", before="commit starts")
    probe(writer.LedgerWriter, "append", "append done", before="I/O thread starts append")
    client = Client(root)
    producer = client.create_producer("lat", batching_enabled=False)
    consumer = _spawn(_CONSUMER, root, str(n), "5")
    for _ in range(5):
        producer.send(b"%020d" % time.monotonic_ns() + b"x" * 80)
        time.sleep(0.05)
    time.sleep(0.5)
    rows = []
    for _ in _paced(rate, n):
        events.clear()
        start = time.monotonic_ns()
        producer.send(b"%020d" % start + b"x" * 80)
        end = time.monotonic_ns()
        ev: dict[str, float] = {}
        seen: dict[str, int] = {}
        for label, t in list(events):
            seen[label] = seen.get(label, 0) + 1
            k = label if seen[label] == 1 else f"{label} #{seen[label]}"
            ev[k] = (t - start) / 1e6  # repeated steps (fsyncs) numbered in time order
        ev["send() returns"] = (end - start) / 1e6
        rows.append(ev)
    client.close()
    return rows, consumer


def _median_table(rows: list[dict[str, float]]) -> list[tuple[str, float, float]]:
    labels: list[str] = []
    for r in rows:
        labels += [k for k in r if k not in labels]
    out = []
    for k in labels:
        xs = [r[k] for r in rows if k in r]
        out.append((k, statistics.median(xs), _q(xs, 0.99)))
    return sorted(out, key=lambda x: x[1])


def main(argv: list[str]) -> int:
    n = int(argv[1]) if len(argv) > 1 else 500
    root = tempfile.mkdtemp(prefix="fp-lat-bd-")
    try:
        prod, consumer = _producer_side(root, n, 100)
        cons: list[dict[str, float]] = [dict(r) for r in _result(consumer)]  # type: ignore[arg-type]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"producer ({n} sends, ms after send() start: p50, p99)")
    for k, p50, p99 in _median_table(prod):
        print(f"  {k:<32} {p50:7.3f} {p99:7.3f}")
    print("consumer (ms after send() start: p50, p99)")
    for k, p50, p99 in _median_table(cons):
        print(f"  {k:<32} {p50:7.3f} {p99:7.3f}")
    bare = _bare_peer(100, n)
    print(f"bare peer p50 {_q(bare, 0.5):.3f} p99 {_q(bare, 0.99):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
