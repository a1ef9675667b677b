"""The consistent-hashing selector (``AUTO_SPLIT``'s default in Pulsar).

Pulsar's ``ConsistentHashingStickyKeyConsumerSelector``: a fixed number of points per consumer
on a ring of slots.
"""

from __future__ import annotations

import bisect
import functools
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from filepulsar.dispatch.hashing import hash_slot, murmur3_32
from filepulsar.dispatch.lru import LruCache
from filepulsar.dispatch.selectors.base import (
    DEFAULT_CONSISTENT_HASHING_POINTS,
    DEFAULT_RANGE_SIZE,
    STATE_VERSION,
    ConsumerAssignError,
    StickyKeyConsumerSelector,
    check_consumer_name,
    check_no_ranges,
)

__all__ = ["ConsistentHashingSelector"]

_KEY_SEPARATOR = "\0"
_RANGE_END = DEFAULT_RANGE_SIZE - 1


@functools.lru_cache(maxsize=1024)
def _ring_points(name: str, name_index: int, points_per_consumer: int) -> tuple[int, ...]:
    """Ring points (slots in ``[1, 65535]``) of the consumer ``(name, name_index)``: point
    ``i`` is the slot of ``name + "\\0" + name_index + "\\0" + i``.

    Remembered for the last 1,024 consumers asked about: a process re-derives the same
    consumers' points for every partition it subscribes to and every membership change (a
    selector is rebuilt from its stored state each time), 100 murmur hashes each.
    """
    prefix = f"{name}{_KEY_SEPARATOR}{name_index}{_KEY_SEPARATOR}"
    return tuple(
        hash_slot(murmur3_32(f"{prefix}{i}"), 1, _RANGE_END) for i in range(points_per_consumer)
    )


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
    RANGE_END = _RANGE_END

    def __init__(self, points_per_consumer: int = DEFAULT_CONSISTENT_HASHING_POINTS) -> None:
        super().__init__()
        if not isinstance(points_per_consumer, int) or points_per_consumer < 1:
            raise ValueError(f"points_per_consumer must be >= 1, got {points_per_consumer!r}")
        self.points_per_consumer = points_per_consumer
        self.hash_range = (1, self.RANGE_END)
        self._instances: list[tuple[str, int]] = []
        # Point -> its queue, the selected instance first. Never changed in place (a change
        # puts a new tuple), so a copy of the dict is a copy of the ring (_RINGS).
        self._ring: dict[int, tuple[tuple[str, int], ...]] = {}
        # The ring's points in order, or None until asked for (:meth:`_points`): a
        # membership commit restores, changes and stores a selector without selecting. Never
        # changed in place (replaced), so a kept ring's list is shared read-only.
        self._sorted: list[int] | None = []
        # The instances this selector was restored with, while it is unchanged since (its
        # ring is :data:`_RINGS`' of them): the points it sorts go there too.
        self._restored: tuple[tuple[str, int], ...] | None = None

    def point_slots(self, name: str, name_index: int) -> list[int]:
        """Ring points (slots) of the consumer ``(name, name_index)``, for ``i = 0, 1, ...``
        (remembered per process)."""
        return list(_ring_points(name, name_index, self.points_per_consumer))

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
        check_consumer_name(name)
        check_no_ranges(self.kind, ranges)
        if name_index is None:
            name_index = self._free_name_index(name)
        elif name_index < 0 or (name, name_index) in self._instances:
            raise ConsumerAssignError(
                f"name index {name_index} of consumer {name!r} is negative or already in use"
            )
        instance = (name, name_index)
        if self._place(instance):
            self._sorted = None
        self._instances.append(instance)
        self._changed()
        return name_index

    def _place(self, instance: tuple[str, int]) -> bool:
        """Put ``instance``'s points on the ring, behind the instances there; whether one of
        them was a new point."""
        ring = self._ring
        new = False
        for point in _ring_points(instance[0], instance[1], self.points_per_consumer):
            queue = ring.get(point)
            if queue is None:
                ring[point] = (instance,)
                new = True
            else:
                ring[point] = (*queue, instance)
        return new

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
        ring = self._ring
        freed = set()
        for point in set(_ring_points(*instance, self.points_per_consumer)):
            queue = ring[point]
            rest = () if len(queue) == 1 else tuple(i for i in queue if i != instance)
            if rest:
                ring[point] = rest
            else:
                del ring[point]
                freed.add(point)
        if freed:
            self._sorted = None
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
        return [(p, list(self._ring[p])) for p in self._points()]

    def _changed(self) -> None:
        self._restored = None  # (its ring is no longer the kept one)
        super()._changed()

    def _points(self) -> list[int]:
        """The ring's points, ascending (read-only)."""
        points = self._sorted
        if points is None:
            points = self._sorted = sorted(self._ring)
            if self._restored is not None:  # unchanged since restored: kept for the next
                _RINGS.put(self.points_per_consumer, self._restored, self._ring, points)
        return points

    def _selected_instance(self, slot: int) -> tuple[str, int] | None:
        points = self._points()
        if not points:
            return None
        i = bisect.bisect_left(points, slot)
        point = points[i if i < len(points) else 0]
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
        sorted_points = self._points()
        if not sorted_points:
            return np.full(slots.shape, -1, dtype=np.int32)
        position = {inst: i for i, inst in enumerate(self._instances)}
        selected = np.array([position[self._ring[p][0]] for p in sorted_points], dtype=np.int32)
        points = np.array(sorted_points, dtype=np.int64)
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
        sorted_points = self._points()
        for point in sorted_points:
            owner = self._ring[point][0]
            if assignments and assignments[-1][2] == owner:
                assignments[-1] = (assignments[-1][0], point, owner)
            else:
                assignments.append((start, point, owner))
            start = point + 1
        if sorted_points and start <= self.hash_range[1]:
            first_owner = self._ring[sorted_points[0]][0]
            if assignments[-1][2] == first_owner:
                assignments[-1] = (assignments[-1][0], self.hash_range[1], first_owner)
            else:
                assignments.append((start, self.hash_range[1], first_owner))
        result: dict[str, list[tuple[int, int]]] = {}
        for lo, hi, (name, _) in assignments:
            result.setdefault(name, []).append((lo, hi))
        return {name: sorted(r) for name, r in result.items()}

    def to_dict(self) -> dict[str, Any]:
        instances = tuple(self._instances)
        _RINGS.put(self.points_per_consumer, instances, self._ring, self._sorted)
        return {
            "kind": self.kind,
            "version": STATE_VERSION,
            "points_per_consumer": self.points_per_consumer,
            "consumers": [[name, idx] for name, idx in instances],
        }

    @classmethod
    def _restore(cls, state: Mapping[str, Any]) -> ConsistentHashingSelector:
        selector = cls(int(state["points_per_consumer"]))
        instances = tuple((check_consumer_name(n), int(i)) for n, i in state["consumers"])
        known = _RINGS.get(selector.points_per_consumer, instances)
        if known is not None:  # this process stored (or restored) that membership lately
            selector._instances = list(instances)
            selector._ring = dict(known[0])
            selector._sorted = known[1]
            selector._restored = instances
            return selector
        # Re-adding the live instances in their original order with their name indexes
        # recreates the ring exactly, including the order of every collision queue; the
        # points are sorted once at the end.
        if len(set(instances)) < len(instances) or any(i < 0 for _, i in instances):
            raise ConsumerAssignError(
                f"name indexes {[list(inst) for inst in instances]} are negative or repeated"
            )
        for instance in instances:
            selector._place(instance)
        selector._instances = list(instances)
        selector._sorted = None
        _RINGS.put(selector.points_per_consumer, instances, selector._ring, None)
        selector._restored = instances
        return selector


