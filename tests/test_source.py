"""The Spark source end to end: real local Spark, AvailableNow, the memory sink."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from filepulsar.connector.source.options import SourceOptions
from filepulsar.connector.source.stream import FilePulsarStreamReader
from filepulsar.storage import (
    ManagedLedger,
    Producer,
    TopicName,
    create_topic,
    open_blob_store,
    set_topic_policies,
)
from filepulsar.storage.errors import ConsumerBusy, InvalidConfiguration, SubscriptionNotFound
from filepulsar.storage.subscriptions import SubscriptionStore

pytestmark = pytest.mark.spark


def run_stream(spark: Any, root: str, ckpt: str, **options: Any) -> tuple[list[Any], list[int]]:
    """Run one AvailableNow query; rows are collected per micro-batch on the driver
    (foreachBatch, which unlike the memory sink can restart from a checkpoint)."""
    rows: list[Any] = []
    reader = spark.readStream.format("filepulsar")
    for k, v in options.items():
        reader = reader.option(k, v)
    q = (
        reader.load(root)
        .writeStream.foreachBatch(lambda df, _id: rows.extend(df.collect()))
        .option("checkpointLocation", ckpt)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    return rows, [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]


def produce(root: str, topic: str, n: int, start: int = 0, **kw: Any) -> None:
    store = open_blob_store(root)
    with Producer(store, topic, **kw) as p:
        for i in range(start, start + n):
            p.send_async(
                b"v%d" % i,
                partition_key=f"k{i % 7}",
                properties={"i": str(i), "tag": "even" if i % 2 == 0 else "odd"},
                event_timestamp=1_600_000_000_000 + i,
            )


def test_every_column_and_order_per_partition(spark: Any, tmp_path: Any) -> None:
    root = str(tmp_path / "root")
    create_topic(open_blob_store(root), "cols", partitions=3)
    produce(root, "cols", 300)
    rows, _ = run_stream(
        spark, root, str(tmp_path / "ck"), topic="cols", startingOffsets="earliest"
    )
    assert len(rows) == 300
    by_part: dict[int, list[Any]] = {}
    for r in rows:
        by_part.setdefault(r.partition, []).append(r)
    for rs in by_part.values():
        ids = [(r.ledgerId, r.entryId, r.batchIndex) for r in rs]
        assert ids == sorted(ids)
        ints = [int(r.value[1:]) for r in rs]
        assert ints == sorted(ints)
    r = next(r for r in rows if r.value == b"v42")
    assert r.key == "k0" and r.orderingKey is None
    assert r.topic == "persistent://public/default/cols"
    assert r.messageId == f"{r.ledgerId}:{r.entryId}:{r.partition}:{r.batchIndex}"
    assert r.properties == {"i": "42", "tag": "even"}
    assert int(r.eventTime.timestamp() * 1000) == 1_600_000_000_042
    assert r.publishTime is not None and r.deliverAt is None
    assert r.sequenceId >= 0 and r.redeliveryCount == 0 and r.producerName
    batch = spark.read.format("filepulsar").option("topic", "cols").load(root)
    stream_schema = spark.readStream.format("filepulsar").option("topic", "cols").load(root).schema
    assert batch.schema == stream_schema
    assert batch.count() == 300
    assert sorted(r.messageId for r in batch.collect()) == sorted(r.messageId for r in rows)


def test_restart_from_checkpoint_no_loss_no_duplicates(spark: Any, tmp_path: Any) -> None:
    root, ck = str(tmp_path / "root"), str(tmp_path / "ck")
    create_topic(open_blob_store(root), "rs", partitions=2)
    produce(root, "rs", 100)
    first, _ = run_stream(
        spark, root, ck, topic="rs", startingOffsets="earliest", maxMessagesPerTrigger=40
    )
    produce(root, "rs", 50, start=100)
    second, _ = run_stream(spark, root, ck, topic="rs", startingOffsets="earliest")
    values = sorted(int(r.value[1:]) for r in first + second)
    assert values == list(range(150))


def test_durable_cursor_resumes_a_new_query(spark: Any, tmp_path: Any) -> None:
    root = str(tmp_path / "root")
    create_topic(open_blob_store(root), "dur", partitions=2)
    produce(root, "dur", 120)
    opts = {"topic": "dur", "subscription": "etl", "subscriptionInitialPosition": "Earliest"}
    a, _ = run_stream(spark, root, str(tmp_path / "ck1"), **opts)
    produce(root, "dur", 30, start=120)
    b, _ = run_stream(spark, root, str(tmp_path / "ck2"), **opts)  # a NEW checkpoint
    assert sorted(int(r.value[1:]) for r in a) == list(range(120))
    assert sorted(int(r.value[1:]) for r in b) == list(range(120, 150))
    store = open_blob_store(root)
    for i in range(2):
        st = SubscriptionStore(store, TopicName.parse("dur").partition(i), "etl").latest()
        ml = ManagedLedger(store, TopicName.parse("dur").partition(i))
        assert st.mark_delete == ml.state().last_position()  # commit moved the cursor
        assert not st.consumers  # the queries left no consumer behind


def test_admission_control_splits_batches(spark: Any, tmp_path: Any) -> None:
    root = str(tmp_path / "root")
    produce(root, "adm", 250, batching_max_messages=100)
    rows, sizes = run_stream(
        spark,
        root,
        str(tmp_path / "ck"),
        topic="adm",
        startingOffsets="earliest",
        maxMessagesPerTrigger=60,
    )
    assert sizes == [60, 60, 60, 60, 10]
    assert sorted(int(r.value[1:]) for r in rows) == list(range(250))


def test_multi_topic_regex_and_tag_filter(spark: Any, tmp_path: Any) -> None:
    root, ck = str(tmp_path / "root"), str(tmp_path / "ck")
    produce(root, "logs-a", 10)
    produce(root, "logs-b", 10, start=100)
    produce(root, "other", 10, start=200)
    pat = "persistent://public/default/logs-.*"
    rows, _ = run_stream(
        spark,
        root,
        ck,
        topicsPattern=pat,
        startingOffsets="earliest",
        propertyFilter=json.dumps({"tag": "even"}),
    )
    assert sorted(int(r.value[1:]) for r in rows) == [
        i for i in [*range(10), *range(100, 110)] if i % 2 == 0
    ]
    produce(root, "logs-c", 4, start=300)  # a new matching topic is picked up
    more, _ = run_stream(
        spark,
        root,
        ck,
        topicsPattern=pat,
        startingOffsets="earliest",
        propertyFilter=json.dumps({"tag": "even"}),
        patternAutoDiscoveryPeriodMs=0,
    )
    assert sorted(int(r.value[1:]) for r in more) == [300, 302]
    rows2, _ = run_stream(
        spark, root, str(tmp_path / "ck2"), topics="logs-a, other", startingOffsets="earliest"
    )
    assert len(rows2) == 20


def test_data_loss_fails_or_skips(spark: Any, tmp_path: Any) -> None:
    """A query restarted after retention deleted messages it had not read (it has no durable
    subscription, so only its checkpoint knew its position) fails by default, naming the
    topic and the lost range; with failOnDataLoss=false it skips them and reads on."""
    from filepulsar.storage.retention import enforce_retention

    root = str(tmp_path / "root")
    store = open_blob_store(root)
    set_topic_policies(store, "lossy", ledger_max_entries=2)  # retention 0/0

    def send(lo: int, hi: int) -> None:
        with Producer(store, "lossy", batching_enabled=False) as p:
            for i in range(lo, hi):
                p.send(b"v%d" % i)  # one commit each: ledgers of 2 entries

    send(0, 3)
    ck = str(tmp_path / "ck")
    first, _ = run_stream(spark, root, ck, topic="lossy", startingOffsets="earliest")
    assert sorted(int(r.value[1:]) for r in first) == [0, 1, 2]
    send(3, 12)
    report = enforce_retention(store, "lossy")  # no durable subscription: all consumed
    assert report.deleted_messages >= 4
    m = ManagedLedger(store, TopicName.parse("lossy")).state()
    assert m.trimmed_last >= (report.deleted_ledgers[-1].ledger_id, 0)
    with pytest.raises(Exception, match=r"lossy.*deleted by retention.*failOnDataLoss=false"):
        run_stream(spark, root, ck, topic="lossy")
    rows, _ = run_stream(spark, root, ck, topic="lossy", failOnDataLoss="false")
    left = sorted(int(r.value[1:]) for r in rows)
    assert left == list(range(report.deleted_messages, 12))  # 3.. were lost unread
    # Starting at "earliest" after retention is not a loss: it means the first message left.
    rows, _ = run_stream(
        spark, root, str(tmp_path / "ck3"), topic="lossy", startingOffsets="earliest"
    )
    assert len(rows) == 12 - report.deleted_messages


def test_bad_options_fail_at_load(spark: Any, tmp_path: Any) -> None:
    root = str(tmp_path)
    with pytest.raises(
        Exception,
        match=r"(?i)unknown option.*maxMessagesPerTriger.*accepted.*maxMessagesPerTrigger",
    ):
        spark.readStream.format("filepulsar").option("topic", "t").option(
            "maxMessagesPerTriger", 5
        ).load(root)
    with pytest.raises(Exception, match="failOnDataLoss' must be true or false"):
        spark.read.format("filepulsar").option("topic", "t").option("failOnDataLoss", "maybe").load(
            root
        )
    with pytest.raises(InvalidConfiguration, match=r"subscriptionType.*allowed: Exclusive"):
        SourceOptions.parse(
            {"path": root, "topic": "t", "subscription": "s", "subscriptionType": "Fanout"},
            streaming=True,
        )
    with pytest.raises(InvalidConfiguration, match="exactly one of"):
        SourceOptions.parse({"path": root, "topic": "t", "topics": "a,b"}, streaming=True)
    with pytest.raises(InvalidConfiguration, match="'startingTime' and 'startingOffsets'"):
        SourceOptions.parse(
            {"path": root, "topic": "t", "startingTime": "5", "startingOffsets": '{"t": "1:2:-1"}'},
            streaming=True,
        )


def test_offsets_naming_no_partition_are_refused(tmp_path: Any) -> None:
    """A JSON offset for a partition the query does not read (a typo, or a partitioned topic's
    base name) is an error naming it, not silently the default."""
    from filepulsar.connector.source.batch import FilePulsarBatchReader

    root = str(tmp_path)
    create_topic(open_blob_store(root), "parted", partitions=2)
    base = "persistent://public/default/parted"
    typo = json.dumps({base + "-partition-7": "0:0:7"})
    with pytest.raises(InvalidConfiguration, match=r"names \['persistent.*partition-7'\]"):
        _reader(root, topic="parted", startingOffsets=typo).initialOffset()
    with pytest.raises(InvalidConfiguration, match="keys are partition names such as"):
        FilePulsarBatchReader(
            {"path": root, "topic": "parted", "endingOffsets": json.dumps({base: "0:0:-1"})},
            None,  # type: ignore[arg-type]
        ).partitions()
    good = json.dumps({base + "-partition-1": "0:0:1", base + "-partition-0": -2})
    assert _reader(root, topic="parted", startingOffsets=good).initialOffset()
    # With a pattern, a partition of a matching topic not created yet is allowed.
    later = json.dumps({"persistent://public/default/part-later-partition-0": "0:0:0"})
    pattern = "persistent://public/default/part-l.*"
    assert _reader(root, topicsPattern=pattern, startingOffsets=later).initialOffset() == {}


def _reader(root: str, **opts: Any) -> FilePulsarStreamReader:
    return FilePulsarStreamReader({"path": root, **opts}, None)  # type: ignore[arg-type]


def _read_all(r: FilePulsarStreamReader, start: dict[str, Any], end: dict[str, Any]) -> list[int]:
    out = []
    for p in r.partitions(start, end):
        for b in r.read(p):
            out.extend(int(v[1:]) for v in b.column("value").to_pylist())
    return out


def test_a_busy_subscription_is_waited_for_on_the_readers_clock(tmp_path: Any) -> None:
    """A second query on an Exclusive subscription retries for consumerBusyTimeoutMs, timed
    and waited on the clock the reader is given (no real waiting), then fails clearly."""
    from filepulsar.dispatch.clock import ManualClock

    root = str(tmp_path)
    produce(root, "busy", 3)
    opts = {"topic": "busy", "subscription": "ex", "consumerBusyTimeoutMs": "5000"}
    first = _reader(root, **opts)
    first.initialOffset()
    clock = ManualClock()
    second = FilePulsarStreamReader({"path": root, **opts}, None, clock=clock)  # type: ignore[arg-type]
    with pytest.raises(ConsumerBusy, match="Exclusive consumer is already connected"):
        second.initialOffset()
    assert clock.monotonic() == pytest.approx(5.0)
    assert clock.sleeps and max(clock.sleeps) == pytest.approx(0.1)
    first.stop()


def test_a_query_keeps_its_consumers_leases_while_spark_runs_a_batch(tmp_path: Any) -> None:
    """Spark calls the reader once a trigger and once a batch, not while a batch runs: the
    query's consumers renew their leases on a thread of their own, so a batch longer than
    the lease (here: no call at all for three and a half leases) does not let another query
    take over an Exclusive subscription. Before, the second query saw the lease lapse and took it
    (the demo's warning on a loaded CI host: a first batch of 31 s). After ``stop()`` the
    subscription is free at once."""
    root = str(tmp_path)
    produce(root, "held", 3)
    opts = {"topic": "held", "subscription": "ex", "consumerLeaseMs": "1000"}
    first = _reader(root, **opts)
    first.initialOffset()
    second = _reader(root, consumerBusyTimeoutMs="3500", **opts)
    with pytest.raises(ConsumerBusy, match="Exclusive consumer is already connected"):
        # Polls for 3.5 s. (A lease of 1 s, not less: the thread renews a third in, so only
        # a stall of two thirds of a second on a loaded host would lapse it.)
        second.initialOffset()
    first.stop()
    second.initialOffset()
    second.stop()


def _key_shared_readers(
    tmp_path: Any, topic: str, partitions: int, n: int, *names: str
) -> tuple[FilePulsarStreamReader, FilePulsarStreamReader]:
    """A topic of ``n`` one-message entries and two driver-side readers (named ``names``)
    of one Key_Shared subscription on it, from the earliest message."""
    root = str(tmp_path)
    create_topic(open_blob_store(root), topic, partitions=partitions)
    produce(root, topic, n, batching_enabled=False)
    opts = {
        "topic": topic,
        "subscription": topic,
        "subscriptionType": "Key_Shared",
        "subscriptionInitialPosition": "Earliest",
    }
    one, two = (_reader(root, consumerName=name, **opts) for name in names)
    return one, two


def test_available_now_does_not_end_while_another_query_leaves_the_subscription(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """Two AvailableNow queries on one Key_Shared subscription: when the other query leaves
    while this one's fetch is between its scan and its claim (the selector moved: the claim
    scans again and hands out nothing), this query fetches again instead of taking the empty
    round for the end of its run (it ended with nothing read, and neither query got the
    messages). The interleaving is forced at that point; the leaving is the other query's
    real release."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    import filepulsar.storage.delivery as delivery

    first, second = _key_shared_readers(tmp_path, "leave", 1, 40, "first", "second")
    for r in (first, second):
        r.prepareForTriggerAvailableNow()
    first.initialOffset()
    start = second.initialOffset()
    real = delivery.Dispatcher._candidates
    left: list[str] = []

    def candidates_then_the_first_leaves(self: Any, *args: Any, **kw: Any) -> Any:
        out = real(self, *args, **kw)
        if not left and self.cid in {c.cid for c in second._streams.consumers.values()}:
            left.append(self.cid)
            first._release()  # the other query's run ends now
        return out

    monkeypatch.setattr(delivery.Dispatcher, "_candidates", candidates_then_the_first_leaves)
    got: list[int] = []
    end = second.latestOffset(start, ReadMaxRows(1000))
    while end != start:
        got += _read_all(second, start, end)
        start = end
        end = second.latestOffset(start, ReadMaxRows(1000))
    assert left
    assert sorted(got) == list(range(40))
    second.stop()


