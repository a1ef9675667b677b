"""IoT telemetry benchmark (issue 27): Apache Pulsar's ``iot-telemetry`` scenario on filepulsar.

The rules are those of Pulsar's public description (``tests/performance/iot-telemetry.md`` and
its ``scenarios/iot-telemetry*.yaml``), written anew for this client:

1. Devices send small keyed telemetry: every message is keyed by its device id
   (``partition_key``) and its 64-byte payload (:func:`encode`) carries the device id, the
   device's counter (0, 1, 2 ... per device), the wall-clock publish instant and whether it is
   a measured message (warm-up messages are not). A device maps to one topic (device id modulo
   the topic count).
2. Gateways are processes (``gateway`` role). Gateway ``g`` holds one producer per topic,
   named ``gw{g}-{topic}`` (stable names, the same after a restart), with KeyBased batching,
   ``send_async`` and explicit, monotonic ``sequence_id`` per producer; deduplication is on
   for the namespace (``public/default``).
3. Only one send per device is in flight, and its next message may go through another
   gateway: the scheduler (:class:`DeviceScheduler`, in the coordinating process that runs
   the benchmark) paces the rate, draws a device that has no send in flight and a gateway at
   random (seeded), as Pulsar's load generator does, and hands the send to that gateway's
   process through its stdin; the gateway reports every send callback on its stdout, which
   frees the device.
4. Applications are processes (``app`` role). Each has its own Key_Shared subscription
   (``iot-application-{a}``) over all topics, and ``clients`` client instances in threads of
   that process, each its own :class:`~filepulsar.Client` and consumer
   (``iot-application-{a}-client-{i}``), calling ``receive`` + ``acknowledge`` per message.
   They share one :class:`SequenceTracker`: a counter below the device's expected one is a
   duplicate (counted, accepted); a first delivery above it is an ordering violation; a
   payload that does not decode or whose key is not its device is invalid.
5. The restart variant closes and reopens ``restart_fraction`` of every application's clients
   (at least one, same names) every ``restart_interval_s``; the tracker lives on.
6. After publishing ends, the applications get a drain window to receive everything; the
   producers' final state (the per-device count of sends acknowledged to the gateways) is
   compared with every application's tracker state: what is short is missing.

Pass rule (Pulsar's "interpreting a run", with the issue's figures): every application
received every published message, with 0 ordering violations, 0 invalid and 0 missing
messages; duplicates are counted, not failed. Figures: the slowest application's consume rate
while publishing over the publish rate (goal >= 0.95), publish-to-receipt p50 (<= 100 ms) and
p99 (<= 1 s), publish (send to callback) p99 (<= 50 ms), CPU per delivered message (the
gateway and application processes' own CPU time from their start signal to their end, over
the applications' unique deliveries). Warm-up messages are checked like the others but left
out of rates and latencies. All processes run on one host, so their wall clocks agree.
Beside the pass rule (not part of it), each application prints what its consumers saw of
their leases (``storage.consumer_leases.lease_counts``: renewal commits, leases extended,
renewals that started late, lapses, consumers removed as lapsed, registered again, lazy
Key_Shared membership record commits and the other consumers' records folded into them): on a
saturated host, lapses are membership changes that make everything slower. Start-up is
printed too (not part of the pass rule): each application's clients subscribe at once, as
independent client instances start, before the start signal (the time it took, and its CPU),
then the time from the start to the application's first delivery and to every client's
first; and its push housekeeping passes (leases, membership records, grouped
acknowledgements: their number, mean and longest). The applications' CPU per delivery is
split by kind of thread (the push dispatcher, its housekeeping, the consumers' threads, the
rest), as ``bench_live_app`` splits one process's.

Where this differs from Pulsar's harness, and why: there is no broker, so publish-to-receipt
runs from the gateway's clock at ``send_async`` (Pulsar's from the broker's publish time); the
scheduler reaches the gateways over pipes (Pulsar's gateways are clients of one process, so
"the next message may use another gateway" needs a shared scheduler here); applications call
``receive`` + ``acknowledge`` per message (Pulsar's use a listener and asynchronous acks); an
invalid message is acknowledged, not negatively acknowledged (it would only come back); there
is no warm-up barrier (measurement starts when the warm-up's time is up, not once every
application holds the warm-up messages); each client is its own (no shared client resources,
PIP-234). The store's own counts (messages in the topics, each subscription's backlog) are
checked against the harness's.

Time series (1 s: publish rate, each application's consume rate and backlog) go to
``bench/out/iot-<variant>.json`` and are drawn in ``bench/out/iot-<variant>.png``.

The host-sized variants start 30 processes and some 600 threads: on a small shared host they
fall far behind and slow everything else down.

The applications run on Python's own interpreter settings unless asked otherwise:
``--switch-interval MS`` sets their ``sys.setswitchinterval``, ``--gc-freeze`` makes each
call ``gc.freeze()`` once its clients subscribed, and ``--gc-threshold N`` sets the cyclic
collector's young-generation threshold (``gc.set_threshold(N, ...)``, the older two Python's
own) (docs/scale.md, "Sizing it", suggests the freeze for a long-running consumer process and
says what the interval and the threshold did, measured here: the interval is not suggested);
the report says which settings the applications ran with, and a run with any writes its files
under the variant's name with ``-si<MS>``, ``-gc<N>`` and ``-frozen`` added. The gateways
always run on Python's own.

Run: ``make bench`` runs the host-sized variants (``iot-telemetry-local-steady`` and its
restart variant ``iot-telemetry-local``); any topology from the command line::

    python -m bench.bench_iot --gateways 4 --topics 10 --apps 5 --clients 4 \\
        --devices 10000 --rate 500 --warmup 5 --duration 30 [--restart] \\
        [--switch-interval 50] [--gc-freeze] [--gc-threshold 7000]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import random
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import IO, Any

import numpy as np


@dataclass(frozen=True)
class Topology:
    """One run of the scenario. Units are in the names."""

    name: str
    gateways: int
    topics: int
    apps: int
    clients: int
    devices: int
    rate_per_s: int
    warmup_s: float
    duration_s: float
    restart_interval_s: float = 0.0
    restart_fraction: float = 0.0
    #: How long the applications may take to receive everything once publishing ended.
    drain_s: float = 60.0
    #: Sends in flight at most (Pulsar's ``maxOutstanding``), bounded by the devices.
    max_outstanding: int = 20_000
    #: The applications' interpreter switch interval (``sys.setswitchinterval``; 0: Python's
    #: own, 5 ms), whether they freeze what is alive once their clients subscribed
    #: (``gc.freeze``), and their collector's young-generation threshold (0: Python's own,
    #: 700): process settings to measure (docs/scale.md, "Sizing it").
    switch_interval_ms: float = 0.0
    gc_freeze: bool = False
    gc_threshold: int = 0

    def __post_init__(self) -> None:
        for f in ("gateways", "topics", "apps", "clients", "devices", "rate_per_s"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1, got {getattr(self, f)}")
        if self.warmup_s < 0 or self.duration_s <= 0 or self.drain_s < 0:
            raise ValueError(
                f"need warmup_s >= 0, duration_s > 0, drain_s >= 0; got {self.warmup_s}, "
                f"{self.duration_s}, {self.drain_s}"
            )
        if not 0.0 <= self.restart_fraction <= 1.0:
            raise ValueError(f"restart_fraction must be in 0..1, got {self.restart_fraction}")
        if self.switch_interval_ms < 0:
            raise ValueError(f"switch_interval_ms must be >= 0, got {self.switch_interval_ms}")
        if self.gc_threshold < 0:
            raise ValueError(f"gc_threshold must be >= 0, got {self.gc_threshold}")

    @property
    def restarts(self) -> bool:
        return self.restart_interval_s > 0 and self.restart_fraction > 0

    @property
    def warmup_messages(self) -> int:
        return round(self.rate_per_s * self.warmup_s)

    @property
    def messages(self) -> int:
        return self.warmup_messages + round(self.rate_per_s * self.duration_s)

    def topic_names(self) -> list[str]:
        return [f"persistent://public/default/iot-telemetry-{t}" for t in range(self.topics)]

    def describe(self) -> str:
        churn = (
            f", {self.restart_fraction:.0%} of each app's clients restarted every "
            f"{self.restart_interval_s:g} s"
            if self.restarts
            else ""
        )
        return (
            f"{self.gateways} gateways, {self.topics} topics, {self.apps} apps x {self.clients} "
            f"clients, {self.devices:,} devices, {self.rate_per_s:,} msg/s, {self.warmup_s:g} s "
            f"warm-up + {self.duration_s:g} s{churn}; {self.interpreter()}"
        )

    @property
    def tuned(self) -> bool:
        """Whether the applications' interpreter settings are not Python's own."""
        return self.switch_interval_ms > 0 or self.gc_freeze or self.gc_threshold > 0

    def interpreter(self) -> str:
        """The applications' interpreter settings, in words."""
        if not self.tuned:
            return "applications on Python's own interpreter settings"
        got = []
        if self.switch_interval_ms > 0:
            got.append(f"switch interval {self.switch_interval_ms:g} ms")
        if self.gc_threshold > 0:
            got.append(f"gc young threshold {self.gc_threshold}")
        if self.gc_freeze:
            got.append("gc.freeze() once subscribed")
        return "applications with " + " and ".join(got)


