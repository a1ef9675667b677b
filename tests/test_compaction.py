"""Topic compaction, compacted reads and TableView (issue 13), with Pulsar's semantics.

Compaction keeps the newest message of every key up to a horizon; a null value removes its
key; keyless messages are not kept. Readers and Exclusive/Failover consumers with
``is_read_compacted`` read that view, then the topic after the horizon. Retention here is the
real one (``Admin.enforce_retention`` over rolled-over ledgers), never edited state.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from filepulsar.admin import Admin
from filepulsar.connector.client import (
    Client,
    ConsumerType,
    InitialPosition,
    MessageId,
    Timeout,
)
from filepulsar.storage import set_namespace_policies, set_topic_policies
from filepulsar.storage.compaction import COMPACTION_SUBSCRIPTION, compact, compaction_dir
from filepulsar.storage.errors import CorruptDataError, DataLossError, InvalidConfiguration
from filepulsar.storage.ledger import ManagedLedger, Position
from filepulsar.storage.names import TopicName

pytestmark = pytest.mark.unit

E = InitialPosition.Earliest
TM = 5000


@pytest.fixture
def client(tmp_path: Path) -> Any:
    c = Client(str(tmp_path / "root"))
    yield c
    c.close()


def read_all(reader: Any) -> list[tuple[str, bytes | None]]:
    out = []
    while reader.has_message_available():
        m = reader.read_next(TM)
        out.append((m.partition_key(), None if m.has_null_value() else m.data()))
    return out


# ---------------------------------------------------------------------- pulsar-client's test
def test_publish_compact_and_consume(client: Client) -> None:
    # pulsar-client's test_publish_compact_and_consume: the broker's HTTP compaction call is
    # our admin API; compaction finishes inside the call, so no status polling is needed.
    topic = "compaction-upstream"
    producer = client.create_producer(
        topic, producer_name="my-producer-name", batching_enabled=False
    )
    assert producer.last_sequence_id() == -1
    consumer = client.subscribe(topic, "my-sub1", is_read_compacted=True)
    consumer.close()
    consumer2 = client.subscribe(topic, "my-sub2", is_read_compacted=False)
    producer.send(b"hello-0", partition_key="key0")
    producer.send(b"hello-1", partition_key="key0")
    producer.close()

    admin = Admin(store=client.store)
    admin.topics().trigger_compaction(topic)
    assert admin.topics().compaction_status(topic)["status"] == "SUCCESS"

    consumer1 = client.subscribe(topic, "my-sub1", is_read_compacted=True)
    msg0 = consumer1.receive(TM)
    assert msg0.data() == b"hello-1"
    consumer1.acknowledge(msg0)
    consumer1.close()

    reader1 = client.create_reader(topic, MessageId.earliest, is_read_compacted=True)
    assert reader1.read_next(TM).data() == b"hello-1"
    reader1.close()

    assert consumer2.receive(TM).data() == b"hello-0"
    assert consumer2.receive(TM).data() == b"hello-1"
    consumer2.close()
    reader2 = client.create_reader(topic, MessageId.earliest, is_read_compacted=False)
    assert [reader2.read_next(TM).data() for _ in range(2)] == [b"hello-0", b"hello-1"]


# ---------------------------------------------------------------------- what the view holds
@pytest.mark.parametrize("batching", [False, True])
def test_view_keeps_latest_per_key_drops_tombstoned_and_keyless(
    client: Client, batching: bool
) -> None:
    topic = f"view-{batching}"
    p = client.create_producer(topic, batching_enabled=batching, batching_max_messages=4)
    sends = [
        ("a", b"a1"),
        ("b", b"b1"),
        ("", b"keyless"),
        ("a", b"a2"),
        ("c", b"c1"),
        ("b", None),  # tombstone: b is gone
        ("d", b""),  # an empty value is a value, not a tombstone
        ("c", b"c2"),
    ]
    for k, v in sends:
        p.send_async(v, None, partition_key=k or None)
    p.flush()
    report = Admin(store=client.store).topics().trigger_compaction(topic)[0]
    assert report.keys == 3 and not report.skipped
    r = client.create_reader(topic, MessageId.earliest, is_read_compacted=True)
    got = read_all(r)
    assert got == [("a", b"a2"), ("d", b""), ("c", b"c2")]  # in topic order
    # Ids are the original ones: the plain reader sees the same ids for those messages.
    plain = client.create_reader(topic, MessageId.earliest)
    ids = {}
    while plain.has_message_available():
        m = plain.read_next(TM)
        ids[m.data()] = m.message_id()
    r.seek(MessageId.earliest)
    assert [r.read_next(TM).message_id() for _ in range(3)] == [ids[b"a2"], ids[b""], ids[b"c2"]]


def test_compaction_is_incremental_and_the_view_ends_at_the_horizon(client: Client) -> None:
    p = client.create_producer("inc")
    for i in range(5):
        p.send(f"v{i}".encode(), partition_key=f"k{i % 2}")
    admin = Admin(store=client.store).topics()
    admin.trigger_compaction("inc")
    p.send(b"late", partition_key="k0")  # after the horizon: read as in the topic
    p.send(b"new", partition_key="k9")
    r = client.create_reader("inc", MessageId.earliest, is_read_compacted=True)
    assert read_all(r) == [("k1", b"v3"), ("k0", b"v4"), ("k0", b"late"), ("k9", b"new")]
    second = admin.trigger_compaction("inc")[0]
    assert second.messages_read == 4  # the previous view (2) and the 2 new messages only
    r2 = client.create_reader("inc", MessageId.earliest, is_read_compacted=True)
    assert read_all(r2) == [("k1", b"v3"), ("k0", b"late"), ("k9", b"new")]
    again = admin.trigger_compaction("inc")[0]
    assert again.skipped and "already" in again.reason


def test_chunked_messages_are_kept_whole(client: Client) -> None:
    set_topic_policies(client.store, "chunky", max_message_size=64 * 1024)
    p = client.create_producer("chunky", chunking_enabled=True)
    big_old, big_new = b"x" * 200_000, b"y" * 150_000
    p.send(big_old, partition_key="k")
    p.send(b"small", partition_key="s")
    p.send(big_new, partition_key="k")
    compact(client.store, "chunky")
    r = client.create_reader("chunky", MessageId.earliest, is_read_compacted=True)
    assert read_all(r) == [("s", b"small"), ("k", big_new)]


def test_partitioned_topics_are_compacted_per_partition(client: Client) -> None:
    admin = Admin(store=client.store).topics()
    admin.create_partitioned_topic("parts", 3)
    p = client.create_producer("parts")
    for i in range(30):
        p.send(f"{i}".encode(), partition_key=f"k{i % 6}")
    reports = admin.trigger_compaction("parts")
    assert len(reports) == 3 and sum(r.keys for r in reports) == 6
    r = client.create_reader("parts", MessageId.earliest, is_read_compacted=True)
    assert sorted(read_all(r)) == sorted((f"k{j}", f"{24 + j}".encode()) for j in range(6))


def test_non_persistent_topics_are_refused(client: Client) -> None:
    client.create_producer("non-persistent://public/default/np").send(b"x", partition_key="k")
    with pytest.raises(InvalidConfiguration, match="only persistent topics"):
        compact(client.store, "non-persistent://public/default/np")


# ---------------------------------------------------------------------- retention
def test_the_view_outlives_retention_and_the_cursor_holds_what_follows(client: Client) -> None:
    set_namespace_policies(
        client.store, "public", "default", retention_time_minutes=0, retention_size_mb=0
    )
    set_topic_policies(client.store, "ret", ledger_max_entries=2)
    c = client.subscribe("ret", "s", consumer_type=ConsumerType.Exclusive, initial_position=E)
    p = client.create_producer("ret")
    for i in range(8):
        p.send(f"v{i}".encode(), partition_key=f"k{i % 3}")
    admin = Admin(store=client.store)
    admin.topics().trigger_compaction("ret")
    assert COMPACTION_SUBSCRIPTION in admin.topics().get_subscriptions("ret")
    p.send(b"after", partition_key="k0")  # past the horizon
    p.send(b"roll", partition_key="k1")
    for _ in range(10):
        m = c.receive(TM)
        c.acknowledge_cumulative(m)
    admin.enforce_retention("ret")  # real retention: consumed ledgers go
    plain = client.create_reader("ret", MessageId.earliest)
    first = plain.read_next(TM)
    assert first.data() != b"v0"  # the early ledgers are gone from the topic itself
    # The compacted view still has the latest value of every key up to the horizon, and the
    # __compaction cursor kept everything after it.
    r = client.create_reader("ret", MessageId.earliest, is_read_compacted=True)
    assert read_all(r) == [
        ("k2", b"v5"),
        ("k0", b"v6"),
        ("k1", b"v7"),
        ("k0", b"after"),
        ("k1", b"roll"),
    ]
    # Reading the trimmed positions from the topic itself reports the loss, as before.
    ml = ManagedLedger(client.store, TopicName.parse("ret"))
    with pytest.raises(DataLossError):
        ml.read_entries(ml.state(), Position(0, 0))


# ---------------------------------------------------------------------- consumers
def test_compacted_consumer_acks_move_the_cursor_past_hidden_messages(client: Client) -> None:
    p = client.create_producer("cc", batching_enabled=False)
    for i in range(6):
        p.send(f"v{i}".encode(), partition_key="same" if i < 5 else "other")
    compact(client.store, "cc")
    c = client.subscribe(
        "cc",
        "s",
        consumer_type=ConsumerType.Failover,
        initial_position=E,
        is_read_compacted=True,
        ack_grouping_time_ms=0,  # the backlog below is read while the consumer is open
    )
    got = [c.receive(TM) for _ in range(2)]
    assert [m.data() for m in got] == [b"v4", b"v5"]
    for m in got:
        c.acknowledge(m)  # individual acks: v0..v3 (hidden) are acknowledged with v4
    with pytest.raises(Timeout):
        c.receive(50)
    stats = Admin(store=client.store).topics().get_stats("cc")
    assert stats["subscriptions"]["s"]["msgBacklog"] == 0
    c.seek(MessageId.earliest)  # back to the start: the view again
    assert c.receive(TM).data() == b"v4"


def test_read_compacted_needs_an_exclusive_or_failover_subscription(client: Client) -> None:
    client.create_producer("sh").send(b"x", partition_key="k")
    with pytest.raises(InvalidConfiguration, match="Exclusive or Failover"):
        client.subscribe("sh", "s", consumer_type=ConsumerType.Shared, is_read_compacted=True)


# ---------------------------------------------------------------------- concurrency, damage
def test_concurrent_compactions_leave_one_consistent_view(client: Client) -> None:
    p = client.create_producer("race", batching_enabled=True)
    for i in range(2000):
        p.send_async(f"{i}".encode(), None, partition_key=f"k{i % 50}")
    p.flush()
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def run() -> None:
        try:
            barrier.wait()
            compact(client.store, "race")
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    r = client.create_reader("race", MessageId.earliest, is_read_compacted=True)
    got = read_all(r)
    assert sorted(got) == sorted((f"k{j}", f"{1950 + j}".encode()) for j in range(50))


def test_a_corrupt_view_is_reported_with_its_location(client: Client, tmp_path: Path) -> None:
    p = client.create_producer("bad")
    p.send(b"value-that-will-rot", partition_key="k")
    compact(client.store, "bad")
    folder = tmp_path / "root" / compaction_dir(TopicName.parse("bad")) / "data"
    [blob] = list(folder.glob("*.entries"))
    data = bytearray(blob.read_bytes())
    data[-12] ^= 0xFF  # bit rot inside the payload
    blob.write_bytes(bytes(data))
    r = client.create_reader("bad", MessageId.earliest, is_read_compacted=True)
    with pytest.raises(CorruptDataError, match=r"compacted entry of .*bad \(ledger 0, entry 0\)"):
        r.read_next(TM)


# ---------------------------------------------------------------------- TableView
def wait_for(pred: Any, what: str) -> None:
    """Poll a table view's state (it follows the topic on its own thread)."""
    deadline = time.monotonic() + 30
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def test_table_view_get(client: Client) -> None:
    # pulsar-client's table_view_test.test_get.
    tv = client.create_table_view("tv-get")
    assert len(tv) == 0
    p = client.create_producer("tv-get")
    p.send(b"value-0", partition_key="key-0")
    p.send(b"\xba\xd0\xba\xd0", partition_key="key-1")  # not UTF-8
    wait_for(lambda: len(tv) == 2, "two keys")
    assert tv.get("key-0") == b"value-0"
    assert tv.get("key-1") == b"\xba\xd0\xba\xd0"
    p.send(b"value-1", partition_key="key-0")
    wait_for(lambda: tv.get("key-0") == b"value-1", "the update")
    assert tv.get("missed-key") is None
    tv.close()


