"""Storage benchmarks (issue 2): producer throughput, and bulk writes against pyarrow IPC.

Run: ``python -m bench.bench_storage`` (or ``make bench``). Each figure is measured in this run;
ratios compare against a peer measured right beside it on the same data and disk.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
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
    ]


if __name__ == "__main__":
    for r in run():
        print(r)
