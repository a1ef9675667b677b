"""Start-up and shutdown of one application of Pulsar's IoT scenario (issue 27): the CPU and
wall time of one process subscribing ``clients`` Key_Shared clients (threads, each its own
``Client``) over ``topics`` topics, as ``bench_iot``'s applications do; then closing and
reopening 10% of them (the restart variant's step), ``restarts`` times; then closing them all.

Run: ``python -m bench.bench_startup [--clients 10] [--topics 30] [--restarts 3] [--others 0]``
on a local disk; prints one JSON line (seconds). ``--others K`` first subscribes K clients of
another process to the same subscription (kept open meanwhile), so that the membership the
clients join and leave is not only their own. CPU is the process's (every thread), so compare
checkouts in interleaved runs on a shared host. pandas is imported before the timing (a
consumer imports it in the background, 0.3 s of CPU that ``bench_iot``'s figure includes).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

SUBSCRIPTION = "iot-application-0"


def _connect(root: str, topics: list[str], name: str) -> tuple[Any, Any]:
    from filepulsar import Client, ConsumerType, InitialPosition

    client = Client(root)
    consumer = client.subscribe(
        topics,
        SUBSCRIPTION,
        consumer_type=ConsumerType.KeyShared,
        consumer_name=name,
        initial_position=InitialPosition.Earliest,
    )
    return client, consumer


def _close(conn: tuple[Any, Any]) -> None:
    conn[1].close()
    conn[0].close()


def _in_threads(work: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """``work(item)`` for every item, each in a thread of its own, at once."""
    out: list[Any] = [None] * len(items)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            out[i] = work(items[i])
        except BaseException as e:  # raised in the calling thread below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def _others(root: str, topics: list[str], k: int) -> None:
    """The ``--others`` process: K clients subscribed until a line on stdin."""
    conns = _in_threads(lambda i: _connect(root, topics, f"{SUBSCRIPTION}-other-{i}"), range(k))
    print("ready", flush=True)
    sys.stdin.readline()
    _in_threads(_close, conns)


def measure(root: str, *, clients: int, topics: int, restarts: int, others: int) -> dict:
    """The figures of one run on ``root`` (see the module docstring)."""
    import pandas  # noqa: F401  (see the module docstring)

    from filepulsar.admin import Admin

    names = [f"iot-topic-{t}" for t in range(topics)]
    admin = Admin(root)
    for t in names:
        admin.topics().create_non_partitioned_topic(t)
    proc = None
    if others:
        cmd = [sys.executable, "-m", "bench.bench_startup", "--others-role", root]
        cmd += ["--topics", str(topics), "--others", str(others)]
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdin is not None and proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the --others process did not start")
    out: dict[str, float] = {}
    cpu0, wall0 = time.process_time(), time.perf_counter()
    conns = _in_threads(
        lambda i: _connect(root, names, f"{SUBSCRIPTION}-client-{i}"), list(range(clients))
    )
    out["subscribe_cpu_s"] = time.process_time() - cpu0
    out["subscribe_s"] = time.perf_counter() - wall0
    k = max(1, clients // 10)
    cpu, wall = 0.0, 0.0
    for r in range(restarts):

        def restart(i: int) -> None:
            _close(conns[i])
            conns[i] = _connect(root, names, f"{SUBSCRIPTION}-client-{i}")

        cpu0, wall0 = time.process_time(), time.perf_counter()
        _in_threads(restart, [(r * k + j) % clients for j in range(k)])
        cpu += time.process_time() - cpu0
        wall += time.perf_counter() - wall0
    out["restart_cpu_s"] = cpu / max(1, restarts)
    out["restart_s"] = wall / max(1, restarts)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    _in_threads(_close, conns)
    out["close_cpu_s"] = time.process_time() - cpu0
    out["close_s"] = time.perf_counter() - wall0
    if proc is not None:
        assert proc.stdin is not None
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        proc.wait()
    return {k: round(v, 3) for k, v in out.items()}


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_startup", description=__doc__)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--topics", type=int, default=30)
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--others", type=int, default=0)
    ap.add_argument("--others-role", metavar="ROOT", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.others_role:
        _others(a.others_role, [f"iot-topic-{t}" for t in range(a.topics)], a.others)
        return
    root = tempfile.mkdtemp(prefix="fp-startup-")
    try:
        figures = measure(
            root, clients=a.clients, topics=a.topics, restarts=a.restarts, others=a.others
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
