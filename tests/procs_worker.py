"""Worker processes of the multi-process concurrency suite (tests/test_concurrency_procs.py).

Run as ``python -m tests.procs_worker '<json config>'``, or forked by :mod:`tests.procs_zygote`
(as the suite starts them), which calls :func:`run`. The ``role`` key picks what the process
does:

``produce``
    Creates a producer (the client's, as a user would) and sends ``n`` numbered messages whose
    value is ``"<producer id>:<seq>"``, in blocks of ten alternating ``send()`` and
    ``send_async()`` + ``flush()``. Every acknowledged message id is recorded; with
    ``pause_after`` the process prints ``paused`` after that many messages and waits for ``go``
    on stdin (a pipe barrier: no sleeps); with ``start_barrier`` it
    prints ``ready`` and sends nothing before ``start``.
``consume``
    Subscribes (Earliest) and receives until ``stop`` arrives on stdin, acknowledging each
    message (durably before the next: ``ack_grouping_time_ms`` 0 unless given) and logging
    ``(message id, key, value, redelivery count, receive time, ack time)``.
    ``delay_ms`` is per-message work (load that makes the consumer slow, never
    synchronisation); with ``pause_after`` it stops after receiving that many messages, before
    acknowledging the last of them, prints ``paused`` and waits for ``go``.
``housekeep``
    Runs :func:`filepulsar.storage.retention.enforce_retention` and
    :func:`filepulsar.storage.retention.sweep_orphans` on the topic in a loop until ``stop``,
    recording every error.

Each process prints JSON event lines on stdout (``ready``, ``paused``, ``s`` every 5 sends,
``a`` per acknowledged message, ``done``) and writes its result file atomically (temporary
file + rename) before it prints ``done``. ``clock_skew_ms`` shifts the wall clock the client
uses (leases, publish times) by that much. The environment variable
``FILEPULSAR_TEST_WALL_SKEW_MS`` shifts the whole process's wall clock (``time.time`` and
``time.time_ns``, patched at start-up: a machine whose clock is off); the times logged for
the harness stay true, so logs of processes compare.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from filepulsar.connector.client import Client, ConsumerType, InitialPosition, Timeout

#: The true wall clock (ns), for the times logged: kept before a skew replaces ``time``'s.
true_time_ns = time.time_ns
true_time = time.time


def skew_wall_clock(skew_ms: int) -> None:
    """Shift this process's wall clock by ``skew_ms`` from the true one (``time.time`` and
    ``time.time_ns``, which every wall-clock read of filepulsar goes through; 0: the true
    clock, whatever an earlier call set, as in a worker forked from a process that set one);
    monotonic time is untouched."""
    if not skew_ms:
        time.time_ns, time.time = true_time_ns, true_time
        return
    time.time_ns = lambda: true_time_ns() + skew_ms * 1_000_000
    time.time = lambda: true_time() + skew_ms / 1000


skew_wall_clock(int(os.environ.get("FILEPULSAR_TEST_WALL_SKEW_MS", "0")))

TYPES = {
    "Shared": ConsumerType.Shared,
    "KeyShared": ConsumerType.KeyShared,
    "Exclusive": ConsumerType.Exclusive,
    "Failover": ConsumerType.Failover,
}


def emit(kind: str, **fields: Any) -> None:
    """Print one event line for the test harness."""
    sys.stdout.write(json.dumps({"ev": kind, **fields}) + "\n")
    sys.stdout.flush()


def write_result(path: str, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON to ``path`` atomically (a reader never sees half a file)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Commands:
    """Lines read from stdin: ``go`` and ``stop`` set events; EOF means stop."""

    def __init__(self) -> None:
        self.start = threading.Event()
        self.go = threading.Event()
        self.stop = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            word = line.strip()
            if word == "start":
                self.start.set()
            elif word == "go":
                self.go.set()
            elif word == "stop":
                self.stop.set()
        self.start.set()
        self.go.set()
        self.stop.set()  # stdin closed: the test is gone


def make_clock(skew_ms: int) -> Callable[[], int] | None:
    if not skew_ms:
        return None
    return lambda: int(time.time() * 1000) + skew_ms


def make_client(cfg: dict[str, Any]) -> Client:
    return Client(
        cfg["root"],
        storage_options=cfg.get("opts") or None,
        clock=make_clock(cfg.get("clock_skew_ms", 0)),
    )


# --------------------------------------------------------------------------- producing
def produce(cfg: dict[str, Any], cmd: Commands) -> dict[str, Any]:
    from filepulsar.storage.producer import Result

    pid = cfg["pid"]
    n = cfg["n"]
    keys = cfg.get("keys", 0)
    pause_after = cfg.get("pause_after", -1)
    acked: list[tuple[int, str]] = []
    failed: list[tuple[int, str]] = []
    errors: list[str] = []
    lock = threading.Lock()
    client = make_client(cfg)
    producer = client.create_producer(
        cfg["topic"],
        producer_name=f"p{pid}-{os.getpid()}",
        batching_enabled=cfg.get("batching", True),
    )
    emit("ready")
    if cfg.get("start_barrier"):
        cmd.start.wait()

    def callback_for(seq: int) -> Callable[[Any, Any], None]:
        def cb(res: Any, mid: Any) -> None:
            with lock:
                if res == Result.Ok:
                    acked.append((seq, str(mid)))
                else:
                    failed.append((seq, str(res)))

        return cb

    max_send_ms = 0.0
    try:
        for seq in range(n):
            t0 = time.monotonic()
            value = f"{pid}:{seq}".encode()
            key = f"k{(pid * 7 + seq) % keys}" if keys else None
            if cfg.get("mode", "mixed") == "send" or (seq // 10) % 2 == 0:
                mid = producer.send(value, partition_key=key)
                with lock:
                    acked.append((seq, str(mid)))
            else:
                producer.send_async(value, callback_for(seq), partition_key=key)
                if seq % 10 == 9 or seq == n - 1:
                    producer.flush()
            max_send_ms = max(max_send_ms, (time.monotonic() - t0) * 1000)
            if seq % 5 == 4:
                # Progress, so the test can tell a stall from slowness: every 5 sends (8
                # producers racing on one S3 topic under a loaded CI host took over 60 s, the
                # test's stall window, for their first 25 each; a stall is no send at all).
                emit("s", n=seq + 1)
            if seq + 1 == pause_after:
                producer.flush()
                emit("paused")
                cmd.go.wait()
        producer.flush()
    except Exception as e:  # recorded for the test: a failed send is not acknowledged
        errors.append(f"{type(e).__name__}: {e}")
    close_errors: list[str] = []
    try:
        client.close()
    except Exception as e:  # a fenced producer fails its close too: reported apart
        close_errors.append(f"{type(e).__name__}: {e}")
    with lock:
        return {
            "acked": sorted(acked),
            "failed": failed,
            "errors": errors,
            "close_errors": close_errors,
            "max_send_ms": round(max_send_ms),
        }


# --------------------------------------------------------------------------- consuming
def consume(cfg: dict[str, Any], cmd: Commands) -> dict[str, Any]:
    client = make_client(cfg)
    consumer = client.subscribe(
        cfg["topic"],
        cfg["sub"],
        consumer_type=TYPES[cfg["type"]],
        consumer_name=cfg["cname"],
        initial_position=InitialPosition.Earliest,
        receiver_queue_size=cfg.get("queue", 10),
        consumer_lease_ms=cfg.get("lease_ms", 30_000),
        # Each acknowledgement written before the next message (a commit each), unless a
        # test groups them: the suite counts on acknowledged messages never coming back.
        ack_grouping_time_ms=cfg.get("ack_grouping_time_ms", 0),
    )
    emit("ready")
    delay_s = cfg.get("delay_ms", 0) / 1000
    pause_after = cfg.get("pause_after", -1)
    log: list[list[Any]] = []  # [message id, key, value, redelivery count, recv ns, ack ns]
    errors: list[str] = []
    received = 0
    try:
        while not cmd.stop.is_set():
            try:
                msg = consumer.receive(100)
            except Timeout:
                continue
            t_recv = true_time_ns()
            received += 1
            if delay_s:
                time.sleep(delay_s)  # per-message work: load, not synchronisation
            if received == pause_after:
                emit("paused")
                cmd.go.wait()
            consumer.acknowledge(msg)
            t_ack = true_time_ns()
            value = msg.data().decode()
            log.append(
                [
                    str(msg.message_id()),
                    msg.partition_key(),
                    value,
                    msg.redelivery_count(),
                    t_recv,
                    t_ack,
                ]
            )
            emit("a", v=value)
    except Exception as e:
        errors.append(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    try:
        client.close()
    except Exception as e:
        errors.append(f"close: {type(e).__name__}: {e}")
    return {"log": log, "errors": errors}


# --------------------------------------------------------------------------- housekeeping
def housekeep(cfg: dict[str, Any], cmd: Commands) -> dict[str, Any]:
    from filepulsar.storage.retention import enforce_retention, sweep_orphans

    client = make_client(cfg)
    store = client.store
    runs = deleted_ledgers = deleted_files = 0
    errors: list[str] = []
    emit("ready")
    while not cmd.stop.is_set():
        # "go" asks for one whole run that starts after it arrived; "synced" answers it.
        asked = cmd.go.is_set()
        try:
            r = enforce_retention(store, cfg["topic"])
            deleted_ledgers += len(r.deleted_ledgers)
            s = sweep_orphans(store, cfg["topic"], min_age_ms=cfg["orphan_min_age_ms"])
            deleted_files += len(s.deleted)
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")
        runs += 1
        if runs == 1:
            emit("ran")
        if asked:
            cmd.go.clear()
            emit("synced")
        time.sleep(cfg.get("pause_ms", 50) / 1000)  # bounds its CPU use: load, not a barrier
    return {
        "runs": runs,
        "deleted_ledgers": deleted_ledgers,
        "deleted_orphans": deleted_files,
        "errors": errors,
    }


ROLES = {"produce": produce, "consume": consume, "housekeep": housekeep}


#: The niceness these workers run at. The suite starts 8-12 of them at once (and the moto
#: server they talk to, in the test process, stays at 0): at the default they take most of a
#: 2-core machine from what runs beside them in ``make test``, the Spark JVMs whose Python
#: workers must connect back within Spark's fixed 10 s (a CI run failed a query's start so).
#: Eight at 5 still get more than half of both cores against two busy processes.
NICENESS = 5


def run(cfg: dict[str, Any]) -> None:
    """Do what ``cfg`` says (its ``role``), write the result file, print ``done``."""
    os.nice(NICENESS)
    cmd = Commands()
    try:
        result = ROLES[cfg["role"]](cfg, cmd)
    except Exception as e:
        result = {"errors": [f"{type(e).__name__}: {e}\n{traceback.format_exc()}"]}
    write_result(cfg["result"], result)
    emit("done")


def main() -> None:
    run(json.loads(sys.argv[1]))


if __name__ == "__main__":
    main()