#: Pulsar's host-sized topology (``iot-telemetry-local-steady.yaml``): the 20-way fan-out, 30
#: topics and 1,000 msg/s of the full scenario, with 10 gateways and 10 clients per app.
LOCAL_STEADY = Topology(
    name="iot-telemetry-local-steady",
    gateways=10,
    topics=30,
    apps=20,
    clients=10,
    devices=100_000,
    rate_per_s=1000,
    warmup_s=20,
    duration_s=120,
)
#: ``iot-telemetry-local.yaml``: the same with 10% of each app's clients restarted every 30 s.
LOCAL = dataclasses.replace(
    LOCAL_STEADY, name="iot-telemetry-local", restart_interval_s=30, restart_fraction=0.1
)

# --- The message ------------------------------------------------------------------------

PAYLOAD_BYTES = 64
_MAGIC = b"IoT1"
#: magic, flags (bit 0: measured), device id, device counter, publish instant (epoch ns);
#: zero padding to 64 bytes.
_HEAD = struct.Struct(">4sIqqq")
_PAD = bytes(PAYLOAD_BYTES - _HEAD.size)
_MEASURED = 1


def encode(device: int, counter: int, publish_ns: int, measured: bool) -> bytes:
    """The 64-byte payload of one telemetry message."""
    return _HEAD.pack(_MAGIC, _MEASURED if measured else 0, device, counter, publish_ns) + _PAD


def decode(data: bytes) -> tuple[int, int, int, bool]:
    """``(device, counter, publish_ns, measured)`` of a payload; ValueError if it is not one."""
    if len(data) != PAYLOAD_BYTES:
        raise ValueError(f"telemetry payload of {len(data)} bytes, expected {PAYLOAD_BYTES}")
    magic, flags, device, counter, publish_ns = _HEAD.unpack_from(data)
    if magic != _MAGIC or data[_HEAD.size :] != _PAD:
        raise ValueError(f"not a telemetry payload: {data[:8]!r}...")
    return device, counter, publish_ns, bool(flags & _MEASURED)


# --- The applications' tracker --------------------------------------------------------------


class SequenceTracker:
    """The per-device order check one application shares among its clients.

    ``next_expected[d]`` is the counter device ``d``'s next in-order message carries. Counters
    received above it (a gap) wait in a per-device set made only when a gap is seen, so a
    later delivery of the missing one advances past them.
    """

    def __init__(self, devices: int) -> None:
        self.next_expected = np.zeros(devices, dtype=np.int64)
        self._pending: dict[int, set[int]] = {}
        self._lock = threading.Lock()
        self.unique = 0
        self.duplicates = 0
        self.ordering_violations = 0
        self.invalid = 0
        self.violation_samples: list[str] = []

    def received(self, device: int, counter: int) -> bool:
        """Note one delivery; True if it is the first delivery of that message."""
        if not 0 <= device < len(self.next_expected) or counter < 0:
            self.note_invalid()
            return False
        with self._lock:
            expected = int(self.next_expected[device])
            if counter < expected:
                self.duplicates += 1
                return False
            pending = self._pending.get(device)
            if counter > expected:
                if pending is None:
                    pending = self._pending[device] = set()
                if counter in pending:
                    self.duplicates += 1
                    return False
                pending.add(counter)
                self.unique += 1
                self.ordering_violations += 1
                if len(self.violation_samples) < 100:
                    self.violation_samples.append(
                        f"device={device} expected={expected} observed={counter}"
                    )
                return True
            self.unique += 1
            expected += 1
            if pending is not None:
                while expected in pending:
                    pending.remove(expected)
                    expected += 1
                if not pending:
                    del self._pending[device]
            self.next_expected[device] = expected
            return True

    def note_invalid(self) -> None:
        with self._lock:
            self.invalid += 1

    def summary(self) -> dict[str, Any]:
        with self._lock:
            return {
                "unique": self.unique,
                "duplicates": self.duplicates,
                "ordering_violations": self.ordering_violations,
                "invalid": self.invalid,
                "violation_samples": list(self.violation_samples),
            }


