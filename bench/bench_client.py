"""Client benchmark (issue 3): one consumer's receive + acknowledge throughput.

Run: ``python -m bench.bench_client`` (or ``make bench``; ``--grouped-acks [N [TYPE]]``:
the grouped acknowledgements figures alone, over ``N`` entries, of a consumer of ``TYPE``:
``Shared``, ``KeyShared`` (the default), ...). 1M messages of 100 B are produced with
``send_table`` (1000 per batch entry: a producer with batching on), then one
Exclusive consumer from Earliest drains them with ``batch_receive`` (pulsar-client's default
policy: up to 10 MB or 100 ms per batch) and one ``acknowledge_cumulative`` per batch, on a
local disk. Further figures: the same reading every payload (``msg.data()``); batches of 1000
messages (one durable subscription commit, i.e. two fsyncs, per 1000 messages, so this one
follows the disk's fsync latency); ``receive`` + ``acknowledge`` per message on a smaller run;
and issue #27's grouped acknowledgements: one Key_Shared consumer fed by single-message
entries, ``receive`` + ``acknowledge`` per message with Pulsar's grouping (100 ms / 1000) and
with ``ack_grouping_time_ms=0`` (a commit per acknowledgement), back to back on one topic:
msg/s, CPU per message and their ratio (the ratio is the figure to read on a loaded host).
Then issue #27's point 4, what an application with several clients does: 1 and 4 Key_Shared
consumers of one subscription in one process (threads), 20k single-message entries with 64
keys, each thread ``receive`` + ``acknowledge`` per message (acks grouped): CPU per message
for each and their ratio (1.0 when the work per entry does not grow with the consumers); then
the same with Shared consumers (``--in-one-process [N]``: these figures alone); then 1 and 4
Shared consumers each in a process of their own, 10k entries, CPU per message after their
start-up (``--in-processes [N]``).
Both of those drain a prepared backlog; the live case times what an application does while
messages arrive: 300 msg/s sent one per entry over 10 topics, received and acknowledged one by
one by 1 and then 4 Key_Shared consumers in the same process (CPU per delivered message, the
producer's included, and the ratio).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from typing import Any

import numpy as np
import pyarrow as pa

from filepulsar.connector.client import (
    Client,
    ConsumerBatchReceivePolicy,
    ConsumerType,
    InitialPosition,
    Timeout,
)

N = 1_000_000
SIZE = 100
N_SINGLE = 20_000
N_GROUPED = 5_000
#: One commit per 1000 messages: bound by the subscription commit's fsyncs.
SMALL = ConsumerBatchReceivePolicy(1000, -1, 1000)


def _table(n: int) -> pa.Table:
    rng = np.random.default_rng(11)
    blob = rng.integers(0, 256, size=n * SIZE, dtype=np.uint8).tobytes()
    offsets = np.arange(0, (n + 1) * SIZE, SIZE, dtype=np.int32)
    values = pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(blob)]
    )
    return pa.table({"value": values})


def _drain(
    client: Client, sub: str, n: int, *, touch: bool, policy: ConsumerBatchReceivePolicy | None
) -> float:
    consumer = client.subscribe(
        "bench",
        sub,
        consumer_type=ConsumerType.Exclusive,
        initial_position=InitialPosition.Earliest,
        batch_receive_policy=policy,
    )
    got = 0
    t0 = time.perf_counter()
    while got < n:
        msgs = consumer.batch_receive()
        if not msgs:
            continue
        if touch:
            for m in msgs:
                m.data()
        consumer.acknowledge_cumulative(msgs[-1])
        got += len(msgs)
    dt = time.perf_counter() - t0
    consumer.close()
    return dt


def _drain_single(client: Client, n: int) -> float:
    consumer = client.subscribe(
        "bench",
        "single",
        consumer_type=ConsumerType.Shared,
        initial_position=InitialPosition.Earliest,
    )
    t0 = time.perf_counter()
    for _ in range(n):
        consumer.acknowledge(consumer.receive(5000))
    dt = time.perf_counter() - t0
    consumer.close()
    return dt


def _keyed_single_entries(client: Client, topic: str, n: int) -> None:
    """``n`` messages of 100 B with 64 keys, one message per entry (batching off)."""
    table = _table(n).append_column(
        "key", pa.array([f"device-{i % 64}" for i in range(n)], pa.string())
    )
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send_table(table)
    producer.close()


def _ack_each(
    client: Client,
    topic: str,
    sub: str,
    n: int,
    group_ms: int,
    kind: ConsumerType = ConsumerType.KeyShared,
) -> tuple[float, float]:
    """Wall and CPU seconds of ``receive`` + ``acknowledge`` of ``n`` messages by one
    consumer of type ``kind`` (its close, which writes the last group, included)."""
    consumer = client.subscribe(
        topic,
        sub,
        consumer_type=kind,
        initial_position=InitialPosition.Earliest,
        ack_grouping_time_ms=group_ms,
    )
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        consumer.acknowledge(consumer.receive(5000))
    consumer.close()
    return time.perf_counter() - t0, time.process_time() - c0


def grouped_acks(
    base: str, n: int = N_GROUPED, kind: ConsumerType = ConsumerType.KeyShared
) -> list[dict[str, Any]]:
    """Issue #27's figures: grouped acknowledgements against one commit per acknowledgement
    (one consumer of type ``kind``)."""
    client = Client(base)
    _keyed_single_entries(client, "iot", n)
    for sub in ("grouped", "each"):  # created before timing starts
        client.subscribe(
            "iot",
            sub,
            consumer_type=kind,
            initial_position=InitialPosition.Earliest,
        ).close()
    g_wall, g_cpu = _ack_each(client, "iot", "grouped", n, 100, kind)
    e_wall, e_cpu = _ack_each(client, "iot", "each", n, 0, kind)
    client.close()
    return [
        {
            "name": f"{kind.wire} receive + acknowledge, {n // 1000}k single-message entries, "
            "acks grouped (100 ms / 1000)",
            "value": n / g_wall,
            "unit": "msg/s",
            "cpu_us_per_msg": g_cpu / n * 1e6,
        },
        {
            "name": "same, ack_grouping_time_ms=0 (one commit per acknowledgement)",
            "value": n / e_wall,
            "unit": "msg/s",
            "cpu_us_per_msg": e_cpu / n * 1e6,
        },
        {
            "name": "grouped / one commit each: throughput ratio",
            "value": e_wall / g_wall,
            "unit": "x",
        },
        {
            "name": "one commit each / grouped: CPU per message ratio",
            "value": e_cpu / g_cpu,
            "unit": "x",
        },
    ]


N_THREADS = 20_000


class _Count:
    """A count shared by threads, as :func:`multiprocessing.Value` is by processes."""

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def get_lock(self) -> threading.Lock:
        return self._lock


def _take_until(consumer: Any, n: int, got: Any) -> None:
    """``receive`` + ``acknowledge`` one message at a time until ``n`` were received among
    the consumers counting into ``got`` (a :class:`_Count`, or a ``multiprocessing.Value``)."""
    while True:
        with got.get_lock():
            if got.value >= n:
                return
        try:
            m = consumer.receive(200)
        except Timeout:  # the others hold what is left
            continue
        consumer.acknowledge(m)
        with got.get_lock():
            got.value += 1


def _threads_drain(
    client: Client,
    topic: str,
    sub: str,
    threads: int,
    n: int,
    kind: ConsumerType = ConsumerType.KeyShared,
) -> tuple[float, float]:
    """Wall and CPU seconds of ``threads`` consumers of type ``kind`` of ``sub`` in this process,
    each on its own thread, receiving and acknowledging (one call each per message) until
    ``n`` messages were received among them (their closes, which write the last groups,
    included)."""
    consumers = [
        client.subscribe(
            topic,
            sub,
            consumer_type=kind,
            initial_position=InitialPosition.Earliest,
            consumer_name=f"c{i}",
        )
        for i in range(threads)
    ]
    got = _Count()
    t0, c0 = time.perf_counter(), time.process_time()
    workers = [threading.Thread(target=_take_until, args=(c, n, got)) for c in consumers]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for c in consumers:
        c.close()
    return time.perf_counter() - t0, time.process_time() - c0


def consumers_in_one_process(base: str, n: int = N_THREADS) -> list[dict[str, Any]]:
    """Issue #27, point 4: CPU per message with 1 and with 4 consumers in one process, of a
    Key_Shared subscription, then of a Shared one."""
    client = Client(base)
    out: list[dict[str, Any]] = []
    for kind in (ConsumerType.KeyShared, ConsumerType.Shared):
        # (A topic of its own for each type: entries the process read and cached for the
        # other type's runs would spare this one its reads.)
        topic = f"iot-{kind.wire}"
        _keyed_single_entries(client, topic, n)
        cpu = {}
        for threads in (1, 4):
            sub = f"{kind.wire}-{threads}"
            wall, cpu[threads] = _threads_drain(client, topic, sub, threads, n, kind)
            out.append(
                {
                    "name": f"{threads} {kind.wire} consumer(s) in one process, receive + "
                    f"acknowledge per message, {n // 1000}k single-message entries",
                    "value": n / wall,
                    "unit": "msg/s",
                    "cpu_us_per_msg": cpu[threads] / n * 1e6,
                }
            )
        out.append(
            {
                "name": f"{kind.wire}: 4 consumers / 1 consumer: CPU per message ratio",
                "value": cpu[4] / cpu[1],
                "unit": "x",
                "goal": "<= 1.2",
            }
        )
    client.close()
    return out


N_PROCESSES = 10_000


def _process_drain(root: str, name: str, n: int, got: Any, go: Any, cpu: Any, k: int) -> None:
    """One process of :func:`consumers_in_processes`: a Shared consumer ``name`` of ``s``
    that receives and acknowledges until ``n`` messages were received among the processes
    (``got``), timed from when every process is subscribed (``go``, a barrier): its CPU
    seconds in ``cpu[k]``."""
    client = Client(root)
    consumer = client.subscribe(
        "iot",
        "s",
        consumer_type=ConsumerType.Shared,
        initial_position=InitialPosition.Earliest,
        consumer_name=name,
    )
    go.wait()
    c0 = time.process_time()
    _take_until(consumer, n, got)
    consumer.close()
    cpu[k] = time.process_time() - c0
    client.close()


def consumers_in_processes(base: str, n: int = N_PROCESSES) -> list[dict[str, Any]]:
    """CPU per message of 1 and of 4 Shared consumers of one subscription, each in a
    process of its own (a service's workers), ``receive`` + ``acknowledge`` per message,
    ``n`` single-message entries, timed from when every process has subscribed (a barrier:
    their start-up is not counted, their first ``receive``'s lazy work is)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    out: list[dict[str, Any]] = []
    cpu_of: dict[int, float] = {}
    for procs in (1, 4):
        root = f"{base}/{procs}"
        client = Client(root)
        client.subscribe(
            "iot", "s", consumer_type=ConsumerType.Shared, initial_position=InitialPosition.Earliest
        ).close()
        _keyed_single_entries(client, "iot", n)
        client.close()
        got, go, cpu = ctx.Value("i", 0), ctx.Barrier(procs + 1), ctx.Array("d", procs)
        workers = [
            ctx.Process(target=_process_drain, args=(root, f"c{k}", n, got, go, cpu, k))
            for k in range(procs)
        ]
        for w in workers:
            w.start()
        go.wait()  # (every process subscribed: their start-up is not timed)
        t0 = time.perf_counter()
        for w in workers:
            w.join()
        wall = time.perf_counter() - t0
        cpu_of[procs] = sum(cpu)
        out.append(
            {
                "name": f"{procs} Shared consumer(s), a process each, receive + acknowledge per "
                f"message, {n // 1000}k single-message entries",
                "value": n / wall,
                "unit": "msg/s",
                "cpu_us_per_msg": cpu_of[procs] / n * 1e6,
            }
        )
    out.append(
        {
            "name": "Shared: 4 processes / 1 process: CPU per message ratio",
            "value": cpu_of[4] / cpu_of[1],
            "unit": "x",
        }
    )
    return out


class LiveConsumers:
    """``n`` Key_Shared consumers of subscription ``app`` over ``topics`` in this process,
    each ``receive`` + ``acknowledge`` per message on its own thread (started here);
    :attr:`got` counts the delivered messages; :meth:`finish` waits (30 s at most) for
    ``sent`` of them, stops and closes everything and returns how many arrived. With
    ``e2e``, each payload starts with its send instant (``time.time_ns()``, 8 bytes little
    endian) and :attr:`e2e_ms` collects each message's send-to-receipt time."""

    def __init__(self, client: Client, topics: list[str], n: int, *, e2e: bool = False) -> None:
        self.client = client
        self._topics = topics
        self.subs = [self._subscribe(i) for i in range(n)]
        self.got = 0
        self.restarts = 0
        self.e2e_ms: list[float] = []
        self._e2e = e2e
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stops = [threading.Event() for _ in self.subs]
        self._workers = [
            threading.Thread(target=self._consume, args=(c, stop))
            for c, stop in zip(self.subs, self._stops, strict=True)
        ]
        for w in self._workers:
            w.start()

    def _subscribe(self, i: int) -> Any:
        return self.client.subscribe(
            self._topics,
            "app",
            consumer_type=ConsumerType.KeyShared,
            initial_position=InitialPosition.Earliest,
            consumer_name=f"c{i}",
        )

    def restart(self, i: int) -> None:
        """Close consumer ``i`` (its thread stopped first: everything it received is
        acknowledged, and its close writes the acknowledgements it grouped) and subscribe it
        again under the same name, as bench_iot's restart variant restarts a client."""
        self._stops[i].set()
        self._workers[i].join()
        self.subs[i].close()
        self.subs[i] = self._subscribe(i)
        self._stops[i] = threading.Event()
        self._workers[i] = threading.Thread(
            target=self._consume, args=(self.subs[i], self._stops[i])
        )
        self._workers[i].start()
        self.restarts += 1

    def _consume(self, c: Any, stop: threading.Event) -> None:
        while not self._stop.is_set() and not stop.is_set():
            try:
                m = c.receive(100)
            except Timeout:
                continue
            if self._e2e:
                sent_ns = int.from_bytes(m.data()[:8], "little")
                self.e2e_ms.append((time.time_ns() - sent_ns) / 1e6)  # (list.append: atomic)
            c.acknowledge(m)
            with self._lock:
                self.got += 1

    def wait_for(self, sent: int) -> None:
        deadline = time.perf_counter() + 30
        while self.got < sent and time.perf_counter() < deadline:
            time.sleep(0.01)  # the consumers catch up (their receive wakes on each commit)

    def finish(self, sent: int) -> int:
        self._stop.set()
        for w in self._workers:
            w.join()
        for c in self.subs:
            c.close()
        self.client.close()
        if self.got < sent:
            raise RuntimeError(f"live traffic: {self.got} of {sent} messages delivered")
        return self.got


def _live(base: str, *, rate: int, topics: int, consumers: int, seconds: float) -> float:
    """CPU seconds per delivered message (the producer included) of live traffic in one
    process: a producer sends ``rate`` keyed messages a second over ``topics`` topics, one
    message per entry (as one send per device in flight leaves nothing to batch), while
    ``consumers`` Key_Shared consumers of one subscription over all the topics each
    ``receive`` and ``acknowledge`` every message on its own thread."""
    client = Client(base)
    names = [f"live-{i}" for i in range(topics)]
    producers = [client.create_producer(t, batching_enabled=False) for t in names]
    live = LiveConsumers(client, names, consumers)
    sent = 0
    t0, c0 = time.perf_counter(), time.process_time()
    while (elapsed := time.perf_counter() - t0) < seconds:
        while sent < int(elapsed * rate):
            producers[sent % topics].send_async(b"x" * 64, None, partition_key=f"d{sent % 1000}")
            sent += 1
        time.sleep(0.002)  # paces the producer at ``rate``: load, not synchronisation
    for p in producers:
        p.flush()
    live.wait_for(sent)
    cpu = time.process_time() - c0
    return cpu / live.finish(sent)


def live_key_shared(base: str) -> list[dict[str, Any]]:
    """Issue #27, live traffic: 300 msg/s over 10 topics to 1 and to 4 Key_Shared consumers
    in one process, 8 s each, receive + acknowledge per message."""
    one = _live(f"{base}/one", rate=300, topics=10, consumers=1, seconds=8)
    four = _live(f"{base}/four", rate=300, topics=10, consumers=4, seconds=8)
    return [
        {
            "name": "live: 300 msg/s over 10 topics, 1 Key_Shared consumer, CPU per delivered "
            "message (the producer included)",
            "value": one * 1e6,
            "unit": "us",
        },
        {
            "name": "live: same, 4 Key_Shared consumers of one subscription in one process",
            "value": four * 1e6,
            "unit": "us",
        },
        {
            "name": "live: 4 consumers / 1 consumer, CPU per message",
            "value": four / one,
            "unit": "x",
        },
    ]


def run() -> list[dict[str, Any]]:
    base = tempfile.mkdtemp(prefix="fp-bench-client-")
    try:
        client = Client(base)
        table = _table(N)
        producer = client.create_producer("bench", batching_enabled=True)
        producer.send_table(table)
        producer.close()
        # Subscriptions are created before timing starts; each drains the same 1M messages.
        t_batch = min(_drain(client, f"b{i}", N, touch=False, policy=None) for i in range(2))
        t_touch = _drain(client, "touch", N, touch=True, policy=None)
        t_small = _drain(client, "small", N, touch=False, policy=SMALL)
        t_single = _drain_single(client, N_SINGLE)
        client.close()
        grouped = grouped_acks(f"{base}/grouped")
        grouped += consumers_in_one_process(f"{base}/threads")
        grouped += consumers_in_processes(f"{base}/procs")
        grouped += live_key_shared(f"{base}/live")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return [
        {
            "name": "consumer batch_receive (default policy) + ack_cumulative, 1M x 100 B",
            "value": N / t_batch / 1e6,
            "unit": "M msg/s",
            "goal": ">= 0.3",
        },
        {
            "name": "same, reading every payload (msg.data())",
            "value": N / t_touch / 1e6,
            "unit": "M msg/s",
        },
        {
            "name": "batch_receive of 1000 messages + ack_cumulative (1000 commits)",
            "value": N / t_small / 1e6,
            "unit": "M msg/s",
        },
        {
            "name": f"consumer receive + acknowledge per message, {N_SINGLE // 1000}k (Shared)",
            "value": N_SINGLE / t_single / 1e6,
            "unit": "M msg/s",
        },
        *grouped,
    ]


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--in-processes"]:  # Shared consumers a process each [N entries]
        tmp = tempfile.mkdtemp(prefix="fp-bench-procs-")
        try:
            rows = consumers_in_processes(tmp, *map(int, sys.argv[2:3]))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    elif sys.argv[1:2] == ["--in-one-process"]:  # issue #27's point 4 alone [N entries]
        tmp = tempfile.mkdtemp(prefix="fp-bench-threads-")
        try:
            rows = consumers_in_one_process(tmp, *map(int, sys.argv[2:3]))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    elif sys.argv[1:2] == ["--grouped-acks"]:  # issue #27's figures alone [N entries [type]]
        tmp = tempfile.mkdtemp(prefix="fp-bench-acks-")
        n = int(sys.argv[2]) if len(sys.argv) > 2 else N_GROUPED
        kind = ConsumerType[sys.argv[3]] if len(sys.argv) > 3 else ConsumerType.KeyShared
        try:
            rows = grouped_acks(tmp, n, kind)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    else:
        rows = run()
    for row in rows:
        goal = f"  (goal {row['goal']})" if "goal" in row else ""
        cpu = f"  ({row['cpu_us_per_msg']:.0f} us CPU/msg)" if "cpu_us_per_msg" in row else ""
        print(f"{row['name']:<75} {row['value']:>8.3f} {row['unit']}{goal}{cpu}")
