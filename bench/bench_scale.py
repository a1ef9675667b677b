"""Scale benchmarks (issue 14): costs that must not grow with a topic's history.

Three topics are built with 10, 1,000 and 10,000 closed ledgers (one entry each; the history
is written through the storage API directly -- one data blob, one index per ledger, one
manifest commit -- which is what thousands of rollovers would have left, minutes faster).
Then, one step on each topic in turn, so the machine's other load falls on every topic alike:

1. commit cost: the latency of ``Producer.send()`` (batching off: one commit per message);
2. consumer fetch cost: a Shared subscription's ``fetch`` + ``acknowledge`` of a message just
   published (two subscription commits and a read of the newest entry);
3. Spark trigger cost: the driver-side work of one micro-batch of one new message, as Spark
   calls it (``latestOffset``, ``partitions``, ``read``, ``commit`` of the stream reader;
   without the JVM, whose share of a trigger does not depend on the topic).

Figures are medians; the ratios compare 10,000 (and 1,000) closed ledgers against 10. Goal
(issue 14): <= 1.2.

Concurrent processes (each a fresh ``python -m bench.bench_scale <role>``, set up first, then
started together through a line on its stdin; rounds of 1, 2, 4, 8 processes in turn, medians):

4. 1-8 producer processes on one partition, and on 8 partitions (process i writes partition
   i), each calling ``send()`` with batching off (one durable commit per message) for a fixed
   window: aggregate msg/s. Goals (issue 14, 2 cores): 8 on 8 partitions >= 1.5x one
   producer, 8 on one partition >= 0.8x one producer;
5. the ceiling: 1-8 bare processes appending 100 bytes + ``fsync`` to a file each, in a loop;
6. 1-8 Shared consumers on one subscription draining a topic (``batch_receive`` + one
   ``acknowledge`` of the batch): aggregate msg/s from the start to the last acknowledgement.

Object-store requests (7): messages produced with ``send_async`` (default batching) and
consumed by an Exclusive consumer (``batch_receive`` + ``acknowledge_cumulative``) on S3 (moto
server on 127.0.0.1), every HTTP request counted by a botocore ``before-send`` hook on the
store's s3fs client, scaled to 1M messages and priced at S3's list prices (``PRICE_PER_1K``).

Run: ``python -m bench.bench_scale [history|procs|s3]`` (or ``make bench``).
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
import uuid
from typing import Any

SIZES = (10, 1_000, 10_000)
ROUNDS = 12
PER_ROUND = 15
TOPIC = "scale"


def build_history(root: str, closed: int) -> None:
    """A topic whose manifest lists ``closed`` closed ledgers of one entry each."""
    from filepulsar.storage import ManagedLedger, Producer, TopicName, open_blob_store, paths
    from filepulsar.storage.fragments import Fragment
    from filepulsar.storage.ledger import encode_index
    from filepulsar.storage.manifest import LedgerInfo, ManifestState
    from filepulsar.storage.policies import set_topic_policies

    store = open_blob_store(root)
    set_topic_policies(store, TOPIC, retention_time_minutes=-1, retention_size_mb=-1)
    with Producer(store, TOPIC, batching_enabled=False) as p:
        p.send(b"x" * 100)
    topic = TopicName.parse(TOPIC)
    ml = ManagedLedger(store, topic)
    frag = ml.state().ledgers[-1].fragments[0]  # type: ignore[index]
    indexes = []
    for i in range(closed):
        f = Fragment(
            frag.blob, 0, 1, frag.offset, frag.length, 1, frag.min_publish, frag.max_publish
        )
        key = paths.ledger_index(topic, i, 1, uuid.uuid4().hex)
        # Plain file writes (no fsync per file): the history is set-up, not measured.
        path = os.path.join(root, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(encode_index(i, [f]))
        indexes.append(key[len(paths.topic_dir(topic)) + 1 :])

    def change(state: ManifestState) -> None:
        now = ml.clock()
        state.ledgers = [
            LedgerInfo(i, 1, 1, frag.length, now, now, frag.min_publish, frag.max_publish, None, ix)
            for i, ix in enumerate(indexes)
        ]
        state.next_ledger_id = closed

    ml.manifest.commit(change)


def _median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1000


def history_costs() -> list[dict[str, Any]]:
    """Commit, fetch and trigger cost at 10 / 1,000 / 10,000 closed ledgers."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from filepulsar.connector.source.stream import FilePulsarStreamReader
    from filepulsar.storage import Producer, TopicName, open_blob_store
    from filepulsar.storage.subscription import SubscriptionConsumer

    base = tempfile.mkdtemp(prefix="fp-bench-scale-")
    try:
        roots = {n: os.path.join(base, f"h{n}") for n in SIZES}
        t0 = time.perf_counter()
        for n, root in roots.items():
            build_history(root, n)
        build_s = time.perf_counter() - t0
        stores = {n: open_blob_store(roots[n]) for n in SIZES}
        producers = {n: Producer(stores[n], TOPIC, batching_enabled=False) for n in SIZES}
        consumers = {
            n: SubscriptionConsumer(stores[n], TopicName.parse(TOPIC), "bench", sub_type="Shared")
            for n in SIZES
        }
        readers = {
            n: FilePulsarStreamReader(
                {"path": roots[n], "topic": TOPIC, "startingOffsets": "latest"},
                None,  # type: ignore[arg-type]
            )
            for n in SIZES
        }
        starts = {n: readers[n].initialOffset() for n in SIZES}
        send: dict[int, list[float]] = {n: [] for n in SIZES}
        fetch: dict[int, list[float]] = {n: [] for n in SIZES}
        trig: dict[int, list[float]] = {n: [] for n in SIZES}
        for r in range(ROUNDS + 1):  # round 0 warms caches up and is not counted
            for _ in range(PER_ROUND):
                for n in SIZES:  # one step on each topic in turn: load falls on all alike
                    p, c, rd = producers[n], consumers[n], readers[n]
                    a = time.perf_counter()
                    p.send(b"y" * 100)
                    b = time.perf_counter()
                    ds = c.fetch(10)
                    c.acknowledge([(d.position, -1, 1) for d in ds])
                    e = time.perf_counter()
                    assert len(ds) == 1, ds
                    end = rd.latestOffset(starts[n], ReadAllAvailable())
                    rows = 0
                    for part in rd.partitions(starts[n], end):
                        rows += sum(batch.num_rows for batch in rd.read(part))
                    rd.commit(end)
                    starts[n] = end
                    g = time.perf_counter()
                    assert rows == 1, rows
                    if r:
                        send[n].append(b - a)
                        fetch[n].append(e - b)
                        trig[n].append(g - e)
        for n in SIZES:
            producers[n].close()
            consumers[n].close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out: list[dict[str, Any]] = [
        {
            "name": "scale: building 10 + 1,000 + 10,000 closed ledgers",
            "value": build_s,
            "unit": "s",
        }
    ]
    for what, data in (
        ("commit cost (send() latency)", send),
        ("consumer fetch + ack cost", fetch),
        ("Spark trigger cost (driver, 1-message batch)", trig),
    ):
        for n in SIZES:
            out.append(
                {
                    "name": f"scale: {what} at {n:,} closed ledgers",
                    "value": _median_ms(data[n]),
                    "unit": "ms",
                }
            )
        for n in SIZES[1:]:
            out.append(
                {
                    "name": f"scale: {what}, {n:,} / 10 closed ledgers",
                    "value": statistics.median(data[n]) / statistics.median(data[SIZES[0]]),
                    "unit": "ratio",
                    "goal": "<= 1.2",
                }
            )
    return out


