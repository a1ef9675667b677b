"""Tests of dispatch.selectors: the three Key_Shared selectors.

What the property tests check, exactly:

* Auto-split: ``ranges()`` reports Pulsar's form -- one range per consumer, contiguous and
  non-overlapping from 0 to ``range_size`` (65536) -- and every slot the slot rule produces
  (``1 .. 65535``, slot 0 having become 1) is selected by the consumer whose range holds it.
* Consistent hashing: ``ranges()`` are non-overlapping and cover ``[1, 65535]`` exactly, and every
  slot in ``[1, 65535]`` is selected by the consumer whose range holds it.
* Sticky: ranges never overlap; a slot is selected by the consumer whose range holds it, or by
  nobody.
* Joining never moves a slot between two existing consumers; leaving hands the leaver's slots
  over exactly as each algorithm says and leaves every other slot alone.
* Vectorised selection equals scalar selection; a state round trip through JSON gives a selector
  that behaves identically, also under further changes.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import mmh3
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filepulsar.dispatch.hashing import murmur3_32
from filepulsar.dispatch.selectors import selector_for_mode, selector_from_dict
from filepulsar.dispatch.selectors.auto_split import AutoSplitHashRangeSelector
from filepulsar.dispatch.selectors.base import ConsumerAssignError, StickyKeyConsumerSelector
from filepulsar.dispatch.selectors.consistent import ConsistentHashingSelector
from filepulsar.dispatch.selectors.sticky import StickyHashRangeSelector

pytestmark = pytest.mark.property

SLOTS = np.arange(65536, dtype=np.int64)
NAMES = [f"C{i}" for i in range(1, 9)]

ops = st.lists(st.tuples(st.booleans(), st.sampled_from(NAMES)), max_size=14)


def owners(selector: StickyKeyConsumerSelector) -> list[str | None]:
    """Owner name of every slot 0..65535 (vectorised path)."""
    return list(selector.select_slots(SLOTS, as_names=True))


def owners_from_ranges(selector: StickyKeyConsumerSelector, lo: int, hi: int) -> list[str | None]:
    table: list[str | None] = [None] * 65536
    for name, ranges in selector.ranges().items():
        for start, end in ranges:
            for slot in range(max(start, lo), min(end, hi) + 1):
                assert table[slot] is None, f"slot {slot} in two ranges"
                table[slot] = name
    return table


def assert_scalar_agrees_at_range_edges(selector: StickyKeyConsumerSelector) -> None:
    """The scalar path picks each range's owner at both ends of the range."""
    for name, ranges in selector.ranges().items():
        for start, end in ranges:
            for slot in {max(start, 1), min(end, 65535)}:
                if start <= slot <= end:
                    assert selector.select_slot(slot) == name


def apply_auto(selector: AutoSplitHashRangeSelector, steps: list[tuple[bool, str]]) -> None:
    for add, name in steps:
        if add and name not in selector.consumers():
            selector.add_consumer(name)
        elif not add:
            selector.remove_consumer(name)


def apply_ch(selector: ConsistentHashingSelector, steps: list[tuple[bool, str]]) -> None:
    for add, name in steps:
        if add:
            selector.add_consumer(name)
        else:
            indexes = [i for n, i in selector.instances() if n == name]
            if indexes:
                selector.remove_consumer(name, name_index=max(indexes))


# ============================================================================================
# Auto-split hash ranges
# ============================================================================================


def test_auto_split_seed_example() -> None:
    selector = AutoSplitHashRangeSelector()
    for name in ["C1", "C2", "C3", "C4"]:
        selector.add_consumer(name)
    assert selector.bounds() == [(16384, "C3"), (32768, "C2"), (49152, "C4"), (65536, "C1")]
    assert selector.slot("Order-3459134") == 6067
    assert selector.select("Order-3459134") == "C3"
    assert selector.select(b"Order-3459134") == "C3"
    assert selector.ranges() == {
        "C3": [(0, 16384)],
        "C2": [(16385, 32768)],
        "C4": [(32769, 49152)],
        "C1": [(49153, 65536)],
    }
    assert selector.remove_consumer("C4")
    assert selector.bounds() == [(16384, "C3"), (32768, "C2"), (65536, "C1")]
    assert selector.remove_consumer("C1")
    assert selector.bounds() == [(16384, "C3"), (65536, "C2")]
    assert not selector.remove_consumer("C1")


