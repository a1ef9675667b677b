"""Producer routing: which partition of a partitioned topic a message goes to.

Pulsar's client routes every message itself:

* A message with a key always goes to ``hash(key) % num_partitions``, with the producer's
  hashing scheme (``JavaStringHash`` by default, or ``Murmur3_32Hash``). The ordering key plays no
  part in routing.
* ``RoundRobinPartition`` (the default mode), keyless messages: with batching the partition is
  ``(now_ms // partition_switch_ms + start) % n`` so a batch stays on one partition; without
  batching a counter starting at ``start`` advances by one per message.
* ``SinglePartition``, keyless messages: one partition chosen at random once per producer.
* ``CustomPartition``: a user function decides.

Keys are ``str``. A ``bytes`` key is what Pulsar's ``keyBytes`` sets: the client stores it as its
base64 text and routes on that text, so bytes keys are hashed as ``base64(key)`` here too.
"""

from __future__ import annotations

import base64
import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from filepulsar.dispatch import modes
from filepulsar.dispatch.clock import wall_ms
from filepulsar.dispatch.hash_arrays import KeyArrayLike, java_string_hash_array, murmur3_32_array
from filepulsar.dispatch.hashing import java_string_hash, murmur3_32, sign_safe_mod

__all__ = [
    "Clock",
    "CustomPartitionRouter",
    "HashingScheme",
    "MessageRouter",
    "RoundRobinPartitionRouter",
    "SinglePartitionRouter",
    "key_hash",
    "keyless_runs",
    "make_router",
    "partition_for_key",
    "partitions_for_keys",
    "route_rows",
    "wall_clock_ms",
]

#: The hashing schemes (:class:`filepulsar.dispatch.modes.HashingScheme`); the functions here
#: take a member or either spelling of one.
HashingScheme = modes.HashingScheme
_SchemeLike: TypeAlias = modes.HashingScheme | str
_SCHEMES = {h.wire: h for h in modes.HashingScheme}
_JAVA = modes.HashingScheme.JavaStringHash
_ROUTING = modes.PartitionsRoutingMode
DEFAULT_PARTITION_SWITCH_MS = 10
"""Batching publish delay (1 ms) times ``batchingPartitionSwitchFrequencyByPublishDelay`` (10)."""

Clock: TypeAlias = Callable[[], int]
"""A callable returning the current time in milliseconds."""


_JAVA_INT_SPAN = 2**32


def _as_java_int(value: int) -> int:
    """``value`` wrapped to a Java ``int``, as Pulsar's message counter wraps after 2**31 - 1."""
    return (value + _JAVA_INT_SPAN // 2) % _JAVA_INT_SPAN - _JAVA_INT_SPAN // 2


#: Milliseconds since the epoch, like Java's ``Clock.millis()`` that Pulsar's router reads
#: (the one wall clock, :func:`filepulsar.dispatch.clock.wall_ms`).
wall_clock_ms = wall_ms


def _check_scheme(hashing_scheme: _SchemeLike) -> modes.HashingScheme:
    """``hashing_scheme`` as the member (from either spelling; else InvalidConfiguration, a
    ValueError)."""
    if isinstance(hashing_scheme, modes.HashingScheme):  # the hot path: already the member
        return hashing_scheme
    found = _SCHEMES.get(hashing_scheme) if isinstance(hashing_scheme, str) else None
    return found or modes.HashingScheme.parse(hashing_scheme, "hashing scheme")


def _check_partitions(num_partitions: int) -> int:
    if not isinstance(num_partitions, int) or isinstance(num_partitions, bool):
        raise TypeError(f"num_partitions must be an int, got {type(num_partitions).__name__}")
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    return num_partitions


def _key_text(key: str | bytes) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(key)).decode("ascii")
    raise TypeError(f"message key must be str or bytes, got {type(key).__name__}")


def key_hash(key: str | bytes, hashing_scheme: _SchemeLike = _JAVA) -> int:
    """Hash of a message key under a producer hashing scheme.

    Parameters
    ----------
    key
        The message key; ``bytes`` keys are hashed as their base64 text (Pulsar's ``keyBytes``).
    hashing_scheme
        ``"JavaStringHash"`` or ``"Murmur3_32Hash"``.

    Returns
    -------
    int
        A non-negative 31-bit hash.

    Raises
    ------
    ValueError
        If the scheme is unknown.
    """
    text = _key_text(key)
    if _check_scheme(hashing_scheme) is _JAVA:
        return java_string_hash(text)
    return murmur3_32(text)


def partition_for_key(
    key: str | bytes, num_partitions: int, hashing_scheme: _SchemeLike = _JAVA
) -> int:
    """Partition of a keyed message: ``signSafeMod(hash(key), num_partitions)``.

    Raises
    ------
    ValueError
        If the scheme is unknown or ``num_partitions < 1``.
    """
    return sign_safe_mod(key_hash(key, hashing_scheme), _check_partitions(num_partitions))


