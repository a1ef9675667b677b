"""The entries a process read lately, shared by every consumer in it (issue #27, point 4).

A Key_Shared consumer scans every entry of its topic to find those of its slots, so the
consumers of one subscription in a process (a client's several consumers, an application's
threads) and the subscriptions of one topic in it would each read, verify and decode every
entry. Pulsar's broker reads an entry once for all of them (its managed-ledger cache); this
cache is that, per process: an entry is read and checksum-verified once, and the sticky-key
hash each consumer needs is computed once beside it (``ReadEntry.key_hash``).

An entry never changes once committed, and a topic's incarnation (a random id written when the
topic is created) tells a re-created topic from the deleted one, so an entry is keyed by its
store, topic, incarnation, ledger and entry id and is never invalidated; the oldest go first
past :data:`MAX_ENTRIES` entries or
:data:`MAX_BYTES` stored bytes (a small entry's payload is bytes of its own, copied when it
was read: the cyclic GC has no view and read buffer per entry to go over; a large one's is a
view of the span it was read in, which it keeps alive). Retention may delete a ledger that
is still cached: only ledgers every durable subscription acknowledged are deleted, so what a
scan reads from the cache there is passed over as acknowledged, as it would be had it been
read before the deletion.

Beside the entries, :data:`RUNS` keeps what a Key_Shared scan makes of them (issue #27, point 4):
runs of consecutive entries of a partition, each with its sticky-key slot and the consumer owning
the slot under one selector (:class:`SlotRuns`). A consumer's scan of a window then costs it only
its own entries: the window is read and slotted once per process and selector, not once per
consumer of the subscription.

Used by :mod:`filepulsar.storage.delivery` (the Key_Shared scan). Thread-safe.
"""

from __future__ import annotations

import bisect
import operator
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from filepulsar.dispatch.lru import LruCache
from filepulsar.storage.cursor import slot_table
from filepulsar.storage.forks import in_forked_child
from filepulsar.storage.ledger import ManagedLedger, Position, ReadEntry
from filepulsar.storage.manifest import ManifestState

if TYPE_CHECKING:
    from filepulsar.dispatch.selectors.base import StickyKeyConsumerSelector

#: Entries kept per process, and their stored bytes.
MAX_ENTRIES = 50_000
MAX_BYTES = 64 << 20

_Key = tuple[str, str, str, int, int]
#: An entry's weight in the cache: its stored bytes.
_stored_bytes = operator.attrgetter("size")


class EntryCache:
    """Committed entries by (store root, topic, incarnation, ledger, entry), oldest first out."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        # Only peeked, never got: the first entries kept are the first to go.
        self._entries: LruCache[_Key, ReadEntry] = LruCache(
            max_entries, max_weight=max_bytes, weigh=_stored_bytes
        )
        self._lock = threading.Lock()

    def read_entries(
        self,
        ml: ManagedLedger,
        mstate: ManifestState,
        start: Position,
        *,
        max_entries: int,
        keep: bool = True,
    ) -> list[ReadEntry]:
        """Up to ``max_entries`` committed entries of ``ml`` from ``start`` (inclusive) as
        :meth:`ManagedLedger.read_entries` returns them, taken from the cache while it holds
        them and read (then kept, unless not ``keep``) from the first one it does not. Only
        entries ``mstate`` shows are returned.

        Raises
        ------
        DataLossError, ChecksumError, CorruptDataError
            As :meth:`ManagedLedger.read_entries`, for what is not cached.
        """
        inc = mstate.incarnation
        root, topic = ml.store.root, ml.topic_str
        peek = self._entries.peek
        if peek((root, topic, inc, start.ledger_id, start.entry_id)) is None:
            # The first one is not cached (a live look: what was committed since the last):
            # read from it. (One lookup of the dict, atomic, with no lock: the lock below
            # guards the walk over several and every change.)
            read = ml.read_entries(mstate, start, max_entries=max_entries)
            if keep:
                self._keep(root, topic, inc, read)
            return read
        out: list[ReadEntry] = []
        pos: Position | None = start
        last_id = -1  # the id of the last entry of the ledger being walked (-1: look it up)
        with self._lock:
            while pos is not None and len(out) < max_entries:
                e = peek((root, topic, inc, pos.ledger_id, pos.entry_id))
                if e is None:
                    break
                out.append(e)
                if pos.entry_id >= last_id:
                    lg = mstate.ledger(pos.ledger_id)
                    last_id = lg.entries - 1 if lg is not None else -1
                if pos.entry_id < last_id:
                    pos = Position(pos.ledger_id, pos.entry_id + 1)
                else:
                    pos = ml.next_position(mstate, pos)
                    last_id = -1
        if pos is None or len(out) >= max_entries:
            return out
        read = ml.read_entries(mstate, pos, max_entries=max_entries - len(out))
        if keep:
            self._keep(root, topic, inc, read)
        out.extend(read)
        return out

    def _keep(self, root: str, topic: str, inc: str, read: list[ReadEntry]) -> None:
        """Keep the entries just ``read`` of a topic (incarnation ``inc``) of the store at
        ``root``."""
        peek, put = self._entries.peek, self._entries.put
        with self._lock:
            for e in read:
                k = (root, topic, inc, e.ledger_id, e.entry_id)
                # (One cached already keeps its place: by another thread meanwhile, or one
                # this loop's puts have not pushed out yet. Each put trims at once, so an
                # entry of this read that an earlier put pushed out is put again, as the
                # newest: the read's entries are what the cache keeps last.)
                if peek(k) is None:
                    put(k, e)

    def clear(self) -> None:
        """Forget every cached entry."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


