"""Read path of committed one-message keyed entries, per entry (issue #27).

    python -m bench.bench_entry_reads [N]

Writes ``N`` (default 20,000) one-message keyed entries (a KeyBased-batching producer with
explicit sequence ids: every entry a batch of one) to each of three topics, then prints, in
thread CPU per entry: EntryCache reads 2 entries at a time (as a live look) and 256 at a
time (a behind consumer), fresh and cached; ``entry_key_hash``; the gc-tracked objects per
cached entry, and per entry a Key_Shared scan's runs (``SlotRuns``) add; and the cyclic
GC's time and passes (``gc.callbacks``) over streaming the three topics (3 ``N`` entries)
through one cache, 2 entries at a time. Then a topic that ten producers write in turn, each
message its own commit (``N`` / 10 entries, at most 2,000: every fragment one entry, the
writers' blobs interleaved, as ``bench_iot``'s gateways write each topic): thread CPU per entry
of ``ManagedLedger.read_entries`` from a fresh ledger (nothing cached), 2 at a time (a live
look's read) and 256 at a time (a backlog's), ``interleaved2_ns`` and ``interleaved256_ns``;
and of a behind Key_Shared consumer's scan of it (``SlotRuns.window``, 120 entries at a time
as a consumer of ``bench_iot``'s applications asks: read, kept, hashed and slotted, from a
fresh ledger and cache), ``interleaved_window_ns``.

Runs against any checkout: ``cd CHECKOUT && .venv/bin/python PATH/bench_entry_reads.py``.
"""

from __future__ import annotations

import gc
import json
import shutil
import sys
import tempfile
import time

from filepulsar import Client
from filepulsar.dispatch.hashing import hash_slot
from filepulsar.dispatch.selectors.consistent import ConsistentHashingSelector
from filepulsar.storage.delivery import entry_key_hash
from filepulsar.storage.entry_cache import EntryCache, SlotRuns
from filepulsar.storage.ledger import EARLIEST, ManagedLedger, ReadEntry
from filepulsar.storage.names import TopicName


def _write(client: Client, topic: str, n: int) -> None:
    p = client.create_producer(
        topic, producer_name="gw-0", batching_enabled=True, batching_type="KeyBased"
    )
    for i in range(n):
        # (a key per message within a flush: every entry one message)
        p.send_async(b"x" * 64, None, partition_key=f"d{i % 1000}", sequence_id=i)
        if i % 500 == 499:
            p.flush()
    p.flush()


def _write_interleaved(client: Client, topic: str, n: int) -> None:
    """Ten producers send in turn, each message its own commit: ``n`` one-entry fragments."""
    ps = [
        client.create_producer(topic, producer_name=f"gw-{i}", batching_enabled=False)
        for i in range(10)
    ]
    for i in range(n):
        ps[i % 10].send(b"x" * 64, partition_key=f"d{i % 1000}")
    for p in ps:
        p.close()


def _read_fresh(ml: ManagedLedger, step: int) -> float:
    """Thread ns per entry of reading the whole topic ``step`` entries at a time."""
    m = ml.state()
    pos = ml.next_position(m, EARLIEST)
    n = t = 0
    while pos is not None:
        t0 = time.thread_time_ns()
        got = ml.read_entries(m, pos, max_entries=step)
        t += time.thread_time_ns() - t0
        n += len(got)
        pos = ml.next_position(m, got[-1].position)
    return t / n


def _window_fresh(ml: ManagedLedger, step: int) -> float:
    """Thread ns per entry of a behind Key_Shared consumer's scan of the whole topic
    (``SlotRuns.window`` ``step`` entries at a time, as ``Dispatcher._candidates`` asks:
    read, kept in a fresh cache, each entry's key hashed and slotted; ten consumers)."""
    m = ml.state()
    sel = ConsistentHashingSelector()
    for i in range(10):
        sel.add_consumer(f"c{i}")
    lo, hi = sel.hash_range

    def slot_of(e: ReadEntry) -> int:
        return hash_slot(entry_key_hash(e), lo, hi)

    runs = SlotRuns(cache=EntryCache())
    pos = ml.next_position(m, EARLIEST)
    n = t = 0
    while pos is not None:
        t0 = time.thread_time_ns()
        w = runs.window(ml, m, pos, step, sel, slot_of, "c0")
        t += time.thread_time_ns() - t0
        assert w is not None and w.last is not None
        n += len(w)
        pos = ml.next_position(m, w.last)
    return t / n


