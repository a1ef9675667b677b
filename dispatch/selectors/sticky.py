"""The sticky selector (``STICKY`` mode): every consumer brings its own fixed hash ranges.

Pulsar's ``HashRangeExclusiveStickyKeyConsumerSelector``.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from filepulsar.dispatch.selectors.base import (
    DEFAULT_RANGE_SIZE,
    STATE_VERSION,
    ConsumerAssignError,
    StickyKeyConsumerSelector,
    check_consumer_name,
)

__all__ = ["StickyHashRangeSelector"]


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
        check_consumer_name(name)
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
            "version": STATE_VERSION,
            "range_size": self.range_size,
            "consumers": [
                [name, [[s, e] for s, e in r]] for name, r in self._consumer_ranges.items()
            ],
        }

    @classmethod
    def _restore(cls, state: Mapping[str, Any]) -> StickyHashRangeSelector:
        selector = cls(int(state["range_size"]))
        for name, ranges in state["consumers"]:
            selector.add_consumer(check_consumer_name(name), [(int(s), int(e)) for s, e in ranges])
        return selector
