"""Tests of dispatch.delayed: whether a message with deliver_at is held back."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filepulsar.dispatch.delayed import (
    DEFAULT_TICK_MS,
    MAX_DELAY_MS,
    delays_apply,
    should_delay,
    should_delay_array,
)

pytestmark = pytest.mark.property

NOW = 1_700_000_000_000


def test_cutoff_is_now_plus_tick() -> None:
    assert DEFAULT_TICK_MS == 1000
    assert not should_delay(NOW + 1000, NOW)  # may go out up to one tick early
    assert should_delay(NOW + 1001, NOW)
    assert not should_delay(NOW - 5, NOW)
    assert not should_delay(NOW + 50, NOW, tick_ms=50)
    assert should_delay(NOW + 51, NOW, tick_ms=50)


def test_strict_mode_compares_with_now() -> None:
    assert should_delay(NOW + 1, NOW, strict=True)
    assert not should_delay(NOW, NOW, strict=True)


def test_no_deliver_at_means_no_delay() -> None:
    for value in (None, 0, -1):
        assert not should_delay(value, -10_000, strict=True)


def test_validation_and_constants() -> None:
    with pytest.raises(ValueError):
        should_delay(NOW, NOW, tick_ms=-1)
    with pytest.raises(ValueError):
        should_delay_array([NOW], NOW, tick_ms=-1)
    with pytest.raises(TypeError):
        should_delay_array(np.array([1.5]), NOW)
    with pytest.raises(TypeError):
        should_delay_array(pa.array(["x"]), NOW)
    assert MAX_DELAY_MS == 10 * 24 * 3600 * 1000
    assert delays_apply("Shared") and delays_apply("Key_Shared")
    assert not delays_apply("Exclusive") and not delays_apply("Failover")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.integers(-5, 3000)), max_size=30),
    st.integers(0, 2000),
    st.booleans(),
)
def test_array_matches_scalar(offsets: list[int | None], tick: int, strict: bool) -> None:
    values = [None if o is None else (0 if o == 0 else NOW + o) for o in offsets]
    expected = [should_delay(v, NOW, tick, strict) for v in values]
    arrow = pa.array(values, pa.int64())
    assert list(should_delay_array(arrow, NOW, tick, strict)) == expected
    assert list(should_delay_array(values, NOW, tick, strict)) == expected
    chunked = pa.chunked_array([arrow[:3], arrow[3:]], type=pa.int64())
    assert list(should_delay_array(chunked, NOW, tick, strict)) == expected
    ints = np.array([0 if v is None else v for v in values], dtype=np.int64)
    assert list(should_delay_array(ints, NOW, tick, strict)) == expected


def test_array_accepts_timestamps_and_empty() -> None:
    stamps = pa.array([NOW + 5000, NOW], pa.timestamp("ms"))
    assert list(should_delay_array(stamps, NOW)) == [True, False]
    micro = pa.array([(NOW + 5000) * 1000], pa.timestamp("us", tz="UTC"))
    assert list(should_delay_array(micro, NOW)) == [True]
    assert should_delay_array([], NOW).shape == (0,)
    assert list(should_delay_array(pa.nulls(2), NOW)) == [False, False]
