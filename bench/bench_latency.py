"""Latency benchmarks (issue 14): publish -> receive across processes, idle sends, idle
consumer CPU, publish -> Spark row, against a bare peer.

Run: ``python -m bench.bench_latency`` (or ``make bench``) on a local disk. Clocks: every
timestamp is ``time.monotonic_ns()``, which Linux shares between the processes of one machine.

- End to end: a consumer process blocks in ``receive()``; this process publishes messages that
  carry their send time (``send()`` at 100 msg/s; ``send_async`` with batching at the highest
  rate it reaches up to 10,000 msg/s); the consumer records arrival - send time and
  acknowledges cumulatively every 50 messages (pulsar-client groups acknowledgements too).
- Bare peer (the ceiling, no filepulsar): one process writes a small file (write, fsync, folder
  fsync) into a folder another process watches with inotify; latency to the watcher's wake-up.
- Protocol peer (versions kept as files, the protocol before local journals and still the
  object stores', no filepulsar): append the entry to the data file and fdatasync it while the
  manifest's temporary file is written and fsynced (two flushes in flight at once), then link
  the manifest to its name and fsync the folder; the watcher is woken by inotify, reads the
  new manifest and the entry's bytes.
- Journal peer (the floor of our commit on a local disk, storage/FORMAT.md "Journal", no
  filepulsar): the writer writes a 300-byte record into a file whose blocks are preallocated
  (``fallocate``, size kept), ``fdatasync``s it, then sets the record's first byte, which
  makes it visible; the reader, woken by inotify (``IN_MODIFY``), reads the records that are
  marked. One flush per commit instead of the protocol peer's two in sequence. Our latency
  minus this is the part our own code adds (our commit also flushes the data file, at the
  same time as the record).
- Idle ``send_async``: ``bench.bench_idle_send``'s measurement (batching off and on).
- Idle consumer CPU: a consumer process blocked in ``receive()`` on a silent topic, CPU time
  (user + system, from ``/proc``) over 5 s as % of one core.
- Spark: a running query (``processingTime`` 100 ms, ``foreachBatch``) over a topic, warmed
  up by one row; then 20 messages published 300 ms apart; latency from send to the batch
  function seeing the row.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

_WARM = 5  # messages sent (and received) before the measured ones

_CONSUMER = r"""
import json, sys, time
from filepulsar.connector.client import Client
root, n, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
client = Client(root)
c = client.subscribe("lat", "s")
print("READY", flush=True)
lat = []
for i in range(n + warm):
    m = c.receive()
    now = time.monotonic_ns()
    lat.append((now - int(m.data()[:20])) / 1e6)
    if i % 50 == 49 or i == n + warm - 1:
        # Acknowledged in groups, as pulsar-client groups acknowledgements (100 ms by
        # default), so the receive loop does not wait for an ack's commit per message.
        c.acknowledge_cumulative(m)
print("RESULT " + json.dumps(lat[warm:]), flush=True)
client.close()
"""

_IDLE_CONSUMER = r"""
import sys
from filepulsar.connector.client import Client
client = Client(sys.argv[1])
c = client.subscribe("idle", "s")
print("READY", flush=True)
try:
    c.receive(60_000)
except Exception:
    pass
"""

#: The watchers' common start: an inotify descriptor ``fd`` (through libc; no package needed).
_INOTIFY = r"""
import ctypes, ctypes.util, os, struct, sys, time, json
libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
fd = libc.inotify_init1(0)
"""

_BARE_WATCHER = (
    _INOTIFY
    + r"""
libc.inotify_add_watch(fd, sys.argv[1].encode(), 0x80)  # IN_MOVED_TO
n = int(sys.argv[2])
print("READY", flush=True)
lat, seen = [], 0
while seen < n:
    data = os.read(fd, 65536)
    now = time.monotonic_ns()
    pos = 0
    while pos < len(data):
        wd, mask, cookie, ln = struct.unpack_from("iIII", data, pos)
        name = data[pos + 16 : pos + 16 + ln].rstrip(b"\0").decode()
        pos += 16 + ln
        lat.append((now - int(name)) / 1e6)
        seen += 1
