"""Idle ``send_async`` latency (issue 13/14): time from ``send_async`` on an idle producer to
its callback (the message is durable then), with no ``flush()``.

Run: ``python -m bench.bench_idle_send [samples]`` on a local disk. Each sample sends one
message, waits for its callback, then leaves the producer idle for a moment, so every send
meets an idle I/O thread. Prints the median and max in ms for a producer with batching off
(pulsar-client's default) and one with batching on (``batching_max_publish_delay_ms=10``).
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import threading
import time

from filepulsar.connector.client import Client


def _measure(batching: bool, samples: int) -> list[float]:
    root = tempfile.mkdtemp(prefix="fp-idle-")
    try:
        client = Client(root)
        producer = client.create_producer(
            "idle", batching_enabled=batching, batching_max_publish_delay_ms=10
        )
        producer.send(b"warm-up")
        out = []
        for _ in range(samples):
            time.sleep(0.05)  # idle: the I/O thread is waiting for work
            done = threading.Event()
            t0 = time.perf_counter()
            producer.send_async(b"x" * 100, lambda res, mid, done=done: done.set())
            if not done.wait(60):
                raise RuntimeError("send_async callback not called within 60 s")
            out.append((time.perf_counter() - t0) * 1000)
        client.close()
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    samples = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    for batching in (False, True):
        lat = _measure(batching, samples)
        print(
            f"idle send_async, batching={'on ' if batching else 'off'}: "
            f"median {statistics.median(lat):.2f} ms, max {max(lat):.2f} ms ({samples} samples)"
        )


if __name__ == "__main__":
    main()