def test_queries_sharing_a_subscription_follow_its_type(tmp_path: Any) -> None:
    """Driver-side readers of two queries on one subscription (no Spark needed)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    root = str(tmp_path)
    create_topic(open_blob_store(root), "shared", partitions=4)
    produce(root, "shared", 200, batching_enabled=False)
    common = {
        "topic": "shared",
        "subscriptionInitialPosition": "Earliest",
        "consumerBusyTimeoutMs": "0",
    }
    # Exclusive: the second query is refused clearly.
    ex1 = _reader(root, subscription="ex", **common)
    ex1.initialOffset()
    with pytest.raises(ConsumerBusy, match="Exclusive consumer is already connected"):
        _reader(root, subscription="ex", **common).initialOffset()
    ex1.stop()
    # Failover: each partition is active in exactly one query.
    f1 = _reader(root, subscription="fo", subscriptionType="Failover", consumerName="q1", **common)
    f2 = _reader(root, subscription="fo", subscriptionType="Failover", consumerName="q2", **common)
    s1, s2 = f1.initialOffset(), f2.initialOffset()
    e1, e2 = f1.latestOffset(s1, ReadAllAvailable()), f2.latestOffset(s2, ReadAllAvailable())
    moved1 = {k for k in e1 if e1[k] != s1[k]}
    moved2 = {k for k in e2 if e2[k] != s2[k]}
    assert moved1 and moved2 and not moved1 & moved2 and len(moved1 | moved2) == 4
    got = _read_all(f1, s1, e1) + _read_all(f2, s2, e2)
    assert sorted(got) == list(range(200))
    f1.stop()
    f2.stop()
    # Shared: two queries split the messages, each message to one query.
    sh1 = _reader(root, subscription="sh", subscriptionType="Shared", **common)
    sh2 = _reader(root, subscription="sh", subscriptionType="Shared", **common)
    a0, b0 = sh1.initialOffset(), sh2.initialOffset()
    seen: list[int] = []
    for _ in range(30):
        a1 = sh1.latestOffset(a0, ReadAllAvailable())
        b1 = sh2.latestOffset(b0, ReadAllAvailable())
        got_a, got_b = _read_all(sh1, a0, a1), _read_all(sh2, b0, b1)
        assert not set(got_a) & set(got_b)
        seen += got_a + got_b
        sh1.commit(a1)
        sh2.commit(b1)
        a0, b0 = a1, b1
        if not got_a and not got_b:
            break
    assert sorted(seen) == list(range(200))


def test_chunked_messages_cross_task_and_batch_boundaries(spark: Any, tmp_path: Any) -> None:
    """A chunked message is emitted whole, once, where its last chunk lies, even when its
    chunks are cut across Spark tasks or micro-batches."""
    root = str(tmp_path / "root")
    store = open_blob_store(root)
    set_topic_policies(store, "chunky", max_message_size=1000)
    sent = [bytes([i]) * 2500 if i % 3 == 0 else b"v%d" % i for i in range(30)]
    with Producer(store, "chunky", batching_enabled=False, chunking_enabled=True) as p:
        for v in sent:
            p.send(v)

    def check(rows: list[Any]) -> None:
        rows = sorted(rows, key=lambda r: (r.ledgerId, r.entryId))
        assert [r.value for r in rows] == sent  # whole, once, in order
        for prev, r in itertools.pairwise(rows):
            # A chunked message sits at its last chunk: its chunks precede it.
            gap = r.entryId - prev.entryId
            assert gap >= 3 if len(r.value) == 2500 else gap == 1

    # Tasks of two entries: nearly every chunked message spans two or three tasks.
    batch = spark.read.format("filepulsar").option("topic", "chunky")
    check(batch.option("maxEntriesPerPartition", 2).load(root).collect())
    # Micro-batches of two entries: the message arrives in the batch with its last chunk.
    rows, sizes = run_stream(
        spark,
        root,
        str(tmp_path / "ck"),
        topic="chunky",
        startingOffsets="earliest",
        maxMessagesPerTrigger=2,
    )
    check(rows)
    assert len(sizes) > 10


def _read_keyed(
    r: FilePulsarStreamReader, start: dict[str, Any], end: dict[str, Any]
) -> list[tuple[str, int]]:
    out = []
    for p in r.partitions(start, end):
        for b in r.read(p):
            vals = b.column("value").to_pylist()
            out.extend(zip(b.column("key").to_pylist(), (int(v[1:]) for v in vals)))
    return out


def test_key_shared_queries_split_by_key(tmp_path: Any) -> None:
    """Two queries on one Key_Shared subscription (driver-side readers, no Spark): each key
    goes to one query, in order, and together they see every message once."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    q1, q2 = _key_shared_readers(tmp_path, "ks", 2, 210, "q1", "q2")
    a0, b0 = q1.initialOffset(), q2.initialOffset()
    got: dict[str, list[tuple[str, int]]] = {"q1": [], "q2": []}
    for _ in range(100):
        a1 = q1.latestOffset(a0, ReadMaxRows(25))
        b1 = q2.latestOffset(b0, ReadMaxRows(25))
        ga, gb = _read_keyed(q1, a0, a1), _read_keyed(q2, b0, b1)
        got["q1"] += ga
        got["q2"] += gb
        q1.commit(a1)
        q2.commit(b1)
        a0, b0 = a1, b1
        if not ga and not gb:
            break
    keys1 = {k for k, _ in got["q1"]}
    keys2 = {k for k, _ in got["q2"]}
    assert keys1 and keys2 and not keys1 & keys2  # the keys are split between the queries
    assert sorted(i for _, i in got["q1"] + got["q2"]) == list(range(210))
    for rows in got.values():
        for k in {k for k, _ in rows}:
            seq = [i for kk, i in rows if kk == k]
            assert seq == sorted(seq)  # per-key order
    q1.stop()
    q2.stop()