print("RESULT " + json.dumps(lat), flush=True)
"""
)


def _spawn(code: str, *args: str) -> subprocess.Popen[str]:
    # -P: the helper imports filepulsar as this process does (from PYTHONPATH), not from a
    # ``filepulsar/`` folder in the current directory (a source tree's, whose subpackages
    # an editable install may then resolve to another checkout).
    proc = subprocess.Popen(
        [sys.executable, "-P", "-c", code, *args], stdout=subprocess.PIPE, text=True, bufsize=1
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("READY"):
        proc.kill()
        raise RuntimeError(f"helper process did not start: {line!r}")
    return proc


def _result(proc: subprocess.Popen[str]) -> list[float]:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("RESULT "):
            proc.wait(30)
            return list(json.loads(line[len("RESULT ") :]))
    raise RuntimeError(f"helper process ended without a result (exit {proc.wait()})")


def _q(xs: list[float], f: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * f))]


def _paced(rate: float, n: int) -> Iterator[int]:
    """``range(n)``, each ``i`` handed out no earlier than ``i / rate`` seconds after the
    first (an open-loop load: a late step does not delay the schedule of the next)."""
    t0 = time.monotonic()
    for i in range(n):
        pause = t0 + i / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        yield i


def _stamp() -> bytes:
    return b"%020d" % time.monotonic_ns() + b"x" * 80


def _end_to_end(rate: float, n: int, *, batching: bool) -> tuple[list[float], float]:
    from filepulsar.connector.client import Client

    root = tempfile.mkdtemp(prefix="fp-lat-")
    try:
        client = Client(root)
        producer = client.create_producer(
            "lat", batching_enabled=batching, batching_max_publish_delay_ms=10
        )
        consumer = _spawn(_CONSUMER, root, str(n), str(_WARM))
        for _ in range(_WARM):  # the first messages of a process pay one-time work
            producer.send(_stamp())
            time.sleep(0.05)
        time.sleep(0.5)  # let the consumer settle into its wait (pacing, not synchronisation)
        t0 = time.monotonic()
        for _ in _paced(rate, n):
            if batching:
                producer.send_async(_stamp(), None)
            else:
                producer.send(_stamp())
        producer.flush()
        achieved = n / (time.monotonic() - t0)
        lat = _result(consumer)
        client.close()
        return lat, achieved
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _bare_peer(rate: float, n: int) -> list[float]:
    folder = tempfile.mkdtemp(prefix="fp-bare-")
    try:
        watcher = _spawn(_BARE_WATCHER, folder, str(n))
        time.sleep(0.2)
        dfd = os.open(folder, os.O_RDONLY)
        for _ in _paced(rate, n):
            name = f"{time.monotonic_ns():020d}"
            tmp = os.path.join(folder, "." + name)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, b"x" * 300)
            os.fsync(fd)
            os.close(fd)
            os.rename(tmp, os.path.join(folder, name))
            os.fsync(dfd)
        os.close(dfd)
        return _result(watcher)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


_PROTOCOL_WATCHER = (
    _INOTIFY
    + r"""
folder = sys.argv[1]
libc.inotify_add_watch(fd, os.path.join(folder, "manifest").encode(), 0x100)  # IN_CREATE
n = int(sys.argv[2])
data = os.open(os.path.join(folder, "data"), os.O_RDONLY)
print("READY", flush=True)
lat, seen = [], 0
while seen < n:
    buf = os.read(fd, 65536)
    pos = 0
    while pos < len(buf):
        wd, mask, cookie, ln = struct.unpack_from("iIII", buf, pos)
        name = buf[pos + 16 : pos + 16 + ln].rstrip(b"\0").decode()
        pos += 16 + ln
        if name.startswith("."):
            continue  # the writer's temporary file
        with open(os.path.join(folder, "manifest", name), "rb") as f:
            head = f.read()
        off, size = (int(x) for x in head.split(b",")[:2])
        entry = os.pread(data, size, off)
        lat.append((time.monotonic_ns() - int(entry[:20])) / 1e6)
        seen += 1
