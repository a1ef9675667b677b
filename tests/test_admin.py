"""The admin API (``filepulsar.admin``), on real files and real clients."""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from filepulsar import Client, ConsumerType, InitialPosition
from filepulsar.admin import Admin, UnitError, parse_size, parse_time
from filepulsar.connector.admin.topics import Topics
from filepulsar.dispatch.clock import ManualClock
from filepulsar.storage import (
    ConsumerBusy,
    InvalidConfiguration,
    InvalidTopicName,
    SubscriptionNotFound,
    TopicNotFound,
)
from filepulsar.storage.errors import AlreadyExists, NamespaceNotFound, NotEmpty

pytestmark = pytest.mark.unit


def _produce(root: str, topic: str, values: list[str], **kw: Any) -> None:
    with Client(root) as c:
        p = c.create_producer(topic, batching_enabled=False, **kw)
        for v in values:
            p.send(v.encode())
        p.close()


def test_units_parse_like_pulsar_admin() -> None:
    assert parse_time("3d", "--time") == 3 * 86400
    assert parse_time("90", "--time") == 90  # bare: seconds
    assert parse_time("10", "-t", default_unit="m") == 600
    assert parse_time("2w", "x") == 14 * 86400 and parse_time("1y", "x") == 365 * 86400
    assert parse_time("-1", "--time", unlimited=True) == -1
    assert parse_size("10G", "--size") == 10 << 30 and parse_size("500m", "--size") == 500 << 20
    assert parse_size("4096", "--size") == 4096 and parse_size("-1", "s", unlimited=True) == -1
    for bad in ("3x", "", "1.5h", "-1", "d", "3 d d"):
        with pytest.raises(UnitError) as e:
            parse_time(bad, "--time")
        assert "--time" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UnitError, match="not a size"):
        parse_size("10GB", "--size")
    assert issubclass(UnitError, InvalidConfiguration)


