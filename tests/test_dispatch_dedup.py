"""Tests of dispatch.dedup: broker-side sequence-id deduplication."""

from __future__ import annotations

import json

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from filepulsar.dispatch.dedup import NO_SEQUENCE_ID, DedupStatus, DedupTracker, dedup_decide

pytestmark = pytest.mark.unit


def test_pulsar_scenario() -> None:
    tracker = DedupTracker()
    assert tracker.check("p1", 0) is DedupStatus.NOT_DUP
    assert tracker.check("p1", 5) is DedupStatus.NOT_DUP
    assert tracker.highest_pushed("p1") == 5
    # Pushed but nothing persisted yet: cannot tell.
    assert tracker.check("p1", 0) is DedupStatus.UNKNOWN
    assert tracker.highest_pushed("p1") == 5
    tracker.record_persisted("p1", 0)
    assert tracker.check("p1", 0) is DedupStatus.DUP
    assert tracker.check("p1", 3) is DedupStatus.UNKNOWN
    tracker.record_persisted("p1", 5)
    assert tracker.check("p1", 3) is DedupStatus.DUP  # gaps are fine: only the highest counts
    assert tracker.check("p1", 6) is DedupStatus.NOT_DUP
    assert tracker.check("other", 0) is DedupStatus.NOT_DUP  # producers are independent


def test_batches_cover_a_sequence_range() -> None:
    tracker = DedupTracker()
    assert tracker.check("p", 10, highest_sequence_id=14) is DedupStatus.NOT_DUP
    assert tracker.highest_pushed("p") == 14
    assert tracker.check("p", 12) is DedupStatus.UNKNOWN
    tracker.record_persisted("p", 10, highest_sequence_id=14)
    assert tracker.highest_persisted("p") == 14
    assert tracker.check("p", 14) is DedupStatus.DUP
    assert tracker.check("p", 15, highest_sequence_id=3) is DedupStatus.NOT_DUP
    assert tracker.highest_pushed("p") == 15  # max(highest_sequence_id, sequence_id)


def test_reset_pushed_after_a_failed_write() -> None:
    tracker = DedupTracker()
    tracker.check("p", 1)
    tracker.record_persisted("p", 1)
    tracker.check("p", 2)  # pushed, then the write fails
    tracker.reset_pushed()
    assert tracker.highest_pushed("p") == 1
    assert tracker.check("p", 2) is DedupStatus.NOT_DUP  # the retry is accepted
    tracker.check("q", 7)
    tracker.reset_pushed()
    assert tracker.highest_pushed("q") is None  # never persisted: forgotten


def test_chunks_only_count_on_the_last_chunk() -> None:
    tracker = DedupTracker()
    for chunk in range(2):
        assert tracker.check("p", 4, chunk_id=chunk, num_chunks=3) is DedupStatus.NOT_DUP
        tracker.record_persisted("p", 4, chunk_id=chunk, num_chunks=3)
    assert tracker.highest_pushed("p") is None
    assert tracker.check("p", 4, chunk_id=2, num_chunks=3) is DedupStatus.NOT_DUP
    tracker.record_persisted("p", 4, chunk_id=2, num_chunks=3)
    assert tracker.highest_persisted("p") == 4
    assert tracker.check("p", 4, chunk_id=2, num_chunks=3) is DedupStatus.DUP
    with pytest.raises(ValueError):
        tracker.check("p", 5, chunk_id=3, num_chunks=3)
    with pytest.raises(ValueError):
        tracker.record_persisted("p", 5, chunk_id=0)


def test_ids_the_producer_did_not_assign_pass_and_change_nothing() -> None:
    """A negative sequence id (the stored "none" marker, NO_SEQUENCE_ID) is never a duplicate
    and moves no state: a broker deduplicates producer-assigned ids only."""
    tracker = DedupTracker()
    for _ in range(3):
        assert tracker.check("spark-q", NO_SEQUENCE_ID) is DedupStatus.NOT_DUP
        tracker.record_persisted("spark-q", NO_SEQUENCE_ID)
    tracker.replay_entry("spark-q", NO_SEQUENCE_ID)
    assert tracker.producers() == []
    tracker.check("p", 4)
    tracker.record_persisted("p", 4)
    assert tracker.check("p", -2, highest_sequence_id=-2) is DedupStatus.NOT_DUP
    assert (tracker.highest_pushed("p"), tracker.highest_persisted("p")) == (4, 4)
    assert tracker.check("p", 4) is DedupStatus.DUP


def test_replay_and_snapshot() -> None:
    tracker = DedupTracker()
    tracker.replay_entry("p", 3)
    tracker.replay_entry("p", 4, 9)
    assert (tracker.highest_pushed("p"), tracker.highest_persisted("p")) == (9, 9)
    tracker.check("p", 10)
    snap = json.loads(json.dumps(tracker.snapshot()))
    restored = DedupTracker.from_snapshot(snap)
    assert restored == tracker
    assert restored.highest_pushed("p") == 10 and restored.highest_persisted("p") == 9
    assert restored.producers() == ["p"]
    with pytest.raises(ValueError, match="version"):
        DedupTracker.from_snapshot({"version": 2})
    with pytest.raises(ValueError):
        DedupTracker.from_snapshot({"version": 1, "pushed": {"p": "x"}})
    with pytest.raises(ValueError):
        DedupTracker.from_snapshot({"version": 1, "persisted": []})
    with pytest.raises(TypeError):
        tracker.check("p", "1")  # type: ignore[arg-type]


