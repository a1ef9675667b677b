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
:data:`MAX_BYTES` stored bytes (an entry's payload is a view of the span it was read in,
which it keeps alive). Retention may delete a ledger that is still cached: only ledgers every
durable subscription acknowledged are deleted, so what a scan reads from the cache there is
passed over as acknowledged, as it would be had it been read before the deletion.

Used by :mod:`filepulsar.storage.delivery` (the Key_Shared scan). Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from filepulsar.storage.forks import in_forked_child
from filepulsar.storage.ledger import ManagedLedger, Position, ReadEntry
from filepulsar.storage.manifest import ManifestState

#: Entries kept per process, and their stored bytes.
MAX_ENTRIES = 50_000
MAX_BYTES = 64 << 20

_Key = tuple[str, str, str, int, int]


class EntryCache:
    """Committed entries by (store root, topic, incarnation, ledger, entry), oldest first out."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[_Key, ReadEntry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def read_entries(
        self, ml: ManagedLedger, mstate: ManifestState, start: Position, *, max_entries: int
    ) -> list[ReadEntry]:
        """Up to ``max_entries`` committed entries of ``ml`` from ``start`` (inclusive) as
        :meth:`ManagedLedger.read_entries` returns them, taken from the cache while it holds
        them and read (then kept) from the first one it does not. Only entries ``mstate``
        shows are returned.

        Raises
        ------
        DataLossError, ChecksumError, CorruptDataError
            As :meth:`ManagedLedger.read_entries`, for what is not cached.
        """
        inc = mstate.incarnation
        root, topic = ml.store.root, ml.topic_str
        out: list[ReadEntry] = []
        pos: Position | None = start
        last_id = -1  # the id of the last entry of the ledger being walked (-1: look it up)
        with self._lock:
            while pos is not None and len(out) < max_entries:
                e = self._entries.get((root, topic, inc, pos.ledger_id, pos.entry_id))
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
        with self._lock:
            for e in read:
                k = (root, topic, inc, e.ledger_id, e.entry_id)
                if k not in self._entries:
                    self._entries[k] = e
                    self._bytes += e.raw.size
            while self._entries and (
                len(self._entries) > self.max_entries or self._bytes > self.max_bytes
            ):
                self._bytes -= self._entries.popitem(last=False)[1].raw.size
        out.extend(read)
        return out

    def clear(self) -> None:
        """Forget every cached entry."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)


#: The process's cache (a forked child starts with a copy of its parent's, still true).
CACHE = EntryCache()


@in_forked_child
def _fresh_cache_lock() -> None:
    """A child forked while a thread of its parent held the lock would wait for it for ever:
    a fresh lock (the entries stay: committed entries are true in the child too)."""
    CACHE._lock = threading.Lock()
