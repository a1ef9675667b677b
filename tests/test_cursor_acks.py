"""The cursor's acknowledgement algebra (storage/cursor.py) against a set model, with Hypothesis:
ledgers of any sizes (empty ones and gaps in the ids between them, as retention and rollovers
leave), individual acknowledgements in groups of any size (as grouped acks arrive), ranges
and cumulative acknowledgements mixed in. After every group the state must say exactly what
the model says: which entries are acknowledged, the mark-delete position (the last entry of
the longest acknowledged prefix) and no two ranges that touch.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filepulsar.dispatch.modes import ConsumerType, KeySharedMode
from filepulsar.storage.cursor import SubscriptionState
from filepulsar.storage.ledger import Position

pytestmark = pytest.mark.property


def _layout(sizes: list[int], gaps: list[int]) -> list[Position]:
    """Every entry position of ledgers with ``sizes`` entries, ledger ids spaced by ``gaps``."""
    out: list[Position] = []
    lid = 0
    for n, g in zip(sizes, gaps, strict=True):
        lid += g
        out.extend((lid, e) for e in range(n))
    return out


def _next_fn(positions: list[Position]) -> Any:
    order = sorted(positions)

    def nxt(p: Position) -> Position | None:
        for q in order:  # the model's own, naive lookup
            if q > p:
                return q
        return None

    return nxt


def _check(s: SubscriptionState, positions: list[Position], acked: set[Position]) -> None:
    prefix: Position = (-1, -1)
    for p in positions:
        if p not in acked:
            break
        prefix = p
    assert s.mark_delete == prefix
    for p in positions:
        assert s.is_acked(p) == (p in acked), p
    ranges = [((r[0], r[1]), (r[2], r[3])) for r in s.acked]
    assert ranges == sorted(ranges)
    nxt = _next_fn(positions)
    for (_, b), (c, _) in itertools.pairwise(ranges):
        assert b < c and nxt(b) != c, ranges  # disjoint and never adjacent: merged
    for a, b in ranges:
        assert a > prefix and all(p in acked for p in positions if a <= p <= b)


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 6), min_size=1, max_size=6),
    gaps=st.lists(st.integers(1, 3), min_size=6, max_size=6),
    ops=st.lists(
        st.tuples(st.sampled_from(["group", "range", "cumulative"]), st.lists(st.integers(0, 40))),
        max_size=12,
    ),
)
def test_grouped_acknowledgements_match_a_set_model(
    sizes: list[int], gaps: list[int], ops: list[tuple[str, list[int]]]
) -> None:
    positions = _layout(sizes, gaps[: len(sizes)])
    if not positions:
        return
    nxt = _next_fn(positions)
    s = SubscriptionState(topic="persistent://t/n/x", name="sub", sub_type=ConsumerType.KeyShared)
    acked: set[Position] = set()
    for kind, picks in ops:
        chosen = [positions[i % len(positions)] for i in picks]
        if kind == "group":
            changed = s.ack_all(chosen, nxt)
            assert changed == bool(set(chosen) - acked)
            acked |= set(chosen)
        elif kind == "range" and chosen:
            a, b = min(chosen), max(chosen)
            s.ack_range(a, b, nxt)
            acked |= {p for p in positions if a <= p <= b}
        elif kind == "cumulative" and chosen:
            p = chosen[0]
            s.ack_cumulative(p, nxt)
            acked |= {q for q in positions if q <= p}
        _check(s, positions, acked)


def test_a_copy_is_the_decoded_encoding_and_shares_nothing_mutable() -> None:
    """``SubscriptionState.copy`` (what a commit changes) equals decoding the state's bytes,
    and changing the copy's lists, maps and consumers leaves the original as it was (the
    values of ``pending`` and ``redeliver`` are read-only sequences a change replaces)."""
    from filepulsar.storage.cursor import ConsumerInfo

    s = SubscriptionState(topic="persistent://t/n/x", name="sub", sub_type=ConsumerType.KeyShared)
    s.version, s.commit_id, s.mark_delete, s.dispatched = 7, "c7", (3, 4), (3, 9)
    s.acked = [[3, 6, 3, 7], [4, 0, 4, 2]]
    s.batch_acks = {"3:8": [0, 2]}
    s.consumers = {
        "a": ConsumerInfo("a", "app", 0, 99, 1, "app\0" + "0", 30_000, 3),
        "b": ConsumerInfo("b", "app2", 1, 98, 2, "b"),
    }
    s.pending = {"3:9": ["a", 0, 17]}
    s.redeliver = {"3:5": [1, 1234, 17]}
    s.selector = {"kind": "consistent", "version": 1, "consumers": [["app", 0], ["app2", 0]]}
    s.properties = {"p": "v"}
    s.name, s.sub_type, s.updated_ms, s.prev_commit_id = "sub2", ConsumerType.KeyShared, 5, "c6"
    s.created_ms, s.last_active_ms, s.join_seq = 1, 4, 2
    s.key_shared_mode, s.selector_version, s.seek_epoch = KeySharedMode.Sticky, 3, 2
    # Every field differs from its default here, so a field added later that copy() leaves
    # out fails this test instead of being dropped by every commit.
    import dataclasses

    for f in dataclasses.fields(SubscriptionState):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        assert getattr(s, f.name) != default, f.name
    before = SubscriptionState.decode(s.encode(), "test")
    c = s.copy()
    assert c == before
    c.acked[0][3] = 99
    c.batch_acks["3:8"].append(5)
    c.consumers["a"].extend(5, 10)
    # (Their values are read-only sequences, shared by the copy: a change replaces them.)
    c.pending["3:9"] = ["a", 4, 17]
    c.redeliver["3:5"] = [9, 1234, 17]
    c.selector["consumers"][0][1] = 7  # type: ignore[index]
    c.properties["q"] = "w"
    assert s == before
