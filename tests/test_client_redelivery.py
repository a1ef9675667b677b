"""Negative acks, ack timeout, dead letters and reconsume_later, with PULSAR_RULES' counts.

An injected clock drives every delay, so nothing here sleeps for time to pass; a short
``receive`` timeout only proves that nothing is deliverable yet.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from filepulsar.connector.client import (
    Client,
    ConsumerDeadLetterPolicy,
    ConsumerType,
    InitialPosition,
    Message,
    MultiplierRedeliveryBackoff,
    Timeout,
)
from filepulsar.storage import set_namespace_policies
from filepulsar.storage.errors import FilePulsarError, InvalidConfiguration
from filepulsar.storage.ledger import ManagedLedger
from filepulsar.storage.names import TopicName
from filepulsar.storage.subscriptions import SubscriptionStore, subscription_backlog

pytestmark = pytest.mark.unit

E = InitialPosition.Earliest
T = "persistent://public/default/work"
LONG_LEASE = 3_600_000  # the clock jumps; leases must not expire in between


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def client(tmp_path: Path, clock: Clock) -> Any:
    c = Client(str(tmp_path / "root"), clock=clock)
    set_namespace_policies(c.store, "public", "default", producer_lease_ms=LONG_LEASE)
    yield c
    c.close()


def subscribe(client: Client, **kw: Any) -> Any:
    kw.setdefault("consumer_type", ConsumerType.Shared)
    kw.setdefault("initial_position", E)
    kw.setdefault("consumer_lease_ms", LONG_LEASE)
    # Every acknowledgement written at once: these tests read the subscription's state
    # between calls (grouped acknowledgements with redelivery: test_client_ack_grouping.py).
    kw.setdefault("ack_grouping_time_ms", 0)
    return client.subscribe(kw.pop("topic", "work"), kw.pop("sub", "s"), **kw)


def nothing(consumer: Any) -> None:
    with pytest.raises(Timeout):
        consumer.receive(30)


def backlog(client: Client, topic: str, sub: str) -> int:
    t = TopicName.parse(topic)
    ml = ManagedLedger(client.store, t)
    return subscription_backlog(ml, ml.state(), SubscriptionStore(client.store, t, sub).latest())


def drain(consumer: Any) -> list[Message]:
    out: list[Message] = []
    while True:
        try:
            m = consumer.receive(100)
        except Timeout:
            return out
        out.append(m)
        consumer.acknowledge(m)


def test_negative_ack_follows_the_backoff(client: Client, clock: Clock) -> None:
    client.create_producer("work", batching_enabled=False).send(b"x")
    backoff = MultiplierRedeliveryBackoff(1000, 60_000, 2)
    c = subscribe(client, negative_ack_redelivery_backoff=backoff)
    m = c.receive(2000)
    for count, delay in enumerate([1000, 2000, 4000, 8000]):
        assert m.redelivery_count() == count
        c.negative_acknowledge(m)
        clock.now += delay - 1
        nothing(c)
        clock.now += 1
        m = c.receive(2000)
    assert m.redelivery_count() == 4 and m.data() == b"x"


def test_negative_ack_fixed_delay_has_a_100_ms_floor(client: Client, clock: Clock) -> None:
    client.create_producer("work", batching_enabled=False).send(b"x")
    c = subscribe(client, negative_ack_redelivery_delay_ms=10)
    c.negative_acknowledge(c.receive(2000))
    clock.now += 99
    nothing(c)
    clock.now += 1
    assert c.receive(2000).redelivery_count() == 1


def test_nack_in_a_batch_redelivers_that_message(client: Client, clock: Clock) -> None:
    """Negatively acknowledging one message of a batch brings back that message, not its
    acknowledged neighbours (with or without batch-index acknowledgement)."""
    p = client.create_producer("work", batching_enabled=True, batching_max_publish_delay_ms=10_000)
    for i in range(3):
        p.send_async(b"%d" % i, None)
    p.flush()
    c = subscribe(client, sub="plain", negative_ack_redelivery_delay_ms=1000)
    a, b, d = (c.receive(2000) for _ in range(3))
    c.acknowledge(a)
    c.negative_acknowledge(b)
    c.acknowledge(d)
    clock.now += 1000
    again = c.receive(2000)
    assert again.data() == b"1" and again.redelivery_count() == 1
    c.acknowledge(again)
    nothing(c)
    assert backlog(client, "work", "plain") == 0

    c2 = subscribe(
        client, sub="indexed", negative_ack_redelivery_delay_ms=1000, batch_index_ack_enabled=True
    )
    a, b, d = (c2.receive(2000) for _ in range(3))
    c2.acknowledge(a)
    c2.negative_acknowledge(b)
    c2.acknowledge(d)
    clock.now += 1000
    only = c2.receive(2000)
    assert only.data() == b"1" and only.redelivery_count() == 1
    c2.acknowledge(only)
    nothing(c2)
    assert backlog(client, "work", "indexed") == 0


@pytest.mark.parametrize("consumer_type", [ConsumerType.Shared, ConsumerType.KeyShared])
def test_a_batch_of_one_acknowledged_while_negatively_acknowledged_stays_acknowledged(
    client: Client, clock: Clock, consumer_type: ConsumerType
) -> None:
    """Entries a KeyBased producer writes for keys sent alone are batches of one message
    (batch index 0; the consumer queues them a row each, as unbatched ones). One
    acknowledged after its negative acknowledgement and before it comes back is not
    delivered again; the others come back as any redelivery does."""
    p = client.create_producer(
        "work",
        batching_enabled=True,
        batching_type="KeyBased",
        batching_max_publish_delay_ms=10_000,
    )
    for i in range(3):
        p.send_async(b"%d" % i, None, partition_key=f"k{i}")
    p.flush()
    c = subscribe(client, consumer_type=consumer_type, negative_ack_redelivery_delay_ms=1000)
    got = sorted((c.receive(2000) for _ in range(3)), key=lambda m: m.data())
    assert [m.message_id().batch_index() for m in got] == [0, 0, 0]
    a, b, d = got
    c.negative_acknowledge(a)
    c.negative_acknowledge(b)
    c.acknowledge(a)  # before it comes back: that acknowledgement stands
    c.acknowledge(d)
    clock.now += 1000
    again = c.receive(2000)
    assert again.data() == b"1" and again.redelivery_count() == 1
    assert again.message_id().batch_index() == 0
    c.acknowledge(again)
    nothing(c)
    assert backlog(client, "work", "s") == 0


def test_ack_timeout_redelivers_after_timeout_within_a_tick(client: Client, clock: Clock) -> None:
    client.create_producer("work", batching_enabled=False).send(b"x")
    c = subscribe(client, unacked_messages_timeout_ms=10_000, tick_duration_ms=1000)
    m = c.receive(2000)
    assert m.redelivery_count() == 0
    clock.now += 9_999
    nothing(c)
    clock.now += 1_001  # timeout + tick at most
    again = c.receive(2000)
    assert again.redelivery_count() == 1 and again.data() == b"x"
    c.acknowledge(again)
    clock.now += 20_000
    nothing(c)  # acknowledged messages do not time out


def test_an_ack_timeout_redelivery_keeps_the_held_batch_index_acknowledgements(
    client: Client, clock: Clock
) -> None:
    """A batch entry whose ack timeout expires goes back to the subscription for any
    consumer; the indexes of it this process acknowledged and holds back (grouped, or for
    the rate) are written first, so another consumer of the process gets only the rest
    (issue #27: acknowledgements held here are this process's at once)."""
    p = client.create_producer("work", batching_enabled=True, batching_max_publish_delay_ms=10_000)
    for i in range(3):
        p.send_async(b"%d" % i, None)
    p.flush()
    kw = {"batch_index_ack_enabled": True, "ack_grouping_time_ms": 60_000}
    a = subscribe(client, unacked_messages_timeout_ms=10_000, tick_duration_ms=1000, **kw)
    first = [a.receive(2000) for _ in range(3)]
    a.acknowledge(first[0])  # held back: the group is 60 s
    b = subscribe(client, **kw)
    clock.now += 11_001  # the timeout and a tick: a's housekeeping thread (every second)
    # redelivers the entry, and b, waiting, gets it
    assert [m.data() for m in (b.receive(10_000), b.receive(2000))] == [b"1", b"2"]
    nothing(b)


def test_dead_letter_after_max_redeliveries(client: Client, clock: Clock) -> None:
    p = client.create_producer("work", batching_enabled=False)
    mid = p.send(b"poison", properties={"a": "1"}, partition_key="k")
    policy = ConsumerDeadLetterPolicy(max_redeliver_count=2, initial_subscription_name="audit")
    c = subscribe(client, dead_letter_policy=policy, negative_ack_redelivery_delay_ms=1000)
    counts = []
    for _ in range(3):
        m = c.receive(2000)
        counts.append(m.redelivery_count())
        c.negative_acknowledge(m)
        clock.now += 1000
    assert counts == [0, 1, 2]  # the application sees 0..max; failing count==max → DLQ
    nothing(c)
    assert backlog(client, "work", "s") == 0  # the original was acknowledged
    dlq = subscribe(client, topic=f"{T}-s-DLQ", sub="audit")  # created with the DLQ producer
    d = dlq.receive(2000)
    assert d.data() == b"poison" and d.partition_key() == "k"
    assert d.properties() == {"a": "1", "REAL_TOPIC": T, "ORIGIN_MESSAGE_ID": str(mid)}


def test_dead_letter_on_ack_timeout_for_key_shared(client: Client, clock: Clock) -> None:
    client.create_producer("work", batching_enabled=False).send(b"slow", partition_key="k")
    c = subscribe(
        client,
        consumer_type=ConsumerType.KeyShared,
        unacked_messages_timeout_ms=5000,
        dead_letter_policy=ConsumerDeadLetterPolicy(1, dead_letter_topic="graveyard"),
    )
    assert c.receive(2000).redelivery_count() == 0
    clock.now += 6000
    assert c.receive(2000).redelivery_count() == 1
    clock.now += 6000
    nothing(c)  # went to the dead-letter topic
    got = drain(subscribe(client, topic="graveyard", sub="x"))
    assert [m.data() for m in got] == [b"slow"]


def test_exclusive_subscriptions_do_not_dead_letter(client: Client, clock: Clock) -> None:
    client.create_producer("work", batching_enabled=False).send(b"x")
    c = subscribe(
        client,
        consumer_type=ConsumerType.Exclusive,
        dead_letter_policy=ConsumerDeadLetterPolicy(1),
        negative_ack_redelivery_delay_ms=1000,
    )
    for _ in range(4):  # no dead letter; and, as in Pulsar, no redelivery count either
        m = c.receive(2000)
        assert m.redelivery_count() == 0
        c.negative_acknowledge(m)
        clock.now += 1000


def test_reconsume_later_counts_then_dead_letter(client: Client, clock: Clock) -> None:
    mid = client.create_producer("work", batching_enabled=False).send(b"job", properties={"p": "q"})
    c = subscribe(client, retry_enable=True, dead_letter_policy=ConsumerDeadLetterPolicy(2))
    m = c.receive(2000)
    for times in (1, 2):
        c.reconsume_later(m, 5000, properties={"step": str(times)})
        nothing(c)  # held for the delay on a Shared subscription
        clock.now += 5000
        m = c.receive(2000)
        assert m.topic_name() == f"{T}-s-RETRY"
        assert m.properties() == {
            "p": "q",
            "step": str(times),
            "REAL_TOPIC": T,
            "ORIGIN_MESSAGE_ID": str(mid),
            "RECONSUMETIMES": str(times),
            "DELAY_TIME": "5000",
        }
    c.reconsume_later(m, 5000)  # RECONSUMETIMES 3 > 2: dead letter
    clock.now += 5000
    nothing(c)
    dead = drain(subscribe(client, topic=f"{T}-s-DLQ", sub="x"))
    assert len(dead) == 1 and dead[0].properties()["RECONSUMETIMES"] == "3"
    assert dead[0].properties()["ORIGIN_MESSAGE_ID"] == str(mid)
    for topic in ("work", f"{T}-s-RETRY"):
        assert backlog(client, topic, "s") == 0


def test_reconsume_later_default_allows_16_retries(client: Client) -> None:
    client.create_producer("work", batching_enabled=False).send(b"job")
    c = subscribe(client, consumer_type=ConsumerType.Exclusive, retry_enable=True)
    seen = []
    while True:
        try:
            m = c.receive(300)
        except Timeout:
            break
        seen.append(int(m.properties().get("RECONSUMETIMES", "0")))
        c.reconsume_later(m, 0)
    assert seen == list(range(17))  # the original, then retries 1..16; the 17th → DLQ
    dead = drain(subscribe(client, topic=f"{T}-s-DLQ", sub="x"))
    assert dead[0].properties()["RECONSUMETIMES"] == "17"


def test_reconsume_later_needs_retry_enable(client: Client) -> None:
    client.create_producer("work").send(b"x")
    c = subscribe(client)
    with pytest.raises(InvalidConfiguration, match="retry_enable"):
        c.reconsume_later(c.receive(2000), 1000)
    with pytest.raises(InvalidConfiguration, match="max_redeliver_count"):
        ConsumerDeadLetterPolicy(0)


def _batch_of_three(client: Client) -> None:
    p = client.create_producer("work", batching_enabled=True, batching_max_publish_delay_ms=10_000)
    for i in range(3):
        p.send_async(b"%d" % i, None)
    p.flush()


@pytest.mark.parametrize("path", ["nack_by_id", "ack_timeout"])
def test_dead_lettered_messages_still_queued_are_not_delivered(
    client: Client, clock: Clock, path: str
) -> None:
    _batch_of_three(client)
    c = subscribe(
        client,
        dead_letter_policy=ConsumerDeadLetterPolicy(1),
        negative_ack_redelivery_delay_ms=1000,
        unacked_messages_timeout_ms=5000 if path == "ack_timeout" else None,
    )
    first = c.receive(2000)  # "1" and "2" wait in the receiver queue
    if path == "nack_by_id":
        c.negative_acknowledge(first)
        clock.now += 1000
    else:
        clock.now += 6000
    again = c.receive(2000)  # the whole batch came back, count 1; two messages queued
    assert again.data() == b"0" and again.redelivery_count() == 1
    if path == "nack_by_id":
        c.negative_acknowledge(again.message_id())  # by id: the whole entry goes
    else:
        clock.now += 6000
    nothing(c)  # the queued "1" and "2" went to the dead-letter topic with "0"
    assert backlog(client, "work", "s") == 0
    dead = drain(subscribe(client, topic=f"{T}-s-DLQ", sub="x"))
    assert sorted(m.data() for m in dead) == [b"0", b"1", b"2"]


def test_dead_letter_and_retry_copies_of_chunked_messages(client: Client, clock: Clock) -> None:
    set_namespace_policies(client.store, "public", "default", max_message_size=1000)
    p = client.create_producer("work", batching_enabled=False, chunking_enabled=True)
    payload = bytes(range(256)) * 10  # 2560 B: three chunks, also in the copies
    p.send(payload, properties={"k": "v"})
    c = subscribe(client, retry_enable=True, dead_letter_policy=ConsumerDeadLetterPolicy(1))
    m = c.receive(2000)
    assert m.data() == payload
    c.reconsume_later(m, 0)  # the retry producer chunks the copy
    r = c.receive(2000)
    assert r.topic_name() == f"{T}-s-RETRY" and r.data() == payload
    assert r.properties()["RECONSUMETIMES"] == "1"
    c.reconsume_later(r, 0)  # RECONSUMETIMES 2 > 1: the dead-letter producer chunks it
    nothing(c)
    dead = drain(subscribe(client, topic=f"{T}-s-DLQ", sub="x"))
    assert [d.data() for d in dead] == [payload]
    assert dead[0].properties()["k"] == "v"
    for topic in ("work", f"{T}-s-RETRY"):
        assert backlog(client, topic, "s") == 0


def _failing_dead_letter(c: Any, monkeypatch: pytest.MonkeyPatch, bad: bytes) -> None:
    real = c._dead_letters.send

    def to_dead_letter(msgs: list[Message]) -> None:
        if any(m.data() == bad for m in msgs):
            raise FilePulsarError("dead-letter topic unavailable")
        real(msgs)

    monkeypatch.setattr(c._dead_letters, "send", to_dead_letter)


def test_ack_timeout_sweep_survives_a_failing_dead_letter(
    client: Client, clock: Clock, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    p = client.create_producer("work", batching_enabled=False)
    bad_id = p.send(b"bad")
    p.send(b"good")
    c = subscribe(
        client, unacked_messages_timeout_ms=5000, dead_letter_policy=ConsumerDeadLetterPolicy(1)
    )
    _failing_dead_letter(c, monkeypatch, b"bad")
    assert sorted(c.receive(2000).data() for _ in range(2)) == [b"bad", b"good"]
    clock.now += 6000
    assert {c.receive(2000).redelivery_count() for _ in range(2)} == {1}
    clock.now += 6000
    # The sweep (run by receive) cannot dead-letter "bad": it logs, redelivers it, and still
    # dead-letters "good"; receive() does not raise.
    m = c.receive(2000)
    assert m.data() == b"bad" and m.redelivery_count() == 2
    assert f"entry {bad_id.ledger_id}:{bad_id.entry_id}" in caplog.text
    assert "dead-letter topic unavailable" in caplog.text
    c.acknowledge(m)
    nothing(c)
    dead = drain(subscribe(client, topic=f"{T}-s-DLQ", sub="x"))
    assert [d.data() for d in dead] == [b"good"]


def test_negative_ack_redelivers_when_the_dead_letter_fails(
    client: Client, clock: Clock, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    client.create_producer("work", batching_enabled=False).send(b"bad")
    c = subscribe(
        client,
        dead_letter_policy=ConsumerDeadLetterPolicy(1),
        negative_ack_redelivery_delay_ms=1000,
    )
    _failing_dead_letter(c, monkeypatch, b"bad")
    c.negative_acknowledge(c.receive(2000))
    clock.now += 1000
    m = c.receive(2000)
    assert m.redelivery_count() == 1
    c.negative_acknowledge(m)  # due for the DLQ, which fails: logged, redelivered instead
    assert "dead-letter topic unavailable" in caplog.text
    clock.now += 999
    nothing(c)
    clock.now += 1
    assert c.receive(2000).redelivery_count() == 2