print("RESULT " + json.dumps(lat), flush=True)
"""
)


def _protocol_peer(rate: float, n: int) -> list[float]:
    import threading

    folder = tempfile.mkdtemp(prefix="fp-proto-")
    try:
        mdir = os.path.join(folder, "manifest")
        os.mkdir(mdir)
        data = os.open(os.path.join(folder, "data"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        watcher = _spawn(_PROTOCOL_WATCHER, folder, str(n))
        time.sleep(0.2)
        dfd = os.open(mdir, os.O_RDONLY)
        filler = b"m" * 600  # about the size of a one-fragment manifest head
        size = 0
        for i in _paced(rate, n):
            entry = _stamp() + b"x" * 280
            os.write(data, entry)
            synced = threading.Thread(target=os.fdatasync, args=(data,))
            synced.start()
            tmp = os.path.join(mdir, f".tmp{i}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, b"%d,%d," % (size, len(entry)) + filler)
            os.fsync(fd)
            os.close(fd)
            synced.join()
            os.link(tmp, os.path.join(mdir, f"{i:020d}"))
            os.unlink(tmp)
            os.fsync(dfd)
            size += len(entry)
        os.close(dfd)
        os.close(data)
        return _result(watcher)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


_JOURNAL_WATCHER = (
    _INOTIFY
    + r"""
path, n = sys.argv[1], int(sys.argv[2])
libc.inotify_add_watch(fd, path.encode(), 0x2)  # IN_MODIFY
journal = os.open(path, os.O_RDONLY)
print("READY", flush=True)
lat, pos = [], 0
while len(lat) < n:
    os.read(fd, 65536)
    while True:
        rec = os.pread(journal, 300, pos)
        if len(rec) < 300 or rec[:1] == b"\0":
            break  # not written, or written but not yet durable (unmarked)
        lat.append((time.monotonic_ns() - int(rec[:20])) / 1e6)
        pos += 300