def _keys_as_text(keys: KeyArrayLike) -> pa.Array | pa.ChunkedArray:
    """Replace bytes keys by their base64 text, as Pulsar's client stores ``keyBytes``."""
    if isinstance(keys, pa.Array | pa.ChunkedArray):
        typ = keys.type
        if pa.types.is_dictionary(typ):
            keys = keys.cast(typ.value_type)
            typ = keys.type
        if pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_null(typ):
            return keys
        if pa.types.is_string_view(typ):
            return keys.cast(pa.string())
        values: list[Any] = keys.to_pylist()
    else:
        values = keys.tolist() if isinstance(keys, np.ndarray) else list(keys)
    return pa.array([None if v is None else _key_text(v) for v in values], type=pa.string())


def partitions_for_keys(
    keys: KeyArrayLike, num_partitions: int, hashing_scheme: _SchemeLike = _JAVA
) -> npt.NDArray[np.int64]:
    """Vectorised :func:`partition_for_key`.

    Parameters
    ----------
    keys
        Message keys: a pyarrow string array (fast path), a binary array or Python sequence
        (bytes keys are base64-encoded one by one first). Nulls mean "no key".
    num_partitions
        Number of partitions.
    hashing_scheme
        ``"JavaStringHash"`` or ``"Murmur3_32Hash"``.

    Returns
    -------
    numpy.ndarray
        ``int64`` partition per key, ``-1`` where the key is null (the router's keyless rule
        applies; see :meth:`MessageRouter.choose_partitions`).

    Raises
    ------
    ValueError
        If the scheme is unknown or ``num_partitions < 1``.
    """
    _check_partitions(num_partitions)
    scheme = _check_scheme(hashing_scheme)
    text = _keys_as_text(keys)
    if scheme is _JAVA:
        hashes = java_string_hash_array(text, null_key="")
    else:
        hashes = murmur3_32_array(text, null_key=b"")
    partitions = hashes.astype(np.int64) % num_partitions
    if text.null_count:
        partitions[np.asarray(text.is_null().to_numpy(zero_copy_only=False), dtype=bool)] = -1
    return partitions


def keyless_runs(
    count: int, num_partitions: int, *, start: int, offset: int = 0, step: int = 1
) -> npt.NDArray[np.int64]:
    """Round-robin partitions of ``count`` keyless messages written in bulk.

    Pulsar's producer switches partition per batch when batching (a batch stays on one
    partition) and per message without batching. A bulk writer has no clock ticking between
    its batches, so it moves to the next partition after every ``step`` keyless messages:
    ``step`` = the batch's max messages with batching, 1 without.

    Parameters
    ----------
    count
        Keyless messages to route.
    num_partitions
        Partitions of the topic.
    start
        Partition of the first run (the producer's round-robin position).
    offset
        Keyless messages this writer routed before (a run continues across calls).
    step
        Messages per run.

    Returns
    -------
    numpy.ndarray
        ``int64`` partition per message: ``(start + (offset + i) // step) % num_partitions``.
    """
    k = np.arange(offset, offset + count, dtype=np.int64)
    partitions: npt.NDArray[np.int64] = (start + k // max(1, step)) % _check_partitions(
        num_partitions
    )
    return partitions


def route_rows(
    keys: KeyArrayLike | None,
    num_rows: int,
    num_partitions: int,
    hashing_scheme: _SchemeLike,
    keyless: Callable[[int], npt.NDArray[np.int64]],
) -> npt.NDArray[np.int64]:
    """Partition of every row of a bulk write: keyed rows hash, keyless rows ask ``keyless``.

    Parameters
    ----------
    keys
        The rows' keys (nulls: keyless), or None when no row has a key.
    num_rows
        Number of rows.
    num_partitions, hashing_scheme
        As for :func:`partitions_for_keys`.
    keyless
        ``keyless(count)`` → the partitions of the keyless rows, in row order (e.g.
        :func:`keyless_runs` or :meth:`MessageRouter.keyless_partitions`).
    """
    if keys is None:
        parts = np.full(num_rows, -1, np.int64)
    else:
        parts = partitions_for_keys(keys, num_partitions, hashing_scheme)
    free = parts < 0
    count = int(free.sum())
    if count:
        parts[free] = keyless(count)
    return parts


