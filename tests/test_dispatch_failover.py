"""Tests of dispatch.failover: the active consumer of a Failover subscription."""

from __future__ import annotations

import bisect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filepulsar.dispatch.failover import active_consumer, failover_hash_ring
from filepulsar.dispatch.hashing import murmur3_32

pytestmark = pytest.mark.property

TOPIC = "persistent://public/default/orders"


def reference_ring_choice(names: list[str], topic: str) -> str:
    """Straightforward reading of the ring rule, for comparison."""
    ring: dict[int, str] = {}
    for name in names:
        for j in range(100):
            ring[murmur3_32(name + str(j))] = name
    points = sorted(ring)
    i = bisect.bisect_left(points, murmur3_32(topic))
    return ring[points[i % len(points)]]


def test_partitioned_topic_spreads_partitions_over_sorted_consumers() -> None:
    consumers = [("b", 0), ("a", 0), ("c", 0)]
    assert [active_consumer(consumers, p, f"{TOPIC}-partition-{p}") for p in range(5)] == [
        "a",
        "b",
        "c",
        "a",
        "b",
    ]


def test_only_the_best_priority_level_is_eligible() -> None:
    consumers = [("a", 1), ("z", 0), ("y", 0), ("b", 2)]
    assert [active_consumer(consumers, p, TOPIC) for p in range(4)] == ["y", "z", "y", "z"]
    assert active_consumer(consumers, -1, TOPIC) in {"y", "z"}
    assert active_consumer([("low", 5)], 3, TOPIC) == "low"


def test_names_sort_like_java_strings() -> None:
    # Java compares UTF-16 units: U+10000 is D800 DC00 and sorts before U+FFFF.
    consumers = [("\uffff", 0), ("\U00010000", 0)]
    assert active_consumer(consumers, 0, TOPIC) == "\U00010000"


def test_errors() -> None:
    with pytest.raises(ValueError, match="at least one"):
        active_consumer([], 0, TOPIC)
    with pytest.raises(ValueError, match="partition_index"):
        active_consumer([("a", 0)], -2, TOPIC)
    with pytest.raises(TypeError):
        active_consumer([("a", "0")], 0, TOPIC)  # type: ignore[list-item]


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=5, unique=True),
    st.text(max_size=20),
)
def test_non_partitioned_topic_uses_the_ring(names: list[str], topic: str) -> None:
    consumers = [(name, 0) for name in names]
    ordered = sorted(names, key=lambda n: n.encode("utf-16-be", "surrogatepass"))
    assert active_consumer(consumers, -1, topic) == reference_ring_choice(ordered, topic)
    # With broker-side consistent hashing partitions use the same ring.
    assert active_consumer(consumers, 4, topic, consistent_hashing=True) == (
        reference_ring_choice(ordered, topic)
    )


def test_later_consumer_overwrites_an_equal_ring_point() -> None:
    # "c1" + "10" == "c11" + "0": the two names share ten ring points; "c11" sorts later.
    shared = {murmur3_32(f"c1{j}") for j in range(10, 20)}
    assert shared <= {murmur3_32(f"c11{j}") for j in range(10)}
    ring = dict(failover_hash_ring(["c1", "c11"]))
    assert all(ring[point] == 1 for point in shared)
    points = sorted(ring)
    topic = next(
        t
        for t in (f"topic-{n}" for n in range(100_000))
        if points[bisect.bisect_left(points, murmur3_32(t)) % len(points)] in shared
    )
    assert active_consumer([("c1", 0), ("c11", 0)], -1, topic) == "c11"
    assert active_consumer([("c11", 0), ("c1", 0)], -1, topic) == "c11"


def test_ring_is_sorted_and_complete() -> None:
    ring = failover_hash_ring(["x"])
    assert [p for p, _ in ring] == sorted({murmur3_32(f"x{j}") for j in range(100)})
