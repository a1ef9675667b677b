"""Delayed delivery: whether a message with ``deliver_at`` is held back.

Pulsar holds a message only if ``deliver_at > cutoff``, where ``cutoff = now + tick`` (tick
1000 ms by default) or, in strict mode (``isDelayedDeliveryDeliverAtTimeStrict``), ``now``. So
by default a message may go out up to one tick early and is never held for less than a tick.
Only Shared and Key_Shared subscriptions honour delays; Exclusive and Failover deliver at once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

__all__ = [
    "DEFAULT_TICK_MS",
    "DELAYING_SUBSCRIPTION_TYPES",
    "MAX_DELAY_MS",
    "delays_apply",
    "should_delay",
    "should_delay_array",
]

DEFAULT_TICK_MS = 1000
"""Broker setting ``delayedDeliveryTickTimeMillis``."""

MAX_DELAY_MS = 864_000_000
"""Ten days: the cap a cloud vendor's guide puts on delays (informational; Pulsar has none)."""

DELAYING_SUBSCRIPTION_TYPES = frozenset({"Shared", "Key_Shared"})
"""Subscription types whose dispatchers honour ``deliver_at``."""


def _check_tick(tick_ms: int) -> None:
    if tick_ms < 0:
        raise ValueError(f"tick_ms must be >= 0, got {tick_ms}")


def should_delay(
    deliver_at_ms: int | None, now_ms: int, tick_ms: int = DEFAULT_TICK_MS, strict: bool = False
) -> bool:
    """Whether a message is held back at ``now_ms``.

    Parameters
    ----------
    deliver_at_ms
        The message's ``deliver_at_time`` in epoch ms; ``None``, 0 or negative means the message
        has no delay.
    now_ms
        The dispatcher's clock reading in epoch ms.
    tick_ms
        ``delayedDeliveryTickTimeMillis``.
    strict
        ``isDelayedDeliveryDeliverAtTimeStrict``: compare against ``now`` instead of
        ``now + tick``.

    Returns
    -------
    bool
        ``True`` if ``deliver_at_ms > cutoff``.

    Raises
    ------
    ValueError
        If ``tick_ms`` is negative.
    """
    _check_tick(tick_ms)
    if deliver_at_ms is None or deliver_at_ms <= 0:
        return False
    cutoff = now_ms if strict else now_ms + tick_ms
    return deliver_at_ms > cutoff


def should_delay_array(
    deliver_at_ms: pa.Array | pa.ChunkedArray | npt.ArrayLike,
    now_ms: int,
    tick_ms: int = DEFAULT_TICK_MS,
    strict: bool = False,
) -> npt.NDArray[np.bool_]:
    """Vectorised :func:`should_delay`.

    Parameters
    ----------
    deliver_at_ms
        ``deliver_at`` per message: a pyarrow integer or timestamp array (nulls allowed), a
        numpy integer array or a sequence of ``int``/``None``. Null, 0 and negative values mean
        "not delayed".
    now_ms, tick_ms, strict
        As for :func:`should_delay`.

    Returns
    -------
    numpy.ndarray
        Boolean mask, ``True`` where the message is held back.

    Raises
    ------
    ValueError
        If ``tick_ms`` is negative.
    TypeError
        If the values are not integers.
    """
    _check_tick(tick_ms)
    values = _as_int64(deliver_at_ms)
    cutoff = now_ms if strict else now_ms + tick_ms
    result: npt.NDArray[np.bool_] = (values > 0) & (values > cutoff)
    return result


def _as_int64(values: Any) -> npt.NDArray[np.int64]:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        if pa.types.is_timestamp(values.type):
            values = values.cast(pa.timestamp("ms", tz=values.type.tz), safe=False).cast(pa.int64())
        if not (pa.types.is_integer(values.type) or pa.types.is_null(values.type)):
            raise TypeError(
                f"deliver_at must be integer milliseconds, got Arrow type {values.type}"
            )
        filled = values.cast(pa.int64()).fill_null(0)
        return np.asarray(filled.to_numpy(zero_copy_only=False), dtype=np.int64)
    arr = np.asarray(values)
    if arr.dtype == object:
        arr = np.array([0 if v is None else v for v in arr.tolist()], dtype=np.int64)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"deliver_at must be integer milliseconds, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def delays_apply(subscription_type: str) -> bool:
    """Whether a subscription type honours ``deliver_at`` (only Shared and Key_Shared do)."""
    return subscription_type in DELAYING_SUBSCRIPTION_TYPES