def _walk(cache: EntryCache, ml: ManagedLedger, step: int, live: bool) -> tuple[int, int]:
    """Thread ns and entries of reading the topic ``step`` entries at a time (``live``: the
    manifest grows with each read, as a live look sees it; else the whole state at once)."""
    m = ml.state()
    pos = ml.next_position(m, EARLIEST)
    n = 0
    t = 0
    while pos is not None:
        t0 = time.thread_time_ns()
        got = cache.read_entries(ml, m, pos, max_entries=step)
        t += time.thread_time_ns() - t0
        if not got:
            break
        n += len(got)
        pos = ml.next_position(m, got[-1].position)
    return t, n


def main(n: int) -> dict[str, float]:
    root = tempfile.mkdtemp(prefix="bench-entry-reads-")
    try:
        client = Client(root)
        topics = [f"persistent://public/default/iot-{i}" for i in range(3)]
        for t in topics:
            _write(client, t, n)
        topic = topics[0]
        out: dict[str, float] = {}
        store = client.store
        for step in (2, 256):
            ml = ManagedLedger(store, TopicName.parse(topic))
            # (a fresh ledger and cache: the first pass reads every entry from the store,
            # and locates the fragments' offsets; a second ledger's pass reads, as a live
            # look does, with the offsets located)
            _walk(EntryCache(), ml, step, False)
            cache = EntryCache()
            t, k = _walk(cache, ml, step, False)
            out[f"read{step}_ns"] = t / k
            t, k = _walk(cache, ml, step, False)
            out[f"cached{step}_ns"] = t / k
        entries = cache.read_entries(
            ml, ml.state(), ml.next_position(ml.state(), EARLIEST), max_entries=n
        )
        t0 = time.thread_time_ns()
        for e in entries:
            entry_key_hash(e)
        out["key_hash_ns"] = (time.thread_time_ns() - t0) / len(entries)
        del entries, cache
        # Tracked objects per cached entry: the cache's, then a Key_Shared scan's runs.
        ml = ManagedLedger(store, TopicName.parse(topic))
        m = ml.state()
        cache = EntryCache()
        gc.collect()
        before = len(gc.get_objects())
        pos = ml.next_position(m, EARLIEST)
        while pos is not None:
            got = cache.read_entries(ml, m, pos, max_entries=256)
            for e in got:
                entry_key_hash(e)
            pos = ml.next_position(m, got[-1].position)
        del got
        gc.collect()
        cached = len(gc.get_objects())
        out["tracked_per_entry"] = (cached - before) / len(cache)
        sel = ConsistentHashingSelector()
        for name in ("a", "b", "c"):
            sel.add_consumer(name)
        runs = SlotRuns(run_entries=n, max_entries=n, cache=cache)

        def slot_of(e: ReadEntry) -> int:
            return hash_slot(entry_key_hash(e), *sel.hash_range)

        pos = ml.next_position(m, EARLIEST)
        while pos is not None:
            w = runs.window(ml, m, pos, 256, sel, slot_of, "a")
            assert w is not None
            last = w.last
            pos = None if last is None else ml.next_position(m, last)
        del w
        gc.collect()
        out["run_tracked_per_entry"] = (len(gc.get_objects()) - cached) / len(cache)
        del cache, runs
        # GC time over streaming 60,000+ entries (a 50,000-entry cache), 2 at a time.
        gc.collect()
        spent = [0, 0, 0]
        t_start = [0]

        def cb(phase: str, info: dict) -> None:
            if phase == "start":
                t_start[0] = time.thread_time_ns()
            else:
                spent[0] += time.thread_time_ns() - t_start[0]
                spent[1] += 1
                if info["generation"] == 2:
                    spent[2] += 1

        cache = EntryCache()
        streamed = 0
        gc.callbacks.append(cb)
        t0 = time.thread_time_ns()
        for t in topics:
            ml = ManagedLedger(store, TopicName.parse(t))
            m = ml.state()
            pos = ml.next_position(m, EARLIEST)
            while pos is not None:
                got = cache.read_entries(ml, m, pos, max_entries=2)
                for e in got:
                    entry_key_hash(e)
                streamed += len(got)
                pos = ml.next_position(m, got[-1].position)
        total = time.thread_time_ns() - t0
        gc.callbacks.remove(cb)
        out["stream_entries"] = streamed
        out["stream_ns"] = total / streamed
        out["gc_ms"] = spent[0] / 1e6
        out["gc_runs"] = spent[1]
        out["gc_full"] = spent[2]
        topic = "persistent://public/default/interleaved"
        _write_interleaved(client, topic, min(n // 10, 2000))
        for step in (2, 256):
            ml = ManagedLedger(store, TopicName.parse(topic))
            out[f"interleaved{step}_ns"] = _read_fresh(ml, step)
        ml = ManagedLedger(store, TopicName.parse(topic))
        out["interleaved_window_ns"] = _window_fresh(ml, 120)
        client.close()
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)))