def test_namespace_policies_with_units(tmp_path: Any) -> None:
    ns = Admin(str(tmp_path)).namespaces()
    assert ns.set_retention("public/default", time="3d", size="10G") == {
        "retentionTimeInMinutes": 4320,
        "retentionSizeInMB": 10240,
    }
    assert ns.get_retention("public/default") == {
        "retentionTimeInMinutes": 4320,
        "retentionSizeInMB": 10240,
    }
    ns.set_retention("public/default", time="-1", size="-1")
    assert ns.get_retention("public/default")["retentionSizeInMB"] == -1
    for bad in ({"time": "90", "size": "1G"}, {"time": "3d", "size": "4096"}):  # fractions
        with pytest.raises(UnitError, match="whole number"):
            ns.set_retention("public/default", **bad)
    assert ns.get_retention("public/default")["retentionTimeInMinutes"] == -1  # unchanged
    ns.remove_retention("public/default")
    assert ns.get_retention("public/default") == {
        "retentionTimeInMinutes": 0,
        "retentionSizeInMB": 0,
    }
    assert ns.set_message_ttl("public/default", "1h") == 3600
    ns.set_deduplication_status("public/default", True)
    ns.set_delayed_delivery("public/default", False, "2s")
    assert ns.set_subscription_expiration_time("public/default", "2h") == 120
    assert ns.set_max_message_size("public/default", "1M") == 1 << 20
    ns.set_auto_topic_creation("public/default", True, "partitioned", 3)
    pol = ns.get_policies("public/default")
    assert pol["message_ttl_seconds"] == 3600 and pol["deduplication_enabled"] is True
    assert pol["delayed_delivery_enabled"] is False and pol["delayed_delivery_tick_ms"] == 2000
    assert pol["subscription_expiration_minutes"] == 120
    assert pol["auto_topic_creation_type"] == "partitioned" and pol["default_num_partitions"] == 3
    with pytest.raises(InvalidConfiguration, match="True or False"):
        ns.set_deduplication_status("public/default", "yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidConfiguration):
        ns.set_auto_topic_creation("public/default", True, "sideways")


def test_tenants_and_namespaces(tmp_path: Any) -> None:
    admin = Admin(str(tmp_path))
    admin.tenants().create("acme")
    assert admin.tenants().list() == ["acme", "public", "pulsar"]
    with pytest.raises(AlreadyExists):
        admin.tenants().create("acme")
    admin.namespaces().create("acme/orders")
    with pytest.raises(AlreadyExists):
        admin.namespaces().create("acme/orders")
    assert admin.namespaces().list("acme") == ["acme/orders"]
    with pytest.raises(NotEmpty):
        admin.tenants().delete("acme")
    admin.topics().create_non_partitioned_topic("persistent://acme/orders/t")
    with pytest.raises(NotEmpty, match="persistent://acme/orders/t"):
        admin.namespaces().delete("acme/orders")
    admin.namespaces().delete("acme/orders", force=True)
    assert admin.namespaces().list("acme") == []
    with pytest.raises(NamespaceNotFound):
        admin.namespaces().delete("acme/orders")
    admin.tenants().delete("acme")
    assert admin.tenants().list() == ["public", "pulsar"]  # built in, as in Pulsar
    with pytest.raises(InvalidTopicName, match="tenant/namespace"):
        admin.namespaces().create("no-slash")


def test_topics_create_list_stats_delete(tmp_path: Any) -> None:
    root = str(tmp_path)
    t = Admin(root).topics()
    t.create_partitioned_topic("orders", 2)
    t.create_non_partitioned_topic("single")
    assert t.update_partitioned_topic("orders", 3) == (2, 3)
    assert t.list() == ["persistent://public/default/orders", "persistent://public/default/single"]
    _produce(root, "single", ["a", "b", "c"])
    s = t.get_stats("single")
    assert s["msgInCounter"] == 3 and s["storageSize"] > 0 and s["subscriptions"] == {}
    internal = t.get_internal_stats("single")
    assert internal["numberOfEntries"] == 3 and internal["lastConfirmedEntry"] == "0:2"
    ps = t.get_partitioned_stats("orders")
    assert ps["metadata"] == {"partitions": 3} and len(ps["partitions"]) == 3
    assert t.examine_message("single", "earliest", 1)["value"] == b"a"
    assert t.examine_message("single", "latest", 1)["value"] == b"c"
    with pytest.raises(TopicNotFound, match="no message at position 4"):
        t.examine_message("single", "earliest", 4)
    with pytest.raises(InvalidConfiguration, match="partitioned"):
        t.examine_message("orders")
    with pytest.raises(TopicNotFound):
        t.get_stats("nope")
    t.delete("single")
    assert t.list() == ["persistent://public/default/orders"]


def test_delete_refused_while_a_consumer_is_connected(tmp_path: Any) -> None:
    """Pulsar refuses to delete a topic (or a subscription) with connected consumers unless
    forced; the first CLI deleted a topic under a live consumer."""
    root = str(tmp_path)
    t = Admin(root).topics()
    _produce(root, "t", ["x"])
    with Client(root) as c:
        consumer = c.subscribe("t", "s", initial_position=InitialPosition.Earliest)
        with pytest.raises(ConsumerBusy, match="--force"):
            t.delete("t")
        with pytest.raises(ConsumerBusy, match="connected consumers"):
            t.delete_subscription("t", "s")
        assert t.get_subscriptions("t") == ["s"]
        consumer.close()
    t.delete_subscription("t", "s")
    assert t.get_subscriptions("t") == []
    with pytest.raises(SubscriptionNotFound):
        t.delete_subscription("t", "s")
    t.delete("t")


def test_msg_backlog_subtracts_individually_acknowledged_messages(tmp_path: Any) -> None:
    # Pulsar's cursor subtracts its individually deleted messages from the backlog it reports:
    # a Shared subscription that acknowledged all but the first of ten has a backlog of one,
    # not ten (the mark-delete position stays before the first). Two producers, so the ranges
    # lie in two ledgers, one range crossing from the first into the second.
    root = str(tmp_path)
    t = Admin(root).topics()
    _produce(root, "t", [f"a{i}" for i in range(6)])
    _produce(root, "t", [f"b{i}" for i in range(4)])
    t.create_subscription("t", "s", "earliest")
    backlog = lambda: t.get_stats("t")["subscriptions"]["s"]["msgBacklog"]  # noqa: E731
    with Client(root) as c:
        consumer = c.subscribe("t", "s", consumer_type=ConsumerType.Shared)
        msgs = [consumer.receive(timeout_millis=5000) for _ in range(10)]
        by_value = {m.value(): m for m in msgs}
        for v in (b"a2", b"a3", b"a4", b"a5", b"b0", b"b1", b"b3"):
            consumer.acknowledge(by_value[v])
        consumer.close()
    assert backlog() == 3  # a0, a1 and b2
    with Client(root) as c:
        consumer = c.subscribe("t", "s", consumer_type=ConsumerType.Shared)
        for m in [consumer.receive(timeout_millis=5000) for _ in range(3)]:
            if m.value() == b"a1":
                consumer.acknowledge(m)
        consumer.close()
    assert backlog() == 2


def test_subscription_cursor_operations(tmp_path: Any) -> None:
    root = str(tmp_path)
    t = Admin(root).topics()
    _produce(root, "t", [f"m{i}" for i in range(10)])
    t.create_subscription("t", "s", "earliest")
    with pytest.raises(AlreadyExists):
        t.create_subscription("t", "s")
    t.create_subscription("t", "late")  # latest: nothing to consume
    backlog = lambda sub: t.get_stats("t")["subscriptions"][sub]["msgBacklog"]  # noqa: E731
    assert backlog("s") == 10 and backlog("late") == 0
    assert [m["value"] for m in t.peek_messages("t", "s", 2)] == [b"m0", b"m1"]
    assert t.skip_messages("t", "s", 3) == 3
    assert backlog("s") == 7
    assert [m["value"] for m in t.peek_messages("t", "s", 1)] == [b"m3"]
    t.reset_cursor("t", "s", message_id="0:1:-1")
    assert backlog("s") == 9 and t.peek_messages("t", "s", 1)[0]["value"] == b"m1"
    t.clear_backlog("t", "s")
    assert backlog("s") == 0
    t.reset_cursor("t", "s", timestamp=0)  # everything was published after 0
    assert backlog("s") == 10
    t.reset_cursor("t", "s", timestamp=int(time.time() * 1000) + 60_000)
    assert backlog("s") == 0
    t.reset_cursor("t", "s", message_id="earliest")
    assert t.expire_messages("t", "s", 3600) == 0  # nothing is an hour old
    assert backlog("s") == 10
    assert t.expire_messages("t", "s", 0) == 1
    assert backlog("s") == 0
    # The cutoff is on the admin's clock: two hours on, everything is an hour old.
    t.reset_cursor("t", "s", message_id="earliest")
    later = ManualClock(int(time.time() * 1000) + 2 * 3_600_000)
    assert Topics(t.store, clock=later).expire_messages("t", "s", 3600) == 1
    assert backlog("s") == 0
    with pytest.raises(SubscriptionNotFound):
        t.skip_messages("t", "nope", 1)
    with pytest.raises(InvalidConfiguration, match="malformed"):
        t.reset_cursor("t", "s", message_id="zz")
    with pytest.raises(InvalidConfiguration, match="exactly one"):
        t.reset_cursor("t", "s")


def test_reset_cursor_reaches_a_connected_exclusive_consumer(tmp_path: Any) -> None:
    """Pulsar's reset-cursor disconnects the consumers, which then read from the new
    position; here a connected Exclusive consumer restarts at the reset cursor on its next
    fetch (before, it kept reading from where it was and never saw the messages again)."""
    root = str(tmp_path)
    _produce(root, "t", [f"m{i}" for i in range(5)])
    t = Admin(root).topics()
    with Client(root) as c:
        consumer = c.subscribe(
            "t",
            "s",
            consumer_type=ConsumerType.Exclusive,
            initial_position=InitialPosition.Earliest,
            receiver_queue_size=1,
        )
        got = [consumer.receive(2000) for _ in range(5)]
        consumer.acknowledge_cumulative(got[-1])
        assert t.get_stats("t")["subscriptions"]["s"]["msgBacklog"] == 0
        t.reset_cursor("t", "s", message_id="earliest")
        again = [consumer.receive(5000).data() for _ in range(5)]
        assert again == [f"m{i}".encode() for i in range(5)]
        consumer.close()


def test_skip_reaches_a_connected_exclusive_consumer(tmp_path: Any) -> None:
    root = str(tmp_path)
    _produce(root, "t", [f"m{i}" for i in range(6)])
    t = Admin(root).topics()
    with Client(root) as c:
        consumer = c.subscribe(
            "t",
            "s",
            consumer_type=ConsumerType.Exclusive,
            initial_position=InitialPosition.Earliest,
            receiver_queue_size=1,
            ack_grouping_time_ms=0,  # the skip counts from the cursor: m0's ack is on it
        )
        first = consumer.receive(2000)
        consumer.acknowledge(first)
        # The receive queue holds at most one more message (m1): skip m1..m3 on the cursor.
        assert t.skip_messages("t", "s", 3) == 3
        rest: list[bytes] = []
        while not rest or rest[-1] != b"m5":
            m = consumer.receive(5000)
            rest.append(m.data())
            consumer.acknowledge(m)
        assert rest[-2:] == [b"m4", b"m5"] and b"m2" not in rest and b"m3" not in rest
        consumer.close()


def test_read_table_returns_every_message_once_without_acknowledging(tmp_path: Any) -> None:
    root = str(tmp_path)
    admin = Admin(root)
    admin.topics().create_partitioned_topic("rt", 3)
    client = Client(root)
    producer = client.create_producer("rt")
    for i in range(30):
        producer.send(b"m%02d" % i, partition_key=f"k{i % 7}")
    consumer = client.subscribe("rt", "s", initial_position=InitialPosition.Earliest)
    table = admin.topics().read_table("rt")
    assert sorted(table.column("value").to_pylist()) == [b"m%02d" % i for i in range(30)]
    assert set(table.column("partition").to_pylist()) == {0, 1, 2}
    assert admin.topics().read_table("rt", max_messages=4).num_rows == 4
    assert admin.topics().read_table("rt", max_messages=0).num_rows == 0
    df = table.to_pandas()
    assert len(df) == 30 and {"key", "publishTime", "properties"} <= set(df.columns)
    # the Spark source's columns; the storage reader's are one keyword away
    assert str(df["publishTime"].dtype) == "datetime64[us, UTC]"
    row = table.slice(0, 1).to_pylist()[0]
    assert row["messageId"].startswith(f"{row['ledgerId']}:{row['entryId']}:{row['partition']}")
    stored = admin.topics().read_table("rt", columns="storage")
    assert stored.column("publish_time").type == pa.int64()
    assert sorted(stored.column("value").to_pylist()) == [b"m%02d" % i for i in range(30)]
    ms = pc.cast(table.column("publishTime"), pa.int64()).to_pylist()
    assert sorted(v // 1000 for v in ms) == sorted(stored.column("publish_time").to_pylist())
    with pytest.raises(InvalidConfiguration, match="columns must be 'spark' or 'storage'"):
        admin.topics().read_table("rt", columns="snake")
    stats = admin.topics().get_partitioned_stats("rt")
    assert stats["subscriptions"]["s"]["msgBacklog"] == 30  # nothing acknowledged
    with pytest.raises(TopicNotFound):
        admin.topics().read_table("missing")
    with pytest.raises(InvalidConfiguration, match="max_messages must be >= 0"):
        admin.topics().read_table("rt", max_messages=-1)
    consumer.close()
    client.close()
