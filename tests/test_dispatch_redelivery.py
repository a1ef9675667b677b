"""Tests of dispatch.redelivery: backoff, negative-ack delay, dead and retry letters."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filepulsar.dispatch.redelivery import (
    DEFAULT_MAX_RECONSUME_TIMES,
    DEFAULT_NEGATIVE_ACK_DELAY_MS,
    MIN_NEGATIVE_ACK_DELAY_MS,
    MultiplierRedeliveryBackoff,
    dead_letter_topic,
    goes_to_dead_letter,
    negative_ack_delay_ms,
    retry_goes_to_dead_letter,
    retry_letter_topic,
)

pytestmark = pytest.mark.property


def test_seed_table() -> None:
    backoff = MultiplierRedeliveryBackoff(min_delay_ms=1000, max_delay_ms=60_000, multiplier=2)
    assert [backoff.next(n) for n in range(8)] == [
        1000,
        2000,
        4000,
        8000,
        16000,
        32000,
        60000,
        60000,
    ]


def test_defaults() -> None:
    backoff = MultiplierRedeliveryBackoff()
    assert (backoff.min_delay_ms, backoff.max_delay_ms, backoff.multiplier) == (
        10_000,
        600_000,
        2.0,
    )
    assert backoff.max_multiplier_pow == int(math.log(60) / math.log(2)) + 1 == 6
    assert [backoff.next(n) for n in (-3, 0, 1, 5, 6, 7, 10**9)] == [
        10_000,
        10_000,
        20_000,
        320_000,
        600_000,  # 640 000 capped
        600_000,  # beyond max_multiplier_pow
        600_000,
    ]


def test_zero_minimum_stays_zero() -> None:
    backoff = MultiplierRedeliveryBackoff(min_delay_ms=0, max_delay_ms=1000)
    assert {backoff.next(n) for n in range(20)} == {0}
    assert MultiplierRedeliveryBackoff(0, 0).next(3) == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_delay_ms": -1}, "min_delay_ms"),
        ({"min_delay_ms": 10, "max_delay_ms": 9}, "max_delay_ms"),
        ({"multiplier": 1.0}, "multiplier"),
        ({"multiplier": 0.5}, "multiplier"),
        ({"multiplier": float("nan")}, "multiplier"),
    ],
)
def test_invalid_arguments(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MultiplierRedeliveryBackoff(**kwargs)  # type: ignore[arg-type]


@settings(max_examples=80, deadline=None)
@given(
    st.integers(0, 10**7),
    st.integers(0, 10**8),
    st.floats(1.01, 10, allow_nan=False),
    st.integers(-2, 80),
)
def test_backoff_matches_the_rule(min_ms: int, extra: int, multiplier: float, n: int) -> None:
    max_ms = min_ms + extra
    backoff = MultiplierRedeliveryBackoff(min_ms, max_ms, multiplier)
    got = backoff.next(n)
    if n <= 0 or min_ms == 0:
        assert got == min_ms
    elif n > math.floor(math.log(max_ms / min_ms) / math.log(multiplier)) + 1:
        assert got == max_ms
    else:
        assert got == min(int(min_ms * multiplier**n), max_ms)
    assert min_ms <= got <= max_ms
    assert got <= backoff.next(n + 1)


def test_negative_ack_delay() -> None:
    assert DEFAULT_NEGATIVE_ACK_DELAY_MS == 60_000 and MIN_NEGATIVE_ACK_DELAY_MS == 100
    assert negative_ack_delay_ms(0) == 60_000
    assert negative_ack_delay_ms(5, delay_ms=50) == 100
    assert negative_ack_delay_ms(5, delay_ms=0) == 100
    backoff = MultiplierRedeliveryBackoff(1000, 60_000, 2)
    assert negative_ack_delay_ms(3, backoff=backoff) == 8000
    with pytest.raises(ValueError):
        negative_ack_delay_ms(0, delay_ms=-1)


def test_dead_letter_after_the_last_allowed_delivery_fails() -> None:
    # max 3: the application sees counts 0, 1, 2, 3; the failure of count 3 goes to the DLQ.
    assert [goes_to_dead_letter(c, 3) for c in range(5)] == [False, False, False, True, True]
    assert goes_to_dead_letter(0, 0)
    with pytest.raises(ValueError):
        goes_to_dead_letter(0, -1)


def test_retry_letter_rules() -> None:
    assert DEFAULT_MAX_RECONSUME_TIMES == 16
    assert not retry_goes_to_dead_letter(1, 16)
    assert not retry_goes_to_dead_letter(16, 16)
    assert retry_goes_to_dead_letter(17, 16)
    assert retry_letter_topic("persistent://t/n/a", "sub") == "persistent://t/n/a-sub-RETRY"
    assert dead_letter_topic("persistent://t/n/a", "sub") == "persistent://t/n/a-sub-DLQ"
