"""Key_Shared consumer selectors: which consumer receives a message key.

A selector turns a message's sticky key (:func:`dispatch.hashing.sticky_key`) into a *slot* of
its hash range and the slot into a consumer. Pulsar has three selectors and this module has each
with Pulsar's exact assignment rules:

* :class:`AutoSplitHashRangeSelector` -- ``AUTO_SPLIT`` with
  ``subscriptionKeySharedUseConsistentHashing=false``: one contiguous range per consumer, split in
  halves as consumers join.
* :class:`ConsistentHashingSelector` -- ``AUTO_SPLIT`` with consistent hashing (Pulsar's
  default): 100 points per consumer on a ring of slots.
* :class:`StickyHashRangeSelector` -- ``STICKY``: every consumer brings its own fixed ranges.

Consumers are identified by name. Every selector offers the scalar path (:meth:`select`,
:meth:`select_slot`) and a vectorised one (:meth:`select_slots`, :meth:`select_keys`) that answers
with indices into :meth:`consumers`. State round-trips through :meth:`to_dict` /
:func:`selector_from_dict` as plain JSON-compatible data, so a stateful Spark operator or a
subscription file can keep it; a restored selector behaves exactly like the original.
"""

from __future__ import annotations

import bisect
import itertools
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import numpy as np
import numpy.typing as npt

from filepulsar.dispatch.hash_arrays import KeyArrayLike, murmur3_32_array, slot_array
from filepulsar.dispatch.hashing import (
    NONE_KEY,
    hash_slot,
    murmur3_32,
    sticky_key,
)
from filepulsar.dispatch.modes import KeySharedMode

__all__ = [
    "DEFAULT_CONSISTENT_HASHING_POINTS",
    "DEFAULT_RANGE_SIZE",
    "AutoSplitHashRangeSelector",
    "ConsistentHashingSelector",
    "ConsumerAssignError",
    "StickyHashRangeSelector",
    "StickyKeyConsumerSelector",
    "selector_for_mode",
    "selector_from_dict",
    "sticky_key",
]

DEFAULT_RANGE_SIZE = 65536
"""Size of the Key_Shared hash space (``2 << 15``)."""

DEFAULT_CONSISTENT_HASHING_POINTS = 100
"""Pulsar's ``subscriptionKeySharedConsistentHashingReplicaPoints`` default."""

_STATE_VERSION = 1
_S = TypeVar("_S", bound="StickyKeyConsumerSelector")
_KEY_SEPARATOR = "\0"


class ConsumerAssignError(ValueError):
    """A consumer cannot be added to (or removed from) a selector as asked.

    Pulsar's broker answers the same situations with ``ConsumerAssignException`` and refuses the
    subscription; here the selector is left unchanged.
    """


