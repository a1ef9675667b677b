"""The producer's send queue on its own (storage/producer/send_queue.py): built over partitions
registered by :class:`PartitionLeases` on a real local store, without the ``Producer`` facade
(its argument checks and routing), as ``tests/test_claims.py`` tests the claim rules alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from filepulsar.dispatch.clock import SYSTEM, wall_ms
from filepulsar.dispatch.modes import ProducerAccessMode
from filepulsar.storage.blobstore.local import LocalBlobStore
from filepulsar.storage.codec import Codec
from filepulsar.storage.errors import FilePulsarError, ProducerQueueIsFull
from filepulsar.storage.ledger import EARLIEST, ManagedLedger
from filepulsar.storage.names import TopicName
from filepulsar.storage.policies import effective_policies
from filepulsar.storage.producer.io_thread import ProducerIo
from filepulsar.storage.producer.leases import Partition, PartitionLeases
from filepulsar.storage.producer.messages import MessageRecord, Result
from filepulsar.storage.producer.send_queue import QueueConfig, SendQueue
from filepulsar.storage.topics import ensure_topic

pytestmark = pytest.mark.unit

TOPIC = TopicName.parse("q")


def _queue(
    store: LocalBlobStore,
    *,
    topic: TopicName = TOPIC,
    renew: Callable[[Partition], None] | None = None,
    io: ProducerIo | None = None,
    **settings: Any,
) -> tuple[SendQueue, list[Partition]]:
    """A queue over ``topic``'s partition (``renew``: default, renew its lease; ``io``:
    default, the process's I/O thread)."""
    ensure_topic(store, topic, auto_create=True)
    policies = effective_policies(store, topic)
    leases = PartitionLeases(
        store=store,
        producer_name="p",
        session="s1",
        access_mode=ProducerAccessMode.Shared,
        policies=policies,
        dedup=True,
        persistent=True,
        clock=wall_ms,
        waits=SYSTEM,
    )
    parts = leases.register_all([topic], None)
    config = dict(
        topic=topic,
        producer_name="p",
        codec=Codec.NONE,
        key_based=True,
        max_messages=1000,
        max_bytes=1 << 20,
        publish_delay_ms=60_000,  # nothing is sealed by time unless a test says so
        max_pending_bytes=1 << 20,
        block_if_queue_full=True,
        dedup=True,
        renew_s=60.0,
        max_message_size=5 * 1024 * 1024,
    )
    config.update(settings)
    queue = SendQueue(
        parts,
        QueueConfig(**config),  # type: ignore[arg-type]
        clock=wall_ms,
        renew=renew or (lambda part: part.writer.renew_lease()),
        io=io,
    )
    return queue, parts


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LocalBlobStore]:
    yield LocalBlobStore(str(tmp_path))


def _lane0() -> int:
    return 0


def _entries(store: LocalBlobStore) -> list[tuple[int, int, list[bytes]]]:
    """Each stored entry's header sequence ids and values, in ledger order."""
    ml = ManagedLedger(store, TOPIC)
    out = []
    for e in ml.read_entries(ml.state(), EARLIEST):
        h = e.raw.header
        out.append((h.sequence_id, h.highest_sequence_id, e.stored().column(0).to_pylist()))
    return out


def test_key_batches_are_written_in_order_of_their_highest_sequence_id(
    store: LocalBlobStore,
) -> None:
    """Pulsar's dedup takes a key batch's highest id as its id, so the queue seals key
    batches by it: every one is stored although their ids interleave."""
    queue, _ = _queue(store)
    sent = [(b"a1", "a", 1), (b"b2", "b", 2), (b"a3", "a", 3), (b"c0", "c", 0)]
    for value, key, seq in sent:
        queue.add(
            _lane0,
            MessageRecord(content=value, partition_key=key, sequence_id=seq),
            None,
            alone=False,
        )
    queue.flush()
    queue.close()
    assert _entries(store) == [(0, 0, [b"c0"]), (2, 2, [b"b2"]), (3, 3, [b"a1", b"a3"])]
    assert queue.last_published == 3


