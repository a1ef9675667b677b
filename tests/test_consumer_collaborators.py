"""The client consumer's collaborators without a store: the :class:`ReceiverQueue` (expanding
fetched entries into messages, chunk assembly, skipping acknowledged batch indexes, byte budgets,
dropping what a lapsed registration queued) and the :class:`AckTracker` (the batch tracker,
batch-index acknowledgement, cumulative acknowledgement, negative acknowledgement, the ack
timeout, redelivery). Entries are real encoded and verified entry bytes; the subscription they
come from is a stand-in that serves them and records what the consumer writes back (as
tests/test_claims.py tests the dispatch rules over hand-built states)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from filepulsar.connector.client.ack_grouping import AckGrouper, AckGrouping
from filepulsar.connector.client.consumer import AckTracker, Part, ReceiverQueue, TopicSet
from filepulsar.connector.client.message import Message
from filepulsar.dispatch.clock import ManualClock
from filepulsar.dispatch.redelivery import MultiplierRedeliveryBackoff
from filepulsar.storage.delivery import Delivery
from filepulsar.storage.entry import ChunkInfo, iter_entries
from filepulsar.storage.entry_encode import encode_entry
from filepulsar.storage.ledger import Position, ReadEntry
from filepulsar.storage.names import TopicName

pytestmark = pytest.mark.unit

TOPIC = TopicName.parse("persistent://public/default/units")


def _entry(
    eid: int, values: list[bytes], *, batched: bool = True, chunk: ChunkInfo | None = None
) -> ReadEntry:
    batch = pa.RecordBatch.from_arrays([pa.array(values, pa.binary())], names=["value"])
    data = encode_entry(
        batch,
        producer_name="p",
        publish_time=1000 + eid,
        batched=batched,
        chunk=chunk,
        first_sequence_id=eid * 10,
    )
    return ReadEntry(7, eid, next(iter_entries(data, 1)), str(TOPIC))


class _Subscription:
    """Stands in for a SubscriptionConsumer: serves ``deliveries`` in order and records the
    acknowledgements, cumulative acknowledgements and redelivery requests it is given."""

    def __init__(self, deliveries: list[Delivery]) -> None:
        self.deliveries = list(deliveries)
        self.registrations = 1
        self.fetch_registration = 1
        self.seeks_followed = 0  # others' seeks followed (the queue drops what it held)
        self.fetch_seeks = 0
        self.acked: list[tuple[Position, int, int]] = []
        self.cumulative: list[Position] = []
        self.nacked: list[tuple[list[Position], int]] = []
        self.subscription_properties: dict[str, str] = {}

    def fetch(self, max_entries: int) -> list[Delivery]:
        out, self.deliveries = self.deliveries[:max_entries], self.deliveries[max_entries:]
        self.fetch_registration = self.registrations
        return out

    def lease_lapsed(self) -> bool:
        return False

    def acknowledge(self, items: Any) -> None:
        self.acked.extend(items)

    def acknowledge_cumulative(self, position: Position) -> None:
        self.cumulative.append(position)

    def negative_acknowledge(self, positions: Any, delay_ms: int) -> None:
        self.nacked.append((list(positions), delay_ms))


class _Consumer:
    """The collaborators wired as the Consumer wires them, over one stand-in subscription."""

    def __init__(
        self,
        deliveries: list[Delivery],
        *,
        batch_index_ack: bool = False,
        ack_timeout_ms: int = 0,
        nack_delay_ms: int = 60_000,
        ack_timeout_backoff: MultiplierRedeliveryBackoff | None = None,
    ) -> None:
        self.clock = ManualClock()
        self.sc = _Subscription(deliveries)
        self.topics = TopicSet(
            None,  # type: ignore[arg-type]  # no store: the part is added by hand
            schema=None,
            clock=self.clock,
            waits=self.clock,
            subscribe=lambda name, t: self.sc,  # type: ignore[arg-type,return-value]
            pattern=None,
            retry_topic=None,
            label=str(TOPIC),
            discovery_s=60,
        )
        self.part = Part(self.sc, TOPIC)  # type: ignore[arg-type]
        self.topics.parts.append(self.part)
        # Not grouped: every acknowledgement reaches the subscription before the call returns.
        self.acks = AckGrouper(AckGrouping(time_ms=0), clock=self.clock, name="c")
        self.queue = ReceiverQueue(
            self.topics,
            self.acks,
            schema=None,
            batch_index_ack=batch_index_ack,
            clock=self.clock,
            track_received=ack_timeout_ms > 0,
            name="c",
            subscription="s",
        )
        self.tracker = AckTracker(
            self.topics,
            self.queue,
            self.acks,
            dead_letters=None,  # type: ignore[arg-type]  # no dead-letter policy
            dead_letter_after=None,
            batch_index_ack=batch_index_ack,
            ack_timeout_ms=ack_timeout_ms,
            tick_ms=100,
            ack_timeout_backoff=ack_timeout_backoff,
            nack_delay_ms=nack_delay_ms,
            nack_backoff=None,
            clock=self.clock,
            seek_inclusive=False,
            name="c",
            subscription="s",
        )

    def fill(self) -> None:
        while self.sc.deliveries:
            self.queue.fill(1000)

    def receive_all(self, max_bytes: int = -1) -> list[Message]:
        self.fill()
        return self.queue.take(1000, max_bytes)[0]


def _ids(msgs: list[Message]) -> list[tuple[int, int]]:
    return [(m.message_id().entry_id, m.message_id().batch_index) for m in msgs]


# --------------------------------------------------------------------------- ReceiverQueue
def test_the_queue_expands_batches_in_fetch_order_and_tracks_each_entry() -> None:
    c = _Consumer([Delivery(_entry(0, [b"a", b"bb", b"ccc"]), 0), Delivery(_entry(1, [b"d"]), 2)])
    # One entry first (how many messages an entry holds is not known yet), then sized by it.
    assert c.queue.fill(10) == 3 and c.queue.fill(10) == 1 and len(c.queue) == 4
    got, _ = c.queue.take(10, -1)
    assert [m.data() for m in got] == [b"a", b"bb", b"ccc", b"d"]
    assert _ids(got) == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert [m.redelivery_count() for m in got] == [0, 0, 0, 2]
    assert len(c.queue) == 0
    assert sorted(c.part.unacked) == [(7, 0), (7, 1)]
    assert c.part.unacked[(7, 0)].size == 3 and c.part.unacked[(7, 0)].batched


def test_take_stops_at_the_byte_budget_but_always_gives_one_message() -> None:
    c = _Consumer([Delivery(_entry(0, [b"12345", b"123", b"1234567"]), 0)])
    c.queue.fill(10)
    got, used = c.queue.take(10, 8)
    assert [m.data() for m in got] == [b"12345", b"123"] and used == 8
    got, used = c.queue.take(10, 2)  # smaller than the next message: it comes all the same
    assert [m.data() for m in got] == [b"1234567"] and used == 7


def test_acknowledged_batch_indexes_are_skipped_and_a_fully_acknowledged_entry_settled() -> None:
    c = _Consumer(
        [
            Delivery(_entry(0, [b"a", b"b", b"c"]), 1, acked_indexes=frozenset({0, 2})),
            Delivery(_entry(1, [b"x", b"y"]), 1, acked_indexes=frozenset({0, 1})),
        ],
        batch_index_ack=True,
    )
    assert [m.data() for m in c.receive_all()] == [b"b"]
    # Every message of entry 1 was acknowledged already: acknowledged whole, never queued.
    assert c.sc.acked == [(Position(7, 1), -1, 1)]
    assert list(c.part.unacked) == [(7, 0)]


def test_chunks_are_assembled_into_one_message_that_acknowledges_every_chunk() -> None:
    chunks = [
        Delivery(_entry(i, [piece], batched=False, chunk=ChunkInfo("u1", i, 3, 6)), 0)
        for i, piece in enumerate([b"ab", b"cd", b"ef"])
    ]
    c = _Consumer(chunks)
    (msg,) = c.receive_all()
    assert msg.data() == b"abcdef" and msg.message_id().entry_id == 2
    c.tracker.acknowledge(msg)
    assert sorted(c.sc.acked) == [(Position(7, i), -1, 1) for i in range(3)]
    assert not c.part.unacked


def test_a_chunked_message_missing_its_first_chunks_is_acknowledged_not_delivered() -> None:
    tail = [
        Delivery(_entry(i, [b"zz"], batched=False, chunk=ChunkInfo("u2", i, 3, 6)), 0)
        for i in (1, 2)
    ]
    c = _Consumer([*tail, Delivery(_entry(3, [b"whole"]), 0)])
    assert [m.data() for m in c.receive_all()] == [b"whole"]
    assert sorted(c.sc.acked) == [(Position(7, 1), -1, 1), (Position(7, 2), -1, 1)]


def test_a_lapsed_registration_drops_what_it_queued() -> None:
    c = _Consumer([Delivery(_entry(0, [b"a", b"b"]), 0)])
    c.queue.fill(10)
    c.sc.registrations = 2  # the lease lapsed and the consumer registered again
    c.queue.check_registrations()
    assert len(c.queue) == 0 and c.queue.take(10, -1)[0] == []
    assert c.part.registration == 2


def test_receive_checks_the_partition_of_the_message_it_hands_out() -> None:
    """check_next_registration (receive's check, of the head's partition alone): a lease
    that may have lapsed is renewed first; what a lapsed registration queued is dropped."""
    c = _Consumer([Delivery(_entry(0, [b"a", b"b"]), 0)])
    c.queue.fill(10)
    c.queue.check_next_registration()
    assert len(c.queue) == 2  # nothing lapsed: kept
    renewed: list[int] = []
    lapsed = [True]

    def renew() -> None:
        renewed.append(1)
        lapsed[0] = False
        c.sc.registrations = 2  # removed meanwhile: it registered again

    c.sc.lease_lapsed = lambda: lapsed[0]  # type: ignore[method-assign]
    c.sc.renew = renew  # type: ignore[attr-defined]
    c.queue.check_next_registration()
    assert renewed == [1]
    assert len(c.queue) == 0 and c.queue.take(10, -1)[0] == []
    assert c.part.registration == 2


def test_a_seek_by_another_consumer_drops_what_was_queued_and_delivered() -> None:
    c = _Consumer([Delivery(_entry(0, [b"a"]), 0), Delivery(_entry(1, [b"b", b"c"]), 0)])
    c.queue.fill(1)
    got = c.queue.take(1, -1)[0]
    assert [m.data() for m in got] == [b"a"] and c.part.unacked
    c.queue.fill(10)
    assert len(c.queue) == 2
    c.sc.seeks_followed = 1  # another consumer's seek, followed by this one's dispatcher
    c.queue.check_registrations()
    assert len(c.queue) == 0 and not c.part.unacked and c.part.seeks == 1
    assert c.part.registration == 1  # the registration holds: it was not lost


def test_drop_removes_only_the_selected_rows() -> None:
    c = _Consumer([Delivery(_entry(0, [b"a", b"b", b"c"]), 0)])
    c.queue.fill(10)
    c.queue.drop(lambda e: e.pos == (7, 0), {1})
    assert [m.data() for m in c.queue.take(10, -1)[0]] == [b"a", b"c"]


# --------------------------------------------------------------------------- AckTracker
def test_the_batch_tracker_acknowledges_a_batch_entry_once_all_its_messages_are() -> None:
    c = _Consumer([Delivery(_entry(0, [b"a", b"b", b"c"]), 0)])
    msgs = c.receive_all()
    c.tracker.acknowledge(msgs[0])
    c.tracker.acknowledge([msgs[2], msgs[0]])  # the same message twice counts once
    assert c.sc.acked == [] and (7, 0) in c.part.unacked
    c.tracker.acknowledge(msgs[1].message_id())  # by id: placed on the partition's entry
    assert c.sc.acked == [(Position(7, 0), -1, 1)] and not c.part.unacked


def test_batch_index_acknowledgement_writes_each_index() -> None:
    c = _Consumer([Delivery(_entry(0, [b"a", b"b"]), 0)], batch_index_ack=True)
    a, b = c.receive_all()
    c.tracker.acknowledge(b)
    assert c.sc.acked == [(Position(7, 0), 1, 2)]
    c.tracker.acknowledge(a)
    assert c.sc.acked[-1] == (Position(7, 0), -1, 1) and not c.part.unacked


def test_a_cumulative_acknowledgement_retires_every_entry_up_to_it() -> None:
    c = _Consumer([Delivery(_entry(i, [b"m"]), 0) for i in range(4)])
    msgs = c.receive_all()
    c.tracker.acknowledge_cumulative(msgs[2])
    assert c.sc.cumulative == [Position(7, 2)]
    assert list(c.part.unacked) == [(7, 3)]


def test_a_negative_acknowledgement_asks_for_the_entry_after_the_delay_once() -> None:
    c = _Consumer([Delivery(_entry(0, [b"a", b"b"]), 0)], nack_delay_ms=2500)
    a, b = c.receive_all()
    c.tracker.negative_acknowledge(a)
    c.tracker.negative_acknowledge(b)  # the same entry is coming back already
    assert c.sc.nacked == [([Position(7, 0)], 2500)]
    # Without batch-index acknowledgement the whole entry comes back; acknowledging one of
    # its messages meanwhile is remembered, not written.
    c.tracker.acknowledge(b)
    assert c.sc.acked == [] and c.part.unacked[(7, 0)].acked == {1}


def test_the_ack_timeout_redelivers_what_was_received_and_not_acknowledged() -> None:
    backoff = MultiplierRedeliveryBackoff(1000, 60_000, 2.0)
    c = _Consumer(
        [Delivery(_entry(0, [b"a"]), 0), Delivery(_entry(1, [b"b"]), 0)],
        ack_timeout_ms=5000,
        ack_timeout_backoff=backoff,
    )
    a, _ = c.receive_all()
    c.tracker.acknowledge(a)
    c.clock.advance(4950)
    c.tracker.tick_if_due()
    assert c.sc.nacked == []
    c.clock.advance(49)  # 4999 ms: not yet, and the next check is a tick (100 ms) later
    c.tracker.tick_if_due()
    assert c.sc.nacked == []
    c.clock.advance(51)
    c.tracker.tick_if_due()
    assert c.sc.nacked == [([Position(7, 1)], backoff.next(0))]
    c.clock.advance(10_000)
    c.tracker.tick_if_due()  # already coming back: not asked for twice
    assert len(c.sc.nacked) == 1


def test_redeliver_unacknowledged_asks_for_every_held_entry_and_empties_the_queue() -> None:
    c = _Consumer([Delivery(_entry(i, [b"m"]), 0) for i in range(3)])
    c.fill()
    first = c.queue.take(1, -1)[0]
    assert len(first) == 1 and len(c.queue) == 2
    c.tracker.redeliver_unacknowledged()
    assert c.sc.nacked == [([Position(7, 0), Position(7, 1), Position(7, 2)], 0)]
    assert len(c.queue) == 0