def test_key_shared_in_spark_single_and_two_queries(spark: Any, tmp_path: Any) -> None:
    root = str(tmp_path / "root")
    create_topic(open_blob_store(root), "ksq", partitions=2)
    produce(root, "ksq", 140, batching_enabled=False)
    opts = {
        "topic": "ksq",
        "subscriptionType": "Key_Shared",
        "subscriptionInitialPosition": "Earliest",
    }
    # A single query on a Key_Shared subscription gets everything.
    rows, _ = run_stream(spark, root, str(tmp_path / "ck0"), subscription="solo", **opts)
    assert sorted(int(r.value[1:]) for r in rows) == list(range(140))
    # Two queries running at once share the subscription: each message reaches one of them,
    # and each query sees a key's messages in order.
    import threading

    out: dict[str, list[Any]] = {}

    def go(name: str) -> None:
        out[name], _ = run_stream(
            spark,
            root,
            str(tmp_path / f"ck-{name}"),
            subscription="pair",
            consumerName=name,
            maxMessagesPerTrigger=10,
            **opts,
        )

    threads = [threading.Thread(target=go, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    both = out["a"] + out["b"]
    assert sorted(int(r.value[1:]) for r in both) == list(range(140))
    for rows in out.values():
        for k in {r.key for r in rows}:
            seq = [int(r.value[1:]) for r in rows if r.key == k]
            assert seq == sorted(seq)


def test_stopped_query_releases_its_consumer(spark: Any, tmp_path: Any) -> None:
    """q.stop() releases the subscription at once (not when its 30 s lease lapses): a new
    query on the Exclusive subscription starts within a 15 s busy timeout. (Spark's stop
    ends the old query's planner process with SIGTERM and goes on; that process then
    unregisters the consumer. 5 s was too short for it once on a loaded CI host.)"""
    import time

    root = str(tmp_path / "root")
    produce(root, "stopq", 10)
    opts = {"topic": "stopq", "subscription": "ex", "subscriptionInitialPosition": "Earliest"}
    reader = spark.readStream.format("filepulsar")
    for k, v in opts.items():
        reader = reader.option(k, v)
    q = (
        reader.load(root)
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ck1"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    store = open_blob_store(root)
    subs = SubscriptionStore(store, TopicName.parse("stopq"), "ex")
    end = ManagedLedger(store, TopicName.parse("stopq")).state().last_position()

    def consumed_all() -> bool:
        try:
            return subs.latest().mark_delete == end
        except SubscriptionNotFound:  # the query has not subscribed yet
            return False

    try:
        deadline = time.monotonic() + 60
        while not consumed_all():  # the running query consumed and committed everything
            assert time.monotonic() < deadline and q.isActive, "the first query did not commit"
            time.sleep(0.05)
        assert subs.latest().consumers
    finally:
        q.stop()
    produce(root, "stopq", 5, start=10)
    rows, _ = run_stream(spark, root, str(tmp_path / "ck2"), consumerBusyTimeoutMs=15000, **opts)
    assert sorted(int(r.value[1:]) for r in rows) == list(range(10, 15))
    assert not subs.latest().consumers


def test_a_partition_found_later_starts_at_its_cursor_within_the_limit(tmp_path: Any) -> None:
    """A topic the pattern finds after the query started joins the offsets at its start (the
    subscription's cursor), then is read under maxMessagesPerTrigger like the others."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    root = str(tmp_path)
    produce(root, "found-a", 3, batching_enabled=False)
    opts = {"topicsPattern": "persistent://public/default/found-.*"}
    r = _reader(root, patternAutoDiscoveryPeriodMs="0", **opts)
    s0 = r.initialOffset()
    produce(root, "found-b", 50, batching_enabled=False)
    s1 = r.latestOffset(s0, ReadMaxRows(1))
    b = "persistent://public/default/found-b"
    assert s1[b][:3] == [-1, -1, -1] and _read_all(r, s0, s1) == []  # joined, nothing read yet
    s2 = r.latestOffset(s1, ReadMaxRows(1))
    assert len(_read_all(r, s1, s2)) == 1  # one message in all, not found-b's whole backlog
    # With a subscription at Latest, a topic found later starts at its cursor (its end when
    # it was subscribed): its earlier messages were never meant for this subscription.
    sub = _reader(
        root,
        subscription="late",
        subscriptionInitialPosition="Latest",
        patternAutoDiscoveryPeriodMs="0",
        **opts,
    )
    t0 = sub.initialOffset()
    produce(root, "found-c", 5, batching_enabled=False)
    t1 = sub.latestOffset(t0, ReadMaxRows(100))
    produce(root, "found-c", 2, start=5, batching_enabled=False)
    t2 = sub.latestOffset(t1, ReadMaxRows(100))
    assert sorted(_read_all(sub, t1, t2)) == [5, 6]
    sub.stop()


def _reference_ids(ledger: Any, entry: Any, part: int, bidx: Any) -> list[str]:
    return [
        f"{lg}:{en}:{part}" + (f":{b}" if b >= 0 else "")
        for lg, en, b in zip(ledger.tolist(), entry.tolist(), bidx.tolist())
    ]


def test_message_ids_match_their_definition_for_any_layout() -> None:
    """The vectorised message id strings (byte templates per entry layout, or the generic
    join) equal ``ledger:entry:partition[:batchIndex]`` for batched and non-batched entries,
    digit-count changes, partial first/last entries and filtered rows."""
    import numpy as np

    from filepulsar.connector.source.columns import _message_ids

    rng = np.random.default_rng(7)
    for _ in range(400):
        ledger, entry, bidx = [], [], []
        lg, en = int(rng.integers(0, 12)), int(rng.integers(0, 1200))
        for _ in range(int(rng.integers(1, 25))):
            if rng.random() < 0.1:
                lg, en = lg + 1, 0
            k = int(rng.integers(1, 1100)) if rng.random() < 0.8 else 1
            idx = list(range(k)) if k > 1 or rng.random() < 0.5 else [-1]
            ledger += [lg] * len(idx)
            entry += [en] * len(idx)
            bidx += idx
            en += int(rng.integers(1, 3))
        arrays = np.array(ledger), np.array(entry), np.array(bidx, np.int32)
        if rng.random() < 0.3:  # a property filter drops messages anywhere
            keep = rng.random(len(ledger)) < 0.7
            arrays = tuple(a[keep] for a in arrays)
        elif rng.random() < 0.5:  # a task's range starts and ends inside entries
            a = int(rng.integers(0, len(ledger)))
            z = int(rng.integers(a, len(ledger) + 1))
            arrays = tuple(x[a:z] for x in arrays)
        part = int(rng.integers(-1, 12))
        got = _message_ids(arrays[0], arrays[1], part, arrays[2])
        got.validate(full=True)
        assert got.to_pylist() == _reference_ids(arrays[0], arrays[1], part, arrays[2])


def test_read_partition_message_ids_on_real_entries(tmp_path: Any) -> None:
    """Through the executor's read: batch entries across entry-id digit changes, a range that
    starts and ends inside entries, and non-batched entries."""
    import numpy as np

    from filepulsar.connector.source.partition import FilePulsarPartition
    from filepulsar.connector.source.read import read_partition

    store = open_blob_store(str(tmp_path))
    with Producer(store, "ids", batching_max_messages=7) as p:
        p.send_table([b"v%d" % i for i in range(7 * 120 + 3)])  # entries 0..120
    with Producer(store, "ids", batching_enabled=False) as p:
        for i in range(5):
            p.send(b"single-%d" % i)
    topic = "persistent://public/default/ids"
    rows = []
    for start, end in [((-1, -1, -1), (0, 125, -1)), ((0, 8, 3), (0, 101, 4))]:
        part = FilePulsarPartition(str(tmp_path), {}, topic, start, end)
        batches = list(read_partition(part))
        rows.append(sum(b.num_rows for b in batches))
        for b in batches:
            cols = [b.column(n).to_numpy() for n in ("ledgerId", "entryId", "batchIndex")]
            assert b.column("messageId").to_pylist() == _reference_ids(
                cols[0], cols[1], -1, cols[2]
            )
            assert np.all(b.column("partition").to_numpy() == -1)
    assert rows == [7 * 120 + 3 + 5, 4 + 7 * 92 + 4]


def test_a_task_hands_spark_batches_of_even_size(tmp_path: Any) -> None:
    """Groups of entries go to Spark in slices of one size, at least SPARK_BATCH_ROWS rows
    (the first, smaller group aside) and under twice that: no small remainder batches (Spark
    pays a fixed cost per batch), every message once and in order."""
    from filepulsar.connector.source.partition import FilePulsarPartition
    from filepulsar.connector.source.read import SPARK_BATCH_ROWS, read_partition

    n = 80 * 1_020
    store = open_blob_store(str(tmp_path))
    with Producer(store, "even", batching_max_messages=1_020) as p:
        p.send_table([b"%06d" % i for i in range(n)])
    part = FilePulsarPartition(
        str(tmp_path), {}, "persistent://public/default/even", (-1, -1, -1), (0, 79, -1)
    )
    batches = list(read_partition(part))
    sizes = [b.num_rows for b in batches]
    assert sum(sizes) == n
    assert all(SPARK_BATCH_ROWS <= s < 2 * SPARK_BATCH_ROWS for s in sizes[1:]), sizes
    assert max(sizes) - min(sizes[1:]) < SPARK_BATCH_ROWS // 4, sizes
    values = [v for b in batches for v in b.column("value").to_pylist()]
    assert values == [b"%06d" % i for i in range(n)]


@pytest.mark.parametrize("sub_type", ["Shared", "Key_Shared"])
def test_max_messages_per_trigger_counts_messages_in_batch_entries_of_claims(
    spark: Any, tmp_path: Any, sub_type: str
) -> None:
    """Shared/Key_Shared claim entries; with a batching producer (10 messages per entry) a
    limit of 25 messages still gives micro-batches of 25 (an entry split across two of them,
    as Failover cuts), and every message is read exactly once."""
    root = str(tmp_path / "root")
    create_topic(open_blob_store(root), "batched", partitions=2)
    produce(
        root,
        "batched",
        400,
        batching_max_messages=10,
        batching_max_publish_delay_ms=60_000,
        batching_type="KeyBased",
    )
    rows, sizes = run_stream(
        spark,
        root,
        str(tmp_path / "ck"),
        topic="batched",
        subscription="limited",
        subscriptionType=sub_type,
        subscriptionInitialPosition="Earliest",
        maxMessagesPerTrigger=25,
    )
    assert sizes == [25] * 16
    assert sorted(int(r.value[1:]) for r in rows) == list(range(400))
    if sub_type == "Key_Shared":
        for k in {r.key for r in rows}:
            seq = [int(r.value[1:]) for r in rows if r.key == k]
            assert seq == sorted(seq)  # per-key order, across split entries


def test_an_entry_split_by_the_limit_is_finished_by_the_next_query(tmp_path: Any) -> None:
    """Driver-side readers (no Spark): a Shared query that read the first part of a batch
    entry and stopped leaves the rest to the next query on the subscription, which reads
    from the first message not acknowledged: every message once."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    root = str(tmp_path)
    produce(root, "split", 30, batching_max_messages=10, batching_max_publish_delay_ms=60_000)
    opts = {
        "topic": "split",
        "subscription": "s",
        "subscriptionType": "Shared",
        "subscriptionInitialPosition": "Earliest",
        "consumerBusyTimeoutMs": "0",
    }
    first = _reader(root, **opts)
    s0 = first.initialOffset()
    s1 = first.latestOffset(s0, ReadMaxRows(15))
    got = _read_all(first, s0, s1)
    assert len(got) == 15
    first.commit(s1)
    first.stop()
    second = _reader(root, **opts)
    a = second.initialOffset()
    for _ in range(10):
        b = second.latestOffset(a, ReadMaxRows(15))
        batch = _read_all(second, a, b)
        assert len(batch) <= 15
        got += batch
        second.commit(b)
        if b == a:
            break
        a = b
    second.stop()
    assert sorted(got) == list(range(30))


def test_admin_read_table_speaks_the_spark_sources_columns(spark: Any, tmp_path: Any) -> None:
    """One vocabulary (issue #30): ``Admin.topics().read_table`` of a topic has the Spark
    source's schema for it, names and types (timestamps as UTC timestamps, not epoch ms), and
    the same rows; ``columns="storage"`` keeps the storage reader's own names."""
    from filepulsar.connector.admin import Admin

    root = str(tmp_path)
    Admin(root).topics().create_partitioned_topic("same", 2)
    produce(root, "same", 12)  # batched, keys, properties, event times
    produce(root, "same", 3, start=12, batching_enabled=False)
    df = spark.read.format("filepulsar").option("topic", "same").load(root)
    spark_table = df.toArrow()
    table = Admin(root).topics().read_table("same")
    assert [(f.name, f.type) for f in table.schema] == [
        (f.name, f.type) for f in spark_table.schema
    ]
    assert table.num_rows == 15
    assert table.sort_by("messageId").to_pylist() == spark_table.sort_by("messageId").to_pylist()
    stored = Admin(root).topics().read_table("same", columns="storage")
    assert "publish_time" in stored.schema.names and "publishTime" not in stored.schema.names
