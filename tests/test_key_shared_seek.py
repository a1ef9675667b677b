"""A seek (or an admin's cursor reset) resets the subscription for every consumer, as Pulsar's
broker disconnects them all and each client clears its receiver queue: everything after the
new position is delivered again, to its key's owner. A lazy Key_Shared consumer that did not
seek must drop what it handed out before (acknowledged then, not since: the seek cleared
the acknowledgements), not record it as pending at itself (it would never be delivered again
while that consumer lives, and the cursor could not pass it). Real storage; the last test
runs the other consumer in another process (``seekEpoch`` in the state it reads anyway).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from filepulsar import Client, ConsumerType, InitialPosition, MessageId
from filepulsar.connector.client import Timeout
from filepulsar.dispatch.clock import ManualClock
from filepulsar.storage import create_topic
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.cursor import SubscriptionState
from filepulsar.storage.ledger import Position
from filepulsar.storage.names import TopicName
from filepulsar.storage.subscription import SubscriptionConsumer
from filepulsar.storage.subscriptions import SubscriptionStore
from tests.test_client_procs import Proc, produce, wait
from tests.test_key_shared_lazy import _filter, _produce, _settled, _value


def _fetch_and_ack(consumers: tuple[SubscriptionConsumer, ...], rounds: int = 1) -> dict[str, list]:
    """Each consumer in turn fetches and acknowledges what it got, ``rounds`` times; what
    each got, by consumer name."""
    got: dict[str, list] = {c.consumer_name: [] for c in consumers}
    for _ in range(rounds):
        for c in consumers:
            ds = c.fetch(100)
            c.acknowledge([(d.position, -1, 1) for d in ds])
            got[c.consumer_name] += ds
    return got


@pytest.mark.contract
@pytest.mark.parametrize("direct", [False, True], ids=["fetched", "taken_directly"])
def test_a_seek_by_one_consumer_redelivers_what_the_other_acknowledged(
    tmp_path: Path, direct: bool
) -> None:
    """Two settled consumers hand out and acknowledge 16 entries (by fetches, or straight
    from a filter's look as the push dispatcher does); b seeks to the first: both get all
    16 again, each its keys'. (Before: a recorded the 8 it held as pending at itself.)"""
    store = open_blob_store(str(tmp_path))
    clock = ManualClock()
    create_topic(store, "lazy")
    a, b = _settled(store, clock, "s", ["a", "b"])
    f = _filter(a)
    _produce(store, 0, 16)
    first: dict[str, list[int]] = {}
    new = f.look() if direct else None
    for c in (a, b):
        if new is not None:
            got = c.take_new(new, 1000)
            assert got is not None
        else:
            got = c.fetch(100)
        first[c.consumer_name] = [_value(d) for d in got]
        c.acknowledge([(d.position, -1, 1) for d in got])
    assert sorted(first["a"] + first["b"]) == list(range(16))
    assert first["a"] and first["b"]
    lid = min(d.position.ledger_id for d in got)
    b.seek(Position(lid, 0))  # the subscription back to its first message
    assert a.seeks_followed == 0 and b.seeks_followed == 0
    again = {n: [_value(d) for d in ds] for n, ds in _fetch_and_ack((a, b), rounds=4).items()}
    assert sorted(again["a"] + again["b"]) == list(range(16)), again
    assert sorted(again["a"]) == sorted(first["a"])  # the same owners
    assert a.seeks_followed == 1 and b.seeks_followed == 0  # b's own seek restarted it
    assert a.state().mark_delete > Position(lid, 0)  # the cursor moves past them again
    a.close()
    b.close()


@pytest.mark.contract
def test_a_renewal_follows_a_seek_before_it_records_what_it_holds(tmp_path: Path) -> None:
    """a holds 8 unacknowledged entries; b seeks; a's renewal (the lease thread's commit, the
    only one a consumer whose receiver queue is full makes) records nothing stale, and the
    next fetches hand out all 16 again."""
    store = open_blob_store(str(tmp_path))
    clock = ManualClock()
    create_topic(store, "lazy")
    a, b = _settled(store, clock, "s", ["a", "b"])
    _produce(store, 0, 16)
    held = a.fetch(100)
    got_b = b.fetch(100)
    assert held and got_b
    b.acknowledge([(d.position, -1, 1) for d in got_b])
    b.seek(Position(min(d.position.ledger_id for d in held), 0))
    a.renew()
    assert a.seeks_followed == 1
    assert all(v[0] != a.cid for v in a.state().pending.values())
    again = sorted(_value(d) for _ in range(3) for c in (a, b) for d in c.fetch(100))
    assert again == list(range(16))
    a.close()
    b.close()


@pytest.mark.contract
def test_a_state_without_seek_epoch_reads_as_zero_and_a_seek_writes_it(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path))
    clock = ManualClock()
    create_topic(store, "lazy")
    (a,) = _settled(store, clock, "s", ["a"])
    s = a.state()
    assert s.seek_epoch == 0 and b'"seekEpoch"' not in s.encode()
    a.seek(Position(0, 0))
    s = SubscriptionStore(store, TopicName.parse("lazy"), "s").latest()
    assert s.seek_epoch == 1 and b'"seekEpoch"' in s.encode()
    assert SubscriptionState.decode(s.encode(), "x").seek_epoch == 1
    a.close()