def test_the_io_thread_seals_a_batch_when_its_delay_ends(store: LocalBlobStore) -> None:
    queue, _ = _queue(store, publish_delay_ms=5)
    got: list[tuple[Result, Any]] = []
    done = threading.Event()

    def callback(result: Result, mid: Any) -> None:
        got.append((result, mid))
        done.set()

    queue.add(_lane0, MessageRecord(content=b"x", partition_key="k"), callback, alone=False)
    assert done.wait(60)  # no flush: the I/O thread sealed and wrote it
    queue.close()
    assert [r for r, _ in got] == [Result.Ok] and got[0][1].entry_id == 0
    assert _entries(store) == [(0, 0, [b"x"])]


def test_a_write_wakes_the_flush_that_waits_for_it(store: LocalBlobStore) -> None:
    """A write that finishes wakes whoever waits for it (flush) only when someone waits:
    a waiter must be counted, or each flush would sleep out its 1 s poll. 20 flushes of
    what the I/O thread writes take far less than the 20 s those polls would."""
    queue, _ = _queue(store)  # (sealed by the flushes only)
    started = SYSTEM.monotonic()
    for i in range(20):
        queue.add(
            _lane0,
            MessageRecord(content=b"x", partition_key=f"k{i}"),
            lambda r, m: None,
            alone=False,
        )
        queue.flush()
    took = SYSTEM.monotonic() - started
    queue.close()
    assert took < 10, f"20 flushes took {took:.1f} s: their waits were not woken"
    assert len(_entries(store)) == 20


def test_pending_bytes_refuse_a_message_when_the_queue_is_full(store: LocalBlobStore) -> None:
    queue, _ = _queue(store, max_pending_bytes=10, block_if_queue_full=False, key_based=False)
    queue.add_plain(_lane0, b"x" * 11, None)  # over the limit once added
    with pytest.raises(ProducerQueueIsFull, match="11 bytes pending"):
        queue.add_plain(_lane0, b"y", None)
    queue.flush()  # stored: the bytes are no longer pending
    queue.add_plain(_lane0, b"z", None)
    queue.flush()
    queue.close()
    assert [vals for _, _, vals in _entries(store)] == [[b"x" * 11], [b"z"]]


def test_a_failed_queue_answers_its_senders_and_refuses_more(store: LocalBlobStore) -> None:
    queue, _ = _queue(store)
    results: list[Result] = []
    queue.add(
        _lane0,
        MessageRecord(content=b"x", partition_key="k"),
        lambda r, m: results.append(r),
        alone=False,
    )
    queue.fail(FilePulsarError("disk gone"))
    with pytest.raises(FilePulsarError, match="disk gone"):
        queue.add_plain(_lane0, b"y", None)
    queue.close()  # the open batch's sender hears of it
    assert results == [Result.AlreadyClosed]
    assert not queue.connected
    assert _entries(store) == []


def test_a_commit_renews_the_lease_only_once_a_quarter_of_it_is_gone(
    store: LocalBlobStore,
) -> None:
    """A commit that renewed the producer's lease writes it into the manifest's record (every
    other writer and reader of the topic folds it); one right after a renewal leaves it be.
    Past a quarter of the lease, the next commit renews it: before the I/O thread's renewal,
    due a third of it after the last (a partition written in between needs no renewal commit
    of its own; before, commits renewed only past a third, when that renewal was due too, and
    it came first nearly every time)."""
    from filepulsar.storage import Producer

    now = [1_000_000]
    p = Producer(store, "lease", producer_name="p", batching_enabled=False, clock=lambda: now[0])
    manifest = p._parts[0].ml.manifest
    lease_ms = p.policies.producer_lease_ms
    assert p._queue.config.renew_s * 1000 == lease_ms / 3  # (the I/O thread's renewal)
    registered = manifest.latest().producers["p"].expires_ms
    assert registered == now[0] + lease_ms
    now[0] += 1_000
    p.send(b"1")
    assert manifest.latest().producers["p"].expires_ms == registered  # not rewritten
    assert not p._parts[0].writer.lease_renewed
    now[0] += lease_ms // 4 - 1_000 + 1  # (a quarter and 1 ms since it was registered)
    p.send(b"2")
    assert manifest.latest().producers["p"].expires_ms == now[0] + lease_ms
    assert p._parts[0].writer.lease_renewed
    p.close()


