"""The dispatch claims (storage/claims.py) as pure functions over hand-built subscription states
(inputs, not storage files): unit cases per rule, and a Hypothesis check of Shared dispatch
across consumers against a set model."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filepulsar.dispatch.modes import ConsumerType
from filepulsar.dispatch.selectors.auto_split import AutoSplitHashRangeSelector
from filepulsar.storage.claims import (
    IDLE,
    LOST,
    RESCAN,
    claim_key_shared,
    claim_shared,
    due_redeliveries,
    next_scan_pos,
    nothing_to_claim_key_shared,
    passed_over,
    take_redeliveries,
)
from filepulsar.storage.cursor import (
    ConsumerInfo,
    SubscriptionState,
    pos_key,
)
from filepulsar.storage.ledger import Position
from filepulsar.storage.versioned import Abort

pytestmark = pytest.mark.property

LEASE = 30_000


def _state(sub_type: str = "Shared", consumers: tuple[str, ...] = ("a",), exp: int = 10**9) -> Any:
    s = SubscriptionState(
        topic="persistent://t/n/x", name="sub", sub_type=ConsumerType.parse(sub_type)
    )
    for i, c in enumerate(consumers):
        s.consumers[c] = ConsumerInfo(c, c, 0, exp, i, c)
    return s


def _abort(fn: Any, *args: Any, **kwargs: Any) -> Any:
    with pytest.raises(Abort) as info:
        fn(*args, **kwargs)
    return info.value.value


def _shared(s: SubscriptionState, **kw: Any) -> list[tuple[Position, int]]:
    args: dict[str, Any] = {"cid": "a", "now": 100, "lease_ms": LEASE, "held": {}}
    args.update(kw)
    args.setdefault("lapsed", frozenset())
    return claim_shared(s, **args)


# ------------------------------------------------------------------ small helpers
def test_due_redeliveries_sorted_and_due_only() -> None:
    s = _state()
    s.redeliver = {"1:5": [1, 50, -1], "0:9": [0, 100, -1], "0:2": [2, 101, -1]}
    assert due_redeliveries(s, 100) == [(0, 9), (1, 5)]
    assert due_redeliveries(s, 49) == []


def test_passed_over_and_take() -> None:
    s = _state(consumers=("a", "b"))
    s.mark_delete = (0, 3)
    s.redeliver = {"0:5": [1, 0, -1]}
    assert passed_over(s, (0, 2)) and passed_over(s, (0, 5)) and not passed_over(s, (0, 4))
    take_redeliveries(s, [(0, 5), (0, 7)])
    assert s.redeliver == {}


# ------------------------------------------------------------------ Shared
def test_shared_due_redeliveries_first_then_fresh_within_max() -> None:
    s = _state()
    s.dispatched = (0, 3)
    s.redeliver = {"0:2": [2, 50, -1], "0:1": [1, 100, -1], "0:0": [0, 101, -1]}
    got = _shared(s, candidates=[(0, 4), (0, 5), (0, 6)], max_entries=3)
    assert got == [((0, 1), 1), ((0, 2), 2), ((0, 4), 0)]
    assert s.dispatched == (0, 4)
    assert s.pending == {"0:1": ["a", 1, -1], "0:2": ["a", 2, -1], "0:4": ["a", 0, -1]}
    assert s.redeliver == {"0:0": [0, 101, -1]}  # not yet due
    a = s.consumers["a"]
    assert (a.expires_ms, a.lease_ms, a.renewals) == (100 + LEASE, LEASE, 1)


def test_shared_skips_acked_pending_and_records_held() -> None:
    s = _state()
    s.acked = [[0, 1, 0, 1]]
    s.pending = {"0:2": ["b", 0, -1]}
    s.redeliver = {"0:3": [0, 500, -1]}
    got = _shared(s, candidates=[(0, i) for i in range(6)], held={(0, 4): 700}, max_entries=10)
    assert got == [((0, 0), 0), ((0, 5), 0)]
    assert s.redeliver == {"0:3": [0, 500, -1], "0:4": [0, 700, -1]}
    assert s.dispatched == (0, 5)
    # an acknowledged due redelivery is dropped, not claimed
    s2 = _state()
    s2.mark_delete = (0, 0)
    s2.redeliver = {"0:0": [3, 0, -1]}
    s2.dispatched = (0, 0)
    assert _shared(s2, candidates=[(0, 1)], max_entries=5) == [((0, 1), 0)]
    assert s2.redeliver == {}


def test_shared_aborts_lost_and_idle() -> None:
    s = _state(consumers=("b",))
    assert _abort(_shared, s, candidates=[(0, 0)], max_entries=1) is LOST
    s = _state()
    s.dispatched = (0, 4)
    assert _abort(_shared, s, candidates=[(0, 3), (0, 4)], max_entries=5) is IDLE
    # only held entries passed over: dispatched moves, which is worth a commit
    s = _state()
    assert _shared(s, candidates=[(0, 0)], held={(0, 0): 900}, max_entries=5) == []
    assert s.dispatched == (0, 0) and s.redeliver == {"0:0": [0, 900, -1]}


def test_shared_purges_lapsed_and_takes_their_entries() -> None:
    """The consumers the caller judged lapsed go, whatever their wall-clock expiry says; the
    claimer itself renews instead."""
    s = _state(consumers=("a", "b", "c"))
    s.pending = {"0:0": ["b", 0, -1], "0:1": ["c", 0, -1]}
    s.dispatched = (0, 1)
    got = _shared(s, candidates=[], max_entries=5, lapsed={"a", "b"})
    assert got == [((0, 0), 1)]
    assert list(s.consumers) == ["a", "c"]
    assert s.pending == {"0:0": ["a", 1, -1], "0:1": ["c", 0, -1]}


# ------------------------------------------------------------------ Key_Shared
def _ks_state(consumers: tuple[str, ...] = ("a", "b")) -> Any:
    s = _state("Key_Shared", consumers)
    sel = AutoSplitHashRangeSelector(range_size=4)
    for c in consumers:
        sel.add_consumer(c)
    s.selector = sel.to_dict()
    return s, sel


def _owner_slots(sel: AutoSplitHashRangeSelector, who: str) -> list[int]:
    return [i for i in range(4) if sel.select_slot(i) == who]


def _ks(s: SubscriptionState, sel: Any, **kw: Any) -> Any:
    args: dict[str, Any] = {
        "cid": "a",
        "now": 100,
        "lease_ms": LEASE,
        "lapsed": frozenset(),
        "scan_version": s.selector_version,
        "selector": sel,
        "held": {},
        "max_entries": 10,
    }
    args.update(kw)
    return claim_key_shared(s, **args)


def test_key_shared_claims_own_slots_and_blocks_after_left_ones() -> None:
    s, sel = _ks_state()
    mine, theirs = _owner_slots(sel, "a")[0], _owner_slots(sel, "b")[0]
    slots = {(0, 0): mine, (0, 1): theirs, (0, 2): mine, (0, 3): mine}
    got, first = _ks(s, sel, slots=slots, max_entries=1)
    assert got == [((0, 0), 0)] and first == (0, 2)
    assert s.pending == {"0:0": ["a", 0, mine]}
    assert next_scan_pos(slots, first, (0, 3), (-1, -1)) == (0, 1)
    # draining: b holds an entry of a's slot pending, so a's slot stays blocked
    s, sel = _ks_state()
    s.pending = {"0:0": ["b", 0, mine]}
    assert _abort(_ks, s, sel, slots={(0, 2): mine}) == (IDLE, (0, 2))


def test_key_shared_held_blocks_slot_and_redelivery_counts() -> None:
    s, sel = _ks_state()
    mine = _owner_slots(sel, "a")[0]
    s.redeliver = {"0:3": [2, 50, mine]}
    slots = {(0, 1): mine, (0, 2): mine, (0, 3): mine}
    got, first = _ks(s, sel, slots=slots, held={(0, 1): 900})
    assert got == [] and first == (0, 2)
    assert s.redeliver == {"0:1": [0, 900, mine], "0:3": [2, 50, mine]}
    s, sel = _ks_state()
    s.redeliver = {"0:3": [2, 50, mine]}
    got, first = _ks(s, sel, slots={(0, 3): mine, (0, 4): mine})
    assert got == [((0, 3), 2), ((0, 4), 0)] and first is None
    assert s.redeliver == {}
    # a redelivery not among the candidates keeps the slot's order
    s, sel = _ks_state()
    s.redeliver = {"0:0": [1, 50, mine]}
    assert _abort(_ks, s, sel, slots={(0, 4): mine}) == (IDLE, (0, 4))


def test_key_shared_rescan_lost_and_purge() -> None:
    s, sel = _ks_state()
    assert _abort(_ks, s, sel, slots={}, scan_version=s.selector_version - 1) is RESCAN
    s, sel = _ks_state(("b",))
    assert _abort(_ks, s, sel, slots={}) is LOST
    s, sel = _ks_state()
    scan = s.selector_version
    assert _ks(s, sel, slots={}, scan_version=scan, lapsed={"b"}) is RESCAN
    assert list(s.consumers) == ["a"] and s.selector_version == scan + 1


def test_next_scan_pos() -> None:
    cands = [(0, 5), (0, 2), (0, 7)]
    assert next_scan_pos(cands, (0, 5), (0, 7), (0, 1)) == (0, 2)
    assert next_scan_pos(cands, (0, 2), (0, 7), (0, 1)) == (0, 1)
    assert next_scan_pos(cands, None, (0, 7), (0, 1)) == (0, 7)
    assert next_scan_pos([], None, None, (0, 1)) == (0, 1)


# ------------------------------------------------------------------ Shared, property
_POSITIONS = [(0, i) for i in range(6)] + [(1, i) for i in range(6)]


def _next(p: Position) -> Position | None:
    i = _POSITIONS.index(p) + 1 if p in _POSITIONS else 0
    return _POSITIONS[i] if i < len(_POSITIONS) else None


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("fetch"), st.sampled_from("abc"), st.integers(0, 4), st.integers(0, 40)),
        st.tuples(st.just("ack"), st.sampled_from(_POSITIONS), st.just(0), st.just(0)),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(ops=_ops, due=st.dictionaries(st.sampled_from(_POSITIONS), st.integers(1, 120)))
def test_shared_matches_set_model(ops: list[tuple[str, Any, int, int]], due: dict) -> None:
    """Consumers a, b, c fetch (candidates read after ``dispatched`` as the Dispatcher does) and
    acknowledge; some entries are delayed until ``due``. Every position is claimed at most once,
    never while acknowledged or held, due redeliveries come first in position order, the limit
    holds, held entries wait in ``redeliver`` with their due time; draining at the end
    delivers every entry not acknowledged."""
    s = _state(consumers=("a", "b", "c"))
    now = 0
    claimed: set[Position] = set()

    def fetch(cid: str, limit: int) -> None:
        nonlocal s
        after = [p for p in _POSITIONS if p > s.dispatched][:limit]
        held = {p: due[p] for p in after if due.get(p, 0) > now}
        before = copy.deepcopy(s)
        work = copy.deepcopy(s)
        try:
            got = claim_shared(
                work,
                cid=cid,
                now=now,
                lease_ms=10**9,
                lapsed=frozenset(),
                candidates=after,
                held=held,
                max_entries=limit,
            )
        except Abort as a:
            assert a.value is IDLE
            assert due_redeliveries(before, now) == [] or limit == 0
            return
        s = work
        ps = [p for p, _ in got]
        assert len(got) <= limit
        assert not claimed & set(ps), "claimed twice"
        assert not any(before.is_acked(p) for p in ps)
        assert all(due.get(p, 0) <= now for p in ps)
        redo = [p for p in due_redeliveries(before, now) if not before.is_acked(p)]
        n = len([p for p in ps if pos_key(p) in before.redeliver])
        assert ps[:n] == redo[:n] and all(pos_key(p) not in before.redeliver for p in ps[n:])
        assert ps[n:] == sorted(ps[n:]) and all(p > before.dispatched for p in ps[n:])
        for p, t in held.items():
            if p <= s.dispatched and not before.is_acked(p):
                assert s.redeliver[pos_key(p)] == [0, t, -1]
        for p in ps:
            assert s.pending[pos_key(p)] == [cid, 0, -1]
        claimed.update(ps)

    for op, who, n, dt in ops:
        if op == "fetch":
            now += dt
            fetch(who, n)
        else:
            s.ack(who, _next)
    now = 10**6
    for _ in range(len(_POSITIONS) + 1):
        fetch("a", 3)
    acked = {p for p in _POSITIONS if s.is_acked(p)}
    assert claimed | acked == set(_POSITIONS)
    assert s.redeliver == {} and s.dispatched == _POSITIONS[-1]


@settings(max_examples=300, deadline=None)
@given(
    slots=st.dictionaries(st.sampled_from(_POSITIONS), st.integers(0, 3), max_size=8),
    acked=st.sets(st.sampled_from(_POSITIONS), max_size=4),
    pending=st.dictionaries(st.sampled_from(_POSITIONS), st.sampled_from(["a", "b"]), max_size=4),
    redeliver=st.dictionaries(st.sampled_from(_POSITIONS), st.integers(0, 200), max_size=3),
    held=st.dictionaries(st.sampled_from(_POSITIONS), st.integers(150, 900), max_size=3),
)
def test_key_shared_nothing_to_claim_agrees_with_the_claim(
    slots: dict, acked: set, pending: dict, redeliver: dict, held: dict
) -> None:
    """Where ``nothing_to_claim_key_shared`` lets a fetch spare its commit, the claim would
    have claimed nothing, recorded nothing and left no entry for later (an idle abort with no
    first unclaimed entry): sparing it changes nothing."""
    s, sel = _ks_state()
    for p in sorted(acked):
        s.ack(p, lambda q: None)
    for p, who in pending.items():
        if not s.is_acked(p):
            s.pending[pos_key(p)] = [who, 0, slots.get(p, 0)]
    for p, due in redeliver.items():
        if not s.is_acked(p) and pos_key(p) not in s.pending:
            s.redeliver[pos_key(p)] = [1, due, slots.get(p, 0)]
    before = copy.deepcopy(s)
    if not nothing_to_claim_key_shared(s, cid="a", selector=sel, slots=slots):
        return
    assert s == before  # the check changes nothing
    work = copy.deepcopy(s)
    try:
        got = _ks(work, sel, slots=slots, held={p: d for p, d in held.items() if p in slots})
    except Abort as a:
        assert a.value == (IDLE, None), a.value
    else:
        raise AssertionError(f"a claim where nothing was to claim: {got}")