def test_auto_split_intermediate_steps() -> None:
    selector = AutoSplitHashRangeSelector()
    selector.add_consumer("C1")
    assert selector.bounds() == [(65536, "C1")]
    selector.add_consumer("C2")
    assert selector.bounds() == [(32768, "C2"), (65536, "C1")]
    selector.add_consumer("C3")
    assert selector.bounds() == [(16384, "C3"), (32768, "C2"), (65536, "C1")]
    assert selector.select_slot(0) == "C3"
    assert selector.select_slot(16384) == "C3"
    assert selector.select_slot(16385) == "C2"
    assert selector.select_slot(65535) == "C1"


def test_auto_split_errors() -> None:
    selector = AutoSplitHashRangeSelector()
    selector.add_consumer("C1")
    with pytest.raises(ConsumerAssignError, match="already"):
        selector.add_consumer("C1")
    with pytest.raises(ConsumerAssignError, match="sticky"):
        selector.add_consumer("C2", [(0, 10)])
    for bad in (0, 1, 3, 65535, 2.0):
        with pytest.raises(ValueError):
            AutoSplitHashRangeSelector(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        selector.select_slot(65536)
    with pytest.raises(ValueError):
        selector.select_slots(np.array([-1]))
    assert issubclass(ConsumerAssignError, ValueError)


def test_auto_split_runs_out_of_ranges() -> None:
    selector = AutoSplitHashRangeSelector(range_size=4)
    for name in ["a", "b", "c", "d"]:
        selector.add_consumer(name)
    assert [b for b, _ in selector.bounds()] == [1, 2, 3, 4]
    with pytest.raises(ConsumerAssignError, match="single slot"):
        selector.add_consumer("e")
    assert selector.consumers() == ["a", "b", "c", "d"]  # unchanged by the refusal


def test_empty_selectors_select_nobody() -> None:
    for selector in (
        AutoSplitHashRangeSelector(),
        ConsistentHashingSelector(),
        StickyHashRangeSelector(),
    ):
        assert selector.select("k") is None
        assert selector.ranges() == {}
        assert list(selector.select_slots(np.array([1, 2]))) == [-1, -1]


@settings(max_examples=40, deadline=None)
@given(ops)
def test_auto_split_ranges_partition_the_hash_space(steps: list[tuple[bool, str]]) -> None:
    selector = AutoSplitHashRangeSelector()
    apply_auto(selector, steps)
    ranges = selector.ranges()
    if not selector.consumers():
        assert ranges == {}
        return
    assert all(len(r) == 1 for r in ranges.values())
    flat = sorted(r[0] for r in ranges.values())
    assert flat[0][0] == 0 and flat[-1][1] == 65536
    for (_, end), (start, _) in itertools.pairwise(flat):
        assert start == end + 1
    assert owners(selector)[1:] == owners_from_ranges(selector, 0, 65535)[1:]
    assert owners(selector)[0] == selector.select_slot(0)
    assert_scalar_agrees_at_range_edges(selector)


@settings(max_examples=40, deadline=None)
@given(ops, st.sampled_from(NAMES))
def test_auto_split_join_takes_lower_half_of_biggest_range(
    steps: list[tuple[bool, str]], newcomer: str
) -> None:
    selector = AutoSplitHashRangeSelector()
    apply_auto(selector, steps)
    if newcomer in selector.consumers() or not selector.consumers():
        return
    bounds = selector.bounds()
    before = owners(selector)
    sizes = [b - (bounds[i - 1][0] if i else 0) for i, (b, _) in enumerate(bounds)]
    biggest = sizes.index(max(sizes))  # first (lowest) on a tie
    lower = bounds[biggest - 1][0] if biggest else 0
    upper, victim = bounds[biggest]
    split = upper - ((upper - lower) >> 1)
    selector.add_consumer(newcomer)
    after = owners(selector)
    for slot in range(1, 65536):
        if lower < slot <= split:
            assert before[slot] == victim and after[slot] == newcomer
        else:
            assert after[slot] == before[slot]


@settings(max_examples=40, deadline=None)
@given(ops, st.sampled_from(NAMES))
def test_auto_split_leave_merges_right_or_top_left(
    steps: list[tuple[bool, str]], leaver: str
) -> None:
    selector = AutoSplitHashRangeSelector()
    apply_auto(selector, steps)
    if leaver not in selector.consumers():
        return
    bounds = selector.bounds()
    before = owners(selector)
    i = [name for _, name in bounds].index(leaver)
    if len(bounds) == 1:
        heir = None
    elif i == len(bounds) - 1:
        heir = bounds[i - 1][1]  # top bound: the left neighbour moves up
    else:
        heir = bounds[i + 1][1]  # otherwise the right neighbour takes over
    selector.remove_consumer(leaver)
    after = owners(selector)
    for slot in range(1, 65536):
        assert after[slot] == (heir if before[slot] == leaver else before[slot])


# ============================================================================================
# Consistent hashing
# ============================================================================================


def test_consistent_hashing_point_key_format() -> None:
    selector = ConsistentHashingSelector()
    name = "orders-aggregator-pod-2345-consumer"
    points = selector.point_slots(name, 0)
    assert len(points) == 100
    # Point i is the slot of name + "\0" + nameIndex + "\0" + i, range [1, 65535].
    raw = mmh3.hash(f"{name}\x000\x001".encode(), 0, False) & 0x7FFFFFFF
    assert points[1] == raw % 65535 + 1 == 2183  # the seed's 6028 uses an older key format
    assert points[0] == murmur3_32(f"{name}\x000\x000") % 65535 + 1
    assert selector.slot("Order-3459134") == murmur3_32("Order-3459134") % 65535 + 1


def test_consistent_hashing_select_is_first_point_at_or_above_wrapping() -> None:
    selector = ConsistentHashingSelector(points_per_consumer=3)
    selector.add_consumer("a")
    selector.add_consumer("b")
    ring = selector.ring()
    points = [p for p, _ in ring]
    for slot in (0, 1, points[0], points[0] + 1, points[-1], points[-1] + 1, 65535):
        if slot > 65535:
            continue
        at_or_above = [p for p in points if p >= slot]
        point = at_or_above[0] if at_or_above else points[0]
        assert selector.select_slot(slot) == dict(ring)[point][0][0]


def _colliding_pair() -> tuple[str, str, int]:
    """Two consumer names with a ring point in common (found by a deterministic search)."""
    probe = ConsistentHashingSelector()
    seen: dict[int, str] = {}
    for n in range(200):
        name = f"consumer-{n}"
        for point in probe.point_slots(name, 0):
            other = seen.get(point)
            if other is not None and other != name:
                return other, name, point
            seen.setdefault(point, name)
    raise AssertionError("no collision found")


def test_consistent_hashing_collision_queue() -> None:
    first, second, point = _colliding_pair()
    selector = ConsistentHashingSelector()
    selector.add_consumer(first)
    selector.add_consumer(second)
    assert selector.select_slot(point) == first  # the first added keeps the point
    assert dict(selector.ring())[point] == [(first, 0), (second, 0)]
    selector.remove_consumer(first)
    assert selector.select_slot(point) == second  # the queued consumer takes over
    selector.add_consumer(first)
    assert selector.select_slot(point) == second  # re-joining queues behind
    reversed_order = ConsistentHashingSelector()
    reversed_order.add_consumer(second)
    reversed_order.add_consumer(first)
    assert reversed_order.select_slot(point) == second


def test_consistent_hashing_name_index() -> None:
    selector = ConsistentHashingSelector()
    assert [selector.add_consumer("x") for _ in range(3)] == [0, 1, 2]
    assert selector.add_consumer("y") == 0
    with pytest.raises(ConsumerAssignError, match="name_index"):
        selector.remove_consumer("x")
    assert selector.remove_consumer("x", name_index=1)
    assert selector.instances() == [("x", 0), ("x", 2), ("y", 0)]
    assert selector.add_consumer("x") == 1  # the freed index is reused
    ring_members = {inst for _, queue in selector.ring() for inst in queue}
    assert ring_members == {("x", 0), ("x", 1), ("x", 2), ("y", 0)}
    points_of_x1 = {p for p, queue in selector.ring() if ("x", 1) in queue}
    assert points_of_x1 == set(selector.point_slots("x", 1))
    assert not selector.remove_consumer("x", name_index=7)
    assert selector.remove_consumer("y")
    with pytest.raises(ConsumerAssignError):
        selector.add_consumer("x", name_index=0)
    with pytest.raises(ConsumerAssignError, match="sticky"):
        selector.add_consumer("z", [(1, 2)])
    with pytest.raises(ValueError):
        ConsistentHashingSelector(0)


def test_consistent_hashing_ranges_join_and_wrap() -> None:
    selector = ConsistentHashingSelector(points_per_consumer=1)
    selector.add_consumer("only")
    # [1, point] and the wrap-around [point + 1, 65535] belong to one consumer: joined.
    assert selector.ranges() == {"only": [(1, 65535)]}
    selector.add_consumer("other")
    (a,) = selector.point_slots("only", 0)
    (b,) = selector.point_slots("other", 0)
    low, high = sorted([(a, "only"), (b, "other")])
    expected = {low[1]: [(1, low[0]), (high[0] + 1, 65535)], high[1]: [(low[0] + 1, high[0])]}
    assert selector.ranges() == expected


@settings(max_examples=30, deadline=None)
@given(ops)
def test_consistent_hashing_ranges_cover_and_agree(steps: list[tuple[bool, str]]) -> None:
    selector = ConsistentHashingSelector()
    apply_ch(selector, steps)
    if not selector.consumers():
        assert selector.ranges() == {}
        return
    covered = sorted(r for rs in selector.ranges().values() for r in rs)
    assert covered[0][0] == 1 and covered[-1][1] == 65535
    for (_, end), (start, _) in itertools.pairwise(covered):
        assert start == end + 1
    table = owners(selector)
    assert table[1:] == owners_from_ranges(selector, 1, 65535)[1:]
    assert all(name is not None for name in table)
    assert_scalar_agrees_at_range_edges(selector)


@settings(max_examples=30, deadline=None)
@given(ops, st.sampled_from(NAMES))
def test_consistent_hashing_join_only_takes_slots(
    steps: list[tuple[bool, str]], newcomer: str
) -> None:
    selector = ConsistentHashingSelector()
    apply_ch(selector, steps)
    before = selector.select_slots(SLOTS)
    index = selector.add_consumer(newcomer)
    after = selector.select_slots(SLOTS)
    new_position = selector.instances().index((newcomer, index))
    moved = before != after
    assert np.all(after[moved] == new_position)


@settings(max_examples=30, deadline=None)
@given(ops, st.sampled_from(NAMES))
def test_consistent_hashing_leave_hands_over_only_its_slots(
    steps: list[tuple[bool, str]], leaver: str
) -> None:
    selector = ConsistentHashingSelector()
    apply_ch(selector, steps)
    indexes = [i for n, i in selector.instances() if n == leaver]
    if not indexes:
        return
    instance = (leaver, min(indexes))
    before_instances = selector.instances()
    before = [before_instances[i] if i >= 0 else None for i in selector.select_slots(SLOTS)]
    selector.remove_consumer(instance[0], name_index=instance[1])
    after_instances = selector.instances()
    after = [after_instances[i] if i >= 0 else None for i in selector.select_slots(SLOTS)]
    for slot in range(1, 65536):
        if before[slot] != instance:
            assert after[slot] == before[slot]
        else:
            assert after[slot] != instance
    # The hand-over is exactly "whoever is next": the same ring built from the survivors.
    rebuilt = ConsistentHashingSelector()
    for name, index in after_instances:
        rebuilt.add_consumer(name, name_index=index)
    assert rebuilt.ring() == selector.ring()
    np.testing.assert_array_equal(rebuilt.select_slots(SLOTS), selector.select_slots(SLOTS))


def reference_ring(
    steps: list[tuple[bool, str]], points: int = 100
) -> tuple[list[tuple[str, int]], dict[int, list[tuple[str, int]]]]:
    """Pulsar's ring from first principles (the model the selector must equal): each
    instance's points are murmur3 of ``name\0index\0i`` folded into [1, 65535]; a point's
    queue lists the instances holding it in the order they joined; a leaver is dropped from
    every queue. Removal picks the highest index of the name (as :func:`apply_ch`)."""
    instances: list[tuple[str, int]] = []
    ring: dict[int, list[tuple[str, int]]] = {}
    for add, name in steps:
        indexes = [i for n, i in instances if n == name]
        if add:
            inst = (name, min(set(range(len(indexes) + 1)) - set(indexes)))
            for i in range(points):
                point = murmur3_32(f"{name}\0{inst[1]}\0{i}") % 65535 + 1
                ring.setdefault(point, []).append(inst)
            instances.append(inst)
        elif indexes:
            inst = (name, max(indexes))
            instances.remove(inst)
            for point in list(ring):
                ring[point] = [x for x in ring[point] if x != inst]
                if not ring[point]:
                    del ring[point]
    return instances, ring


@settings(max_examples=40, deadline=None)
@given(ops, st.integers(min_value=1, max_value=100))
def test_consistent_hashing_ring_restored_at_every_step_equals_pulsars(
    steps: list[tuple[bool, str]], points: int
) -> None:
    """Every membership step made on a selector restored from the state the step before
    stored (as a subscription's registrations and leavings do, the process's ring cache
    answering the restores) gives Pulsar's ring: same points, same collision order; a
    restored copy changed afterwards leaves the other copies of that state alone."""
    state = ConsistentHashingSelector(points).to_dict()
    for n in range(len(steps)):
        selector = selector_from_dict(state)
        assert isinstance(selector, ConsistentHashingSelector)
        apply_ch(selector, steps[n : n + 1])
        instances, ring = reference_ring(steps[: n + 1], points)
        assert selector.instances() == instances
        assert selector.ring() == sorted(ring.items())
        state = selector.to_dict()
        again = selector_from_dict(state)
        assert isinstance(again, ConsistentHashingSelector)
        again.add_consumer("intruder")  # a copy changed: the cached ring is not
        assert selector_from_dict(state).ring() == sorted(ring.items())
    direct = ConsistentHashingSelector(points)
    apply_ch(direct, steps)
    np.testing.assert_array_equal(
        selector_from_dict(state).select_slots(SLOTS), direct.select_slots(SLOTS)
    )


def test_a_restored_ring_sorts_its_points_once_for_the_process() -> None:
    """The points a restored, unchanged selector sorts to select are kept with its ring: the
    next restore of that membership selects without sorting again; a changed selector's
    sorted points are its own."""
    from filepulsar.dispatch.selectors import consistent

    selector = ConsistentHashingSelector(7)
    for name in ("sorts-once-a", "sorts-once-b", "sorts-once-c"):
        selector.add_consumer(name)
    state = json.loads(json.dumps(selector.to_dict()))  # (a new membership, stored unsorted)
    first = selector_from_dict(state)
    assert isinstance(first, ConsistentHashingSelector)
    owners = first.select_slots(SLOTS)
    again = selector_from_dict(state)
    assert isinstance(again, ConsistentHashingSelector)
    assert again._sorted is not None  # kept: no sort at this restore's first selection
    np.testing.assert_array_equal(again.select_slots(SLOTS), owners)
    changed = selector_from_dict(state)
    changed.add_consumer("sorts-once-d")
    changed.select_slots(SLOTS)
    kept = consistent._RINGS.get(7, tuple(map(tuple, state["consumers"])))
    assert kept is not None and kept[1] == sorted(kept[0])


@pytest.mark.procs
def test_a_forked_child_keeps_no_ring_of_its_parent() -> None:
    """A child forked while a parent's thread changed the ring cache must not inherit a
    half-made change (rings and their point count out of step): it starts empty."""
    import os

    from filepulsar.dispatch.selectors import consistent

    selector = ConsistentHashingSelector(5)
    selector.add_consumer("forked-a")
    selector_from_dict(selector.to_dict())
    assert consistent._RINGS._points > 0
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: reports what it kept, then leaves at once
        try:
            kept = len(consistent._RINGS._rings) + consistent._RINGS._points
            os.write(write, str(kept).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 64) == b"0"
    os.close(read)


# ============================================================================================
# Sticky
# ============================================================================================


def test_sticky_seed_example() -> None:
    selector = StickyHashRangeSelector()
    selector.add_consumer("C1", [(0, 16383), (32768, 49151)])
    selector.add_consumer("C2", [(16384, 32767), (49152, 65535)])
    assert selector.select("Order-3459134") == "C1"
    assert selector.ranges() == {
        "C1": [(0, 16383), (32768, 49151)],
        "C2": [(16384, 32767), (49152, 65535)],
    }


def test_sticky_uncovered_slots_wait_and_ranges_free_on_leave() -> None:
    selector = StickyHashRangeSelector()
    selector.add_consumer("C1", [(10, 20), (30, 40)])
    assert selector.select_slot(25) is None  # a gap between one consumer's ranges
    assert selector.select_slot(20) == "C1"
    assert selector.select_slot(41) is None
    assert selector.remove_consumer("C1")
    assert selector.select_slot(15) is None
    selector.add_consumer("C2", [(15, 35)])
    assert selector.select_slot(15) == "C2"


@pytest.mark.parametrize(
    ("ranges", "message"),
    [
        (None, "at least one"),
        ([], "at least one"),
        ([(5, 4)], "start > end"),
        ([(-1, 4)], "outside"),
        ([(0, 65536)], "outside"),
        ([(0, 10), (10, 20)], "own"),
        ([(0, 10), (5, 6)], "own"),
        ([(100, 200)], "overlaps"),
        ([(150, 150)], "overlaps"),
        ([(0, 100)], "overlaps"),
        ([(200, 300)], "overlaps"),
        ([(0, 65535)], "overlaps"),
    ],
)
def test_sticky_refusals(ranges: list[tuple[int, int]] | None, message: str) -> None:
    selector = StickyHashRangeSelector()
    selector.add_consumer("C1", [(100, 200)])
    with pytest.raises(ConsumerAssignError, match=message):
        selector.add_consumer("C2", ranges)
    assert selector.consumers() == ["C1"]
    assert selector.select_slot(99) is None


def test_sticky_adjacent_ranges_and_duplicates() -> None:
    selector = StickyHashRangeSelector()
    selector.add_consumer("C1", [(100, 200)])
    selector.add_consumer("C2", [(0, 99), (201, 65535)])
    assert selector.select_slot(99) == "C2" and selector.select_slot(100) == "C1"
    with pytest.raises(ConsumerAssignError, match="already"):
        selector.add_consumer("C1", [(5, 5)])
    with pytest.raises(ValueError):
        StickyHashRangeSelector(1)


@st.composite
def sticky_plans(draw: st.DrawFn) -> list[tuple[str, list[tuple[int, int]]]]:
    """Consumers with random ranges; some of them overlap on purpose."""
    plans = []
    for name in draw(st.lists(st.sampled_from(NAMES), max_size=6, unique=True)):
        ranges = []
        for _ in range(draw(st.integers(1, 3))):
            start = draw(st.integers(0, 65535))
            end = draw(st.integers(start, min(65535, start + 20000)))
            ranges.append((start, end))
        plans.append((name, ranges))
    return plans


@settings(max_examples=40, deadline=None)
@given(sticky_plans(), st.data())
def test_sticky_never_overlaps_and_select_agrees(
    plans: list[tuple[str, list[tuple[int, int]]]], data: st.DataObject
) -> None:
    selector = StickyHashRangeSelector()
    for name, ranges in plans:
        before = owners(selector)
        try:
            selector.add_consumer(name, ranges)
        except ConsumerAssignError:
            assert owners(selector) == before
            continue
        after = owners(selector)
        assert all(a == b or (b is None and a == name) for a, b in zip(after, before, strict=True))
    assert owners(selector) == owners_from_ranges(selector, 0, 65535)
    assert_scalar_agrees_at_range_edges(selector)
    if selector.consumers():
        leaver = data.draw(st.sampled_from(selector.consumers()))
        before = owners(selector)
        selector.remove_consumer(leaver)
        after = owners(selector)
        assert after == [None if b == leaver else b for b in before]


# ============================================================================================
# All selectors: scalar vs vectorised, state round trip
# ============================================================================================


def build(kind: str, steps: list[tuple[bool, str]]) -> StickyKeyConsumerSelector:
    if kind == "auto":
        auto = AutoSplitHashRangeSelector()
        apply_auto(auto, steps)
        return auto
    if kind == "ch":
        ch = ConsistentHashingSelector()
        apply_ch(ch, steps)
        return ch
    sticky = StickyHashRangeSelector()
    for i, name in enumerate(sorted({n for _, n in steps})):
        sticky.add_consumer(name, [(i * 7000, i * 7000 + 5000)])
    return sticky


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from(["auto", "ch", "sticky"]),
    ops,
    st.lists(st.one_of(st.binary(max_size=24), st.text(max_size=12)), max_size=40),
)
def test_vectorised_selection_equals_scalar(
    kind: str, steps: list[tuple[bool, str]], keys: list[bytes | str]
) -> None:
    selector = build(kind, steps)
    expected = [selector.select(k) for k in keys]
    assert list(selector.select_keys(keys, as_names=True)) == expected
    indices = selector.select_keys(keys)
    assert list(selector.names_of(indices)) == expected
    slots = [selector.slot(k) for k in keys]
    np.testing.assert_array_equal(selector.slots(keys), np.array(slots, dtype=np.int64))
    assert list(selector.select_slots(np.array(slots, dtype=np.int64), as_names=True)) == [
        selector.select_slot(s) for s in slots
    ]


