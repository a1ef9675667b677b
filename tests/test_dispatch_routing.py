"""Tests of dispatch.routing: producer routing of messages to partitions."""

from __future__ import annotations

import base64
import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filepulsar.dispatch.hashing import java_string_hash, murmur3_32
from filepulsar.dispatch.routing import (
    CustomPartitionRouter,
    RoundRobinPartitionRouter,
    SinglePartitionRouter,
    key_hash,
    make_router,
    partition_for_key,
    partitions_for_keys,
)

pytestmark = pytest.mark.property

text = st.text(st.characters(exclude_categories=["Cs"]), max_size=16)


class FakeClock:
    """A settable millisecond clock."""

    def __init__(self, now_ms: int = 0) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def test_partition_for_key_uses_the_scheme() -> None:
    assert partition_for_key("hello", 7) == 99162322 % 7
    assert partition_for_key("hello", 7, "JavaStringHash") == java_string_hash("hello") % 7
    assert partition_for_key("hello", 7, "Murmur3_32Hash") == murmur3_32("hello") % 7
    assert partition_for_key("polygenelubricants", 5) == 0  # MIN_VALUE masks to 0
    assert partition_for_key("anything", 1) == 0


def test_unknown_scheme_and_bad_partition_counts() -> None:
    with pytest.raises(ValueError, match=r"JavaStringHash.*Murmur3_32Hash"):
        partition_for_key("k", 3, "Crc32")
    with pytest.raises(ValueError, match="Murmur3_32Hash"):
        RoundRobinPartitionRouter(3, hashing_scheme="murmur")
    with pytest.raises(ValueError):
        partition_for_key("k", 0)
    with pytest.raises(TypeError):
        partition_for_key("k", True)


def test_bytes_keys_route_on_their_base64_text() -> None:
    raw = b"\x00\xffkey"
    text_key = base64.b64encode(raw).decode()
    assert key_hash(raw) == java_string_hash(text_key)
    assert partition_for_key(raw, 11, "Murmur3_32Hash") == murmur3_32(text_key) % 11
    got = partitions_for_keys(pa.array([raw, None], pa.binary()), 11)
    assert list(got) == [partition_for_key(raw, 11), -1]