# --- Concurrent processes -------------------------------------------------------------------

#: Process counts of the concurrency figures.
PROCS = (1, 2, 4, 8)
#: Measured window of each producer run, in seconds, and rounds (medians are reported: one
#: producer's rate alone moves by 20% between runs here, with the disk's flush time).
WINDOW_S = 2.0
PROC_ROUNDS = 5
CONSUME_ROUNDS = 2
#: Messages the Shared-consumer runs drain, and messages per batch entry.
CONSUME_N = 20_000
CONSUME_BATCH = 50
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _spawn(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.bench_scale", *args],
        cwd=_REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _run_workers(argvs: list[list[str]]) -> list[dict[str, float]]:
    """Start one process per argv, wait until every one is set up (it prints ``ready``), then
    start them together (a line on stdin) and collect each one's JSON result line."""
    procs = [_spawn(a) for a in argvs]
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"bench worker failed to start: {line!r}")
    go = time.time() + 0.2
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(f"{go}\n")
        p.stdin.flush()
    out = []
    for p in procs:
        assert p.stdout is not None
        out.append(json.loads(p.stdout.readline()))
        p.wait()
        if p.returncode:
            raise RuntimeError(f"bench worker exited with {p.returncode}")
    return out


def _wait_go() -> float:
    print("ready", flush=True)
    go = float(sys.stdin.readline())
    time.sleep(max(0.0, go - time.time()))  # the common start instant of all workers
    return go


