"""The auto-split hash-range selector (``AUTO_SPLIT`` without consistent hashing).

Pulsar's ``HashRangeAutoSplitStickyKeyConsumerSelector``: one contiguous range per consumer, split
in halves as consumers join.
"""

from __future__ import annotations

import bisect
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
    check_no_ranges,
)

__all__ = ["AutoSplitHashRangeSelector"]


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
        check_consumer_name(name)
        check_no_ranges(self.kind, ranges)
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
            "version": STATE_VERSION,
            "range_size": self.range_size,
            "consumers": list(self._added),
            "bounds": [[b, o] for b, o in zip(self._bounds, self._owners)],
        }

    @classmethod
    def _restore(cls, state: Mapping[str, Any]) -> AutoSplitHashRangeSelector:
        selector = cls(int(state["range_size"]))
        consumers = [check_consumer_name(n) for n in state["consumers"]]
        bounds = [(int(b), check_consumer_name(o)) for b, o in state["bounds"]]
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
