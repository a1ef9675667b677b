"""Redelivery timing and the dead-letter / retry-letter decisions.

* :class:`MultiplierRedeliveryBackoff` is Pulsar's exponential backoff for negative acks and
  ack timeouts.
* :func:`negative_ack_delay_ms` is the delay before a negatively acknowledged message returns.
* The dead-letter and retry-letter helpers give Pulsar's default topic names, property names and
  the count at which a message leaves for the dead-letter topic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_MAX_RECONSUME_TIMES",
    "DEFAULT_NEGATIVE_ACK_DELAY_MS",
    "MIN_NEGATIVE_ACK_DELAY_MS",
    "PROPERTY_DELAY_TIME",
    "PROPERTY_ORIGIN_MESSAGE_ID",
    "PROPERTY_REAL_TOPIC",
    "PROPERTY_RECONSUME_TIMES",
    "MultiplierRedeliveryBackoff",
    "dead_letter_topic",
    "goes_to_dead_letter",
    "negative_ack_delay_ms",
    "retry_goes_to_dead_letter",
    "retry_letter_topic",
]

DEFAULT_NEGATIVE_ACK_DELAY_MS = 60_000
"""Default ``negativeAckRedeliveryDelay`` (1 minute)."""

MIN_NEGATIVE_ACK_DELAY_MS = 100
"""Floor the consumer applies to a fixed negative-ack delay."""

DEFAULT_MAX_RECONSUME_TIMES = 16
"""Retries allowed by ``reconsumeLater`` when retry is enabled without a dead-letter policy."""

PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_RECONSUME_TIMES = "RECONSUMETIMES"
PROPERTY_DELAY_TIME = "DELAY_TIME"


@dataclass(frozen=True)
class MultiplierRedeliveryBackoff:
    """Pulsar's ``MultiplierRedeliveryBackoff``: ``min * multiplier**n``, capped at ``max``.

    ``next(n)`` is ``min_delay_ms`` for ``n <= 0``; ``max_delay_ms`` once ``n`` exceeds
    ``floor(ln(max / min) / ln(multiplier)) + 1``; otherwise
    ``min(int(min_delay_ms * multiplier**n), max_delay_ms)``. A zero minimum always gives 0.

    Parameters
    ----------
    min_delay_ms
        Delay of the first redelivery (default 10 s); must be ``>= 0``.
    max_delay_ms
        Cap (default 10 min); must be ``>= min_delay_ms``.
    multiplier
        Growth factor (default 2.0); must be ``> 1``.

    Raises
    ------
    ValueError
        If an argument breaks the constraints above (Pulsar's builder checks the same).
    """

    min_delay_ms: int = 10_000
    max_delay_ms: int = 600_000
    multiplier: float = 2.0
    max_multiplier_pow: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.min_delay_ms < 0:
            raise ValueError(f"min_delay_ms must be >= 0, got {self.min_delay_ms}")
        if self.max_delay_ms < self.min_delay_ms:
            raise ValueError(
                f"max_delay_ms must be >= min_delay_ms, got max {self.max_delay_ms} "
                f"< min {self.min_delay_ms}"
            )
        if not self.multiplier > 1:
            raise ValueError(f"multiplier must be > 1, got {self.multiplier}")
        if self.min_delay_ms == 0:
            # ln(max / 0) is infinite; next() never gets past its first test anyway.
            max_pow = 0
        else:
            ratio = math.log(self.max_delay_ms / self.min_delay_ms) / math.log(self.multiplier)
            max_pow = int(ratio) + 1
        object.__setattr__(self, "max_multiplier_pow", max_pow)

    def next(self, redelivery_count: int) -> int:
        """Delay in milliseconds before redelivering a message.

        Parameters
        ----------
        redelivery_count
            The message's redelivery count (0 on its first delivery).

        Returns
        -------
        int
            The delay in ms, within ``[min_delay_ms, max_delay_ms]``.
        """
        if redelivery_count <= 0 or self.min_delay_ms <= 0:
            return self.min_delay_ms
        if redelivery_count > self.max_multiplier_pow:
            return self.max_delay_ms
        delay = int(self.min_delay_ms * math.pow(self.multiplier, redelivery_count))
        return min(delay, self.max_delay_ms)


def negative_ack_delay_ms(
    redelivery_count: int,
    *,
    delay_ms: int = DEFAULT_NEGATIVE_ACK_DELAY_MS,
    backoff: MultiplierRedeliveryBackoff | None = None,
) -> int:
    """Delay before a negatively acknowledged message is redelivered.

    Parameters
    ----------
    redelivery_count
        The message's redelivery count.
    delay_ms
        The consumer's fixed ``negativeAckRedeliveryDelay``; raised to at least
        :data:`MIN_NEGATIVE_ACK_DELAY_MS`.
    backoff
        When given, the delay is ``backoff.next(redelivery_count)`` and ``delay_ms`` is unused.

    Raises
    ------
    ValueError
        If ``delay_ms`` is negative.
    """
    if delay_ms < 0:
        raise ValueError(f"negative ack delay must be >= 0 ms, got {delay_ms}")
    if backoff is not None:
        return backoff.next(redelivery_count)
    return max(delay_ms, MIN_NEGATIVE_ACK_DELAY_MS)


def _check_max(max_count: int, what: str) -> None:
    if max_count < 0:
        raise ValueError(f"{what} must be >= 0, got {max_count}")


def goes_to_dead_letter(failed_redelivery_count: int, max_redeliver_count: int) -> bool:
    """Whether a failed delivery (nack or ack timeout) sends the message to the dead-letter topic.

    The application sees redelivery counts ``0 .. max_redeliver_count``; when the delivery whose
    count has reached ``max_redeliver_count`` fails, the message goes to the dead-letter topic
    (with ``REAL_TOPIC`` and ``ORIGIN_MESSAGE_ID`` added) and the original is acknowledged.

    Raises
    ------
    ValueError
        If ``max_redeliver_count`` is negative.
    """
    _check_max(max_redeliver_count, "max_redeliver_count")
    return failed_redelivery_count >= max_redeliver_count


def retry_goes_to_dead_letter(reconsume_times: int, max_reconsume_times: int) -> bool:
    """Whether a ``reconsumeLater`` whose ``RECONSUMETIMES`` is now ``reconsume_times`` (1 on
    the first retry) goes to the dead-letter topic instead of the retry topic.

    Raises
    ------
    ValueError
        If ``max_reconsume_times`` is negative.
    """
    _check_max(max_reconsume_times, "max_reconsume_times")
    return reconsume_times > max_reconsume_times


#: The vendor guide's default retry delay levels (``MESSAGE_DELAYLEVEL``): level 1 is 1 s,
#: level 3 is 10 s, ..., level 18 is 2 h.
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_LEVEL_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(levels: str | Sequence[int]) -> tuple[int, ...]:
    """Retry delay levels in ms, from the vendor guide's form (``"1s 5s 10s 30s 1m ... 2h"``,
    units ms/s/m/h/d) or a sequence of ms.

    Raises
    ------
    ValueError
        If a level is not a positive duration, or there is none.
    """
    if isinstance(levels, str):
        out = []
        for tok in levels.split():
            num = tok.rstrip("smhd")
            unit = tok[len(num) :]
            if not num.isdigit() or unit not in _LEVEL_UNITS or int(num) <= 0:
                raise ValueError(
                    f"retry delay level {tok!r} is not a positive duration like 1s, 5m, 2h "
                    "(units ms, s, m, h, d)"
                )
            out.append(int(num) * _LEVEL_UNITS[unit])
    else:
        out = list(levels)
        for v in out:
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"retry delay levels must be positive ms, got {v!r}")
    if not out:
        raise ValueError("retry delay levels are empty: give at least one, e.g. '1s 5s 10s'")
    return tuple(out)


def delay_of_level(levels: Sequence[int], level: int) -> int:
    """The delay (ms) of retry level ``level`` (1-based); levels past the last use the last,
    as the vendor's level-increment mode keeps its longest interval.

    Raises
    ------
    ValueError
        If ``level`` is below 1.
    """
    if isinstance(level, bool) or not isinstance(level, int) or level < 1:
        raise ValueError(f"retry delay level must be an integer >= 1, got {level!r}")
    return levels[min(level, len(levels)) - 1]


def retry_letter_topic(topic: str, subscription: str) -> str:
    """Pulsar's default retry-letter topic: ``<topic>-<subscription>-RETRY``."""
    return f"{topic}-{subscription}-RETRY"


def dead_letter_topic(topic: str, subscription: str) -> str:
    """Pulsar's default dead-letter topic: ``<topic>-<subscription>-DLQ``."""
    return f"{topic}-{subscription}-DLQ"