class MessageRouter(ABC):
    """Chooses a partition for each message of one producer.

    Parameters
    ----------
    num_partitions
        Partitions of the topic (at least 1).
    hashing_scheme
        Scheme for keyed messages: ``"JavaStringHash"`` (default) or ``"Murmur3_32Hash"``.
    """

    def __init__(self, num_partitions: int, *, hashing_scheme: _SchemeLike = _JAVA) -> None:
        self.num_partitions = _check_partitions(num_partitions)
        self.hashing_scheme = _check_scheme(hashing_scheme)

    def choose_partition(self, key: str | bytes | None = None) -> int:
        """Partition for one message; keyed messages always go to ``hash(key) % n``.

        Parameters
        ----------
        key
            The message key, or ``None`` for a keyless message.

        Returns
        -------
        int
            A partition index in ``[0, num_partitions)``.
        """
        if key is not None:
            return partition_for_key(key, self.num_partitions, self.hashing_scheme)
        return self._keyless_partition()

    @abstractmethod
    def _keyless_partition(self) -> int: ...

    def choose_partitions(self, keys: KeyArrayLike) -> npt.NDArray[np.int64]:
        """Vectorised :meth:`choose_partition` for a batch of messages, in order.

        Keyed messages hash; keyless ones (nulls) take the router's keyless rule as if the
        messages were sent one after the other (see the subclass for clock handling).
        """
        partitions = partitions_for_keys(keys, self.num_partitions, self.hashing_scheme)
        keyless = np.flatnonzero(partitions < 0)
        if len(keyless):
            partitions[keyless] = self._keyless_partitions(len(keyless))
        return partitions

    def _keyless_partitions(self, count: int) -> npt.NDArray[np.int64]:
        return np.array([self._keyless_partition() for _ in range(count)], dtype=np.int64)

    def keyless_partitions(self, count: int, batch_size: int = 1) -> npt.NDArray[np.int64]:
        """Partitions of ``count`` keyless messages written in bulk, ``batch_size`` per batch.

        The default sends them as one by one; round robin overrides it (see there).
        """
        return self._keyless_partitions(count)