class StickyKeyConsumerSelector(ABC):
    """What every Key_Shared selector offers.

    ``hash_range`` is the selector's inclusive hash range ``(start, end)``; the slot of a key is
    ``murmur3_32(key) % (end - start + 1) + start`` with 0 turned into 1
    (:func:`dispatch.hashing.hash_slot`). :meth:`select_slot` and :meth:`select_slots` accept
    any slot in ``[0, slot_limit)``, which covers every slot the rule can produce.
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
            The sticky key (see :func:`dispatch.hashing.sticky_key`).

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
            Sticky keys, as accepted by :func:`dispatch.hashing.murmur3_32_array`.
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


def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"consumer name must be str, got {type(name).__name__}")
    return name


def _check_no_ranges(kind: str, ranges: object) -> None:
    if ranges is not None:
        raise ConsumerAssignError(
            f"{kind} selector assigns ranges itself; fixed ranges are only for the sticky selector"
        )


# ============================================================================================
# Auto-split hash ranges
# ============================================================================================


class AutoSplitHashRangeSelector(StickyKeyConsumerSelector):
    """Pulsar's ``HashRangeAutoSplitStickyKeyConsumerSelector``.

    State is a sorted map *upper bound -> consumer* over ``(0, range_size]``; a consumer with
    bound ``b`` whose lower neighbour's bound is ``l`` (0 for the lowest) owns slots ``(l, b]``.

    * The first consumer owns ``range_size``.
    * A joining consumer splits the biggest range, the lowest one on a tie. For ``(l, b]`` the
      split point is ``b - ((b - l) >> 1)``; the new consumer takes ``(l, split]`` and the owner
      keeps ``(split, b]``. A biggest range of one slot cannot be split.
    * A leaving consumer's range merges into its right neighbour. If it owned the top bound and
      others remain, the consumer of the next-lower bound moves up to ``range_size``.
    * A slot goes to the first bound ``>= slot``.

    Parameters
    ----------
    range_size
        Size of the hash space: a power of two, at least 2. Slots are ``murmur % range_size``
        with 0 turned into 1.

    Raises
    ------
    ValueError
        If ``range_size`` is not a power of two of at least 2.
    """

    kind = "auto_split"

    def __init__(self, range_size: int = DEFAULT_RANGE_SIZE) -> None:
        super().__init__()
        if not isinstance(range_size, int) or range_size < 2 or range_size & (range_size - 1):
            raise ValueError(f"range_size must be a power of two >= 2, got {range_size!r}")
        self.range_size = range_size
        self.hash_range = (0, range_size - 1)
        self._bounds: list[int] = []
        self._owners: list[str] = []
        self._added: list[str] = []

    def add_consumer(self, name: str, ranges: Sequence[tuple[int, int]] | None = None) -> None:
        """Add a consumer by splitting the biggest range.

        Parameters
        ----------
        name
            Unique consumer name.
        ranges
            Must be ``None``: this selector assigns ranges itself.

        Raises
        ------
        ConsumerAssignError
            If the name is already present, ``ranges`` is given, or every range is down to one
            slot.
        """
        _check_name(name)
        _check_no_ranges(self.kind, ranges)
        if name in self._added:
            raise ConsumerAssignError(f"consumer {name!r} is already in the auto-split selector")
        if not self._bounds:
            self._bounds.append(self.range_size)
            self._owners.append(name)
        else:
            biggest, size, lower = 0, 0, 0
            previous = 0
            for i, bound in enumerate(self._bounds):
                if bound - previous > size:
                    biggest, size, lower = i, bound - previous, previous
                previous = bound
            if size <= 1:
                raise ConsumerAssignError(
                    f"cannot add consumer {name!r}: all {len(self._bounds)} ranges hold a single "
                    "slot, none can be split"
                )
            upper = self._bounds[biggest]
            split = upper - ((upper - lower) >> 1)
            self._bounds.insert(biggest, split)
            self._owners.insert(biggest, name)
        self._added.append(name)
        self._changed()

    def remove_consumer(self, name: str) -> bool:
        """Remove a consumer, merging its range into its right neighbour (or, at the top, left).

        Returns
        -------
        bool
            ``False`` when the consumer was not present (nothing changes).
        """
        if name not in self._added:
            return False
        i = self._owners.index(name)
        if self._bounds[i] == self.range_size and len(self._bounds) > 1:
            self._owners[i] = self._owners[i - 1]
            del self._bounds[i - 1]
            del self._owners[i - 1]
        else:
            del self._bounds[i]
            del self._owners[i]
        self._added.remove(name)
        self._changed()
        return True

    def consumers(self) -> list[str]:
        return list(self._added)

    def bounds(self) -> list[tuple[int, str]]:
        """The sorted *upper bound -> consumer* map as ``(bound, name)`` pairs."""
        return list(zip(self._bounds, self._owners))

    def ranges(self) -> dict[str, list[tuple[int, int]]]:
        """Pulsar's reported ranges: ``[0, b1], [b1 + 1, b2], ..., [b_k-1 + 1, range_size]``.

        As in Pulsar the first range starts at 0 and the last ends at ``range_size`` although
        the slot rule only produces ``1 .. range_size - 1``.
        """
        result: dict[str, list[tuple[int, int]]] = {}
        start = 0
        for bound, owner in zip(self._bounds, self._owners):
            result.setdefault(owner, []).append((start, bound))
            start = bound + 1
        return result

    def _select_slot(self, slot: int) -> str | None:
        if not self._bounds:
            return None
        return self._owners[bisect.bisect_left(self._bounds, slot)]

    def _owner_indices(self, slots: npt.NDArray[np.int64]) -> npt.NDArray[np.int32]:
        if not self._bounds:
            return np.full(slots.shape, -1, dtype=np.int32)
        position = {name: i for i, name in enumerate(self._added)}
        owner_index = np.array([position[o] for o in self._owners], dtype=np.int32)
        bounds = np.array(self._bounds, dtype=np.int64)
        result: npt.NDArray[np.int32] = owner_index[np.searchsorted(bounds, slots, side="left")]
        return result

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "version": _STATE_VERSION,
            "range_size": self.range_size,
            "consumers": list(self._added),
            "bounds": [[b, o] for b, o in zip(self._bounds, self._owners)],
        }

    @classmethod
    def _restore(cls, state: Mapping[str, Any]) -> AutoSplitHashRangeSelector:
        selector = cls(int(state["range_size"]))
        consumers = [_check_name(n) for n in state["consumers"]]
        bounds = [(int(b), _check_name(o)) for b, o in state["bounds"]]
        values = [b for b, _ in bounds]
        owners = [o for _, o in bounds]
        if values != sorted(set(values)) or (
            values and (values[-1] != selector.range_size or values[0] < 1)
        ):
            raise ValueError(f"bounds {values} must rise strictly to {selector.range_size}")
        if sorted(owners) != sorted(consumers) or len(set(consumers)) != len(consumers):
            raise ValueError(f"bound owners {owners} do not match consumers {consumers}")
        selector._bounds, selector._owners, selector._added = values, owners, consumers
        return selector


# ============================================================================================
# Consistent hashing
# ============================================================================================


class ConsistentHashingSelector(StickyKeyConsumerSelector):
    """Pulsar's ``ConsistentHashingStickyKeyConsumerSelector`` (the ``AUTO_SPLIT`` default).

    * Hash range ``[1, 65535]``: the slot of a key is ``murmur % 65535 + 1``.
    * Point ``i`` (``0 <= i < points_per_consumer``) of a consumer is the slot of the UTF-8 string
      ``name + "\\0" + name_index + "\\0" + i``. ``name_index`` is the smallest index no other
      live consumer of the same name holds (0 for a unique name), freed when the consumer leaves.
    * When points collide the first consumer added keeps the point; later ones queue behind it
      and take over in order as it leaves.
    * A slot goes to the first point ``>= slot``, wrapping to the lowest point.

    Consumers with the same name are separate instances told apart by their name index; they
    share a name in :meth:`consumers` and :meth:`ranges`.

    Parameters
    ----------
    points_per_consumer
        Points on the ring per consumer (Pulsar's default 100).

    Raises
    ------
    ValueError
        If ``points_per_consumer`` is not a positive integer.
    """

    kind = "consistent_hashing"
    RANGE_END = DEFAULT_RANGE_SIZE - 1

    def __init__(self, points_per_consumer: int = DEFAULT_CONSISTENT_HASHING_POINTS) -> None:
        super().__init__()
        if not isinstance(points_per_consumer, int) or points_per_consumer < 1:
            raise ValueError(f"points_per_consumer must be >= 1, got {points_per_consumer!r}")
        self.points_per_consumer = points_per_consumer
        self.hash_range = (1, self.RANGE_END)
        self._instances: list[tuple[str, int]] = []
        self._ring: dict[int, list[tuple[str, int]]] = {}
        self._sorted_points: list[int] = []

    def point_slots(self, name: str, name_index: int) -> list[int]:
        """Ring points (slots) of the consumer ``(name, name_index)``, for ``i = 0, 1, ...``."""
        prefix = f"{name}{_KEY_SEPARATOR}{name_index}{_KEY_SEPARATOR}"
        return [
            hash_slot(murmur3_32(f"{prefix}{i}"), *self.hash_range)
            for i in range(self.points_per_consumer)
        ]

    def _free_name_index(self, name: str) -> int:
        used = {idx for n, idx in self._instances if n == name}
        index = 0
        while index in used:
            index += 1
        return index

    def add_consumer(
        self,
        name: str,
        ranges: Sequence[tuple[int, int]] | None = None,
        *,
        name_index: int | None = None,
    ) -> int:
        """Add a consumer instance: its points join the ring (behind earlier ones on collision).

        Parameters
        ----------
        name
            Consumer name; several live consumers may share it.
        ranges
            Must be ``None``: points are derived from the name.
        name_index
            Force the name index (used when restoring state); by default the smallest free one.

        Returns
        -------
        int
            The instance's name index; pass it to :meth:`remove_consumer` when names repeat.

        Raises
        ------
        ConsumerAssignError
            If ``ranges`` is given or the forced ``name_index`` is taken or negative.
        """
        _check_name(name)
        _check_no_ranges(self.kind, ranges)
        if name_index is None:
            name_index = self._free_name_index(name)
        elif name_index < 0 or (name, name_index) in self._instances:
            raise ConsumerAssignError(
                f"name index {name_index} of consumer {name!r} is negative or already in use"
            )
        instance = (name, name_index)
        for point in self.point_slots(name, name_index):
            queue = self._ring.get(point)
            if queue is None:
                self._ring[point] = [instance]
                bisect.insort(self._sorted_points, point)
            else:
                queue.append(instance)
        self._instances.append(instance)
        self._changed()
        return name_index

    def remove_consumer(self, name: str, *, name_index: int | None = None) -> bool:
        """Remove a consumer instance and its points; queued consumers take over its points.

        Parameters
        ----------
        name
            Consumer name.
        name_index
            Which instance, when several live consumers share ``name``.

        Returns
        -------
        bool
            ``False`` when no such consumer is present (nothing changes).

        Raises
        ------
        ConsumerAssignError
            If ``name_index`` is omitted while several instances share ``name``.
        """
        candidates = [inst for inst in self._instances if inst[0] == name]
        if name_index is not None:
            candidates = [inst for inst in candidates if inst[1] == name_index]
        if not candidates:
            return False
        if len(candidates) > 1:
            raise ConsumerAssignError(
                f"{len(candidates)} consumers are named {name!r} (name indexes "
                f"{sorted(i for _, i in candidates)}); pass name_index= to choose one"
            )
        instance = candidates[0]
        for point in set(self.point_slots(*instance)):
            queue = [inst for inst in self._ring[point] if inst != instance]
            if queue:
                self._ring[point] = queue
            else:
                del self._ring[point]
                del self._sorted_points[bisect.bisect_left(self._sorted_points, point)]
        self._instances.remove(instance)
        self._changed()
        return True

    def consumers(self) -> list[str]:
        return [name for name, _ in self._instances]

    def instances(self) -> list[tuple[str, int]]:
        """Live consumers as ``(name, name_index)`` in the order they were added."""
        return list(self._instances)

    def ring(self) -> list[tuple[int, list[tuple[str, int]]]]:
        """Sorted ring points with their queues (the first instance is the selected one)."""
        return [(p, list(self._ring[p])) for p in self._sorted_points]

    def _selected_instance(self, slot: int) -> tuple[str, int] | None:
        if not self._sorted_points:
            return None
        i = bisect.bisect_left(self._sorted_points, slot)
        point = self._sorted_points[i if i < len(self._sorted_points) else 0]
        return self._ring[point][0]

    def select_slot_instance(self, slot: int) -> tuple[str, int] | None:
        """Like :meth:`select_slot` but tells same-named consumers apart."""
        return self._selected_instance(slot)

    def select_instance(self, key: str | bytes) -> tuple[str, int] | None:
        """Like :meth:`select` but tells same-named consumers apart: ``(name, name_index)``."""
        return self._selected_instance(self.slot(key))

    def _select_slot(self, slot: int) -> str | None:
        instance = self._selected_instance(slot)
        return None if instance is None else instance[0]

    def _owner_indices(self, slots: npt.NDArray[np.int64]) -> npt.NDArray[np.int32]:
        if not self._sorted_points:
            return np.full(slots.shape, -1, dtype=np.int32)
        position = {inst: i for i, inst in enumerate(self._instances)}
        selected = np.array(
            [position[self._ring[p][0]] for p in self._sorted_points], dtype=np.int32
        )
        points = np.array(self._sorted_points, dtype=np.int64)
        i = np.searchsorted(points, slots, side="left")
        i[i == len(points)] = 0
        result: npt.NDArray[np.int32] = selected[i]
        return result

    def ranges(self) -> dict[str, list[tuple[int, int]]]:
        """Ranges as Pulsar 4.x reports them for consistent hashing.

        Walking the points upwards from slot 1, point ``p`` contributes ``[previous + 1, p]`` to
        its selected consumer, joined with the previous range when the same instance selected it;
        ``[last + 1, 65535]`` wraps to the lowest point's consumer. Ranges of same-named
        instances are listed together under the name, sorted.
        """
        assignments: list[tuple[int, int, tuple[str, int]]] = []
        start = self.hash_range[0]
        for point in self._sorted_points:
            owner = self._ring[point][0]
            if assignments and assignments[-1][2] == owner:
                assignments[-1] = (assignments[-1][0], point, owner)
            else:
                assignments.append((start, point, owner))
            start = point + 1
        if self._sorted_points and start <= self.hash_range[1]:
            first_owner = self._ring[self._sorted_points[0]][0]
            if assignments[-1][2] == first_owner:
                assignments[-1] = (assignments[-1][0], self.hash_range[1], first_owner)
            else:
                assignments.append((start, self.hash_range[1], first_owner))
        result: dict[str, list[tuple[int, int]]] = {}
        for lo, hi, (name, _) in assignments:
            result.setdefault(name, []).append((lo, hi))
        return {name: sorted(r) for name, r in result.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "version": _STATE_VERSION,
            "points_per_consumer": self.points_per_consumer,
            "consumers": [[name, idx] for name, idx in self._instances],
        }

    @classmethod
    def _restore(cls, state: Mapping[str, Any]) -> ConsistentHashingSelector:
        # Re-adding the live instances in their original order with their name indexes
        # recreates the ring exactly, including the order of every collision queue.
        selector = cls(int(state["points_per_consumer"]))
        for name, index in state["consumers"]:
            selector.add_consumer(_check_name(name), name_index=int(index))
        return selector


# ============================================================================================
# Sticky (exclusive, user-given ranges)
# ============================================================================================


class StickyHashRangeSelector(StickyKeyConsumerSelector):
    """Pulsar's ``HashRangeExclusiveStickyKeyConsumerSelector`` (``STICKY`` mode).

    Every consumer brings inclusive ranges within ``[0, range_size - 1]``. A slot belongs to the
    consumer whose range contains it; an uncovered slot belongs to nobody and its messages wait.

    Parameters
    ----------
    range_size
        Size of the hash space (at least 2). Slots are ``murmur % range_size``, 0 turned into 1.

    Raises
    ------
    ValueError
        If ``range_size`` is smaller than 2.
    """

    kind = "sticky"

    def __init__(self, range_size: int = DEFAULT_RANGE_SIZE) -> None:
        super().__init__()
        if not isinstance(range_size, int) or range_size < 2:
            raise ValueError(f"range_size must be an integer >= 2, got {range_size!r}")
        self.range_size = range_size
        self.hash_range = (0, range_size - 1)
        self._consumer_ranges: dict[str, list[tuple[int, int]]] = {}
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._range_owner: list[str] = []

    def add_consumer(self, name: str, ranges: Sequence[tuple[int, int]] | None = None) -> None:
        """Add a consumer with its fixed ranges.

        Parameters
        ----------
        name
            Unique consumer name.
        ranges
            Inclusive ``(start, end)`` pairs within ``[0, range_size - 1]``.

        Raises
        ------
        ConsumerAssignError
            If the name is present, ``ranges`` is missing or empty, a range has ``start > end``
            or lies outside the hash space, two of the consumer's own ranges overlap, or a range
            overlaps another consumer's (``max(s1, s2) <= min(e1, e2)``).
        """
        _check_name(name)
        if name in self._consumer_ranges:
            raise ConsumerAssignError(f"consumer {name!r} is already in the sticky selector")
        if not ranges:
            raise ConsumerAssignError(
                f"sticky consumer {name!r} needs at least one hash range in "
                f"[0, {self.range_size - 1}]"
            )
        checked: list[tuple[int, int]] = []
        for item in ranges:
            start, end = (int(v) for v in item)
            if start > end:
                raise ConsumerAssignError(
                    f"consumer {name!r}: hash range [{start}, {end}] has start > end"
                )
            if start < 0 or end > self.range_size - 1:
                raise ConsumerAssignError(
                    f"consumer {name!r}: hash range [{start}, {end}] is outside "
                    f"[0, {self.range_size - 1}]"
                )
            checked.append((start, end))
        checked.sort()
        for (s1, e1), (s2, e2) in itertools.pairwise(checked):
            if max(s1, s2) <= min(e1, e2):
                raise ConsumerAssignError(
                    f"consumer {name!r}: its own hash ranges [{s1}, {e1}] and [{s2}, {e2}] overlap"
                )
        for start, end in checked:
            i = bisect.bisect_right(self._starts, end) - 1
            if i >= 0 and self._ends[i] >= start:
                raise ConsumerAssignError(
                    f"consumer {name!r}: hash range [{start}, {end}] overlaps "
                    f"[{self._starts[i]}, {self._ends[i]}] of consumer {self._range_owner[i]!r}"
                )
        for start, end in checked:
            i = bisect.bisect_left(self._starts, start)
            self._starts.insert(i, start)
            self._ends.insert(i, end)
            self._range_owner.insert(i, name)
        self._consumer_ranges[name] = checked
        self._changed()

    def remove_consumer(self, name: str) -> bool:
        """Remove a consumer; its ranges become uncovered.

        Returns
        -------
        bool
            ``False`` when the consumer was not present.
        """
        if self._consumer_ranges.pop(name, None) is None:
            return False
        keep = [i for i, owner in enumerate(self._range_owner) if owner != name]
        self._starts = [self._starts[i] for i in keep]
        self._ends = [self._ends[i] for i in keep]
        self._range_owner = [self._range_owner[i] for i in keep]
        self._changed()
        return True

    def consumers(self) -> list[str]:
        return list(self._consumer_ranges)

    def ranges(self) -> dict[str, list[tuple[int, int]]]:
        return {name: list(r) for name, r in self._consumer_ranges.items()}

    def _select_slot(self, slot: int) -> str | None:
        i = bisect.bisect_right(self._starts, slot) - 1
        if i >= 0 and slot <= self._ends[i]:
            return self._range_owner[i]
        return None

    def _owner_indices(self, slots: npt.NDArray[np.int64]) -> npt.NDArray[np.int32]:
        if not self._starts:
            return np.full(slots.shape, -1, dtype=np.int32)
        position = {name: i for i, name in enumerate(self._consumer_ranges)}
        owner = np.array([position[o] for o in self._range_owner], dtype=np.int32)
        starts = np.array(self._starts, dtype=np.int64)
        ends = np.array(self._ends, dtype=np.int64)
        i = np.searchsorted(starts, slots, side="right") - 1
        clipped = np.maximum(i, 0)
        covered = (i >= 0) & (slots <= ends[clipped])
        result: npt.NDArray[np.int32] = np.where(covered, owner[clipped], -1).astype(np.int32)
        return result

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "version": _STATE_VERSION,
            "range_size": self.range_size,
            "consumers": [
                [name, [[s, e] for s, e in r]] for name, r in self._consumer_ranges.items()
            ],
        }

    @classmethod
    def _restore(cls, state: Mapping[str, Any]) -> StickyHashRangeSelector:
        selector = cls(int(state["range_size"]))
        for name, ranges in state["consumers"]:
            selector.add_consumer(_check_name(name), [(int(s), int(e)) for s, e in ranges])
        return selector


# ============================================================================================
# Construction helpers
# ============================================================================================

_KINDS: dict[str, type[StickyKeyConsumerSelector]] = {
    AutoSplitHashRangeSelector.kind: AutoSplitHashRangeSelector,
    ConsistentHashingSelector.kind: ConsistentHashingSelector,
    StickyHashRangeSelector.kind: StickyHashRangeSelector,
}


def _check_state(state: Mapping[str, Any], kind: str) -> None:
    if not isinstance(state, Mapping):
        raise ValueError(f"selector state must be a mapping, got {type(state).__name__}")
    if state.get("kind") != kind:
        raise ValueError(f"selector state has kind {state.get('kind')!r}, expected {kind!r}")
    if state.get("version") != _STATE_VERSION:
        raise ValueError(
            f"unsupported {kind} selector state version {state.get('version')!r} "
            f"(this code reads version {_STATE_VERSION})"
        )


def selector_from_dict(state: Mapping[str, Any]) -> StickyKeyConsumerSelector:
    """Rebuild any selector from its :meth:`~StickyKeyConsumerSelector.to_dict` output.

    Raises
    ------
    ValueError
        If the kind is unknown or the state is invalid.
    """
    kind = state.get("kind") if isinstance(state, Mapping) else None
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"unknown selector kind {kind!r}; expected one of {sorted(_KINDS)}")
    return cls.from_dict(state)


def selector_for_mode(
    key_shared_mode: KeySharedMode | str = "AUTO_SPLIT",
    *,
    use_consistent_hashing: bool = True,
    consistent_hashing_points: int = DEFAULT_CONSISTENT_HASHING_POINTS,
) -> StickyKeyConsumerSelector:
    """The selector Pulsar's broker builds for a Key_Shared subscription.

    Parameters
    ----------
    key_shared_mode
        ``"AUTO_SPLIT"`` (default) or ``"STICKY"``, in either spelling
        (:class:`dispatch.modes.KeySharedMode`).
    use_consistent_hashing
        Broker setting ``subscriptionKeySharedUseConsistentHashing`` (default true): whether
        ``AUTO_SPLIT`` uses consistent hashing or auto-split hash ranges.
    consistent_hashing_points
        ``subscriptionKeySharedConsistentHashingReplicaPoints`` (default 100).

    Raises
    ------
    ValueError
        If ``key_shared_mode`` is not one of the two modes (InvalidConfiguration).
    """
    if KeySharedMode.parse(key_shared_mode) is KeySharedMode.Sticky:
        return StickyHashRangeSelector()
    if use_consistent_hashing:
        return ConsistentHashingSelector(consistent_hashing_points)
    return AutoSplitHashRangeSelector()