# --- The device scheduler (coordinating process) ------------------------------------------


class DeviceScheduler:
    """Which device sends next, with which counter, through which gateway.

    At most one send per device is in flight: a device is drawn (seeded, at random) among those
    whose previous send's callback has come back, and a gateway at random, so a device's
    consecutive messages may go through different gateways, each sent only after the previous
    one was acknowledged. ``produced`` is the producers' final state: per device, the number
    of its messages acknowledged to a gateway.
    """

    def __init__(self, devices: int, gateways: int, *, max_outstanding: int, seed: int) -> None:
        self.counters = np.zeros(devices, dtype=np.int64)
        self.produced = np.zeros(devices, dtype=np.int64)
        self._in_flight = np.zeros(devices, dtype=bool)
        self._gateways = gateways
        self._random = random.Random(seed)
        self._cond = threading.Condition()
        self.max_outstanding = min(max_outstanding, devices)
        self.outstanding = 0
        self.acked = 0
        self.acked_measured = 0
        self.failed = 0
        self.last_ack = 0.0

    def next_send(self) -> tuple[int, int, int]:
        """``(device, counter, gateway)`` of the next send; waits while too many are in
        flight."""
        with self._cond:
            while self.outstanding >= self.max_outstanding:
                self._cond.wait()
            n = len(self.counters)
            device = self._random.randrange(n)
            while self._in_flight[device]:
                device = self._random.randrange(n)
            self._in_flight[device] = True
            self.outstanding += 1
            counter = int(self.counters[device])
            self.counters[device] = counter + 1
            return device, counter, self._random.randrange(self._gateways)

    def done(self, device: int, counter: int, ok: bool, measured: bool) -> None:
        """A gateway's send callback for ``device``'s message ``counter``."""
        with self._cond:
            self._in_flight[device] = False
            self.outstanding -= 1
            if ok:
                self.produced[device] = max(int(self.produced[device]), counter + 1)
                self.acked += 1
                self.acked_measured += measured
            else:
                self.failed += 1
            self.last_ack = time.time()
            self._cond.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no send is in flight; False if ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.outstanding:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True


# --- Roles (child processes) ------------------------------------------------------------------


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _say(line: str, lock: threading.Lock) -> None:
    with lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def gateway_producers(client: Any, topics: list[str], gateway: int) -> list[Any]:
    """Gateway ``gateway``'s producers, one per topic (named per gateway and topic, KeyBased
    batching; dedup is the namespace's, turned on by the run)."""
    return [
        client.create_producer(
            t,
            producer_name=f"gw{gateway}-{i}",
            batching_enabled=True,
            batching_type="KeyBased",
            block_if_queue_full=True,
        )
        for i, t in enumerate(topics)
    ]


def role_gateway(cfg: dict[str, Any]) -> None:
    """A gateway process: a producer per topic; sends what stdin asks (``device counter
    measured`` lines, then ``end``), reports each callback on stdout (``+``/``-`` device
    counter measured), then a ``final`` JSON line. Publish latencies go to a ``.npy``."""
    from filepulsar import Client

    client = Client(cfg["root"])
    topics = cfg["topics"]
    producers = gateway_producers(client, topics, cfg["index"])
    # Explicit sequence ids, monotonic per producer, from where a previous life left off.
    seqs = [p.last_sequence_id() + 1 for p in producers]
    out_lock = threading.Lock()
    latencies: list[float] = []
    done_lines: list[str] = []
    done_cond = threading.Condition()
    finished = threading.Event()

    def flusher() -> None:
        """Write the callbacks' lines in bunches (one pipe write per wake-up)."""
        while True:
            with done_cond:
                while not done_lines and not finished.is_set():
                    done_cond.wait()
                lines = done_lines[:]
                done_lines.clear()
            if lines:
                _say("\n".join(lines), out_lock)
            elif finished.is_set():
                return

    writer = threading.Thread(target=flusher, daemon=True)
    writer.start()
    _say("ready", out_lock)
    sys.stdin.readline()  # go
    cpu0 = _cpu_s()
    sent = 0
    n_topics = len(topics)
    for line in sys.stdin:
        if line.startswith("end"):
            break
        for item in line.split(";"):
            d_s, c_s, m_s = item.split()
            device, counter, measured = int(d_s), int(c_s), m_s == "1"
            t = device % n_topics
            seq = seqs[t]
            seqs[t] = seq + 1
            t0 = time.perf_counter()

            def callback(res: Any, _mid: Any, d=device, c=counter, m=measured, t0=t0) -> None:
                ok = res.value == 0
                if ok and m:
                    latencies.append(time.perf_counter() - t0)
                with done_cond:
                    done_lines.append(f"{'+' if ok else '-'} {d} {c} {int(m)}")
                    done_cond.notify()

            payload = encode(device, counter, time.time_ns(), measured)
            producers[t].send_async(payload, callback, partition_key=str(device), sequence_id=seq)
            sent += 1
    for p in producers:
        p.flush()
    for p in producers:
        p.close()
    client.close()
    cpu = _cpu_s() - cpu0
    with done_cond:
        finished.set()
        done_cond.notify()
    writer.join()
    np.save(cfg["latency_path"], np.asarray(latencies, dtype=np.float64))
    _say("final " + json.dumps({"sent": sent, "cpu_s": cpu}), out_lock)