class RoundRobinPartitionRouter(MessageRouter):
    """Pulsar's ``RoundRobinPartitionMessageRouterImpl`` (routing mode ``RoundRobinPartition``).

    Parameters
    ----------
    num_partitions
        Partitions of the topic.
    start
        The producer's start partition (Pulsar draws it at random per producer; pass
        ``random.randrange(num_partitions)`` to do the same).
    batching_enabled
        With batching, keyless messages switch partition every ``partition_switch_ms`` of the
        clock; without, every message moves to the next partition.
    partition_switch_ms
        Length of a round-robin time slot; values below 1 are raised to 1 as Pulsar does.
    clock
        Callable returning milliseconds; defaults to :func:`wall_clock_ms`.
    hashing_scheme
        Scheme for keyed messages.

    Raises
    ------
    ValueError
        If ``num_partitions < 1`` or the scheme is unknown.
    """

    def __init__(
        self,
        num_partitions: int,
        start: int = 0,
        batching_enabled: bool = True,
        partition_switch_ms: int = DEFAULT_PARTITION_SWITCH_MS,
        clock: Clock | None = None,
        *,
        hashing_scheme: _SchemeLike = _JAVA,
    ) -> None:
        super().__init__(num_partitions, hashing_scheme=hashing_scheme)
        self.start = int(start)
        self.batching_enabled = bool(batching_enabled)
        self.partition_switch_ms = max(1, int(partition_switch_ms))
        self._clock: Clock = clock if clock is not None else wall_clock_ms
        self._counter = self.start

    def _keyless_partition(self) -> int:
        if self.batching_enabled:
            now = self._clock()
            return sign_safe_mod(now // self.partition_switch_ms + self.start, self.num_partitions)
        partition = sign_safe_mod(_as_java_int(self._counter), self.num_partitions)
        self._counter += 1
        return partition

    def _keyless_partitions(self, count: int) -> npt.NDArray[np.int64]:
        """With batching the clock is read once for the whole call: a batch is one instant."""
        if self.batching_enabled:
            return np.full(count, self._keyless_partition(), dtype=np.int64)
        first = self._counter
        self._counter += count
        counters = np.arange(first, first + count, dtype=np.int64)
        counters = (counters + _JAVA_INT_SPAN // 2) % _JAVA_INT_SPAN - _JAVA_INT_SPAN // 2
        partitions: npt.NDArray[np.int64] = counters % self.num_partitions
        return partitions

    def keyless_partitions(self, count: int, batch_size: int = 1) -> npt.NDArray[np.int64]:
        """Bulk keyless messages: with batching, runs of ``batch_size`` from the clock's
        partition (:func:`keyless_runs`, one partition per batch); without, the counter's next
        ``count`` partitions (one per message)."""
        if self.batching_enabled:
            return keyless_runs(
                count, self.num_partitions, start=self._keyless_partition(), step=batch_size
            )
        return self._keyless_partitions(count)


class SinglePartitionRouter(MessageRouter):
    """Pulsar's ``SinglePartitionMessageRouterImpl`` (routing mode ``SinglePartition``).

    Parameters
    ----------
    num_partitions
        Partitions of the topic.
    partition
        Partition for keyless messages; by default one chosen at random, once.
    hashing_scheme
        Scheme for keyed messages.
    rng
        Random source for the default partition (for reproducible tests).

    Raises
    ------
    ValueError
        If ``partition`` is outside ``[0, num_partitions)``.
    """

    def __init__(
        self,
        num_partitions: int,
        partition: int | None = None,
        *,
        hashing_scheme: _SchemeLike = _JAVA,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(num_partitions, hashing_scheme=hashing_scheme)
        if partition is None:
            partition = (rng or random.Random()).randrange(num_partitions)
        if not 0 <= partition < num_partitions:
            raise ValueError(f"partition {partition} is outside [0, {num_partitions - 1}]")
        self.partition = partition

    def _keyless_partition(self) -> int:
        return self.partition


class CustomPartitionRouter(MessageRouter):
    """Routing mode ``CustomPartition``: a user function picks the partition of every message.

    Parameters
    ----------
    fn
        ``fn(key, num_partitions) -> int``, called for keyed and keyless (``key=None``)
        messages alike; it owns the whole decision, as Pulsar's custom ``MessageRouter`` does.
    num_partitions
        Partitions of the topic.

    Raises
    ------
    TypeError
        If ``fn`` is not callable.
    """

    def __init__(self, fn: Callable[[str | bytes | None, int], int], num_partitions: int) -> None:
        super().__init__(num_partitions)
        if not callable(fn):
            raise TypeError("CustomPartitionRouter needs a callable (key, num_partitions) -> int")
        self.fn = fn

    def choose_partition(self, key: str | bytes | None = None) -> int:
        """Ask the user function, then check its answer.

        Raises
        ------
        ValueError
            If the function returns something other than an int in ``[0, num_partitions)``
            (Pulsar fails the send with "Illegal partition index chosen by the message routing
            policy").
        """
        partition = self.fn(key, self.num_partitions)
        if (
            not isinstance(partition, int | np.integer)
            or isinstance(partition, bool)
            or not 0 <= partition < self.num_partitions
        ):
            raise ValueError(
                f"Illegal partition index chosen by the message routing policy: {partition!r} "
                f"(topic has {self.num_partitions} partitions)"
            )
        return int(partition)

    def _keyless_partition(self) -> int:
        return self.choose_partition(None)

    def choose_partitions(self, keys: KeyArrayLike) -> npt.NDArray[np.int64]:
        if isinstance(keys, pa.Array | pa.ChunkedArray):
            values: list[Any] = keys.to_pylist()
        else:
            values = keys.tolist() if isinstance(keys, np.ndarray) else list(keys)
        return np.array([self.choose_partition(k) for k in values], dtype=np.int64)


def make_router(
    routing_mode: str | modes.PartitionsRoutingMode,
    num_partitions: int,
    *,
    hashing_scheme: _SchemeLike = _JAVA,
    batching_enabled: bool = True,
    partition_switch_ms: int = DEFAULT_PARTITION_SWITCH_MS,
    start: int | None = None,
    partition: int | None = None,
    custom: Callable[[str | bytes | None, int], int] | None = None,
    clock: Clock | None = None,
    rng: random.Random | None = None,
) -> MessageRouter:
    """Build the router of a producer from Pulsar's routing-mode name.

    Parameters
    ----------
    routing_mode
        ``"RoundRobinPartition"``, ``"SinglePartition"`` or ``"CustomPartition"``, or
        pulsar-client's spelling or member
        (:class:`filepulsar.dispatch.modes.PartitionsRoutingMode`).
    start
        Round-robin start partition; ``None`` draws one at random as Pulsar does.
    partition
        Single-partition choice; ``None`` draws one at random.
    custom
        The function for ``CustomPartition``.

    Raises
    ------
    ValueError
        If the mode is unknown, or ``CustomPartition`` has no ``custom`` function.
    """
    routing_mode = _ROUTING.parse(routing_mode, "routing mode")
    if routing_mode is _ROUTING.RoundRobinDistribution:
        if start is None:
            start = (rng or random.Random()).randrange(_check_partitions(num_partitions))
        return RoundRobinPartitionRouter(
            num_partitions,
            start,
            batching_enabled,
            partition_switch_ms,
            clock,
            hashing_scheme=hashing_scheme,
        )
    if routing_mode is _ROUTING.UseSinglePartition:
        return SinglePartitionRouter(
            num_partitions, partition, hashing_scheme=hashing_scheme, rng=rng
        )
    if routing_mode is _ROUTING.CustomPartition:
        if custom is None:
            raise ValueError("routing mode CustomPartition needs custom=fn(key, num_partitions)")
        return CustomPartitionRouter(custom, num_partitions)
    raise AssertionError(routing_mode)  # parse_mode returned a member of the set
