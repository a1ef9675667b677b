"""Client features pulsar-client users reach for (issue 13): ExclusiveWithFencing producers,
pausing a message listener, and the vendor guide's retry delay levels on reconsume_later.

Delays run on an injected clock, so nothing sleeps for time to pass.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from filepulsar.connector.client import (
    AlreadyClosed,
    Client,
    ConsumerType,
    InitialPosition,
    Message,
    ProducerAccessMode,
    ProducerFenced,
    Result,
    Timeout,
)
from filepulsar.dispatch.redelivery import delay_of_level, parse_delay_levels
from filepulsar.storage import set_namespace_policies
from filepulsar.storage.errors import InvalidConfiguration

pytestmark = pytest.mark.unit

E = InitialPosition.Earliest
LONG_LEASE = 3_600_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def client(tmp_path: Path) -> Any:
    c = Client(str(tmp_path / "root"))
    yield c
    c.close()


# ---------------------------------------------------------------------- ExclusiveWithFencing
def test_exclusive_with_fencing_fences_an_exclusive_producer(client: Client) -> None:
    # pulsar-client's test_producer_access_mode_exclusive_with_fencing.
    p1 = client.create_producer("fx", producer_name="p-1", access_mode=ProducerAccessMode.Exclusive)
    p1.send(b"before")
    p2 = client.create_producer(
        "fx", producer_name="p-2", access_mode=ProducerAccessMode.ExclusiveWithFencing
    )
    assert p2.producer_name() == "p-2"
    with pytest.raises((ProducerFenced, AlreadyClosed)):
        p1.send(b"fenced")
    p2.send(b"after")
    c = client.subscribe("fx", "s", initial_position=E)
    assert [c.receive(2000).data() for _ in range(2)] == [b"before", b"after"]
    with pytest.raises(Timeout):
        c.receive(50)


def test_exclusive_with_fencing_fences_shared_producers_and_holds_the_topic(
    client: Client,
) -> None:
    a = client.create_producer("fs", producer_name="a")
    b = client.create_producer("fs", producer_name="b")
    f = client.create_producer(
        "fs", producer_name="f", access_mode=ProducerAccessMode.ExclusiveWithFencing
    )
    for p in (a, b):
        with pytest.raises(ProducerFenced):
            p.send(b"x")
    # The fencing producer is exclusive: shared and exclusive newcomers are refused...
    with pytest.raises(ProducerFenced):
        client.create_producer("fs", producer_name="late")
    with pytest.raises(ProducerFenced):
        client.create_producer(
            "fs", producer_name="late-ex", access_mode=ProducerAccessMode.Exclusive
        )
    # ...and another fencing producer takes the topic from it.
    g = client.create_producer(
        "fs", producer_name="g", access_mode=ProducerAccessMode.ExclusiveWithFencing
    )
    with pytest.raises(ProducerFenced):
        f.send(b"y")
    g.send(b"z")


def test_a_fenced_producers_queued_async_sends_fail(client: Client) -> None:
    p1 = client.create_producer("fa", producer_name="p1", access_mode=ProducerAccessMode.Exclusive)
    client.create_producer(
        "fa", producer_name="p2", access_mode=ProducerAccessMode.ExclusiveWithFencing
    )
    results: list[Result] = []
    done = threading.Event()

    def cb(res: Result, _mid: Any) -> None:
        results.append(res)
        done.set()

    try:
        p1.send_async(b"late", cb)
    except (ProducerFenced, AlreadyClosed):
        return  # refused at once: as good as a failed callback
    assert done.wait(60)
    assert results and results[0] != Result.Ok


# ---------------------------------------------------------------------- listener pause
def test_paused_listener_gets_nothing_until_resumed_then_everything_in_order(
    client: Client,
) -> None:
    got: list[bytes] = []
    arrived = threading.Condition()

    def listener(consumer: Any, msg: Message) -> None:
        with arrived:
            got.append(msg.data())
            arrived.notify_all()
        consumer.acknowledge(msg)

    c = client.subscribe("pl", "s", message_listener=listener, initial_position=E)
    p = client.create_producer("pl")
    p.send(b"0")
    with arrived:
        assert arrived.wait_for(lambda: len(got) == 1, 60)
    c.pause_message_listener()
    for i in range(1, 6):
        p.send(str(i).encode())
    # Proof that nothing is delivered while paused: the messages are queued for this consumer
    # (a second receive-based consumer on the Exclusive subscription is refused, so look at
    # what the listener saw after the producer's sends returned and a receive window passed).
    with arrived:
        assert not arrived.wait_for(lambda: len(got) > 1, 0.3)
    c.resume_message_listener()
    with arrived:
        assert arrived.wait_for(lambda: len(got) == 6, 60)
    assert got == [str(i).encode() for i in range(6)]


def test_pause_without_a_listener_is_harmless(client: Client) -> None:
    c = client.subscribe("pn", "s", initial_position=E)
    c.pause_message_listener()
    c.resume_message_listener()
    client.create_producer("pn").send(b"x")
    assert c.receive(2000).data() == b"x"


def test_close_wakes_a_paused_listener(client: Client) -> None:
    c = client.subscribe("pc", "s", message_listener=lambda *_: None, initial_position=E)
    c.pause_message_listener()
    c.close()  # must not hang on the paused listener thread
    assert c._listener is not None
    thread = c._listener.thread
    thread.join(60)
    assert not thread.is_alive()


# ---------------------------------------------------------------------- retry delay levels
def test_delay_levels_parse_the_vendor_default() -> None:
    levels = parse_delay_levels("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h")
    assert len(levels) == 18
    assert delay_of_level(levels, 1) == 1000  # "level 1 is 1 s"
    assert delay_of_level(levels, 3) == 10_000  # "level 3 is 10 s"
    assert delay_of_level(levels, 18) == 7_200_000
    assert delay_of_level(levels, 40) == 7_200_000  # past the last: the last
    assert parse_delay_levels("250ms 1d") == (250, 86_400_000)
    for bad in ("", "1x", "0s", "s", "1.5s"):
        with pytest.raises(ValueError, match="delay level"):
            parse_delay_levels(bad)
    with pytest.raises(ValueError, match=">= 1"):
        delay_of_level(levels, 0)


def _retry_client(tmp_path: Path, clock: Clock) -> Client:
    c = Client(str(tmp_path / "r"), clock=clock)
    set_namespace_policies(c.store, "public", "default", producer_lease_ms=LONG_LEASE)
    return c


#: Pulsar's delayed delivery may release a message up to one tick early (not strict mode).
TICK_MS = 1000


def _held_for(c: Any, clock: Clock, ms: int) -> Message:
    """The retried message: held until a tick before ``ms`` have passed, delivered at ``ms``."""
    clock.now += ms - TICK_MS - 1
    with pytest.raises(Timeout):
        c.receive(30)
    clock.now += TICK_MS + 1
    return c.receive(5000)


def test_reconsume_later_with_a_delay_level(tmp_path: Path) -> None:
    clock = Clock()
    client = _retry_client(tmp_path, clock)
    try:
        client.create_producer("lv").send(b"job")
        c = client.subscribe(
            "lv",
            "s",
            consumer_type=ConsumerType.Shared,
            initial_position=E,
            retry_enable=True,
            consumer_lease_ms=LONG_LEASE,
        )
        m = c.receive(5000)
        c.reconsume_later(m, delay_level=3)  # level 3: 10 s
        m = _held_for(c, clock, 10_000)
        assert m.properties()["DELAY_TIME"] == "10000"
        with pytest.raises(InvalidConfiguration, match="not both"):
            c.reconsume_later(m, 1000, delay_level=2)
        with pytest.raises(InvalidConfiguration, match=">= 1"):
            c.reconsume_later(m, delay_level=0)
    finally:
        client.close()


def test_reconsume_later_without_a_delay_climbs_the_levels(tmp_path: Path) -> None:
    clock = Clock()
    client = _retry_client(tmp_path, clock)
    try:
        client.create_producer("inc").send(b"job")
        c = client.subscribe(
            "inc",
            "s",
            consumer_type=ConsumerType.Shared,
            initial_position=E,
            retry_enable=True,
            consumer_lease_ms=LONG_LEASE,
            retry_delay_levels="2s 5s 10s",
        )
        m = c.receive(5000)
        waits = []
        for expected in (2000, 5000, 10_000, 10_000):  # then stays at the last level
            c.reconsume_later(m)
            m = _held_for(c, clock, expected)
            waits.append(int(m.properties()["DELAY_TIME"]))
        assert waits == [2000, 5000, 10_000, 10_000]
        assert m.properties()["RECONSUMETIMES"] == "4"
    finally:
        client.close()


def test_bad_retry_delay_levels_are_refused(client: Client) -> None:
    with pytest.raises(InvalidConfiguration, match="delay level '2x'"):
        client.subscribe("bad", "s", retry_enable=True, retry_delay_levels="1s 2x")


# ---------------------------------------------------------------------- null values
@pytest.mark.parametrize("batching", [False, True])
def test_null_values_are_distinct_from_empty_bytes(client: Client, batching: bool) -> None:
    # pulsar-client's test_null_value_message and test_null_value_vs_empty_bytes.
    producer = client.create_producer(f"nv-{batching}", batching_enabled=batching)
    consumer = client.subscribe(f"nv-{batching}", "sub", initial_position=E)
    producer.send(b"not null", partition_key="k1")
    producer.send(None, partition_key="k2")
    producer.send(b"", partition_key="k3")
    done = threading.Event()
    producer.send_async(None, lambda res, _mid: done.set())
    producer.flush()
    assert done.wait(60)
    got = [consumer.receive(5000) for _ in range(4)]
    assert [(m.data(), m.has_null_value()) for m in got] == [
        (b"not null", False),
        (b"", True),
        (b"", False),
        (b"", True),
    ]
    assert [m.partition_key() for m in got[:3]] == ["k1", "k2", "k3"]


def test_a_null_value_still_needs_bytes_otherwise(client: Client) -> None:
    producer = client.create_producer("nv-bad")
    with pytest.raises(TypeError, match="must be bytes, got str"):
        producer.send("text")  # type: ignore[arg-type]
