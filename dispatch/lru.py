"""The one least-recently-used dict: values by key, the oldest forgotten past a bound.

Every per-process cache of the project keeps its values in one:

1. :meth:`LruCache.get` returns a kept value and makes its key the newest;
   :meth:`LruCache.peek` returns it and leaves the order alone (a cache only ever peeked
   forgets in the order values were put: first in, first out).
2. :meth:`LruCache.put` keeps a value as the newest, with a weight where the cache has a
   ``max_weight`` (1 unless given: stored bytes, ring points); a key kept already moves to the
   end and takes the new value and weight.
3. Past ``max_items`` values, or a total weight over ``max_weight``, the oldest go one by one
   until both hold again; with ``keep_newest`` the newest value stays however heavy it is
   (else a value heavier than ``max_weight`` goes at once). An owner that must release what
   goes (close a descriptor) keeps its own bound with :meth:`LruCache.oldest` and
   :meth:`LruCache.pop` instead.

Not thread-safe: its owner guards it with a lock of its own (often one it shares with the
state beside the cache) and says what a forked child keeps of it.

Used by :mod:`filepulsar.storage.catalog` (segments and resolved heads),
:mod:`filepulsar.storage.ledger` (closed-ledger indexes, fragment offsets),
:mod:`filepulsar.storage.entry_cache` (entries, by count and bytes, peeked: first in, first
out), :mod:`filepulsar.storage.blobstore.read_handles` (open descriptors),
:mod:`filepulsar.connector.source.meter` (per-entry message counts) and
:mod:`filepulsar.dispatch.selectors.consistent` (known rings, by points, the newest kept).
It lives in ``dispatch`` (which imports nothing of the project) so every floor can share it.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable, Hashable, ItemsView, Iterable
from typing import Generic, TypeVar

__all__ = ["LruCache"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """Values by key, least recently used first out past ``max_items`` values or a total
    weight over ``max_weight`` (None: no such bound); ``keep_newest``: the newest value is
    never forgotten, however heavy.

    Raises
    ------
    ValueError
        If a bound is negative.
    """

    __slots__ = (
        "_d",
        "_floor",
        "_max_items",
        "_max_weight",
        "_move",
        "_weights",
        "peek",
        "weight",
    )

    def __init__(
        self,
        max_items: int | None = None,
        *,
        max_weight: int | None = None,
        keep_newest: bool = False,
    ) -> None:
        if (max_items is not None and max_items < 0) or (max_weight is not None and max_weight < 0):
            raise ValueError(
                f"bounds must be >= 0, not max_items={max_items} max_weight={max_weight}"
            )
        self._floor = 1 if keep_newest else 0  # values never forgotten
        # (Held as numbers put compares without a test for None.)
        self._max_items = sys.maxsize if max_items is None else max(max_items, self._floor)
        self._max_weight = sys.maxsize if max_weight is None else max_weight
        self._d: OrderedDict[K, V] = OrderedDict()
        #: Each value's weight (None: no ``max_weight``, nothing is weighed).
        self._weights: dict[K, int] | None = None if max_weight is None else {}
        #: The kept values' total weight (0 without ``max_weight``).
        self.weight = 0
        self._move = self._d.move_to_end
        #: ``peek(key)``: the value kept for ``key`` (None: none is), its place left alone.
        #: (The dict's own ``get``, bound once: a cache peeked per message pays no call.)
        self.peek: Callable[[K], V | None] = self._d.get

    def get(self, key: K) -> V | None:
        """The value kept for ``key``, now the newest (None: none is kept)."""
        try:
            self._move(key)  # (a hit costs one lookup less than ``get`` then a move)
        except KeyError:
            return None
        return self._d[key]

    def put(self, key: K, value: V, weight: int = 1) -> None:
        """Keep ``value`` for ``key`` as the newest, weighing ``weight`` (counted against
        ``max_weight``; ignored without it); then forget the oldest values while a bound is
        passed (``value`` itself when it alone weighs more than ``max_weight`` and the newest
        is not kept)."""
        d = self._d
        had = key in d
        d[key] = value
        if had:
            self._move(key)
        weights = self._weights
        if weights is not None:
            if had:
                self.weight -= weights[key]
            weights[key] = weight
            self.weight += weight
        if len(d) > self._max_items or self.weight > self._max_weight:
            self._forget()

    def put_new(self, items: Iterable[tuple[K, V, int]]) -> None:
        """:meth:`put` each ``(key, value, weight)`` whose key is not kept (a key kept already
        keeps its value and place), in order; then forget the oldest values while a bound is
        passed (what is left is what :meth:`put` one by one leaves: the newest values that
        fit). One call for a batch: a cache filled per message pays one call per batch."""
        d, weights = self._d, self._weights
        added = 0
        for key, value, weight in items:
            if key not in d:
                d[key] = value
                if weights is not None:
                    weights[key] = weight
                    added += weight
        self.weight += added
        if len(d) > self._max_items or self.weight > self._max_weight:
            self._forget()

    def _forget(self) -> None:
        """Forget the oldest values while a bound is passed."""
        d, weights, floor = self._d, self._weights, self._floor
        if weights is None:
            while len(d) > self._max_items:
                d.popitem(last=False)
            return
        while len(d) > floor and (len(d) > self._max_items or self.weight > self._max_weight):
            self.weight -= weights.pop(d.popitem(last=False)[0])

    def pop(self, key: K) -> V | None:
        """Forget ``key``; its value (None: none was kept)."""
        value = self._d.pop(key, None)
        weights = self._weights
        if weights is not None and key in weights:
            self.weight -= weights.pop(key)
        return value

    def oldest(self) -> tuple[K, V] | None:
        """The least recently used ``(key, value)``, left in place (None: the cache is empty)."""
        return next(iter(self._d.items()), None)

    def items(self) -> ItemsView[K, V]:
        """The kept ``(key, value)`` pairs, oldest first (a view: not to be changed while
        iterated)."""
        return self._d.items()

    def clear(self) -> None:
        """Forget every value."""
        self._d.clear()
        if self._weights is not None:
            self._weights.clear()
        self.weight = 0

    def __getitem__(self, key: K) -> V:
        """The value kept for ``key``, its place left alone; raises KeyError if none is."""
        return self._d[key]

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)