def role_app(cfg: dict[str, Any]) -> None:
    """An application process: ``clients`` Key_Shared consumers (a client each, in threads)
    on one subscription over every topic, sharing a :class:`SequenceTracker`. Prints progress
    lines (``p`` JSON) every ``progress_s`` until ``stop`` on stdin, then writes its tracker
    state and latencies (``.npy``) and a ``final`` JSON line."""
    from bench.bench_live_app import cpu_by_kind, thread_cpu
    from filepulsar import Client, ConsumerType, InitialPosition, Timeout

    a = cfg["index"]
    if cfg.get("switch_interval_s"):
        sys.setswitchinterval(cfg["switch_interval_s"])
    if cfg.get("gc_threshold"):
        gc.set_threshold(cfg["gc_threshold"], *gc.get_threshold()[1:])
    tracker = SequenceTracker(cfg["devices"])
    sub = f"iot-application-{a}"
    out_lock = threading.Lock()
    stop = threading.Event()
    e2e_ms: list[float] = []
    restarts: list[int] = []  # the slot of every restart done (append is atomic)
    errors: list[str] = []

    def connect(i: int) -> tuple[Any, Any]:
        client = Client(cfg["root"])
        consumer = client.subscribe(
            cfg["topics"],
            sub,
            consumer_type=ConsumerType.KeyShared,
            consumer_name=f"{sub}-client-{i}",
            initial_position=InitialPosition.Earliest,
        )
        return client, consumer

    # Start-up: every client subscribed (each over every topic), then each one's first
    # delivery after the start (perf_counter s; a restarted client keeps its first).
    sub_t0, sub_cpu0 = time.perf_counter(), _cpu_s()
    connected: list[Any] = [None] * cfg["clients"]

    def connect_at(i: int) -> None:
        try:
            connected[i] = connect(i)
        except Exception as e:
            connected[i] = e

    starting = [threading.Thread(target=connect_at, args=(i,)) for i in range(cfg["clients"])]
    for th in starting:
        th.start()
    for th in starting:
        th.join()
    for c in connected:
        if isinstance(c, Exception):
            raise c
    slots: list[tuple[Any, Any]] = connected
    subscribe_s, subscribe_cpu_s = time.perf_counter() - sub_t0, _cpu_s() - sub_cpu0
    if cfg.get("gc_freeze"):
        gc.freeze()  # (everything alive now: imports, clients, consumers; docs/scale.md)
    first_at: list[float | None] = [None] * len(slots)
    restart_flags = [threading.Event() for _ in slots]

    def consume(i: int) -> None:
        client, consumer = slots[i]
        try:
            while not stop.is_set():
                if restart_flags[i].is_set():
                    consumer.close()
                    client.close()
                    client, consumer = connect(i)
                    restart_flags[i].clear()
                    restarts.append(i)
                try:
                    msg = consumer.receive(timeout_millis=200)
                except Timeout:
                    continue
                if first_at[i] is None:
                    first_at[i] = time.perf_counter()
                now_ns = time.time_ns()
                try:
                    device, counter, publish_ns, measured = decode(msg.data())
                    if msg.partition_key() != str(device):
                        raise ValueError(f"key {msg.partition_key()!r} is not device {device}")
                except ValueError:
                    tracker.note_invalid()
                else:
                    if measured:
                        e2e_ms.append((now_ns - publish_ns) / 1e6)
                    tracker.received(device, counter)
                consumer.acknowledge(msg)
        except Exception as e:  # the run fails on it: reported in the final line
            errors.append(f"client {i}: {e!r}")
        finally:
            consumer.close()
            client.close()

    def restarter() -> None:
        k = max(1, math.ceil(cfg["clients"] * cfg["restart_fraction"]))
        rng = random.Random(a)
        while not stop.wait(cfg["restart_interval_s"]):
            for i in rng.sample(range(cfg["clients"]), min(k, cfg["clients"])):
                restart_flags[i].set()

    _say("ready", out_lock)
    sys.stdin.readline()  # go
    cpu0, go_at = _cpu_s(), time.perf_counter()
    threads0 = thread_cpu()
    threads = [threading.Thread(target=consume, args=(i,), daemon=True) for i in range(len(slots))]
    if cfg["restart_interval_s"] > 0 and cfg["restart_fraction"] > 0:
        threads.append(threading.Thread(target=restarter, daemon=True))
    for th in threads:
        th.start()

    def progress() -> None:
        while not stop.wait(cfg["progress_s"]):
            s = tracker.summary()
            _say(f"p {json.dumps({'t': time.time(), 'unique': s['unique']})}", out_lock)

    reporter = threading.Thread(target=progress, daemon=True)
    reporter.start()
    sys.stdin.readline()  # stop
    # CPU by kind of thread, from the start to now (the consumers' closes not included; a
    # client restarted meanwhile counts from its new thread's start).
    by_kind = {k: v[0] / 1e9 for k, v in cpu_by_kind(threads0, thread_cpu()).items()}
    stop.set()
    for th in threads:
        th.join()
    reporter.join()
    cpu = _cpu_s() - cpu0
    np.save(cfg["state_path"], tracker.next_expected)
    np.save(cfg["latency_path"], np.asarray(e2e_ms, dtype=np.float64))
    from filepulsar.connector.client.consumer.push import PASSES
    from filepulsar.storage.consumer_leases import lease_counts

    firsts = [t - go_at for t in first_at if t is not None]
    final = {
        **tracker.summary(),
        "cpu_s": cpu,
        "subscribe_s": subscribe_s,
        "subscribe_cpu_s": subscribe_cpu_s,
        # From the start (publishing starts then too) to its first delivery, and to every
        # client's first (None: a client got nothing).
        "first_delivery_s": min(firsts) if firsts else None,
        "every_client_first_s": max(firsts) if len(firsts) == len(first_at) else None,
        "restarts": len(restarts),
        "errors": errors,
        "leases": lease_counts(),
        "housekeeping": PASSES.snapshot(),
        "threads_cpu_s": by_kind,
        # (the interpreter settings it ran with: the report says whether they applied)
        "switch_interval_ms": sys.getswitchinterval() * 1000,
        "gc_frozen": gc.get_freeze_count(),
        "gc_threshold": gc.get_threshold()[0],
    }
    _say("final " + json.dumps(final), out_lock)


# --- The coordinating process -------------------------------------------------------------

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Child:
    """A role process: JSON config on argv, commands on stdin, lines on stdout (read by a
    thread that hands each to ``on_line``)."""

    def __init__(self, role: str, cfg: dict[str, Any], on_line: Any) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.bench_iot", role, json.dumps(cfg)],
            cwd=_REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.label = f"{role} {cfg['index']}"
        self.final: dict[str, Any] | None = None
        self._ready = threading.Event()
        self._on_line = on_line
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        out: IO[str] | None = self.proc.stdout
        assert out is not None
        for line in out:
            line = line.rstrip("\n")
            if line == "ready":
                self._ready.set()
            elif line.startswith("final "):
                self.final = json.loads(line[6:])
            else:
                self._on_line(line)
        self._ready.set()  # a process that died unready wakes its waiter

    def wait_ready(self) -> None:
        self._ready.wait()
        if self.proc.poll() is not None:
            raise RuntimeError(f"bench_iot {self.label} exited with {self.proc.returncode}")

    def tell(self, text: str) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        stdin.write(text + "\n")
        stdin.flush()

    def finish(self, timeout_s: float = 300.0) -> dict[str, Any]:
        self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=10)
        if self.proc.returncode or self.final is None:
            raise RuntimeError(f"bench_iot {self.label} exited with {self.proc.returncode}")
        return self.final