def test_table_view_for_each_and_listen(client: Client) -> None:
    # pulsar-client's table_view_test.test_for_each.
    tv = client.create_table_view("tv-each")
    p = client.create_producer("tv-each")
    p.send(b"value-0", partition_key="key-0")
    p.send(b"value-1", partition_key="key-1")
    wait_for(lambda: len(tv) == 2, "two keys")
    d: dict[str, bytes] = {}
    tv.for_each(lambda k, v: d.__setitem__(k, v))
    assert d == {"key-0": b"value-0", "key-1": b"value-1"}
    d.clear()

    def listener(key: str, value: bytes) -> None:
        if len(value) == 0:
            d.pop(key)
        else:
            d[key] = value

    tv.for_each_and_listen(listener)
    assert d == {"key-0": b"value-0", "key-1": b"value-1"}
    p.send(b"value-0-new", partition_key="key-0")
    p.send(b"", partition_key="key-1")
    p.send(b"value-2", partition_key="key-2")
    wait_for(lambda: d == {"key-0": b"value-0-new", "key-2": b"value-2"}, "the listener")
    assert len(tv) == 2  # the empty value removed key-1 from the view too


def test_table_view_loads_compacted_history_before_returning(client: Client) -> None:
    p = client.create_producer("tv-hist", batching_enabled=True)
    for i in range(3000):
        p.send_async(f"{i}".encode(), None, partition_key=f"k{i % 100}")
    p.flush()
    p.send(None, partition_key="k0")  # a null value removes the key
    compact(client.store, "tv-hist")
    p.send(b"fresh", partition_key="k1")
    tv = client.create_table_view("tv-hist")
    assert len(tv) == 99  # everything stored was loaded before create_table_view returned
    assert tv.get("k0") is None and tv.get("k1") == b"fresh"
    assert tv.get("k99") == b"2999"