def test_a_busy_producer_keeps_its_lease_on_a_partition_it_does_not_write(
    store: LocalBlobStore,
) -> None:
    """Each partition's lease is renewed a third of it after its last renewal, between writes
    too: a producer whose writes to partition 0 keep its I/O thread busy for longer than its
    lease still holds partition 1 (before, only the idle I/O thread renewed, so partition 1's
    lease lapsed, another producer registering there dropped it, and the next send to it was
    fenced)."""
    import time

    from filepulsar.storage import create_topic
    from filepulsar.storage.policies import set_topic_policies

    create_topic(store, "lanes", partitions=2)
    set_topic_policies(store, "lanes", producer_lease_ms=1500)
    target = [0]

    p = _routed(store, "p", lambda m, n: target[0])
    t0 = time.monotonic()
    while time.monotonic() - t0 < 4.0:  # ~2.7 leases; the I/O thread always has work
        p.send_async(b"x" * 100)
    p.flush()
    q = _routed(store, "q", lambda m, n: 1)
    q.send(b"y")  # registering on partition 1 drops the leases it finds expired
    target[0] = 1
    p.send(b"z")  # p's lease there was renewed meanwhile: not fenced
    p.close()
    q.close()


def test_a_long_bulk_write_with_a_send_queued_keeps_the_other_partitions_leases(
    store: LocalBlobStore,
) -> None:
    """A long bulk write (``send_table``) holds the ledgers; the I/O thread, with a
    ``send_async`` queued meanwhile, waits for them and still renews the leases of the
    partitions due (before, it renewed none while it waited: p's lease on partition 2 lapsed,
    another producer dropped it and the next send there was fenced). The slow write stands
    in for a big table or a slow store."""
    import threading
    import time

    import pyarrow as pa

    from filepulsar.storage import create_topic
    from filepulsar.storage.policies import set_topic_policies

    create_topic(store, "lanes", partitions=3)
    set_topic_policies(store, "lanes", producer_lease_ms=1500)
    target = [0]

    p = _routed(store, "p", lambda m, n: target[0])
    w0 = p._parts[0].writer
    real = w0.append_stream

    writing = threading.Event()

    def slow_append_stream(*a: Any, **k: Any) -> Any:  # a slow store, or a big table
        writing.set()
        time.sleep(2.5)
        return real(*a, **k)

    w0.append_stream = slow_append_stream  # type: ignore[method-assign]
    bulk = threading.Thread(target=p.send_table, args=(pa.table({"value": [b"big"] * 10}),))
    bulk.start()
    assert writing.wait(30)  # the bulk write holds the ledgers
    target[0] = 1
    p.send_async(b"a", lambda r, m: None)  # queued: the I/O thread waits for the ledgers
    time.sleep(1.8)  # partition 2's lease, last renewed at creation, lapses
    q = _routed(store, "q", lambda m, n: 2)
    q.send(b"y")  # registering on partition 2 drops the leases it finds expired
    bulk.join()
    p.flush()
    target[0] = 2
    p.send(b"z")  # p's lease on partition 2 should have been renewed meanwhile
    p.close()
    q.close()


def test_between_writes_the_most_overdue_partition_is_renewed_alone(store: LocalBlobStore) -> None:
    """With work queued, the I/O thread renews one lease a loop, the most overdue first, so
    that the partitions that came due together do not hold back a write for a commit each;
    idle, it renews every one due."""
    from filepulsar.storage import Producer, create_topic

    create_topic(store, "many", partitions=4)
    p = Producer(store, "many", producer_name="p", batching_enabled=False)
    queue = p._queue
    renewed: list[int] = []
    queue._renew = lambda part: renewed.append(part.index)  # type: ignore[method-assign]
    now = SYSTEM.monotonic()
    for lane, age in zip(queue._lanes, (100.0, 300.0, 200.0, 0.0)):
        lane.renewed_at = now - age
    queue._renew_due(1)
    assert renewed == [1]
    queue._renew_due()
    assert renewed == [1, 2, 0]  # partition 3 was renewed just now: not due
    p.close()


def _routed(store: LocalBlobStore, name: str, route: Any) -> Any:
    """A producer on the topic ``lanes`` sending where ``route`` says, one message an entry."""
    from filepulsar.storage import Producer

    return Producer(
        store,
        "lanes",
        producer_name=name,
        batching_enabled=False,
        message_routing_mode="CustomPartition",
        message_router=route,
    )