def _drain(consumer: object, into: list[str], until: float) -> None:
    """Receive and acknowledge until nothing comes for a while (or ``until``)."""
    while time.monotonic() < until:
        try:
            msg = consumer.receive(300)  # type: ignore[attr-defined]
        except Timeout:
            return
        into.append(msg.data().decode())
        consumer.acknowledge(msg)  # type: ignore[attr-defined]


@pytest.mark.contract
def test_client_consumers_in_one_process_get_everything_again_after_a_seek(
    tmp_path: Path,
) -> None:
    root = str(tmp_path / "root")
    produce(root, "t", 16, keys=8)
    with Client(root) as client:
        cs = [
            client.subscribe(
                "t",
                "s",
                consumer_type=ConsumerType.KeyShared,
                consumer_name=n,
                initial_position=InitialPosition.Earliest,
                receiver_queue_size=100,
                # Written by the seek (it flushes the process's groups), not before: a holds
                # what it handed out until then, no fetch having seen it acknowledged.
                ack_grouping_time_ms=60_000,
            )
            for n in ("a", "b")
        ]
        first: list[str] = []
        deadline = time.monotonic() + 30
        while len(first) < 16 and time.monotonic() < deadline:
            for c in cs:
                _drain(c, first, deadline)
        assert sorted(first, key=int) == [str(i) for i in range(16)]
        cs[1].seek(MessageId.earliest)
        again: list[str] = []
        deadline = time.monotonic() + 30
        while len(set(again)) < 16 and time.monotonic() < deadline:
            for c in cs:
                _drain(c, again, deadline)
        assert sorted(set(again), key=int) == [str(i) for i in range(16)]


@pytest.mark.procs
def test_a_consumer_in_another_process_gets_everything_again_after_a_seek(
    tmp_path: Path,
) -> None:
    """a consumes in a child process, b here; b seeks to the earliest after all 16 were
    acknowledged: a, which only reads the state, still gets its keys again."""
    root = str(tmp_path / "root")
    produce(root, "t", 0)
    a = Proc("a", root, "t", "s", "KeyShared", queue=100, lease_ms=3000)
    try:
        wait([a], lambda: a.count("ready") == 1, "a ready")
        with Client(root) as client:
            b = client.subscribe(
                "t",
                "s",
                consumer_type=ConsumerType.KeyShared,
                consumer_name="b",
                initial_position=InitialPosition.Earliest,
                receiver_queue_size=100,
            )
            mine: list[str] = []
            _drain(b, mine, time.monotonic() + 1)
            # Produced while both wait: handed out as they come (the push dispatcher), with
            # no fetch after the acknowledgements that could forget what a held.
            produce(root, "t", 16, keys=8)
            deadline = time.monotonic() + 60
            while len(mine) + a.count("acked") < 16 and time.monotonic() < deadline:
                _drain(b, mine, deadline)  # (a writes each acknowledgement at once)
            theirs = a.values("recv")
            assert sorted(mine + theirs, key=int) == [str(i) for i in range(16)]
            assert theirs, "a got none of the keys: the test shows nothing"
            mark = len(theirs)
            b.seek(MessageId.earliest)
            again: list[str] = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                _drain(b, again, deadline)
                if len(set(again + a.values("recv")[mark:])) >= 16:
                    break
            assert sorted(set(again + a.values("recv")[mark:]), key=int) == [
                str(i) for i in range(16)
            ], (again, a.values("recv")[mark:])
            b.close()
    finally:
        a.close()


@pytest.mark.contract
def test_an_admin_reset_is_followed_by_every_consumer(tmp_path: Path) -> None:
    """An admin's reset-cursor (no consumer seeks): both consumers follow it."""
    from filepulsar.storage.subscriptions import reset_subscription

    store = open_blob_store(str(tmp_path))
    clock = ManualClock()
    create_topic(store, "lazy")
    a, b = _settled(store, clock, "s", ["a", "b"])
    _produce(store, 0, 16)
    first = [d for ds in _fetch_and_ack((a, b)).values() for d in ds]
    assert len(first) == 16
    reset_subscription(store, TopicName.parse("lazy"), "s", Position(first[0].position[0], 0))
    again = sorted(_value(d) for _ in range(3) for c in (a, b) for d in c.fetch(100))
    assert again == list(range(16))
    assert a.seeks_followed == 1 and b.seeks_followed == 1
    a.close()
    b.close()