def test_subscription_expiry_spares_the_compaction_cursor(client: Client) -> None:
    set_namespace_policies(client.store, "public", "default", subscription_expiration_minutes=1)
    p = client.create_producer("exp")
    p.send(b"v", partition_key="k")
    compact(client.store, "exp")
    client.subscribe("exp", "idle", initial_position=E).close()
    later = int(time.time() * 1000) + 3_600_000  # an hour of inactivity for everyone
    report = Admin(store=client.store).enforce_retention("exp", now=later)
    assert [e.subscription for e in report.expired_subscriptions] == ["idle"]
    assert Admin(store=client.store).topics().get_subscriptions("exp") == [COMPACTION_SUBSCRIPTION]


def test_table_view_with_a_schema(client: Client) -> None:
    # pulsar-client's table_view_test.test_schema.
    from filepulsar.schema import StringSchema

    tv = client.create_table_view("tv-schema", schema=StringSchema())
    p = client.create_producer("tv-schema", schema=StringSchema())
    p.send("value", partition_key="key")
    wait_for(lambda: tv.get("key") == "value", "the value")
    assert tv.get("missed-key") is None
    entries: dict[str, str] = {}
    tv.for_each(lambda k, v: entries.__setitem__(k, v))
    assert entries == {"key": "value"}
    entries.clear()
    tv.for_each_and_listen(lambda k, v: entries.__setitem__(k, v))
    assert entries == {"key": "value"}
    p.send("new-value", partition_key="key")
    wait_for(lambda: tv.get("key") == "new-value", "the update")
    wait_for(lambda: entries == {"key": "new-value"}, "the listener")


@pytest.mark.parametrize("retired", ["0123abcd", None, {"a": 1}])
def test_a_compaction_state_whose_retired_is_not_a_list_names_the_file_and_field(
    client: Client, retired: Any
) -> None:
    """A checksummed compaction state whose ``retired`` is not a list is CorruptDataError
    naming the file and the field (was: 'blob id None is not a valid name')."""
    from filepulsar.storage import jsontext
    from filepulsar.storage.compaction import CompactionState, _store

    client.create_producer("st").send(b"v", partition_key="k")
    compact(client.store, "st")
    state = _store(client.store, TopicName.parse("st")).latest()
    d = jsontext.decode_framed(state.encode(), "test")
    assert CompactionState.decode(jsontext.encode_framed(d), "x").blob == state.blob
    d["retired"] = retired
    where = "compaction/state/1.json of st"
    with pytest.raises(CorruptDataError, match=r"compaction state .*1\.json of st.*'retired' is"):
        CompactionState.decode(jsontext.encode_framed(d), where)