def _at(samples: list[tuple[float, int]], t: float) -> float:
    """A counter's value at ``t``, interpolated between its samples ``(time, value)``."""
    if not samples:
        return 0.0
    ts = [s[0] for s in samples]
    vs = [s[1] for s in samples]
    return float(np.interp(t, ts, vs, left=0.0))


class _Run:
    """The coordinating process's side of one run: the role processes, the device scheduler,
    what the processes report, and the phases in order (:meth:`start`, :meth:`publish`,
    :meth:`drain`, :meth:`stop`)."""

    def __init__(self, topo: Topology, base: str) -> None:
        self.topo = topo
        self.base = base
        self.root = os.path.join(base, "store")
        self.topics = topo.topic_names()
        self.sched = DeviceScheduler(
            topo.devices, topo.gateways, max_outstanding=topo.max_outstanding, seed=0x51C0FFEE
        )
        #: Per application, its progress lines: ``(time, unique messages received)``.
        self.app_samples: list[list[tuple[float, int]]] = [[] for _ in range(topo.apps)]
        self._samples_lock = threading.Lock()
        #: Every second: the sends acknowledged and each application's unique receipts.
        self.series: list[dict[str, Any]] = []
        self._stop_sampling = threading.Event()
        self._sampling = threading.Thread(target=self._sample, daemon=True)
        self.apps: list[_Child] = []
        self.gateways: list[_Child] = []
        self.measure_start = 0.0
        self.publish_end = 0.0
        self.all_acked = False
        self._cpu0 = 0.0

    def path(self, name: str) -> str:
        return os.path.join(self.base, name)

    def received(self) -> list[int]:
        """Each application's unique receipts, as last reported."""
        with self._samples_lock:
            return [s[-1][1] if s else 0 for s in self.app_samples]

    def _on_app_line(self, a: int) -> Any:
        def handle(line: str) -> None:
            if line.startswith("p "):
                p = json.loads(line[2:])
                with self._samples_lock:
                    self.app_samples[a].append((p["t"], p["unique"]))

        return handle

    def _on_gateway_line(self, line: str) -> None:
        k, d, c, m = line.split()
        self.sched.done(int(d), int(c), k == "+", m == "1")

    def _sample(self) -> None:
        while True:
            self.series.append(
                {"t": time.time(), "published": self.sched.acked, "received": self.received()}
            )
            if self._stop_sampling.wait(1.0):
                return

    def start(self) -> float:
        """Dedup on, topics made, every process set up (subscriptions and producers made);
        then start them together. Returns the set-up time (s)."""
        from filepulsar.admin import Admin

        topo = self.topo
        admin = Admin(self.root)
        admin.namespaces().set_deduplication_status("public/default", True)
        for t in self.topics:
            admin.topics().create_non_partitioned_topic(t)
        t0 = time.perf_counter()
        for a in range(topo.apps):
            cfg = {
                "index": a,
                "root": self.root,
                "topics": self.topics,
                "clients": topo.clients,
                "devices": topo.devices,
                "restart_interval_s": topo.restart_interval_s,
                "restart_fraction": topo.restart_fraction,
                "switch_interval_s": topo.switch_interval_ms / 1000,
                "gc_freeze": topo.gc_freeze,
                "gc_threshold": topo.gc_threshold,
                "progress_s": 0.5,
                "state_path": self.path(f"app{a}-state.npy"),
                "latency_path": self.path(f"app{a}-e2e.npy"),
            }
            self.apps.append(_Child("app", cfg, self._on_app_line(a)))
        for g in range(topo.gateways):
            cfg = {
                "index": g,
                "root": self.root,
                "topics": self.topics,
                "latency_path": self.path(f"gw{g}-publish.npy"),
            }
            self.gateways.append(_Child("gateway", cfg, self._on_gateway_line))
        for c in self.apps + self.gateways:
            c.wait_ready()
        setup_s = time.perf_counter() - t0
        for c in self.apps + self.gateways:
            c.tell("go")
        self._cpu0 = _cpu_s()
        self._sampling.start()
        return setup_s

    def publish(self) -> list[dict[str, Any]]:
        """Send every message at the rate; wait for their callbacks; end the gateways.
        Returns the gateways' final reports.

        Due messages are handed to their gateways every few ms, one pipe write per gateway; a
        pace behind schedule catches up (as Pulsar's generator does)."""
        topo, sched = self.topo, self.sched
        total, warm = topo.messages, topo.warmup_messages
        start = time.monotonic()
        self.measure_start = time.time() if warm == 0 else 0.0
        sent = 0
        while sent < total:
            due = min(total, int((time.monotonic() - start) * topo.rate_per_s) + 1)
            bunches: list[list[str]] = [[] for _ in self.gateways]
            while sent < due:
                device, counter, g = sched.next_send()
                measured = sent >= warm
                if measured and not self.measure_start:
                    self.measure_start = time.time()
                bunches[g].append(f"{device} {counter} {int(measured)}")
                sent += 1
            for g, bunch in enumerate(bunches):
                if bunch:
                    self.gateways[g].tell(";".join(bunch))
            wait = start + sent / topo.rate_per_s - time.monotonic()
            if wait > 0:
                time.sleep(max(wait, 0.002))
        self.all_acked = sched.wait_idle(timeout_s=60.0)
        self.publish_end = time.time()
        for gw in self.gateways:
            gw.tell("end")
        return [gw.finish() for gw in self.gateways]

    def drain(self) -> tuple[float, bool]:
        """Wait until every application holds every acknowledged message, or the drain
        window (from the end of publishing) ends: ``(seconds, whether all arrived)``."""
        while time.time() - self.publish_end < self.topo.drain_s:
            if min(self.received()) >= self.sched.acked:
                return time.time() - self.publish_end, True
            time.sleep(0.25)
        return time.time() - self.publish_end, min(self.received()) >= self.sched.acked

    def store_counts(self) -> tuple[int, list[int]]:
        """The store's own count, apart from the harness's: the messages stored in the
        topics, and each application's backlog in its subscription."""
        from filepulsar.admin import Admin

        topics = Admin(self.root).topics()
        stored = 0
        backlog = [0] * self.topo.apps
        for t in self.topics:
            stats = topics.get_stats(t)
            stored += stats["msgInCounter"]
            for a in range(self.topo.apps):
                sub = stats["subscriptions"].get(f"iot-application-{a}")
                backlog[a] += sub["msgBacklog"] if sub else 0
        return stored, backlog

    def stop(self) -> tuple[list[dict[str, Any]], float]:
        """Stop the applications: their final reports, and the coordinator's CPU time (s)
        since the start."""
        for app in self.apps:
            app.tell("stop")
        finals = [app.finish() for app in self.apps]
        self._stop_sampling.set()
        self._sampling.join()
        return finals, _cpu_s() - self._cpu0

    def kill(self) -> None:
        """End every role process still running (after a failure)."""
        for c in self.apps + self.gateways:
            if c.proc.poll() is None:
                c.proc.kill()
                c.proc.wait()