#: The process's cache (a forked child starts with a copy of its parent's, still true).
CACHE = EntryCache()

#: Slotted entries kept per run (those before a scan go past it), and entries and their
#: stored bytes in all runs (the least recently used runs go past them; a run's entries keep
#: the spans large ones were read in alive, as the cache's do).
RUN_ENTRIES = 16_384
RUNS_ENTRIES = 2 * MAX_ENTRIES
RUNS_BYTES = MAX_BYTES
_RUNS_PER_PARTITION = 8


@dataclass(slots=True)
class Window:
    """Entries ``lo..hi-1`` of a :class:`SlotRun` (as consecutive as the partition's), with
    their slots, and those of them the asked owner's slots hold (``own``, indexes in
    ``lo..hi-1``). The lists are the run's: read only up to ``hi``."""

    positions: list[Position]
    entries: list[ReadEntry]
    slots: list[int]
    lo: int
    hi: int
    own: list[int]

    def __len__(self) -> int:
        return self.hi - self.lo

    @property
    def last(self) -> Position | None:
        """The last entry of the window (None: it is empty)."""
        return self.positions[self.hi - 1] if self.hi > self.lo else None

    def before(self, p: Position) -> Position | None:
        """The last entry of the window before ``p`` (None: none is)."""
        i = bisect.bisect_left(self.positions, p, self.lo, self.hi)
        return self.positions[i - 1] if i > self.lo else None

    def scanned(self) -> list[ReadEntry]:
        """The window's entries, in order."""
        return self.entries[self.lo : self.hi]


class SlotRun:
    """Consecutive committed entries of one partition (from the first a scan asked for, with
    none left out), each with its slot and the ``sel_id`` owning it under ``sel`` (the
    selector's own table and :attr:`ids`: two indexes a slot); the entries of each owner by
    index. Appended to under :attr:`lock`; trimmed by replacing the lists
    (a :class:`Window` handed out keeps the lists it was cut from)."""

    __slots__ = (
        "base",
        "by_owner",
        "bytes",
        "entries",
        "ids",
        "lock",
        "positions",
        "sel",
        "slots",
        "start",
        "table",
    )

    def __init__(self, sel: StickyKeyConsumerSelector, start: Position) -> None:
        self.sel = sel
        self.start = start  # the first position asked for (the run's first once read)
        self.positions: list[Position] = []
        self.entries: list[ReadEntry] = []
        self.slots: list[int] = []
        #: owner -> the indexes of its entries (absolute: ``base`` + the lists' index).
        self.by_owner: dict[str | None, list[int]] = {}
        self.base = 0
        self.bytes = 0  # the entries' stored bytes
        self.table, self.ids = slot_table(sel)  # a slot's owner: ids[table.item(slot)]
        self.lock = threading.Lock()

    def at(self, ml: ManagedLedger, mstate: ManifestState, start: Position) -> int | None:
        """The index ``start`` has (or will have: the entry after the last) in this run, or
        None if it is not in it."""
        ps = self.positions
        if not ps:
            return 0 if start == self.start else None
        i = bisect.bisect_left(ps, start)
        if i < len(ps):
            return i if ps[i] == start else None
        return i if ml.next_position(mstate, ps[-1]) == start else None

    def extend(self, entries: list[ReadEntry], slot_of: Callable[[ReadEntry], int]) -> None:
        """Append ``entries`` (those after the last, in order), slotted."""
        at, sel_ids, by_owner = self.table.item, self.ids, self.by_owner
        n = self.base + len(self.positions)
        for e in entries:
            slot = slot_of(e)
            o = sel_ids[at(slot)]
            self.positions.append(e.position)
            self.entries.append(e)
            self.slots.append(slot)
            self.bytes += e.size
            ids = by_owner.get(o)
            if ids is None:
                ids = by_owner[o] = []
            ids.append(n)
            n += 1

    def trim(self, keep: int) -> int:
        """Forget all but the last ``keep`` entries (new lists); how many were forgotten."""
        k = len(self.positions) - keep
        if k <= 0:
            return 0
        self.bytes -= sum(e.size for e in self.entries[:k])
        self.positions = self.positions[k:]
        self.entries = self.entries[k:]
        self.slots = self.slots[k:]
        self.base += k
        first = self.base
        for o, ids in list(self.by_owner.items()):
            rest = ids[bisect.bisect_left(ids, first) :]
            if rest:
                self.by_owner[o] = rest
            else:
                del self.by_owner[o]
        return k