def test_select_keys_treats_nulls_as_none_key() -> None:
    selector = ConsistentHashingSelector()
    selector.add_consumer("a")
    selector.add_consumer("b")
    got = selector.select_keys(pa.array([None, b"k"]), as_names=True)
    assert list(got) == [selector.select(b"NONE_KEY"), selector.select(b"k")]
    with pytest.raises(ValueError):
        selector.select_keys(pa.array([None, b"k"]), null_key=None)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["auto", "ch", "sticky"]), ops, ops)
def test_state_round_trip_behaves_identically(
    kind: str, steps: list[tuple[bool, str]], more: list[tuple[bool, str]]
) -> None:
    original = build(kind, steps)
    state: dict[str, Any] = json.loads(json.dumps(original.to_dict()))
    restored = selector_from_dict(state)
    assert type(restored) is type(original)
    assert restored == original
    assert restored.ranges() == original.ranges()
    assert restored.consumers() == original.consumers()
    np.testing.assert_array_equal(restored.select_slots(SLOTS), original.select_slots(SLOTS))
    if isinstance(original, AutoSplitHashRangeSelector):
        assert isinstance(restored, AutoSplitHashRangeSelector)
        apply_auto(original, more)
        apply_auto(restored, more)
    elif isinstance(original, ConsistentHashingSelector):
        assert isinstance(restored, ConsistentHashingSelector)
        assert restored.ring() == original.ring()
        apply_ch(original, more)
        apply_ch(restored, more)
        assert restored.ring() == original.ring()
    np.testing.assert_array_equal(restored.select_slots(SLOTS), original.select_slots(SLOTS))