def test_the_decision_is_a_pure_function_of_the_marks() -> None:
    """``dedup_decide`` returns the decision and the pushed mark after it, touching nothing."""
    assert dedup_decide(6, None, None, None) == (DedupStatus.NOT_DUP, 6)
    assert dedup_decide(6, 9, 5, 5) == (DedupStatus.NOT_DUP, 9)
    assert dedup_decide(6, 2, 5, 5) == (DedupStatus.NOT_DUP, 6)  # a range's top is its maximum
    assert dedup_decide(5, 9, 5, 5) == (DedupStatus.DUP, 5)
    assert dedup_decide(5, None, 7, 4) == (DedupStatus.UNKNOWN, 7)
    assert dedup_decide(5, None, 7, None) == (DedupStatus.UNKNOWN, 7)
    assert dedup_decide(NO_SEQUENCE_ID, None, 7, 7) == (DedupStatus.NOT_DUP, 7)
    assert dedup_decide(NO_SEQUENCE_ID, None, None, None) == (DedupStatus.NOT_DUP, None)


@pytest.mark.parametrize("bad", [1.0, True, "1", None])
def test_a_sequence_id_that_is_not_an_int_is_refused(bad: object) -> None:
    with pytest.raises(TypeError, match="sequence_id must be an int"):
        dedup_decide(bad, None, None, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sequence_id must be an int"):  # before the chunk's check
        DedupTracker().check("p", bad, chunk_id=3)  # type: ignore[arg-type]


PRODUCERS = st.sampled_from(["p1", "p2", "p3"])
SEQUENCE = st.integers(0, 25)


class DedupMachine(RuleBasedStateMachine):
    """Publishing through a broker that writes in order, fails writes and restarts.

    The reference is the rule in its plainest form over two dicts; on top of it the machine keeps
    the ground truth of what was written and checks that nothing is ever written twice.
    """

    def __init__(self) -> None:
        super().__init__()
        self.tracker = DedupTracker()
        self.pushed: dict[str, int] = {}
        self.persisted: dict[str, int] = {}
        self.in_flight: list[tuple[str, int, int | None]] = []
        self.written: dict[str, int] = {}

    @rule(producer=PRODUCERS, sequence_id=SEQUENCE, batch=st.one_of(st.none(), st.integers(0, 4)))
    def send(self, producer: str, sequence_id: int, batch: int | None) -> None:
        highest = None if batch is None else sequence_id + batch
        top = sequence_id if highest is None else highest
        if producer in self.pushed and sequence_id <= self.pushed[producer]:
            known = self.persisted.get(producer)
            expected = (
                DedupStatus.DUP
                if known is not None and sequence_id <= known
                else DedupStatus.UNKNOWN
            )
        else:
            expected = DedupStatus.NOT_DUP
            self.pushed[producer] = top
            self.in_flight.append((producer, sequence_id, highest))
        assert self.tracker.check(producer, sequence_id, highest) is expected

    @rule(producer=PRODUCERS)
    def send_without_sequence_id(self, producer: str) -> None:
        # Never a duplicate and nothing to record: the reference is left as it is.
        assert self.tracker.check(producer, NO_SEQUENCE_ID) is DedupStatus.NOT_DUP
        self.tracker.record_persisted(producer, NO_SEQUENCE_ID)

    @rule()
    def persist_next(self) -> None:
        if not self.in_flight:
            return
        producer, sequence_id, highest = self.in_flight.pop(0)
        # Ground truth: a producer's writes only ever move forward.
        assert sequence_id > self.written.get(producer, -1)
        top = sequence_id if highest is None else highest
        self.written[producer] = top
        self.persisted[producer] = max(self.persisted.get(producer, top), top)
        self.tracker.record_persisted(producer, sequence_id, highest)

    @rule()
    def fail_pending_writes(self) -> None:
        self.in_flight.clear()
        self.pushed = dict(self.persisted)
        self.tracker.reset_pushed()

    @rule()
    def restart(self) -> None:
        self.in_flight.clear()
        self.pushed = dict(self.persisted)
        state = json.loads(json.dumps(self.tracker.snapshot()))
        self.tracker = DedupTracker.from_snapshot(state)
        self.tracker.reset_pushed()

    @invariant()
    def matches_reference(self) -> None:
        for producer in ("p1", "p2", "p3"):
            assert self.tracker.highest_pushed(producer) == self.pushed.get(producer)
            assert self.tracker.highest_persisted(producer) == self.persisted.get(producer)
            persisted = self.persisted.get(producer)
            if persisted is not None:
                assert persisted <= self.pushed[producer]


DedupMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
test_dedup_against_reference = DedupMachine.TestCase