def run_topology(topo: Topology, *, out_dir: str = "bench/out") -> dict[str, Any]:
    """Run one topology end to end; its figures and time series (also written to
    ``out_dir``)."""
    base = tempfile.mkdtemp(prefix="fp-bench-iot-")
    run = _Run(topo, base)
    try:
        setup_s = run.start()
        gw_finals = run.publish()
        drain_s, drained = run.drain()
        app_finals, coordinator_cpu_s = run.stop()
        # Once the applications closed: their acknowledgements are all stored then (a running
        # one holds up to a second of them, as a broker's cursor does: client.md).
        stored, store_backlog = run.store_counts()
        states = [np.load(run.path(f"app{a}-state.npy")) for a in range(topo.apps)]
        e2e = np.concatenate([np.load(run.path(f"app{a}-e2e.npy")) for a in range(topo.apps)])
        pub = np.concatenate(
            [np.load(run.path(f"gw{g}-publish.npy")) for g in range(topo.gateways)]
        )
    finally:
        run.kill()
        shutil.rmtree(base, ignore_errors=True)

    sched = run.sched
    produced = sched.produced
    window = run.publish_end - run.measure_start
    published_total = int(produced.sum())
    app_rows = []
    for a, (fin, state) in enumerate(zip(app_finals, states, strict=True)):
        short = np.maximum(produced - state, 0)
        samples = run.app_samples[a]
        rate = (_at(samples, run.publish_end) - _at(samples, run.measure_start)) / window
        app_rows.append(
            {
                "app": a,
                "consume_rate_while_publishing": rate,
                "unique": fin["unique"],
                "duplicates": fin["duplicates"],
                "ordering_violations": fin["ordering_violations"],
                "invalid": fin["invalid"],
                # Not received at all by the drain's end; and, from the producers' final
                # state (how far each device got, tails included), short of in-order.
                "missing": max(0, published_total - fin["unique"]),
                "behind_in_order": int(short.sum()),
                "devices_short": int((short > 0).sum()),
                "restarts": fin["restarts"],
                "subscribe_s": fin["subscribe_s"],
                "subscribe_cpu_s": fin["subscribe_cpu_s"],
                "first_delivery_s": _or_nan(fin["first_delivery_s"]),
                "every_client_first_s": _or_nan(fin["every_client_first_s"]),
                # What the application's consumers saw of their leases (LeaseCounts): not in
                # the pass rule; lapses and removals are membership changes.
                "leases": fin.get("leases", {}),
                # Its push housekeeping passes (leases, records, grouped acknowledgements).
                "housekeeping": fin.get("housekeeping", {}),
                # Its CPU by kind of thread while it ran (push dispatcher, housekeeping,
                # consumers, other), in seconds.
                "threads_cpu_s": fin.get("threads_cpu_s", {}),
                # The interpreter settings it ran with (Topology.interpreter).
                "switch_interval_ms": fin["switch_interval_ms"],
                "gc_frozen": fin["gc_frozen"],
                "gc_threshold": fin["gc_threshold"],
                "errors": fin["errors"],
                "violation_samples": fin["violation_samples"][:5],
            }
        )
    publish_rate = sched.acked_measured / window
    slowest = min(r["consume_rate_while_publishing"] for r in app_rows)
    delivered = sum(r["unique"] for r in app_rows)
    sut_cpu = sum(f["cpu_s"] for f in gw_finals) + sum(f["cpu_s"] for f in app_finals)
    every = sum(
        r["missing"] == 0
        and r["behind_in_order"] == 0
        and r["ordering_violations"] == 0
        and r["invalid"] == 0
        and not r["errors"]
        for r in app_rows
    )
    passed = (
        every == topo.apps
        and sched.failed == 0
        and run.all_acked
        and stored == published_total
        and sum(f["sent"] for f in gw_finals) == topo.messages
    )

    def pct(xs: np.ndarray, q: float, scale: float = 1.0) -> float:
        return float(np.percentile(xs, q)) * scale if len(xs) else float("nan")

    figures = {
        "variant": topo.name,
        "topology": dataclasses.asdict(topo),
        "setup_s": setup_s,
        "messages": topo.messages,
        "published": published_total,
        "stored": stored,
        "store_backlog_after_drain": store_backlog,
        "send_failures": sched.failed,
        "publish_rate": publish_rate,
        "slowest_app_rate": slowest,
        "slowest_over_publish": slowest / publish_rate if publish_rate else 0.0,
        "e2e_p50_ms": pct(e2e, 50),
        "e2e_p99_ms": pct(e2e, 99),
        "publish_p50_ms": pct(pub, 50, 1000),
        "publish_p99_ms": pct(pub, 99, 1000),
        "cpu_ms_per_delivered": sut_cpu * 1000 / delivered if delivered else float("nan"),
        "cpu_s_gateways_and_apps": sut_cpu,
        "cpu_s_gateways": sum(f["cpu_s"] for f in gw_finals),
        "cpu_s_apps": sum(f["cpu_s"] for f in app_finals),
        "cpu_s_coordinator": coordinator_cpu_s,
        # Start-up (issue #27): the slowest application's subscription of every client over
        # every topic (before the start), and its clients' first deliveries after it.
        "subscribe_s_max": max(r["subscribe_s"] for r in app_rows),
        "every_client_first_s_max": max(r["every_client_first_s"] for r in app_rows),
        "housekeeping_pass_max_s": max(r["housekeeping"].get("max_s", 0.0) for r in app_rows),
        "drain_s": drain_s,
        "drained": drained,
        "apps_with_every_message": every,
        "ordering_violations": sum(r["ordering_violations"] for r in app_rows),
        "invalid": sum(r["invalid"] for r in app_rows),
        "missing": sum(r["missing"] for r in app_rows),
        "duplicates": sum(r["duplicates"] for r in app_rows),
        "restarts": sum(r["restarts"] for r in app_rows),
        "lease_lapses": sum(r["leases"].get("lapsed", 0) for r in app_rows),
        "lease_removals": sum(r["leases"].get("removed", 0) for r in app_rows),
        "passed": passed,
        "apps": app_rows,
        "measure_start": run.measure_start,
        "publish_end": run.publish_end,
        "series": run.series,
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"iot-{topo.name}.json"), "w") as f:
        json.dump(figures, f, indent=1)
    plot_series(figures, os.path.join(out_dir, f"iot-{topo.name}.png"))
    return figures


