"""The one least-recently-used dict: values by key, the oldest forgotten past a bound.

The caches named below keep their values in one:

1. :meth:`LruCache.get` returns a kept value and makes its key the newest;
   :meth:`LruCache.peek` returns it and leaves the order alone (a cache only ever peeked
   forgets in the order values were put: first in, first out).
2. :meth:`LruCache.put` keeps a value as the newest; a key kept already moves to the end and
   takes the new value (and its weight: a cache with a ``max_weight`` weighs each value with
   its ``weigh``, stored bytes or ring points, when it is put and when it goes, so a value's
   weight must not change while it is kept).
3. Past ``max_items`` values, or a total weight over ``max_weight``, the oldest go one by one
   until both hold again; with ``keep_newest`` the newest value stays however heavy it is
   (else a value heavier than ``max_weight`` empties the cache: every other value goes
   first, then it). The bounds are read once, when the cache is made. An owner that must
   release what goes (close a descriptor) keeps its own bound instead, with ``items``
   (oldest first) and :meth:`LruCache.pop`.

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
from collections.abc import Callable, Hashable, ItemsView, Iterator
from typing import Generic, TypeVar

__all__ = ["LruCache"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """Values by key, least recently used first out past ``max_items`` values or a total
    weight over ``max_weight`` (None: no such bound; each value weighs ``weigh(value)``);
    ``keep_newest``: the newest value is never forgotten, however heavy.

    Raises
    ------
    ValueError
        If a bound is negative, or only one of ``max_weight`` and ``weigh`` is given.
    """

    __slots__ = (
        "_d",
        "_floor",
        "_max_items",
        "_max_weight",
        "_move",
        "_weigh",
        "items",
        "peek",
        "weight",
    )

    def __init__(
        self,
        max_items: int | None = None,
        *,
        max_weight: int | None = None,
        weigh: Callable[[V], int] | None = None,
        keep_newest: bool = False,
    ) -> None:
        if (max_items is not None and max_items < 0) or (max_weight is not None and max_weight < 0):
            raise ValueError(
                f"bounds must be >= 0, not max_items={max_items} max_weight={max_weight}"
            )
        if (max_weight is None) != (weigh is None):
            raise ValueError("max_weight and weigh go together")
        self._floor = 1 if keep_newest else 0  # values never forgotten
        # (Held as numbers put compares without a test for None.)
        self._max_items = sys.maxsize if max_items is None else max(max_items, self._floor)
        self._max_weight = sys.maxsize if max_weight is None else max_weight
        self._weigh = weigh
        self._d: OrderedDict[K, V] = OrderedDict()
        #: The kept values' total weight (0 without ``max_weight``).
        self.weight = 0
        self._move = self._d.move_to_end
        #: ``peek(key)``: the value kept for ``key`` (None: none is), its place left alone.
        #: (The dict's own ``get``, bound once: a cache peeked per message pays no call.)
        self.peek: Callable[[K], V | None] = self._d.get
        #: ``items()``: the kept ``(key, value)`` pairs, oldest first (a live view: not to be
        #: changed while iterated; ``next(iter(items()))`` is the least recently used).
        self.items: Callable[[], ItemsView[K, V]] = self._d.items

    def get(self, key: K) -> V | None:
        """The value kept for ``key``, now the newest (None: none is kept)."""
        try:
            self._move(key)  # (a hit costs one lookup less than ``get`` then a move)
        except KeyError:
            return None
        return self._d[key]

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` for ``key`` as the newest; then forget the oldest values while a bound
        is passed (``value`` itself when it alone weighs more than ``max_weight`` and the
        newest is not kept)."""
        d, weigh = self._d, self._weigh
        had = key in d
        if weigh is None:  # (a count bound alone: one new key puts one value past it at most)
            d[key] = value
            if had:
                self._move(key)
            elif len(d) > self._max_items:
                d.popitem(last=False)
            return
        weight = self.weight + weigh(value)
        if had:
            weight -= weigh(d[key])
            d[key] = value
            self._move(key)
        else:
            d[key] = value
        while (len(d) > self._max_items or weight > self._max_weight) and len(d) > self._floor:
            weight -= weigh(d.popitem(last=False)[1])
        self.weight = weight

    def pop(self, key: K) -> V | None:
        """Forget ``key``; its value (None: none was kept)."""
        d, weigh = self._d, self._weigh
        if key not in d:
            return None
        value = d.pop(key)
        if weigh is not None:
            self.weight -= weigh(value)
        return value

    def clear(self) -> None:
        """Forget every value."""
        self._d.clear()
        self.weight = 0

    def __iter__(self) -> Iterator[K]:
        """The kept keys, oldest first (not to be changed while iterated)."""
        return iter(self._d)

    def __copy__(self) -> LruCache[K, V]:
        """A cache of its own with the same bounds, values and order (the bound methods of
        this one's dict stay this one's)."""
        new: LruCache[K, V] = LruCache.__new__(LruCache)
        new._floor, new._max_items, new._max_weight = self._floor, self._max_items, self._max_weight
        new._weigh, new.weight = self._weigh, self.weight
        new._d = OrderedDict(self._d)
        new._move, new.peek, new.items = new._d.move_to_end, new._d.get, new._d.items
        return new

    def __deepcopy__(self, memo: dict[int, object]) -> LruCache[K, V]:
        """As :meth:`__copy__`, with the values deep-copied."""
        import copy

        new = self.__copy__()
        new._d = OrderedDict((k, copy.deepcopy(v, memo)) for k, v in self._d.items())
        new._move, new.peek, new.items = new._d.move_to_end, new._d.get, new._d.items
        return new

    def __getitem__(self, key: K) -> V:
        """The value kept for ``key``, its place left alone; raises KeyError if none is."""
        return self._d[key]

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)