class SlotRuns:
    """The process's :class:`SlotRun` s, by partition (store root, topic, incarnation) and
    selector: what Key_Shared consumers of one subscription in the process scan, read and
    slotted once for all of them."""

    def __init__(
        self,
        run_entries: int = RUN_ENTRIES,
        max_entries: int = RUNS_ENTRIES,
        max_bytes: int = RUNS_BYTES,
        cache: EntryCache | None = None,
    ) -> None:
        self.cache = cache  # where entries are read (None: the process's :data:`CACHE`)
        self.run_entries = run_entries
        self.max_entries = max_entries
        self._runs: OrderedDict[tuple[str, str, str, int], list[SlotRun]] = OrderedDict()
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def window(
        self,
        ml: ManagedLedger,
        mstate: ManifestState,
        start: Position,
        count: int,
        sel: StickyKeyConsumerSelector,
        slot_of: Callable[[ReadEntry], int],
        owner: str | None,
        *,
        read: bool = True,
    ) -> Window | None:
        """Up to ``count`` committed entries of ``ml`` from ``start`` (inclusive), as
        :meth:`EntryCache.read_entries` gives them (entries another consumer's newer manifest
        showed may follow those ``mstate`` shows), slotted under ``sel`` (``slot_of``); ``own``
        says which of them ``owner`` 's slots hold. Not ``read``: only what a run holds
        already, nothing read (None: no run holds ``start``).

        Raises
        ------
        DataLossError, ChecksumError, CorruptDataError
            As :meth:`ManagedLedger.read_entries`, for what is not cached.
        """
        key = (ml.store.root, ml.topic_str, mstate.incarnation, id(sel))
        with self._lock:
            runs = self._runs.get(key)
            if runs is None:
                if not read:
                    return None
                runs = self._runs[key] = []
            else:
                self._runs.move_to_end(key)
            run = next(
                (r for r in runs if r.sel is sel and r.at(ml, mstate, start) is not None), None
            )
            if run is None and not read:
                return None
            if run is None:
                # (Consumers far apart scan runs of their own; a partition keeps a few.)
                run = SlotRun(sel, start)
                runs.append(run)
                if len(runs) > _RUNS_PER_PARTITION:
                    runs.pop(0)
        with run.lock:
            i = run.at(ml, mstate, start)
            if i is None:  # trimmed meanwhile: a run of its own
                if not read:
                    return None
                run, i = SlotRun(sel, start), 0
            need = i + count - len(run.positions) if read else 0
            grown = 0
            if need > 0:
                ps = run.positions
                nxt = ml.next_position(mstate, ps[-1]) if ps else start
                if nxt is not None:
                    cache = CACHE if self.cache is None else self.cache
                    got = cache.read_entries(ml, mstate, nxt, max_entries=need)
                    run.extend(got, slot_of)
                    grown = len(got)
            trimmed = 0
            if i > 0 and (len(run.positions) > self.run_entries or run.bytes > self.max_bytes):
                # What comes before ``start`` goes (a consumer still before it scans a run
                # of its own from then on).
                trimmed = run.trim(len(run.positions) - i)
                i = 0
            hi = min(i + count, len(run.positions))
            ids = run.by_owner.get(owner, [])
            base = run.base
            a = bisect.bisect_left(ids, base + i)
            b = bisect.bisect_left(ids, base + hi, a)
            w = Window(run.positions, run.entries, run.slots, i, hi, [x - base for x in ids[a:b]])
        if grown or trimmed:
            self._bound(run)
        return w

    def _bound(self, keep: SlotRun) -> None:
        """After a run grew or was trimmed: past the bound, the least recently used
        partitions' runs go, then the oldest runs of the one left; never ``keep`` (the run
        just used). The entries and bytes held are counted from the runs kept, not kept
        as running totals: a run trimmed or evicted while another thread extended it (or a
        run of its own a trimmed one left behind) would make such totals drift."""
        with self._lock:
            size = sum(len(r.positions) for rs in self._runs.values() for r in rs)
            held = sum(r.bytes for rs in self._runs.values() for r in rs)
            while size > self.max_entries or held > self.max_bytes:
                if len(self._runs) > 1:
                    _, gone = self._runs.popitem(last=False)
                else:
                    runs = next(iter(self._runs.values()), [])
                    gone = [next((r for r in runs if r is not keep), keep)]
                    if gone[0] is keep:
                        break  # the run in use alone: a run bounds itself (run_entries)
                    runs.remove(gone[0])
                size -= sum(len(r.positions) for r in gone)
                held -= sum(r.bytes for r in gone)

    def clear(self) -> None:
        """Forget every run."""
        with self._lock:
            self._runs.clear()


#: The process's slotted runs.
RUNS = SlotRuns()


@in_forked_child
def _fresh_cache_lock() -> None:
    """A child forked while a thread of its parent held the lock would wait for it for ever:
    a fresh lock (the entries stay: committed entries are true in the child too)."""
    CACHE._lock = threading.Lock()
    RUNS._lock = threading.Lock()
    RUNS._runs = OrderedDict()  # (a run's lock may be held too: the runs go)
