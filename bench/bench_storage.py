"""Storage benchmarks (issue 2): producer throughput, and bulk writes against pyarrow IPC;
live gateways (issue 27): many producers each publishing one message at a time.

Run: ``python -m bench.bench_storage`` (or ``make bench``). Each figure is measured in this run;
ratios compare against a peer measured right beside it on the same data and disk.

The live case is a gateway of the IoT scenario in one process: ``GW_PRODUCERS`` producers on as
many topics, ``KeyBased`` batching, deduplication on, explicit sequence ids, one send in flight
per producer, ``GW_RATE`` keyed 64-byte messages a second in all; so nearly every message is
an entry and a commit of its own. It reports the process's CPU per published message beside a
peer doing only the disk work of such a message (append the entry to a data file and fsync
it, append a commit record to a journal file, fdatasync and mark it: storage/FORMAT.md's
floor), on as many file pairs, interleaved with it.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import threading
import time
from typing import Any

import numpy as np
import pyarrow as pa

from filepulsar.storage import Producer, open_blob_store

N = 1_000_000
SIZE = 100


def _values(n: int) -> list[bytes]:
    rng = np.random.default_rng(7)
    blob = rng.integers(0, 256, size=n * SIZE, dtype=np.uint8).tobytes()
    return [blob[i * SIZE : (i + 1) * SIZE] for i in range(n)]


def _best(fn: Any, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        times.append(fn())
    return min(times)


GW_PRODUCERS = 30
GW_RATE = 300
GW_SECONDS = 8.0


def _gateway(root: str, *, producers: int, rate: int, seconds: float) -> float:
    """CPU seconds per message of one gateway process publishing live (module docstring)."""
    from filepulsar import Client
    from filepulsar.admin import Admin

    Admin(root).namespaces().set_deduplication_status("public/default", True)
    client = Client(root)
    prods = [
        client.create_producer(
            f"gw-{i}", producer_name=f"gw0-{i}", batching_type="KeyBased", batching_enabled=True
        )
        for i in range(producers)
    ]
    seqs = [p.last_sequence_id() + 1 for p in prods]
    busy = [False] * producers
    failed = [0]
    cond = threading.Condition()

    def answer(i: int) -> Any:
        def callback(res: Any, _mid: Any) -> None:
            with cond:
                busy[i] = False
                failed[0] += res.value != 0
                cond.notify_all()

        return callback

    callbacks = [answer(i) for i in range(producers)]
    sent = 0
    t0, c0 = time.perf_counter(), time.process_time()
    while (elapsed := time.perf_counter() - t0) < seconds:
        while sent < int(elapsed * rate):
            i = sent % producers
            with cond:
                while busy[i]:  # one send in flight per producer
                    cond.wait()
                busy[i] = True
            seq = seqs[i]
            seqs[i] = seq + 1
            key = f"d{sent % 1000}"
            prods[i].send_async(b"x" * 64, callbacks[i], partition_key=key, sequence_id=seq)
            sent += 1
        time.sleep(0.002)  # paces the gateway at ``rate``: load, not synchronisation
    for p in prods:
        p.flush()
    cpu = time.process_time() - c0
    for p in prods:
        p.close()
    client.close()
    if failed[0]:
        raise RuntimeError(f"live gateway: {failed[0]} of {sent} sends failed")
    return cpu / sent


def _gateway_peer(root: str, *, files: int, n: int) -> float:
    """CPU seconds per message of the disk work alone (module docstring), ``n`` messages
    over ``files`` data and journal file pairs."""
    entry = b"e" * 160  # about a framed one-message entry of 64 bytes with its key
    record = b"r" * 900  # about a commit record of such a topic's manifest
    fds = []
    for i in range(files):
        data = os.open(os.path.join(root, f"d{i}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        journal = os.open(os.path.join(root, f"j{i}"), os.O_RDWR | os.O_CREAT)
        fds.append((data, journal))
    c0 = time.process_time()
    at = [0] * files
    for k in range(n):
        i = k % files
        data, journal = fds[i]
        os.write(data, entry)
        os.fsync(data)
        os.pwrite(journal, record, at[i])
        os.fdatasync(journal)
        os.pwrite(journal, b"m", at[i] + len(record) - 1)
        at[i] += len(record)
    cpu = time.process_time() - c0
    for data, journal in fds:
        os.close(data)
        os.close(journal)
    return cpu / n


def live_gateways(base: str) -> list[dict[str, Any]]:
    """Issue #27, the publishing side: a gateway's CPU per message beside the disk's own
    (median of 2 each, alternating order)."""
    ours, peer = [], []
    for i in range(4):
        root = os.path.join(base, f"gw{i}")
        os.makedirs(root)
        if (i % 2) == (i // 2):
            ours.append(_gateway(root, producers=GW_PRODUCERS, rate=GW_RATE, seconds=GW_SECONDS))
        else:
            peer.append(_gateway_peer(root, files=GW_PRODUCERS, n=int(GW_RATE * GW_SECONDS)))
    t_ours, t_peer = statistics.median(ours), statistics.median(peer)
    return [
        {
            "name": f"live gateway: {GW_PRODUCERS} producers, {GW_RATE} msg/s, one in flight "
            "each (KeyBased, dedup, explicit sequence ids), CPU per message",
            "value": t_ours * 1e6,
            "unit": "us",
        },
        {
            "name": "disk work of one such message: entry write + fsync, journal record "
            "write + fdatasync + mark (peer)",
            "value": t_peer * 1e6,
            "unit": "us",
        },
        {
            "name": "live gateway / disk-work peer, CPU per message (median of 2, alternating)",
            "value": t_ours / t_peer,
            "unit": "x",
        },
    ]


def run() -> list[dict[str, Any]]:
    values = _values(N)
    table = pa.table({"value": pa.array(values, pa.binary())})
    base = tempfile.mkdtemp(prefix="fp-bench-")
    counter = [0]

    def fresh() -> str:
        counter[0] += 1
        d = os.path.join(base, f"r{counter[0]}")
        os.makedirs(d)
        return d

    def send_async() -> float:
        store = open_blob_store(fresh())
        p = Producer(store, "bench")
        t0 = time.perf_counter()
        for v in values:
            p.send_async(v)
        p.flush()
        dt = time.perf_counter() - t0
        p.close()
        return dt

    def send_table() -> float:
        store = open_blob_store(fresh())
        p = Producer(store, "bench")
        t0 = time.perf_counter()
        p.send_table(table)
        dt = time.perf_counter() - t0
        p.close()
        return dt

    def ipc_writer() -> float:
        path = os.path.join(fresh(), "data.arrow")
        t0 = time.perf_counter()
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            for b in table.to_batches(max_chunksize=1000):
                w.write_batch(b)
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        return time.perf_counter() - t0

    try:
        # Warm up allocators and imports on a small run.
        Producer(open_blob_store(fresh()), "warm").send_table(table.slice(0, 10000))
        t_async = _best(send_async)
        # Interleave the bulk path and its peer so disk/fsync drift hits both alike.
        # Alternate which goes first: the second of a pair meets the first's dirty-page
        # writeback, so a fixed order would favour one side.
        bulk_times, ipc_times = [], []
        for i in range(6):
            if i % 2:
                ipc_times.append(ipc_writer())
                bulk_times.append(send_table())
            else:
                bulk_times.append(send_table())
                ipc_times.append(ipc_writer())
        t_bulk = statistics.median(bulk_times)
        t_ipc = statistics.median(ipc_times)
        gateways = live_gateways(os.path.join(base, "live"))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return [
        {
            "name": "producer send_async, 1M x 100 B, batching on",
            "value": N / t_async / 1e6,
            "unit": "M msg/s",
            "goal": ">= 0.5",
        },
        {"name": "producer send_table, 1M x 100 B", "value": N / t_bulk / 1e6, "unit": "M msg/s"},
        {
            "name": "pyarrow IPC stream writer + fsync, same data (peer)",
            "value": N / t_ipc / 1e6,
            "unit": "M msg/s",
        },
        {
            "name": "send_table / pyarrow IPC writer (median of 6, alternating order)",
            "value": t_ipc / t_bulk,
            "unit": "ratio",
            "goal": ">= 0.5",
        },
        *gateways,
    ]


if __name__ == "__main__":
    for r in run():
        print(r)