def worker_produce(root: str, topic: str, seconds: float) -> None:
    """Send 100-byte messages with ``send()`` (batching off: one commit per message, acked on
    return) for ``seconds``; print the count."""
    from filepulsar.storage import Producer, open_blob_store

    with Producer(open_blob_store(root), topic, batching_enabled=False) as p:
        p.send(b"w" * 100)  # warm-up (first commit after the producer joined)
        go = _wait_go()
        n = 0
        end = go + seconds
        while time.time() < end:
            p.send(b"x" * 100)
            n += 1
        done = time.time()
    print(json.dumps({"n": n, "start": go, "end": done}), flush=True)


def worker_fsync(path: str, seconds: float) -> None:
    """The ceiling: append 100 bytes and fsync, in a loop, to one file of this process."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    go = _wait_go()
    n = 0
    end = go + seconds
    while time.time() < end:
        os.write(fd, b"x" * 100)
        os.fsync(fd)
        n += 1
    done = time.time()
    os.close(fd)
    print(json.dumps({"n": n, "start": go, "end": done}), flush=True)


def worker_consume(root: str, topic: str) -> None:
    """A Shared consumer: ``batch_receive`` + ``acknowledge`` of the batch until the
    subscription has nothing left for 1 s; print the count and the last acknowledgement's
    time."""
    from filepulsar.connector.client import (
        Client,
        ConsumerBatchReceivePolicy,
        ConsumerType,
        InitialPosition,
    )

    client = Client(root)
    consumer = client.subscribe(
        topic,
        "scale",
        consumer_type=ConsumerType.Shared,
        initial_position=InitialPosition.Earliest,
        batch_receive_policy=ConsumerBatchReceivePolicy(1000, -1, 100),
    )
    go = _wait_go()
    n = 0
    last = go
    idle_since = None
    while True:
        msgs = consumer.batch_receive()
        if msgs:
            consumer.acknowledge(msgs)
            n += len(msgs)
            last = time.time()
            idle_since = None
        else:
            idle_since = idle_since or time.time()
            if time.time() - idle_since > 1.0:
                break
    consumer.close()
    client.close()
    print(json.dumps({"n": n, "start": go, "end": last}), flush=True)


def _rate(results: list[dict[str, float]]) -> float:
    total = sum(r["n"] for r in results)
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    return total / span


def concurrency() -> list[dict[str, Any]]:
    """Aggregate msg/s of 1-8 producer processes (one partition, 8 partitions, bare fsync
    ceiling) and of 1-8 Shared consumer processes on one subscription."""
    from filepulsar.storage import Producer, create_topic, open_blob_store

    out: list[dict[str, Any]] = []
    base = tempfile.mkdtemp(prefix="fp-bench-procs-")
    runs: dict[str, dict[int, list[float]]] = {
        what: {k: [] for k in PROCS} for what in ("one", "eight", "bare", "cons")
    }
    try:
        # Rounds of every process count in turn: the machine's other load falls on all alike,
        # and the medians of the rounds are reported.
        for r in range(PROC_ROUNDS):
            for k in PROCS:
                root = os.path.join(base, f"p{r}-{k}")
                store = open_blob_store(root)
                create_topic(store, "one")
                create_topic(store, "eight", partitions=8)
                runs["one"][k].append(
                    _rate(_run_workers([["produce", root, "one", str(WINDOW_S)]] * k))
                )
                # Process i writes partition i (a producer per partition, as a partitioned
                # topic's producers spread over its partitions).
                runs["eight"][k].append(
                    _rate(
                        _run_workers(
                            [
                                ["produce", root, f"eight-partition-{i}", str(WINDOW_S)]
                                for i in range(k)
                            ]
                        )
                    )
                )
                runs["bare"][k].append(
                    _rate(
                        _run_workers(
                            [
                                ["fsync", os.path.join(root, f"bare-{i}"), str(WINDOW_S)]
                                for i in range(k)
                            ]
                        )
                    )
                )
                if r < CONSUME_ROUNDS:
                    topic = f"c{k}"
                    with Producer(store, topic, batching_max_messages=CONSUME_BATCH) as p:
                        for _ in range(CONSUME_N):
                            p.send_async(b"c" * 100, None)
                        p.flush()
                    results = _run_workers([["consume", root, topic] for _ in range(k)])
                    got = sum(res["n"] for res in results)
                    if got != CONSUME_N:
                        raise RuntimeError(f"Shared consumers received {got} of {CONSUME_N}")
                    runs["cons"][k].append(_rate(results))
                shutil.rmtree(root, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    rates = {
        what: {k: statistics.median(v) for k, v in by_k.items()} for what, by_k in runs.items()
    }
    labels = {
        "one": "producer processes on one partition, send() (batching off)",
        "eight": "producer processes on 8 partitions (one each), send() (batching off)",
        "bare": "bare processes appending 100 B + fsync, a file each (ceiling)",
        "cons": f"Shared consumers on one subscription (batch_receive + ack, {CONSUME_BATCH}/entry)",  # noqa: E501
    }
    for what, label in labels.items():
        for k in PROCS:
            out.append({"name": f"scale: {k} {label}", "value": rates[what][k], "unit": "msg/s"})
    out.append(
        {
            "name": "scale: 8 producers on 8 partitions / 1 producer (aggregate msg/s)",
            "value": rates["eight"][8] / rates["eight"][1],
            "unit": "ratio",
            "goal": ">= 1.5",
        }
    )
    out.append(
        {
            "name": "scale: 8 producers on one partition / 1 producer (aggregate msg/s)",
            "value": rates["one"][8] / rates["one"][1],
            "unit": "ratio",
            "goal": ">= 0.8",
        }
    )
    out.append(
        {
            "name": "scale: bare fsync ceiling, 8 processes / 1 process",
            "value": rates["bare"][8] / rates["bare"][1],
            "unit": "ratio",
        }
    )
    for k in (1, 8):
        out.append(
            {
                "name": f"scale: {k} producer(s) on {min(k, 8)} partition(s) / bare fsync ceiling",
                "value": rates["eight"][k] / rates["bare"][k],
                "unit": "ratio",
            }
        )
    return out


# --- Object-store requests --------------------------------------------------------------

#: Messages produced and consumed in the S3 run (the figures are scaled to 1M: moto on one
#: machine serves a few hundred requests a second, so a 1M run would take many minutes;
#: every request count here grows linearly with the messages, as each comes per batch).
S3_N = 100_000
#: S3 Standard list prices, us-east-1 (https://aws.amazon.com/s3/pricing/, "Requests & data
#: retrievals"): PUT, COPY, POST, LIST $0.005 per 1,000; GET, SELECT and all other requests
#: (HEAD among them) $0.0004 per 1,000; DELETE free.
PRICE_PER_1K = {"PUT/POST/LIST": 0.005, "GET/HEAD": 0.0004, "DELETE": 0.0}
_CLASSES = {
    "PutObject": "PUT/POST/LIST",
    "CopyObject": "PUT/POST/LIST",
    "CreateMultipartUpload": "PUT/POST/LIST",
    "UploadPart": "PUT/POST/LIST",
    "CompleteMultipartUpload": "PUT/POST/LIST",
    "ListObjectsV2": "PUT/POST/LIST",
    "ListObjects": "PUT/POST/LIST",
    "DeleteObject": "DELETE",
    "DeleteObjects": "DELETE",
}


class RequestCounter:
    """Counts the HTTP requests s3fs sends (botocore's ``before-send`` event: every attempt,
    retries included), by operation name."""

    def __init__(self) -> None:
        self.ops: dict[str, int] = {}

    def __call__(self, event_name: str, **_: Any) -> None:
        op = event_name.rsplit(".", 1)[-1]
        self.ops[op] = self.ops.get(op, 0) + 1

    def take(self) -> dict[str, int]:
        ops, self.ops = self.ops, {}
        return ops


def _by_class(ops: dict[str, int]) -> dict[str, int]:
    out = dict.fromkeys(PRICE_PER_1K, 0)
    for op, n in ops.items():
        out[_CLASSES.get(op, "GET/HEAD")] += n
    return out


def s3_costs() -> list[dict[str, Any]]:
    """Requests per 1M messages produced (``send_async``, default batching) and consumed
    (Exclusive, ``batch_receive`` + ``acknowledge_cumulative``) on S3 (moto server on
    127.0.0.1), and their cost at S3's list prices."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    from filepulsar.connector.client import Client, ConsumerType, InitialPosition

    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        os.environ.setdefault(name, value)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=url, region_name="us-east-1").create_bucket(Bucket="bench")
        options = {
            "endpoint_url": url,
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"region_name": "us-east-1"},
        }
        client = Client("s3://bench/root", storage_options=options)
        counter = RequestCounter()
        fs = client.store._fs  # the bench hooks the store's s3fs client
        fs.connect()
        fs.s3.meta.events.register("before-send.s3", counter)
        producer = client.create_producer("cost")
        consumer = client.subscribe(
            "cost",
            "cost",
            consumer_type=ConsumerType.Exclusive,
            initial_position=InitialPosition.Earliest,
        )
        counter.take()
        t0 = time.perf_counter()
        for _ in range(S3_N):
            producer.send_async(b"s" * 100, None)
        producer.flush()
        produce_s = time.perf_counter() - t0
        produced = counter.take()
        t0 = time.perf_counter()
        got = 0
        while got < S3_N:
            msgs = consumer.batch_receive()
            if msgs:
                consumer.acknowledge_cumulative(msgs[-1])
                got += len(msgs)
        consume_s = time.perf_counter() - t0
        consumed = counter.take()
        producer.close()
        consumer.close()
        client.close()
    finally:
        server.stop()
    scale = 1_000_000 / S3_N
    out: list[dict[str, Any]] = []
    for what, ops, secs in (("produced", produced, produce_s), ("consumed", consumed, consume_s)):
        classes = _by_class(ops)
        cost = sum(classes[c] * scale * PRICE_PER_1K[c] / 1000 for c in classes)
        detail = ", ".join(f"{op} {n * scale:,.0f}" for op, n in sorted(ops.items()))
        out.append(
            {
                "name": f"scale: S3 requests per 1M messages {what} (x{scale:g} of {S3_N:,})",
                "value": sum(ops.values()) * scale,
                "unit": "requests",
                "detail": detail,
            }
        )
        out.append(
            {
                "name": f"scale: S3 request cost per 1M messages {what}, list prices",
                "value": cost,
                "unit": "USD",
            }
        )
        out.append(
            {
                "name": f"scale: S3 (moto) {what} rate, {S3_N:,} x 100 B",
                "value": S3_N / secs,
                "unit": "msg/s",
            }
        )
    return out


def run() -> list[dict[str, Any]]:
    return history_costs() + concurrency() + s3_costs()


def main(argv: list[str]) -> None:
    cmd = argv[1] if len(argv) > 1 else "all"
    if cmd == "produce":
        worker_produce(argv[2], argv[3], float(argv[4]))
    elif cmd == "fsync":
        worker_fsync(argv[2], float(argv[3]))
    elif cmd == "consume":
        worker_consume(argv[2], argv[3])
    else:
        parts = {"history": history_costs, "procs": concurrency, "s3": s3_costs}
        rows = run() if cmd == "all" else parts[cmd]()
        for row in rows:
            goal = f"  (goal {row['goal']})" if "goal" in row else ""
            print(f"{row['name']:<90} {row['value']:>10.3f} {row['unit']}{goal}", flush=True)


if __name__ == "__main__":
    main(sys.argv)
