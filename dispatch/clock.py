"""One clock and one poll helper: time as an input, never read deep inside logic.

Logic that needs the time takes a clock -- a wall clock as a callable returning milliseconds
since the epoch (``clock: Callable[[], int]``, as every storage class and dispatch rule here
accepts), or a whole :class:`Clock` where it also waits. Only this module reads the system's
time; tests pass a :class:`ManualClock` and move it by hand, so nothing waits for real.

* :func:`wall_ms` -- the system wall clock in ms (Java's ``System.currentTimeMillis``); the
  default of every ``clock`` parameter.
* :class:`Clock` -- the protocol: ``now_ms`` (wall ms), ``monotonic`` (seconds, for
  deadlines and rates; never goes back) and ``sleep``.
* :data:`SYSTEM` -- the system's clock; :class:`ManualClock` -- a clock for tests whose
  ``sleep`` advances it instead of waiting.
* :func:`poll` -- call a check until it yields or a deadline passes, sleeping with doubling
  backoff in between: the one poll loop.

It lives in ``dispatch`` (which imports nothing of the project) so dispatch's rules and the
storage layer share it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, TypeVar

__all__ = ["SYSTEM", "Clock", "ManualClock", "SystemClock", "poll", "waits_of", "wall_ms"]

T = TypeVar("T")


def wall_ms() -> int:
    """Milliseconds since the epoch, from the system clock."""
    return time.time_ns() // 1_000_000


class Clock(Protocol):
    """What logic that waits is given: wall time, monotonic time and a way to wait."""

    def now_ms(self) -> int:
        """Wall time, milliseconds since the epoch (publish times, leases, retention)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (deadlines, renewal intervals)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (a manual clock advances instead)."""
        ...


class SystemClock:
    """The system's clocks (:data:`SYSTEM`)."""

    def now_ms(self) -> int:
        return wall_ms()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


#: The system clock, the default wherever a :class:`Clock` is taken.
SYSTEM: Clock = SystemClock()


class ManualClock:
    """A clock for tests: time moves only by :meth:`advance` or :meth:`sleep`.

    Parameters
    ----------
    start_ms
        The wall time it starts at (ms since the epoch).
    """

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._start_ms = int(start_ms)
        self._ms = self._start_ms
        self._mono = 0.0
        #: Every ``sleep`` asked for, in seconds (what a poll loop waited).
        self.sleeps: list[float] = []

    def now_ms(self) -> int:
        return self._ms

    def __call__(self) -> int:
        """The wall time in ms: a ManualClock is also a ``clock: Callable[[], int]``."""
        return self._ms

    def monotonic(self) -> float:
        return self._mono

    def advance(self, ms: int) -> None:
        """Move both clocks forward by ``ms`` milliseconds."""
        if ms < 0:
            raise ValueError(f"a clock does not go back: advance({ms})")
        self._mono += ms / 1000
        self._ms = self._start_ms + round(self._mono * 1000)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if seconds > 0:
            # Monotonic time moves by exactly ``seconds`` (a deadline is reached, not missed
            # by rounding); the wall clock by whole milliseconds.
            self._mono += seconds
            self._ms = self._start_ms + round(self._mono * 1000)


def waits_of(clock: object) -> Clock:
    """The :class:`Clock` to read deadlines from and wait on: ``clock`` itself when it is a
    whole Clock (a :class:`ManualClock` passed as a ``clock`` parameter), else the system's.
    """
    if all(callable(getattr(clock, a, None)) for a in ("now_ms", "monotonic", "sleep")):
        return clock  # type: ignore[return-value]
    return SYSTEM


def poll(
    check: Callable[[], T | None],
    timeout_s: float | None,
    *,
    clock: Clock = SYSTEM,
    first_delay_s: float = 0.002,
    max_delay_s: float = 0.1,
) -> T | None:
    """Call ``check`` until it returns something other than None, or the time is up.

    ``check`` runs at once, then after sleeps that double from ``first_delay_s`` up to
    ``max_delay_s`` (never past the deadline); it always runs at least once, and once more
    at the deadline.

    Parameters
    ----------
    check
        Returns the result, or None to keep waiting.
    timeout_s
        How long to wait, in seconds; None waits forever, 0 checks once.
    clock
        Where time is read and waited (:data:`SYSTEM`; a :class:`ManualClock` in tests).

    Returns
    -------
    object or None
        What ``check`` returned, or None if the time ran out.
    """
    deadline = None if timeout_s is None else clock.monotonic() + timeout_s
    delay = first_delay_s
    while True:
        found = check()
        if found is not None:
            return found
        if deadline is None:
            clock.sleep(delay)
        else:
            left = deadline - clock.monotonic()
            if left <= 0:
                return None
            clock.sleep(min(delay, left))
        delay = min(delay * 2, max_delay_s)
