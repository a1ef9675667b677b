"""One clock and one poll helper: waiting logic reads time from the clock it is given.

A ManualClock moves only when the code under test sleeps on it, so these tests never wait
for real, and they see every wait the code asked for.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from filepulsar.dispatch.clock import SYSTEM, ManualClock, poll, waits_of, wall_ms
from filepulsar.storage import Producer, Reader, open_blob_store

pytestmark = pytest.mark.unit


def test_poll_doubles_its_sleeps_up_to_the_cap_and_stops_at_the_deadline() -> None:
    clock = ManualClock()
    calls = []
    assert poll(lambda: calls.append(1), 1.0, clock=clock, max_delay_s=0.1) is None
    assert clock.sleeps[:6] == [0.002, 0.004, 0.008, 0.016, 0.032, 0.064]
    assert max(clock.sleeps) == 0.1 and clock.monotonic() == pytest.approx(1.0)
    assert len(calls) == len(clock.sleeps) + 1  # once more at the deadline


def test_poll_returns_the_first_result_and_zero_timeout_checks_once() -> None:
    clock = ManualClock()
    seen = iter([None, None, "x"])
    assert poll(lambda: next(seen), None, clock=clock) == "x"
    assert clock.sleeps == [0.002, 0.004]
    clock2 = ManualClock()
    calls = []
    assert poll(lambda: calls.append(1), 0, clock=clock2) is None
    assert calls == [1] and clock2.sleeps == []


def test_manual_clock_is_a_wall_clock_callable_and_never_goes_back() -> None:
    clock = ManualClock(start_ms=5_000)
    clock.advance(250)
    assert clock() == clock.now_ms() == 5_250 and clock.monotonic() == 0.25
    with pytest.raises(ValueError):
        clock.advance(-1)
    assert waits_of(clock) is clock and waits_of(lambda: 0) is SYSTEM and waits_of(None) is SYSTEM
    assert abs(wall_ms() - time.time() * 1000) < 5_000


def test_reader_waits_on_the_clock_it_is_given(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path))
    with Producer(store, "t", batching_enabled=False) as p:
        p.send(b"a")
    clock = ManualClock()
    r = Reader(store, "t", clock=clock)
    assert r.read_batch(10, timeout_ms=5_000).column("value").to_pylist() == [b"a"]
    assert clock.sleeps == []  # data was there: no wait
    started = time.monotonic()
    assert r.read_batch(10, timeout_ms=5_000).num_rows == 0
    # The five seconds passed on the manual clock, in doubling polling pauses, not for real.
    assert sum(clock.sleeps) == pytest.approx(5.0) and clock.sleeps[0] <= 0.002
    assert clock.sleeps[1] == 2 * clock.sleeps[0]
    assert time.monotonic() - started < 4.0
