"""What every Key_Shared consumer selector shares.

:class:`StickyKeyConsumerSelector` (the scalar and vectorised selection paths, slots, the state
round-trip), :class:`ConsumerAssignError`, the hash-space defaults and the checks of names and
saved state that the three selectors of :mod:`filepulsar.dispatch.selectors` build on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import numpy as np
import numpy.typing as npt

from filepulsar.dispatch.errors import ConsumerAssignError
from filepulsar.dispatch.hash_arrays import KeyArrayLike, murmur3_32_array, slot_array
from filepulsar.dispatch.hashing import NONE_KEY, hash_slot, murmur3_32

__all__ = [
    "DEFAULT_CONSISTENT_HASHING_POINTS",
    "DEFAULT_RANGE_SIZE",
    "ConsumerAssignError",
    "StickyKeyConsumerSelector",
]

DEFAULT_RANGE_SIZE = 65536
"""Size of the Key_Shared hash space (``2 << 15``)."""

DEFAULT_CONSISTENT_HASHING_POINTS = 100
"""Pulsar's ``subscriptionKeySharedConsistentHashingReplicaPoints`` default."""

STATE_VERSION = 1
"""The version every selector writes in its ``to_dict`` state and reads back."""
_S = TypeVar("_S", bound="StickyKeyConsumerSelector")