def test_state_validation() -> None:
    with pytest.raises(ValueError, match="kind"):
        selector_from_dict({"kind": "nope"})
    auto = AutoSplitHashRangeSelector()
    auto.add_consumer("a")
    state = auto.to_dict()
    with pytest.raises(ValueError, match="version"):
        selector_from_dict({**state, "version": 99})
    with pytest.raises(ValueError, match="inconsistent"):
        selector_from_dict({**state, "bounds": [[100, "a"]]})
    with pytest.raises(ValueError, match="inconsistent"):
        selector_from_dict({**state, "consumers": ["a", "b"]})
    ch_state = {
        "kind": "consistent_hashing",
        "version": 1,
        "points_per_consumer": 5,
        "consumers": [["a", 0], ["a", 0]],
    }
    with pytest.raises(ValueError, match="inconsistent"):
        selector_from_dict(ch_state)
    sticky_state = {
        "kind": "sticky",
        "version": 1,
        "range_size": 65536,
        "consumers": [["a", [[0, 10]]], ["b", [[5, 20]]]],
    }
    with pytest.raises(ValueError):
        selector_from_dict(sticky_state)


def test_selector_for_mode() -> None:
    assert isinstance(selector_for_mode(), ConsistentHashingSelector)
    assert isinstance(
        selector_for_mode("AUTO_SPLIT", use_consistent_hashing=False), AutoSplitHashRangeSelector
    )
    assert isinstance(selector_for_mode("STICKY"), StickyHashRangeSelector)
    with pytest.raises(ValueError, match="AUTO_SPLIT"):
        selector_for_mode("ROUND_ROBIN")