print("RESULT " + json.dumps(lat[:n]), flush=True)
"""
)


def _journal_peer(rate: float, n: int) -> list[float]:
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    folder = tempfile.mkdtemp(prefix="fp-journal-")
    try:
        path = os.path.join(folder, "journal")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        size = ctypes.c_long(300 * (n + 1))
        if libc.fallocate(fd, 1, ctypes.c_long(0), size) != 0:  # FALLOC_FL_KEEP_SIZE
            os.close(fd)
            raise OSError(ctypes.get_errno(), "fallocate")
        os.fsync(fd)
        watcher = _spawn(_JOURNAL_WATCHER, path, str(n))
        time.sleep(0.2)
        for i in _paced(rate, n):
            record = _stamp() + b"x" * 200
            os.pwrite(fd, b"\0" + record[1:], 300 * i)  # written, not yet visible
            os.fdatasync(fd)
            os.pwrite(fd, record[:1], 300 * i)  # durable: now visible
        os.close(fd)
        return _result(watcher)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _idle_consumer_cpu(seconds: float = 5.0) -> float:
    root = tempfile.mkdtemp(prefix="fp-idle-")
    try:
        proc = _spawn(_IDLE_CONSUMER, root)
        time.sleep(1.0)  # past start-up work
        c0, t0 = _proc_cpu_s(proc.pid), time.monotonic()
        time.sleep(seconds)
        c1, t1 = _proc_cpu_s(proc.pid), time.monotonic()
        proc.kill()
        proc.wait()
        return (c1 - c0) / (t1 - t0) * 100
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _spark_row_latency(n: int = 20, trigger_ms: int = 100) -> list[float]:
    from filepulsar.connector.client import Client
    from filepulsar.jobs.spark import local_spark

    root = tempfile.mkdtemp(prefix="fp-spark-lat-")
    try:
        client = Client(root)
        producer = client.create_producer("lat")
        producer.send(_stamp())  # the topic exists before the query starts
        spark = local_spark("bench-latency")
        seen: list[float] = []

        def batch(df: Any, _: int) -> None:
            now = time.monotonic_ns()
            for row in df.select("value").collect():
                seen.append((now - int(bytes(row["value"])[:20])) / 1e6)

        q = (
            spark.readStream.format("filepulsar")
            .option("topic", "lat")
            .option("startingOffsets", "latest")
            .load(root)
            .writeStream.foreachBatch(batch)
            .trigger(processingTime=f"{trigger_ms} milliseconds")
            .start()
        )
        deadline = time.monotonic() + 120
        while q.lastProgress is None and time.monotonic() < deadline:
            time.sleep(0.1)  # the query's first (empty) batch: started
        # The first batch that reads rows starts the query's Python workers (seconds): wait
        # for a warm-up row so the figures are the running query's.
        producer.send(_stamp())
        while not seen and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
        seen.clear()
        for _ in range(n):
            producer.send(_stamp())
            time.sleep(0.3)
        while len(seen) < n and time.monotonic() < deadline:
            time.sleep(0.1)
        q.stop()
        client.close()
        return seen
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _quantile_rows(xs: list[float], names: dict[float, str]) -> list[dict[str, Any]]:
    """One row (milliseconds) per quantile of ``xs``: ``names`` maps the quantile to its name."""
    return [{"name": name, "value": _q(xs, f), "unit": "ms"} for f, name in names.items()]


def run() -> list[dict[str, Any]]:
    from bench.bench_idle_send import _measure

    rows: list[dict[str, Any]] = []
    lat, _ = _end_to_end(100, 1000, batching=False)
    rows += [
        {
            "name": "e2e latency p50, send() at 100 msg/s",
            "value": _q(lat, 0.5),
            "unit": "ms",
            "goal": "<= 2",
        },
        {
            "name": "e2e latency p99, send() at 100 msg/s",
            "value": _q(lat, 0.99),
            "unit": "ms",
            "goal": "<= 10",
        },
        {"name": "e2e latency p99.9, send() at 100 msg/s", "value": _q(lat, 0.999), "unit": "ms"},
    ]
    bare = _bare_peer(100, 1000)
    rows += _quantile_rows(
        bare,
        {
            0.5: "bare peer (file+fsync+inotify) p50 at 100 msg/s",
            0.99: "bare peer (file+fsync+inotify) p99 at 100 msg/s",
            0.999: "bare peer (file+fsync+inotify) p99.9 at 100 msg/s",
        },
    )
    proto = _protocol_peer(100, 1000)
    rows += _quantile_rows(
        proto,
        {
            0.5: "protocol peer (data fdatasync || manifest fsync, link, inotify, read) p50",
            0.99: "protocol peer p99",
        },
    )
    journal = _journal_peer(100, 1000)
    rows += _quantile_rows(
        journal,
        {
            0.5: "journal peer (one fdatasync per commit, inotify, read) p50",
            0.99: "journal peer p99",
        },
    )
    rows += [
        {
            "name": "e2e p50 minus journal peer p50 (our own code's part)",
            "value": _q(lat, 0.5) - _q(journal, 0.5),
            "unit": "ms",
        },
    ]
    lat, achieved = _end_to_end(10_000, 30_000, batching=True)
    rows += [
        {
            "name": "e2e rate reached, send_async batching (target 10,000 msg/s)",
            "value": achieved,
            "unit": "msg/s",
        },
    ]
    rows += _quantile_rows(
        lat,
        {
            0.5: "e2e latency p50, send_async batching at that rate",
            0.99: "e2e latency p99, send_async batching at that rate",
            0.999: "e2e latency p99.9, send_async batching at that rate",
        },
    )
    for batching in (False, True):
        idle = _measure(batching, 30)
        rows.append(
            {
                "name": "idle send_async to callback, batching "
                + ("on (10 ms)" if batching else "off"),
                "value": statistics.median(idle),
                "unit": "ms",
                "goal": "<= 20",
            }
        )
    rows.append(
        {
            "name": "idle consumer CPU (blocked in receive, 5 s)",
            "value": _idle_consumer_cpu(),
            "unit": "% core",
            "goal": "< 1",
        }
    )
    spark = _spark_row_latency()
    if spark:
        rows += [
            {
                "name": "publish -> Spark row p50 (processingTime 100 ms)",
                "value": _q(spark, 0.5),
                "unit": "ms",
            },
            {
                "name": "publish -> Spark row max (processingTime 100 ms)",
                "value": max(spark),
                "unit": "ms",
            },
        ]
    return rows


if __name__ == "__main__":
    for r in run():
        goal = f"  (goal {r['goal']})" if "goal" in r else ""
        print(f"{r['name']:<70} {r['value']:>9.3f} {r['unit']}{goal}")