class StickyKeyConsumerSelector(ABC):
    """What every Key_Shared selector offers.

    ``hash_range`` is the selector's inclusive hash range ``(start, end)``; the slot of a key is
    ``murmur3_32(key) % (end - start + 1) + start`` with 0 turned into 1
    (:func:`filepulsar.dispatch.hashing.hash_slot`). :meth:`select_slot` and :meth:`select_slots`
    accept any slot in ``[0, slot_limit)``, which covers every slot the rule can produce.
    """

    kind: ClassVar[str]
    hash_range: tuple[int, int]

    def __init__(self) -> None:
        self._table: npt.NDArray[np.int32] | None = None

    # -- membership --------------------------------------------------------------------------

    @abstractmethod
    def add_consumer(
        self, name: str, ranges: Sequence[tuple[int, int]] | None = None
    ) -> int | None:
        """Add a consumer; see the subclass for the rule and what is returned."""

    @abstractmethod
    def remove_consumer(self, name: str) -> bool:
        """Remove a consumer; return whether it was present."""

    @abstractmethod
    def consumers(self) -> list[str]:
        """Live consumers in the order they were added.

        Vectorised results are indices into this list (``-1`` for "no consumer").
        """

    @abstractmethod
    def ranges(self) -> dict[str, list[tuple[int, int]]]:
        """Inclusive hash ranges per consumer, as Pulsar's stats report ``keyHashRangeArrays``."""

    # -- selection ---------------------------------------------------------------------------

    @property
    def slot_limit(self) -> int:
        """One past the highest slot :meth:`select_slot` accepts."""
        return self.hash_range[1] + 1

    def slot(self, key: str | bytes) -> int:
        """The slot of a sticky key in this selector's hash range.

        Parameters
        ----------
        key
            The sticky key; ``str`` is hashed over its UTF-8 bytes.

        Returns
        -------
        int
            ``murmur3_32(key) % (end - start + 1) + start``, 0 replaced by 1.
        """
        return hash_slot(murmur3_32(key), *self.hash_range)

    def select(self, key: str | bytes) -> str | None:
        """The consumer that receives messages with this sticky key.

        Parameters
        ----------
        key
            The sticky key (see :func:`filepulsar.dispatch.hashing.sticky_key`).

        Returns
        -------
        str or None
            The consumer's name, or ``None`` when no consumer owns the key's slot (no consumers,
            or a sticky selector whose ranges leave the slot uncovered: the message waits).
        """
        return self.select_slot(self.slot(key))

    def select_slot(self, slot: int) -> str | None:
        """The consumer that owns ``slot``.

        Parameters
        ----------
        slot
            A slot in ``[0, slot_limit)``, e.g. from :meth:`slot`.

        Returns
        -------
        str or None
            The owner's name, or ``None`` when nobody owns the slot.

        Raises
        ------
        ValueError
            If ``slot`` is outside ``[0, slot_limit)``.
        """
        if not 0 <= slot < self.slot_limit:
            raise ValueError(f"slot {slot} is outside [0, {self.slot_limit - 1}]")
        return self._select_slot(slot)

    @abstractmethod
    def _select_slot(self, slot: int) -> str | None: ...

    @abstractmethod
    def _owner_indices(self, slots: npt.NDArray[np.int64]) -> npt.NDArray[np.int32]:
        """Index into :meth:`consumers` of the owner of every slot (``-1`` for nobody)."""

    def _lookup_table(self) -> npt.NDArray[np.int32]:
        if self._table is None:
            self._table = self._owner_indices(np.arange(self.slot_limit, dtype=np.int64))
        return self._table

    def owner_table(self) -> npt.NDArray[np.int32]:
        """The owner of every slot in ``[0, slot_limit)``: ``int32`` indices into
        :meth:`consumers` (``-1`` for nobody), what :meth:`select_slots` gathers from,
        computed once per membership change. Read-only: it is this selector's own."""
        return self._lookup_table()

    def _changed(self) -> None:
        self._table = None

    def select_slots(self, slots: npt.ArrayLike, *, as_names: bool = False) -> npt.NDArray[Any]:
        """Vectorised :meth:`select_slot`.

        The owners of all slots are computed once per membership change (``numpy.searchsorted``
        over the sorted bounds or points) into a table, so a batch costs one gather.

        Parameters
        ----------
        slots
            Integer slots in ``[0, slot_limit)``.
        as_names
            Return consumer names (``None`` for nobody) instead of indices.

        Returns
        -------
        numpy.ndarray
            ``int32`` indices into :meth:`consumers` with ``-1`` for nobody, or an object array of
            names when ``as_names`` is true.

        Raises
        ------
        ValueError
            If a slot is out of range.
        TypeError
            If ``slots`` is not an integer array.
        """
        arr = np.asarray(slots)
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"slots must be integers, got dtype {arr.dtype}")
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= self.slot_limit):
            raise ValueError(f"slots must lie in [0, {self.slot_limit - 1}]")
        table = self._lookup_table()
        indices = (
            table[arr.astype(np.intp, copy=False)]
            if arr.size
            else np.zeros(arr.shape, dtype=np.int32)
        )
        if as_names:
            return self.names_of(indices)
        return indices

    def slots(
        self, keys: KeyArrayLike, *, null_key: bytes | None = NONE_KEY
    ) -> npt.NDArray[np.int64]:
        """Vectorised :meth:`slot` (nulls hash as ``null_key``, by default ``b"NONE_KEY"``)."""
        return slot_array(murmur3_32_array(keys, null_key=null_key), *self.hash_range)

    def select_keys(
        self,
        keys: KeyArrayLike,
        *,
        null_key: bytes | None = NONE_KEY,
        as_names: bool = False,
    ) -> npt.NDArray[Any]:
        """Vectorised :meth:`select`: sticky keys to consumer indices (or names).

        Parameters
        ----------
        keys
            Sticky keys, as accepted by :func:`filepulsar.dispatch.hashing.murmur3_32_array`.
        null_key
            Key used for null elements (``None`` refuses nulls).
        as_names
            Return names instead of indices into :meth:`consumers`.
        """
        return self.select_slots(self.slots(keys, null_key=null_key), as_names=as_names)

    def names_of(self, indices: npt.NDArray[np.integer[Any]]) -> npt.NDArray[np.object_]:
        """Map indices from :meth:`select_slots` to names (``-1`` becomes ``None``)."""
        lookup = np.array([*self.consumers(), None], dtype=object)
        return lookup[np.asarray(indices)]

    # -- state -------------------------------------------------------------------------------

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible state; :meth:`from_dict` rebuilds an identical selector."""

    @classmethod
    def from_dict(cls: type[_S], state: Mapping[str, Any]) -> _S:
        """Rebuild a selector of this class from its :meth:`to_dict` output.

        Raises
        ------
        ValueError
            If ``state`` is not a valid state of this selector kind and version.
        """
        _check_state(state, cls.kind)
        try:
            return cls._restore(state)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"inconsistent {cls.kind} selector state: {e}") from e

    @classmethod
    @abstractmethod
    def _restore(cls: type[_S], state: Mapping[str, Any]) -> _S: ...

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StickyKeyConsumerSelector):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.ranges()!r})"


def check_consumer_name(name: object) -> str:
    """``name`` when it is a string (a consumer name), else :class:`TypeError`."""
    if not isinstance(name, str):
        raise TypeError(f"consumer name must be str, got {type(name).__name__}")
    return name


def check_no_ranges(kind: str, ranges: object) -> None:
    """Raise :class:`ConsumerAssignError` when fixed ``ranges`` are given to a ``kind``
    selector that assigns ranges itself (every selector but the sticky one)."""
    if ranges is not None:
        raise ConsumerAssignError(
            f"{kind} selector assigns ranges itself; fixed ranges are only for the sticky selector"
        )


def _check_state(state: Mapping[str, Any], kind: str) -> None:
    if not isinstance(state, Mapping):
        raise ValueError(f"selector state must be a mapping, got {type(state).__name__}")
    if state.get("kind") != kind:
        raise ValueError(f"selector state has kind {state.get('kind')!r}, expected {kind!r}")
    if state.get("version") != STATE_VERSION:
        raise ValueError(
            f"unsupported {kind} selector state version {state.get('version')!r} "
            f"(this code reads version {STATE_VERSION})"
        )
