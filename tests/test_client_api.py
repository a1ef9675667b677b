"""The Python client in one process: the pulsar-client-shaped API on every backend.

Multi-process behaviour (several consumer processes, SIGKILL) is in test_client_procs.py;
redelivery, retry and dead letters in test_client_redelivery.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from filepulsar.connector.client import (
    AlreadyClosed,
    BatchingType,
    Client,
    CompressionType,
    ConsumerBatchReceivePolicy,
    ConsumerBusy,
    ConsumerKeySharedPolicy,
    ConsumerType,
    CumulativeAcknowledgementNotAllowedError,
    InitialPosition,
    KeySharedMode,
    Message,
    MessageId,
    ProducerAccessMode,
    Timeout,
)
from filepulsar.dispatch.clock import ManualClock
from filepulsar.storage import set_topic_policies
from filepulsar.storage.errors import InvalidConfiguration
from filepulsar.storage.ledger import ManagedLedger
from filepulsar.storage.names import TopicName
from filepulsar.storage.subscriptions import SubscriptionStore, subscription_backlog

pytestmark = pytest.mark.unit

E = InitialPosition.Earliest


def backlog(client: Client, topic: str, sub: str) -> int:
    """Unacknowledged messages after the mark-delete position, over all partitions."""
    total = 0
    for name in client.get_topic_partitions(topic):
        t = TopicName.parse(name)
        ml = ManagedLedger(client.store, t)
        total += subscription_backlog(
            ml, ml.state(), SubscriptionStore(client.store, t, sub).latest()
        )
    return total


@pytest.fixture
def client(store_root: tuple[str, dict[str, Any]]) -> Any:
    root, options = store_root
    c = Client(root, storage_options=options or None)
    yield c
    c.close()


@pytest.fixture
def local_client(tmp_path: Path) -> Any:
    c = Client(str(tmp_path / "root"))
    yield c
    c.close()


def test_roundtrip_fields_on_every_backend(client: Client) -> None:
    producer = client.create_producer("orders", producer_name="p1")
    ids = [
        producer.send(
            b"v%d" % i,
            properties={"i": str(i)},
            partition_key=f"k{i % 3}",
            ordering_key=b"o",
            event_timestamp=1000 + i,
        )
        for i in range(5)
    ]
    consumer = client.subscribe("orders", "s", initial_position=E)
    msgs = [consumer.receive(5000) for _ in range(5)]
    assert [m.data() for m in msgs] == [b"v%d" % i for i in range(5)]
    m = msgs[2]
    assert m.value() == b"v2" and m.properties() == {"i": "2"}
    assert m.partition_key() == "k2" and m.ordering_key() == "o"
    assert m.event_timestamp() == 1002 and m.publish_timestamp() > 0
    assert m.topic_name() == "persistent://public/default/orders"
    assert m.redelivery_count() == 0 and m.producer_name() == "p1"
    assert [x.message_id() for x in msgs] == ids
    consumer.acknowledge_cumulative(msgs[-1])
    with pytest.raises(Timeout):
        consumer.receive(50)
    consumer.close()
    again = client.subscribe("orders", "s", initial_position=E)
    with pytest.raises(Timeout):
        again.receive(50)  # the cursor was durable


def test_partitioned_topic_and_topic_list(local_client: Client) -> None:
    from filepulsar.storage import create_topic

    create_topic(local_client.store, "multi", partitions=3)
    assert local_client.get_topic_partitions("multi") == [
        f"persistent://public/default/multi-partition-{i}" for i in range(3)
    ]
    p = local_client.create_producer("multi", batching_enabled=False)
    for i in range(30):
        p.send(b"%d" % i, partition_key=f"key-{i}")
    q = local_client.create_producer("single")
    q.send(b"other")
    c = local_client.subscribe(["multi", "single"], "s", initial_position=E)
    got = [c.receive(5000) for _ in range(31)]
    assert sorted(m.data() for m in got) == sorted([b"%d" % i for i in range(30)] + [b"other"])
    topics = {m.topic_name() for m in got}
    assert "persistent://public/default/single" in topics and len(topics) == 4
    for m in got:  # ids remember their topic, so a multi-topic consumer can ack by id
        c.acknowledge(m.message_id())
    with pytest.raises(Timeout):
        c.receive(50)


def test_exclusive_busy_and_cumulative_refused_on_shared(local_client: Client) -> None:
    local_client.create_producer("t").send(b"x")
    c1 = local_client.subscribe("t", "ex", initial_position=E)
    with pytest.raises(ConsumerBusy, match="Exclusive consumer is already connected"):
        local_client.subscribe("t", "ex")
    c1.close()
    sh = local_client.subscribe("t", "sh", consumer_type=ConsumerType.Shared, initial_position=E)
    msg = sh.receive(5000)
    with pytest.raises(CumulativeAcknowledgementNotAllowedError, match="Shared"):
        sh.acknowledge_cumulative(msg)
    sh.close()
    with pytest.raises(AlreadyClosed):
        sh.receive(10)


def test_a_multi_topic_subscribe_registers_on_every_partition_or_on_none(
    local_client: Client,
) -> None:
    """A subscription over many topics registers on their partitions at once (issue #27:
    one registration commit each, their flushes overlapping): every partition, in the order
    named, or, when one refuses it, none (those registered are left)."""
    from filepulsar.storage import create_topic

    topics = [f"multi-{i}" for i in range(12)]
    create_topic(local_client.store, topics[3], partitions=3)
    held = local_client.subscribe(topics[7], "ex", initial_position=E)  # Exclusive there
    with pytest.raises(ConsumerBusy, match="Exclusive consumer is already connected"):
        local_client.subscribe(topics, "ex", initial_position=E)
    for t in topics:
        for name in local_client.get_topic_partitions(t):
            consumers = SubscriptionStore(local_client.store, TopicName.parse(name), "ex")
            left = [c.name for c in consumers.latest().consumers.values()]
            assert left == ([held.consumer_name()] if t == topics[7] else []), name
    held.close()
    c = local_client.subscribe(topics, "ex", initial_position=E)
    want = [n for t in topics for n in local_client.get_topic_partitions(t)]
    assert [p.topic_str for p in c._topics.parts] == want
    c.close()


def test_batch_tracker_and_batch_index_ack(local_client: Client) -> None:
    p = local_client.create_producer(
        "b", batching_enabled=True, batching_max_publish_delay_ms=10_000
    )
    for i in range(4):
        p.send_async(b"%d" % i, None)
    p.flush()
    c = local_client.subscribe("b", "plain", initial_position=E)
    msgs = [c.receive(5000) for _ in range(4)]
    assert [m.message_id().batch_index for m in msgs] == [0, 1, 2, 3]
    c.acknowledge([msgs[0], msgs[1], msgs[3]])  # 2 left: the entry stays unacknowledged
    c.close()
    c = local_client.subscribe("b", "plain", initial_position=E)
    assert [c.receive(5000).data() for _ in range(4)] == [b"0", b"1", b"2", b"3"]
    c.close()

    c = local_client.subscribe("b", "idx", initial_position=E, batch_index_ack_enabled=True)
    msgs = [c.receive(5000) for _ in range(4)]
    c.acknowledge([msgs[0], msgs[1], msgs[3]])
    c.close()
    c = local_client.subscribe("b", "idx", initial_position=E, batch_index_ack_enabled=True)
    only = c.receive(5000)
    assert only.data() == b"2"  # a partly acked batch redelivers only its unacked message
    c.acknowledge(only)
    with pytest.raises(Timeout):
        c.receive(50)


def test_cumulative_ack_inside_a_batch(local_client: Client) -> None:
    p = local_client.create_producer(
        "cb", batching_enabled=True, batching_max_publish_delay_ms=10_000
    )
    for i in range(3):
        p.send_async(b"%d" % i, None)
    p.flush()
    p.send(b"single")
    c = local_client.subscribe("cb", "s", initial_position=E)
    msgs = [c.receive(5000) for _ in range(4)]
    c.acknowledge_cumulative(msgs[1])  # inside the batch: the entry stays
    c.close()
    c = local_client.subscribe("cb", "s", initial_position=E)
    assert [c.receive(5000).data() for _ in range(4)] == [b"0", b"1", b"2", b"single"]


def test_key_shared_in_process_keeps_keys_apart(local_client: Client) -> None:
    p = local_client.create_producer("ks", batching_type=BatchingType.KeyBased)
    # Named consumers: consistent hashing places them by name, so the split of the six keys
    # is fixed (random default names left ~3% of runs with every key on one consumer).
    a, b = (
        local_client.subscribe(
            "ks",
            "s",
            consumer_type=ConsumerType.KeyShared,
            initial_position=E,
            receiver_queue_size=5,
            consumer_name=name,
        )
        for name in ("a", "b")
    )
    for i in range(60):
        p.send_async(b"%d" % i, None, partition_key=f"key-{i % 6}")
    p.flush()
    owner: dict[str, str] = {}
    seen: dict[str, list[int]] = {}
    got = 0
    while got < 60:
        progressed = False
        for name, c in (("a", a), ("b", b)):
            try:
                m = c.receive(20)
            except Timeout:
                continue
            progressed = True
            got += 1
            assert owner.setdefault(m.partition_key(), name) == name
            seen.setdefault(m.partition_key(), []).append(int(m.data()))
            c.acknowledge(m)
        assert progressed or got < 60
    assert all(v == sorted(v) for v in seen.values())
    assert set(owner.values()) == {"a", "b"}


def test_key_shared_sticky_and_auto_split_policies(local_client: Client) -> None:
    local_client.create_producer("st")
    pol = ConsumerKeySharedPolicy(KeySharedMode.Sticky, sticky_ranges=[(0, 32767)])
    s1 = local_client.subscribe(
        "st", "sticky", consumer_type=ConsumerType.KeyShared, key_shared_policy=pol
    )
    with pytest.raises(InvalidConfiguration, match="refused"):
        local_client.subscribe(
            "st",
            "sticky",
            consumer_type=ConsumerType.KeyShared,
            key_shared_policy=ConsumerKeySharedPolicy(
                KeySharedMode.Sticky, sticky_ranges=[(100, 200)]
            ),
        )
    s1.close()
    with pytest.raises(InvalidConfiguration, match="sticky_ranges"):
        ConsumerKeySharedPolicy(KeySharedMode.Sticky)
    ranges = ConsumerKeySharedPolicy(use_consistent_hashing=False)
    c = local_client.subscribe(
        "st", "ranges", consumer_type=ConsumerType.KeyShared, key_shared_policy=ranges
    )
    sel = SubscriptionStore(local_client.store, TopicName.parse("st"), "ranges").latest().selector
    assert sel is not None and sel["kind"] != ConsumerKeySharedPolicy().key_shared_mode.name
    c.close()


def test_tag_filter_delivers_subscribed_and_untagged_and_acks_the_rest(
    local_client: Client,
) -> None:
    p = local_client.create_producer("tags", batching_enabled=False)
    p.send(b"t1", properties={"tag1": "TAGS"})
    p.send(b"t2", properties={"tag2": "TAGS"})
    p.send(b"plain", properties={"xxx": "yyy"})
    p.send(b"t1t3", properties={"tag1": "TAGS", "tag3": "TAGS", "xxx": "yyy"})
    p.send(b"t3", properties={"tag3": "TAGS"})
    c = local_client.subscribe(
        "tags",
        "tagged",
        consumer_type=ConsumerType.Shared,
        initial_position=E,
        subscription_properties={"tag1": "1", "tag2": "1"},
    )
    got = []
    while True:
        try:
            m = c.receive(100)
        except Timeout:
            break
        got.append(m.data())
        c.acknowledge(m)
    assert got == [b"t1", b"t2", b"plain", b"t1t3"]
    assert backlog(local_client, "tags", "tagged") == 0  # t3 was acknowledged unseen
    c.close()
    with pytest.raises(InvalidConfiguration, match="fixed at creation"):
        local_client.subscribe("tags", "tagged", subscription_properties={"tag3": "1"})
    everything = local_client.subscribe("tags", "all", initial_position=E)
    assert len([everything.receive(1000) for _ in range(5)]) == 5


def test_delayed_message_held_on_shared_not_on_exclusive(local_client: Client) -> None:
    p = local_client.create_producer("delay")
    p.send(b"later", deliver_after=60_000)
    p.send(b"now")
    ex = local_client.subscribe("delay", "ex", initial_position=E)
    assert [ex.receive(2000).data() for _ in range(2)] == [b"later", b"now"]
    sh = local_client.subscribe(
        "delay", "sh", consumer_type=ConsumerType.Shared, initial_position=E
    )
    assert sh.receive(2000).data() == b"now"
    with pytest.raises(Timeout):
        sh.receive(100)


def test_seek_by_message_id_and_time(tmp_path: Path) -> None:
    clock = [1_700_000_000_000]
    c = Client(str(tmp_path / "root"), clock=lambda: clock[0])
    p = c.create_producer("seek", batching_enabled=False)
    ids = []
    for i in range(6):
        ids.append(p.send(b"%d" % i))
        clock[0] += 1000
    cons = c.subscribe("seek", "s", initial_position=E)
    for _ in range(6):
        cons.acknowledge(cons.receive(2000))
    cons.seek(ids[2])  # exclusive by default: the next is 3
    assert cons.receive(2000).data() == b"3"
    cons.seek(1_700_000_000_000 + 4000)  # by publish time: the first at or after it
    assert cons.receive(2000).data() == b"4"
    cons.seek(MessageId.earliest)
    assert cons.receive(2000).data() == b"0"
    cons.seek(MessageId.latest)
    with pytest.raises(Timeout):
        cons.receive(50)
    cons.close()
    inc = c.subscribe("seek", "inc", initial_position=E, start_message_id_inclusive=True)
    inc.seek(ids[2])
    assert inc.receive(2000).data() == b"2"
    c.close()


def test_seek_into_a_batch_skips_earlier_indexes(local_client: Client) -> None:
    p = local_client.create_producer(
        "sb", batching_enabled=True, batching_max_publish_delay_ms=10_000
    )
    for i in range(5):
        p.send_async(b"%d" % i, None)
    p.flush()
    c = local_client.subscribe("sb", "s", initial_position=E)
    msgs = [c.receive(2000) for _ in range(5)]
    c.seek(msgs[1].message_id())
    assert [c.receive(2000).data() for _ in range(3)] == [b"2", b"3", b"4"]
    c.acknowledge_cumulative(msgs[4])


def test_unsubscribe_and_pattern_discovery(local_client: Client) -> None:
    local_client.create_producer("pat-a").send(b"a")
    c = local_client.subscribe(
        re.compile("persistent://public/default/pat-.*"),
        "s",
        initial_position=E,
        pattern_auto_discovery_period=1,
    )
    assert c.receive(2000).data() == b"a"
    local_client.create_producer("pat-b").send(b"b")  # created after subscribe
    assert c.receive(10_000).data() == b"b"  # picked up by the periodic re-listing
    local_client.create_producer("other").send(b"no")
    with pytest.raises(Timeout):
        c.receive(100)
    c.unsubscribe()
    with pytest.raises(AlreadyClosed):
        c.receive(10)
    assert not SubscriptionStore(local_client.store, TopicName.parse("pat-a"), "s").exists()


def test_chunked_message_reassembled_and_fully_acked(local_client: Client) -> None:
    set_topic_policies(local_client.store, "big", max_message_size=1000)
    p = local_client.create_producer("big", batching_enabled=False, chunking_enabled=True)
    payload = bytes(range(256)) * 10  # 2560 B: three chunks
    mid = p.send(payload, properties={"k": "v"})
    p.send(b"small")
    c = local_client.subscribe("big", "s", initial_position=E)
    m = c.receive(2000)
    assert m.data() == payload and m.properties() == {"k": "v"} and m.message_id() == mid
    c.acknowledge(m)
    c.acknowledge(c.receive(2000))
    c.close()  # writes the grouped acknowledgements
    assert backlog(local_client, "big", "s") == 0


def test_reader_and_producer_options(local_client: Client) -> None:
    p = local_client.create_producer(
        "r", compression_type=CompressionType.ZSTD, access_mode=ProducerAccessMode.Exclusive
    )
    assert p.topic() == "persistent://public/default/r" and p.producer_name()
    for i in range(5):
        p.send(b"%d" % i)
    assert p.last_sequence_id() == 4
    with pytest.raises(Exception, match="exclusive"):
        local_client.create_producer("r")
    r = local_client.create_reader("r", MessageId.earliest)
    first = [r.read_next(1000) for _ in range(3)]
    assert [m.data() for m in first] == [b"0", b"1", b"2"]
    r.seek(first[1].message_id())
    assert r.read_next(1000).data() == b"2"  # exclusive, as the reader was created
    assert r.has_message_available()
    r.close()
    r2 = local_client.create_reader("r", first[1].message_id())
    assert r2.read_next(1000).data() == b"2"  # exclusive start
    with pytest.raises(InvalidConfiguration, match="names a broker"):
        Client("pulsar://localhost:6650")
    with pytest.raises(InvalidConfiguration, match="schema"):
        local_client.create_producer("r2", schema=object())


def test_message_listener_and_filepulsar_url(tmp_path: Path) -> None:
    import threading

    c = Client("filepulsar://" + str(tmp_path / "root"))
    got: list[bytes] = []
    done = threading.Event()

    def listener(consumer: Any, msg: Message) -> None:
        got.append(msg.data())
        consumer.acknowledge(msg)
        if len(got) == 3:
            done.set()

    cons = c.subscribe("l", "s", initial_position=E, message_listener=listener)
    p = c.create_producer("l")
    for i in range(3):
        p.send(b"%d" % i)
    assert done.wait(10)
    assert got == [b"0", b"1", b"2"]
    with pytest.raises(InvalidConfiguration, match="listener"):
        cons.receive(10)
    c.close()


def test_unknown_root_scheme_and_bad_arguments(local_client: Client) -> None:
    with pytest.raises(InvalidConfiguration, match="consumer_type 'Sometimes' is not allowed"):
        local_client.subscribe("t", "s", consumer_type="Sometimes")
    with pytest.raises(InvalidConfiguration, match=r"Argument .topic. is expected"):
        local_client.subscribe(42, "s")  # type: ignore[arg-type]
    with pytest.raises(InvalidConfiguration, match="key_shared_policy"):
        local_client.subscribe("t", "s", key_shared_policy=ConsumerKeySharedPolicy())


def test_failover_assigns_partitions_by_sorted_name_and_priority(local_client: Client) -> None:
    from filepulsar.storage import create_topic

    create_topic(local_client.store, "fo", partitions=2)

    def failover(name: str, priority: int = 0) -> Any:
        return local_client.subscribe(
            "fo",
            "s",
            consumer_type=ConsumerType.Failover,
            consumer_name=name,
            initial_position=E,
            priority_level=priority,
        )

    c2, c1, low = failover("c2"), failover("c1"), failover("a-low", priority=1)
    p = local_client.create_producer("fo", batching_enabled=False)
    for i in range(10):
        p.send(b"%d" % i)

    def drain(c: Any) -> set[str]:
        topics: set[str] = set()
        while True:
            try:
                m = c.receive(100)
            except Timeout:
                return topics
            topics.add(m.topic_name())
            c.acknowledge(m)

    # Eligible: the best priority level, sorted by name → partition p goes to eligible[p % 2].
    assert drain(c1) == {"persistent://public/default/fo-partition-0"}
    assert drain(c2) == {"persistent://public/default/fo-partition-1"}
    assert drain(low) == set()
    c1.close()
    for i in range(10):
        p.send(b"%d" % i)
    assert drain(c2) == {f"persistent://public/default/fo-partition-{i}" for i in range(2)}


def test_listener_keeps_delivering_after_receive_errors(
    local_client: Client, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    import threading
    import time

    got: list[bytes] = []
    done = threading.Event()

    def listener(consumer: Any, msg: Message) -> None:
        got.append(msg.data())
        consumer.acknowledge(msg)
        done.set()

    cons = local_client.subscribe("lerr", "s", initial_position=E, message_listener=listener)
    real = cons._receive
    failing = threading.Event()
    failing.set()
    calls: list[float] = []

    def flaky(timeout_millis: int | None) -> Message:
        if failing.is_set():
            calls.append(time.monotonic())
            raise OSError("storage unreachable")
        return real(timeout_millis)

    monkeypatch.setattr(cons, "_receive", flaky)
    time.sleep(0.6)
    assert 1 <= len(calls) <= 6  # backs off (0.1, 0.2, 0.4 s ...), no busy loop
    assert "receive failed" in caplog.text and "subscription 's'" in caplog.text
    failing.clear()
    local_client.create_producer("lerr").send(b"after")
    assert done.wait(10)  # the thread is still alive
    assert got == [b"after"]
    with pytest.raises(InvalidConfiguration, match="listener"):
        cons.batch_receive()
    cons.close()
    assert cons._listener is not None and not cons._listener.thread.is_alive()


@pytest.mark.parametrize("closer", ["reader", "client"])
def test_close_does_not_wait_for_a_blocked_read_next(tmp_path: Path, closer: str) -> None:
    import threading
    import time

    c = Client(str(tmp_path / "root"))
    c.create_producer("quiet").close()  # the topic exists, with nothing in it
    r = c.create_reader("quiet", MessageId.earliest)
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            r.read_next()  # waits forever
        except BaseException as e:
            outcome.append(e)

    th = threading.Thread(target=read, daemon=True)
    th.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    (r if closer == "reader" else c).close()
    assert time.monotonic() - t0 < 2
    th.join(5)
    assert not th.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], AlreadyClosed)


def test_client_close_releases_a_producer_that_failed(local_client: Client) -> None:
    from filepulsar.storage.errors import FilePulsarError

    p = local_client.create_producer("fail", producer_name="p1")
    p._inner._queue.fail(FilePulsarError("disk gone"))  # a write error; the producer is not closed
    assert not p.is_connected()
    local_client.create_producer("other")  # tracking a new handle prunes closed ones only
    assert p in local_client._core.tracked()
    ml = ManagedLedger(local_client.store, TopicName.parse("fail"))
    assert "p1" in ml.state().producers
    local_client.close()
    assert "p1" not in ml.state().producers  # its registration was released


def test_unsupported_and_unused_options(local_client: Client) -> None:
    with pytest.raises(InvalidConfiguration, match="crypto_key_reader"):
        local_client.create_producer("u", crypto_key_reader=object())
    local_client.create_producer("u").send(b"x", properties={"a": "TAGS"})
    # properties are Pulsar's consumer metadata (unused), not subscription properties.
    c = local_client.subscribe("u", "s", initial_position=E, properties={"b": "TAGS"})
    m = c.receive(2000)
    assert m.data() == b"x"
    c.acknowledge(m)
    c.close()
    with pytest.raises(InvalidConfiguration, match=r"created with properties \{\}"):
        local_client.subscribe("u", "s", subscription_properties={"b": "TAGS"})


def test_receive_and_read_next_time_out_on_the_clients_clock(tmp_path: Path) -> None:
    """A whole Clock given to the Client (a ManualClock here) times the waits of receive,
    batch_receive and read_next, as it does the storage layer's: the timeouts pass on it, so
    nothing waits for real and the clock has moved by at least the timeouts."""
    clock = ManualClock()
    client = Client(str(tmp_path), clock=clock)
    try:
        client.create_producer("clocked").close()
        consumer = client.subscribe(
            "clocked",
            "s",
            initial_position=InitialPosition.Earliest,
            batch_receive_policy=ConsumerBatchReceivePolicy(10, -1, 20_000),
        )
        reader = client.create_reader("clocked", MessageId.earliest)
        with pytest.raises(Timeout):
            consumer.receive(timeout_millis=20_000)
        assert clock.monotonic() >= 20
        assert consumer.batch_receive() == []
        assert clock.monotonic() >= 40
        with pytest.raises(Timeout):
            reader.read_next(timeout_millis=20_000)
        assert clock.monotonic() >= 60
    finally:
        client.close()