def test_round_robin_with_batching_switches_every_partition_switch_ms() -> None:
    clock = FakeClock(1_000_000)
    router = RoundRobinPartitionRouter(5, start=2, clock=clock)
    first = router.choose_partition()
    assert first == (1_000_000 // 10 + 2) % 5
    clock.now_ms += 9
    assert router.choose_partition() == first  # same 10 ms slot: same partition (one batch)
    clock.now_ms += 1
    assert router.choose_partition() == (first + 1) % 5
    clock.now_ms += 30
    assert router.choose_partition() == (first + 4) % 5


def test_round_robin_without_batching_counts_from_start() -> None:
    router = RoundRobinPartitionRouter(3, start=2, batching_enabled=False, clock=FakeClock())
    assert [router.choose_partition() for _ in range(7)] == [2, 0, 1, 2, 0, 1, 2]


def test_round_robin_counter_wraps_like_a_java_int() -> None:
    # Java's int counter goes from 2**31 - 1 to -2**31; signSafeMod keeps partitions valid.
    router = RoundRobinPartitionRouter(3, start=2**31 - 2, batching_enabled=False)
    expected = [(2**31 - 2) % 3, (2**31 - 1) % 3, -(2**31) % 3, (-(2**31) + 1) % 3]
    assert [router.choose_partition() for _ in range(4)] == expected
    batch = RoundRobinPartitionRouter(3, start=2**31 - 2, batching_enabled=False)
    assert list(batch.choose_partitions([None] * 4)) == expected


def test_keyed_messages_ignore_the_round_robin() -> None:
    router = RoundRobinPartitionRouter(4, start=1, batching_enabled=False, clock=FakeClock())
    assert router.choose_partition("k") == partition_for_key("k", 4)
    assert router.choose_partition() == 1  # the counter did not move for the keyed message
    murmur = RoundRobinPartitionRouter(4, clock=FakeClock(), hashing_scheme="Murmur3_32Hash")
    assert murmur.choose_partition("k") == murmur3_32("k") % 4


def test_partition_switch_ms_is_at_least_one() -> None:
    router = RoundRobinPartitionRouter(4, partition_switch_ms=0, clock=FakeClock(7))
    assert router.partition_switch_ms == 1
    assert router.choose_partition() == 7 % 4


def test_single_partition_router() -> None:
    router = SinglePartitionRouter(8, rng=random.Random(3))
    chosen = router.partition
    assert 0 <= chosen < 8
    assert {router.choose_partition() for _ in range(20)} == {chosen}
    assert router.choose_partition("k") == partition_for_key("k", 8)
    assert SinglePartitionRouter(8, partition=5).choose_partition() == 5
    with pytest.raises(ValueError):
        SinglePartitionRouter(8, partition=8)


def test_custom_partition_router_validates_the_answer() -> None:
    router = CustomPartitionRouter(lambda key, n: 0 if key is None else len(key) % n, 3)
    assert router.choose_partition("abcd") == 1
    assert router.choose_partition() == 0
    assert list(router.choose_partitions(["a", None, "ab"])) == [1, 0, 2]
    numpy_answer = CustomPartitionRouter(lambda key, n: np.int64(2), 3)  # type: ignore[arg-type,return-value]
    assert numpy_answer.choose_partition("x") == 2
    for bad in (3, -1, "1", True, 1.0):
        bad_router = CustomPartitionRouter(lambda key, n, bad=bad: bad, 3)  # type: ignore[misc]
        with pytest.raises(ValueError, match="Illegal partition index"):
            bad_router.choose_partition("x")
    with pytest.raises(TypeError):
        CustomPartitionRouter("not callable", 3)  # type: ignore[arg-type]


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.one_of(st.none(), text), max_size=40),
    st.integers(1, 40),
    st.sampled_from(["JavaStringHash", "Murmur3_32Hash"]),
)
def test_partitions_for_keys_matches_scalar(
    keys: list[str | None], num_partitions: int, scheme: str
) -> None:
    expected = [-1 if k is None else partition_for_key(k, num_partitions, scheme) for k in keys]
    assert list(partitions_for_keys(keys, num_partitions, scheme)) == expected
    arrow = pa.array(keys, pa.string())
    assert list(partitions_for_keys(arrow, num_partitions, scheme)) == expected


@settings(max_examples=30, deadline=None)
@given(st.lists(st.one_of(st.none(), text), max_size=30), st.integers(1, 9), st.booleans())
def test_choose_partitions_equals_one_by_one(
    keys: list[str | None], num_partitions: int, batching: bool
) -> None:
    def router() -> RoundRobinPartitionRouter:
        return RoundRobinPartitionRouter(
            num_partitions, start=3, batching_enabled=batching, clock=FakeClock(123_456)
        )

    one_by_one = router()
    expected = [one_by_one.choose_partition(k) for k in keys]
    batch = router()
    assert list(batch.choose_partitions(keys)) == expected
    # The counter continues where the batch left it.
    assert batch.choose_partition() == one_by_one.choose_partition()
    single = SinglePartitionRouter(num_partitions, partition=num_partitions - 1)
    assert list(single.choose_partitions(keys)) == [single.choose_partition(k) for k in keys]


def test_make_router() -> None:
    rng = random.Random(1)
    rr = make_router("RoundRobinPartition", 6, rng=rng, clock=FakeClock())
    assert isinstance(rr, RoundRobinPartitionRouter) and 0 <= rr.start < 6
    single = make_router("SinglePartition", 6, partition=2)
    assert isinstance(single, SinglePartitionRouter) and single.partition == 2
    custom = make_router("CustomPartition", 6, custom=lambda k, n: n - 1)
    assert custom.choose_partition("x") == 5
    with pytest.raises(ValueError, match="custom"):
        make_router("CustomPartition", 6)
    with pytest.raises(ValueError, match="RoundRobinPartition"):
        make_router("Broadcast", 6)


def test_default_clock_is_wall_milliseconds() -> None:
    router = RoundRobinPartitionRouter(1_000_003, start=0)
    assert 0 <= router.choose_partition() < 1_000_003