def _or_nan(x: float | None) -> float:
    return float("nan") if x is None else float(x)


def plot_series(figures: dict[str, Any], path: str) -> None:
    """Publish rate, each application's consume rate (above) and backlog (below) over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = figures["series"]
    if len(series) < 2:
        return
    t0 = series[0]["t"]
    ts = np.array([s["t"] - t0 for s in series])
    pub = np.array([s["published"] for s in series], dtype=float)
    rec = np.array([s["received"] for s in series], dtype=float)  # (samples, apps)
    dt = np.diff(ts)
    mid = ts[1:]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    for a in range(rec.shape[1]):
        ax1.plot(mid, np.diff(rec[:, a]) / dt, linewidth=0.7, alpha=0.6)
        ax2.plot(ts, pub - rec[:, a], linewidth=0.7, alpha=0.6)
    ax1.plot(mid, np.diff(pub) / dt, color="black", linewidth=1.6, label="publish rate")
    ax1.plot([], [], color="grey", linewidth=0.7, label="each application's consume rate")
    for ax in (ax1, ax2):
        for t in (figures["measure_start"], figures["publish_end"]):
            ax.axvline(t - t0, color="grey", linestyle="--", linewidth=0.8)
    ax1.set_ylabel("msg/s")
    ax1.legend(loc="upper right", fontsize=8)
    ax2.set_ylabel("backlog (published - received), msgs")
    ax2.set_xlabel("s since start (dashed: measurement start, publishing end)")
    verdict = "PASS" if figures["passed"] else "FAIL"
    ax1.set_title(
        f"{figures['variant']}: {verdict}; slowest app / publish rate "
        f"{figures['slowest_over_publish']:.2f}x, e2e p99 {figures['e2e_p99_ms']:.0f} ms",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


PASS_RULE = (
    "pass: every application receives every published message (unique, within the drain "
    "window), 0 ordering violations, 0 invalid, 0 missing, no failed send, the topics hold "
    "exactly the published messages; duplicates are counted and accepted"
)


def results(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """``make bench`` rows of one run."""
    v = figures["variant"]
    apps = figures["topology"]["apps"]
    rows: list[tuple[str, float, str, str | None]] = [
        ("publish rate achieved (measured window)", figures["publish_rate"], "msg/s", None),
        (
            "slowest application's consume rate / publish rate, while publishing",
            figures["slowest_over_publish"],
            "ratio",
            ">= 0.95",
        ),
        ("publish-to-receipt p50", figures["e2e_p50_ms"], "ms", "<= 100"),
        ("publish-to-receipt p99", figures["e2e_p99_ms"], "ms", "<= 1000"),
        ("publish (send_async to callback) p50", figures["publish_p50_ms"], "ms", None),
        ("publish (send_async to callback) p99", figures["publish_p99_ms"], "ms", "<= 50"),
        (
            "CPU per delivered message (gateways + apps)",
            figures["cpu_ms_per_delivered"],
            "ms",
            None,
        ),
        (
            "applications that received every message",
            figures["apps_with_every_message"],
            f"of {apps}",
            f">= {apps}",
        ),
        ("ordering violations", figures["ordering_violations"], "msgs", "<= 0"),
        ("invalid messages", figures["invalid"], "msgs", "<= 0"),
        (
            "missing messages (not received by the drain window's end, all apps)",
            figures["missing"],
            "msgs",
            "<= 0",
        ),
        ("duplicates (accepted)", figures["duplicates"], "msgs", None),
        ("drain after publishing", figures["drain_s"], "s", None),
        (
            "slowest application's subscribe (every client over every topic)",
            figures["subscribe_s_max"],
            "s",
            None,
        ),
        (
            "slowest application's first delivery to every client, after the start",
            figures["every_client_first_s_max"],
            "s",
            None,
        ),
        (
            "longest housekeeping pass (leases, records, acknowledgements; all apps)",
            figures["housekeeping_pass_max_s"],
            "s",
            None,
        ),
        (
            "consumer leases lapsed (all apps; each a membership change)",
            figures.get("lease_lapses", 0),
            "leases",
            None,
        ),
        ("pass", 1.0 if figures["passed"] else 0.0, "1 = pass", ">= 1"),
    ]
    out = []
    for name, value, unit, goal in rows:
        row: dict[str, Any] = {"name": f"iot {v}: {name}", "value": float(value), "unit": unit}
        if goal:
            row["goal"] = goal
        out.append(row)
    out[-1]["detail"] = PASS_RULE
    return out


def _goals_met(rows: list[dict[str, Any]]) -> str:
    met = total = 0
    for r in rows:
        if "goal" not in r:
            continue
        op, bound = r["goal"].split()
        total += 1
        met += r["value"] >= float(bound) if op == ">=" else r["value"] <= float(bound)
    return f"{met} of {total}"


def report(figures: dict[str, Any]) -> str:
    """A human summary of one run: the pass rule, the verdict, the figures."""
    topo = Topology(**figures["topology"])
    lines = [
        f"{topo.name}: {topo.describe()}",
        PASS_RULE,
        f"verdict: {'PASS' if figures['passed'] else 'FAIL'}; figures' goals met: "
        f"{_goals_met(results(figures))}",
        f"set-up {figures['setup_s']:.1f} s; published {figures['published']:,} of "
        f"{figures['messages']:,} ({figures['send_failures']} failed sends), "
        f"{figures['stored']:,} stored in the topics; subscriptions' stored backlog once the "
        f"applications closed "
        f"{sum(figures['store_backlog_after_drain']):,}; drain "
        f"{figures['drain_s']:.1f} s{'' if figures['drained'] else ' (window ended)'}; client "
        f"restarts {figures['restarts']}",
    ]
    for r in results(figures):
        goal = f"  (goal {r['goal']})" if "goal" in r else ""
        lines.append(f"  {r['name']:<92} {r['value']:>10.3f} {r['unit']}{goal}")
    for a in figures["apps"]:
        lines.append(
            f"  app {a['app']:>2}: {a['consume_rate_while_publishing']:8.1f} msg/s while "
            f"publishing, unique {a['unique']:,}, dup {a['duplicates']}, order "
            f"{a['ordering_violations']}, invalid {a['invalid']}, missing {a['missing']}, "
            f"restarts {a['restarts']}{', errors ' + str(a['errors']) if a['errors'] else ''}"
        )
        lines.append(
            f"          start-up: subscribed in {a['subscribe_s']:.1f} s "
            f"({a['subscribe_cpu_s']:.1f} s CPU); first delivery {a['first_delivery_s']:.1f} s "
            f"after the start, to every client {a['every_client_first_s']:.1f} s"
        )
        hk = a.get("housekeeping") or {}
        if hk.get("passes"):
            lines.append(
                f"          housekeeping: {hk['passes']} passes, mean "
                f"{hk['total_s'] / hk['passes']:.3f} s, longest {hk['max_s']:.1f} s, "
                f"{hk['over_1s']} of a second or more"
            )
        le = a.get("leases") or {}
        if le:
            lines.append(
                f"          leases: {le['renewals']} renewal commits, {le['extended']} leases "
                f"extended, {le['late']} renewals late, {le['lapsed']} lapsed, "
                f"{le['removed']} consumers removed as lapsed, {le['registered_again']} "
                f"registered again, {le.get('records', 0)} membership record commits "
                f"({le.get('records_folded', 0)} other consumers' records folded in)"
            )
    by_kind: dict[str, float] = {}
    for a in figures["apps"]:
        for k, v in (a.get("threads_cpu_s") or {}).items():
            by_kind[k] = by_kind.get(k, 0.0) + v
    unique = sum(a["unique"] for a in figures["apps"])
    ran = sorted(
        {(a["switch_interval_ms"], a["gc_frozen"] > 0, a["gc_threshold"]) for a in figures["apps"]}
    )
    if ran:
        lines.append(
            "  the applications ran with: "
            + "; ".join(
                f"switch interval {si:g} ms, {'gc frozen' if fz else 'gc not frozen'}, "
                f"gc young threshold {th}"
                for si, fz, th in ran
            )
        )
    if by_kind and unique:
        lines.append(
            "  applications' CPU per delivery by thread (while running): "
            + ", ".join(f"{k} {v * 1e6 / unique:.0f} us" for k, v in sorted(by_kind.items()))
        )
    lines.append(
        f"  CPU: gateways + apps {figures['cpu_s_gateways_and_apps']:.1f} s (gateways "
        f"{figures['cpu_s_gateways']:.1f} s, apps {figures['cpu_s_apps']:.1f} s), coordinator "
        f"{figures['cpu_s_coordinator']:.1f} s"
    )
    return "\n".join(lines)


def _exit_on_sigterm() -> None:
    """A terminated coordinator unwinds (its ``finally`` kills the role processes and removes
    the store) instead of vanishing; role processes end by themselves when their stdin
    closes."""

    def handler(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def run() -> list[dict[str, Any]]:
    _exit_on_sigterm()
    out: list[dict[str, Any]] = []
    for topo in (LOCAL_STEADY, LOCAL):
        figures = run_topology(topo)
        print(report(figures), file=sys.stderr, flush=True)
        out += results(figures)
    return out


def main(argv: list[str]) -> None:
    if len(argv) > 2 and argv[1] in ("gateway", "app"):
        cfg = json.loads(argv[2])
        (role_gateway if argv[1] == "gateway" else role_app)(cfg)
        return
    ap = argparse.ArgumentParser(
        prog="python -m bench.bench_iot", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--gateways", type=int, default=4)
    ap.add_argument("--topics", type=int, default=10)
    ap.add_argument("--apps", type=int, default=5)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--devices", type=int, default=10_000)
    ap.add_argument("--rate", type=int, default=500, help="msg/s")
    ap.add_argument("--warmup", type=float, default=5.0, help="s")
    ap.add_argument("--duration", type=float, default=30.0, help="s")
    ap.add_argument("--drain", type=float, default=60.0, help="s")
    ap.add_argument(
        "--restart",
        action="store_true",
        help="restart 10%% of each application's clients every 30 s",
    )
    ap.add_argument("--restart-interval", type=float, default=30.0, help="s")
    ap.add_argument("--restart-fraction", type=float, default=0.1)
    ap.add_argument("--name", default=None, help="variant name (files in bench/out)")
    ap.add_argument(
        "--switch-interval",
        type=float,
        default=0.0,
        metavar="MS",
        help="the applications' sys.setswitchinterval, in ms (0: Python's own, 5 ms)",
    )
    ap.add_argument(
        "--gc-freeze",
        action="store_true",
        help="the applications call gc.freeze() once their clients subscribed",
    )
    ap.add_argument(
        "--gc-threshold",
        type=int,
        default=0,
        metavar="N",
        help="the applications' gc young-generation threshold (0: Python's own, 700)",
    )
    ap.add_argument(
        "--variant",
        choices=[LOCAL_STEADY.name, LOCAL.name],
        help="run a named host-sized variant instead of the options above",
    )
    args = ap.parse_args(argv[1:])
    if args.variant:
        topo = LOCAL_STEADY if args.variant == LOCAL_STEADY.name else LOCAL
    else:
        name = args.name or (
            f"g{args.gateways}-t{args.topics}-a{args.apps}x{args.clients}-d{args.devices}"
            f"-r{args.rate}{'-restarts' if args.restart else ''}"
        )
        topo = Topology(
            name=name,
            gateways=args.gateways,
            topics=args.topics,
            apps=args.apps,
            clients=args.clients,
            devices=args.devices,
            rate_per_s=args.rate,
            warmup_s=args.warmup,
            duration_s=args.duration,
            drain_s=args.drain,
            restart_interval_s=args.restart_interval if args.restart else 0.0,
            restart_fraction=args.restart_fraction if args.restart else 0.0,
        )
    if args.switch_interval < 0:
        ap.error(f"--switch-interval must be >= 0 ms, got {args.switch_interval:g}")
    if args.gc_threshold < 0:
        ap.error(f"--gc-threshold must be >= 0, got {args.gc_threshold}")
    topo = dataclasses.replace(
        topo,
        switch_interval_ms=args.switch_interval,
        gc_freeze=args.gc_freeze,
        gc_threshold=args.gc_threshold,
    )
    if topo.tuned and not (args.name and not args.variant):  # (a run named by hand keeps it)
        si = f"-si{topo.switch_interval_ms:g}" if topo.switch_interval_ms > 0 else ""
        th = f"-gc{topo.gc_threshold}" if topo.gc_threshold > 0 else ""
        topo = dataclasses.replace(
            topo, name=topo.name + si + th + ("-frozen" if topo.gc_freeze else "")
        )
    _exit_on_sigterm()
    print(report(run_topology(topo)), flush=True)


if __name__ == "__main__":
    main(sys.argv)