_Instance = tuple[str, int]
_Ring = tuple[dict[int, tuple[_Instance, ...]], list[int] | None]


def _points_of(ring: _Ring) -> int:
    """A ring's weight in :class:`_KnownRings`: its points."""
    return len(ring[0])


class _KnownRings:
    """Rings of the memberships this process stored or restored lately, by (points per
    consumer, instances in order): a subscription's selector is rebuilt from its stored state
    for each registration, leaving and look (one state per partition), and a copy of a known
    ring costs a dict copy, not 100 points per consumer placed and sorted. Kept rings are
    never changed (their users copy what they take); the least recently used go beyond
    ``max_points`` points in all (about 100 bytes each). Thread-safe."""

    def __init__(self, max_points: int) -> None:
        self.max_points = max_points
        self._rings = self._new_cache()
        self._lock = threading.Lock()

    def _new_cache(self) -> LruCache[tuple[int, tuple[_Instance, ...]], _Ring]:
        """Rings weighing their points, the newest kept however many it has."""
        return LruCache(max_weight=self.max_points, weigh=_points_of, keep_newest=True)

    @property
    def _points(self) -> int:
        """The points of the kept rings, in all."""
        return self._rings.weight

    def get(self, points_per_consumer: int, instances: tuple[_Instance, ...]) -> _Ring | None:
        """The kept ring of that membership (read-only), or None."""
        with self._lock:
            return self._rings.get((points_per_consumer, instances))

    def put(
        self,
        points_per_consumer: int,
        instances: tuple[_Instance, ...],
        ring: dict[int, tuple[_Instance, ...]],
        sorted_points: list[int] | None,
    ) -> None:
        """Keep a copy of ``ring`` (and its sorted points, read-only, None when not known)
        unless that membership's is kept."""
        key = (points_per_consumer, instances)
        with self._lock:
            known = self._rings.get(key)
            if known is not None:
                if known[1] is None and sorted_points is not None:
                    # (the same ring: its points are sorted once, not at every restore)
                    self._rings.put(key, (known[0], sorted_points))
                return
        kept = (dict(ring), sorted_points)  # (copied outside the lock)
        with self._lock:
            if key not in self._rings:
                self._rings.put(key, kept)

    def after_fork(self) -> None:
        """In a forked child: a new lock and no kept ring (a parent's thread may have held
        the lock, between changing the rings and their point count)."""
        self._lock = threading.Lock()
        self._rings = self._new_cache()


_RINGS = _KnownRings(max_points=1 << 16)
"""This process's :class:`_KnownRings`: 65,536 distinct points in all (65 rings of 10
consumers, about 6 MB: a process's consumers of 30 partitions change them one membership at a
time), but the newest ring is always kept, however large (one of 10,000 consumers: about
16 MB)."""
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_RINGS.after_fork)
