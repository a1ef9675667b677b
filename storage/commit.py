"""Publishing written entries: the one manifest commit that makes written entries visible.

:class:`Publish` is that commit, used by both ways in -- the producer's
:class:`~filepulsar.storage.writer.LedgerWriter` and the sink's
:func:`~filepulsar.storage.staged.commit_staged`: its change function (:func:`apply_entries`)
appends the entries to the open ledger (broker-side dedup, ledger rollover with its index
blob, one fragment per run of entries of one blob) after the caller's own check (the
producer's lease, the sink's batch id), and the index blobs a rollover names are written
before the manifest. :class:`PendingEntry` is an encoded entry on its way.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from filepulsar.dispatch.dedup import DedupStatus, DedupTracker, dedup_decide
from filepulsar.storage import paths
from filepulsar.storage.errors import CommitConflict
from filepulsar.storage.fragments import Fragment
from filepulsar.storage.ledger import ManagedLedger, Position, encode_index
from filepulsar.storage.manifest import LedgerInfo, ManifestState
from filepulsar.storage.names import TopicName
from filepulsar.storage.policies import Policies
from filepulsar.storage.versioned import Abort

LEDGER_MISMATCH = "ledger-mismatch"
"""What :func:`apply_entries` aborts with when the manifest's open ledger is not the writer's."""

# (A module name: an enum member read through its class costs a lookup, ~60 ns on CPython 3.11,
# and the one-entry commit compares with it once per publish.)
_NOT_DUP = DedupStatus.NOT_DUP


@dataclass(slots=True)
class PendingEntry:
    """An encoded entry waiting to be written, with what the commit needs to know of it.

    Build it with :meth:`of`.
    """

    parts: list[Any]  # the encoded entry's buffers, written back to back
    size: int
    num_messages: int
    publish_time: int
    producer_name: str
    sequence_id: int
    highest_sequence_id: int

    @classmethod
    def of(
        cls,
        parts: list[Any],
        num_messages: int,
        publish_time: int,
        producer_name: str,
        sequence_id: int,
        highest_sequence_id: int,
    ) -> PendingEntry:
        size = sum(len(memoryview(p)) if not isinstance(p, bytes) else len(p) for p in parts)
        return cls(
            parts, size, num_messages, publish_time, producer_name, sequence_id, highest_sequence_id
        )


def _is_full(lg: LedgerInfo, pol: Policies, now: int) -> bool:
    return (
        lg.entries >= pol.ledger_max_entries
        or lg.size >= pol.ledger_max_size_mb * 1024 * 1024
        or len(lg.fragments or ()) >= pol.ledger_max_fragments
        or (lg.entries > 0 and now - lg.created_ms >= pol.ledger_max_age_minutes * 60000)
    )


def _close_ledger(
    ml: ManagedLedger,
    state: ManifestState,
    lg: LedgerInfo,
    now: int,
    indexes: list[tuple[str, bytes]],
) -> None:
    """Close ``lg``: its fragments go to an index blob (written before the manifest), named
    uniquely for this commit attempt."""
    if not lg.entries:
        assert state.ledgers[-1] is lg  # the open ledger is the last
        state.ledgers.pop()
        return
    key = paths.ledger_index(ml.topic, lg.ledger_id, state.version + 1, uuid.uuid4().hex)
    indexes.append((key, encode_index(lg.ledger_id, lg.fragments or [])))
    lg.index = paths.topic_relative(ml.topic, key)
    lg.fragments = None
    lg.closed_ms = now


#: A fragment grows by the next run of its blob up to these sizes (``_extends``).
MERGE_MAX_ENTRIES = 4096
MERGE_MAX_BYTES = 1024 * 1024


def _extends(prev: Fragment, frag: Fragment) -> bool:
    """Whether ``frag`` (the next entries of the ledger) is stored right after ``prev`` in the
    same blob and both hold one message per entry, so ``prev`` can grow to cover it.

    A producer appending one entry per commit (``send()`` without batching, or a batch of
    one) would otherwise add a fragment per message, and the open ledger's record -- read
    and parsed by every waiting reader on every commit -- would grow to
    ``ledger_max_fragments`` of them. One-message entries keep exact per-entry counts
    (``messages == count``), so a grown fragment still counts by metadata alone; the caps
    bound what a reader locating an entry inside a fragment, or searching it by publish
    time, reads. (``storage/FORMAT.md``, "Manifest".)"""
    return (
        prev.blob == frag.blob
        and prev.offset + prev.length == frag.offset
        and prev.messages == prev.count
        and frag.messages == frag.count
        and prev.count + frag.count <= MERGE_MAX_ENTRIES
        and prev.length + frag.length <= MERGE_MAX_BYTES
    )


def _add_fragment(
    lg: LedgerInfo,
    entries: list[PendingEntry],
    offsets: list[int],
    blob: str,
    run: list[int],
    out: list[Position | None],
) -> None:
    first, last = run[0], run[-1]
    length = offsets[last] + entries[last].size - offsets[first]
    msgs = sum(entries[i].num_messages for i in run)
    pubs = [entries[i].publish_time for i in run]
    frag = Fragment(blob, lg.entries, len(run), offsets[first], length, msgs, min(pubs), max(pubs))
    assert lg.fragments is not None
    prev = lg.fragments[-1] if lg.fragments else None
    if prev is not None and _extends(prev, frag):
        # A replacement, never a change in place: states copied from this one (a cached
        # version, a memo) share the fragment objects.
        lg.fragments[-1] = Fragment(
            blob,
            prev.first_entry,
            prev.count + frag.count,
            prev.offset,
            prev.length + frag.length,
            prev.messages + frag.messages,
            min(prev.min_publish, frag.min_publish),
            max(prev.max_publish, frag.max_publish),
        )
    else:
        lg.fragments.append(frag)
    for k, i in enumerate(run):
        out[i] = Position(lg.ledger_id, lg.entries + k)
    lg.min_publish = frag.min_publish if lg.entries == 0 else min(lg.min_publish, frag.min_publish)
    lg.max_publish = max(lg.max_publish, frag.max_publish)
    lg.entries += len(run)
    lg.messages += msgs
    lg.size += length


def apply_entries(
    ml: ManagedLedger,
    state: ManifestState,
    entries: list[PendingEntry],
    blobs: list[str],
    offsets: list[int],
    *,
    policies: Policies,
    now: int,
    dedup: bool,
    follows: list[bool] | None = None,
    blob_ledger: int | None = None,
    indexes: list[tuple[str, bytes]],
) -> tuple[list[Position | None], int, bool]:
    """Append written entries to ``state`` (inside a manifest commit's change function).

    Applies broker-side dedup when ``dedup`` (entries with a negative sequence id are never
    duplicates; ``follows[i]`` joins entry ``i`` to entry ``i-1``, and a run so joined is kept
    or dropped whole by the ids of its last entry: a chunked message's chunks, whose headers
    carry -1 but on the last), rolls the open ledger over per
    ``policies`` (closing it records an index blob in ``indexes`` for ``before_write``), and
    adds one fragment per run of consecutive entries of one blob (or grows the last fragment
    by it, :func:`_extends`). ``blob_ledger`` is the ledger
    an appended-to blob already belongs to (None for a fresh blob); a mismatch raises
    ``Abort(LEDGER_MISMATCH)``. Returns each entry's position (None: dropped duplicate), the ledger
    used, and whether it was closed after this append.
    """
    indexes.clear()
    accepted = list(range(len(entries)))
    if dedup and len(entries) == 1:
        # One entry, a producer's usual commit: the tracker's rule on the manifest's mark
        # alone (nothing is in flight, so pushed is persisted), without a tracker to seed.
        e = entries[0]
        name = e.producer_name
        persisted = state.dedup.get(name)
        status, persisted = dedup_decide(e.sequence_id, e.highest_sequence_id, persisted, persisted)
        if status is not _NOT_DUP:
            accepted = []  # a duplicate
        if persisted is not None:
            state.note_dedup(name, persisted, now)
    elif dedup:
        # Seeded with the writers of these entries only: a producer's decisions read its own
        # high-water mark alone (a topic's manifest may hold thousands).
        tracker = DedupTracker()
        for name in {e.producer_name for e in entries}:
            seq = state.dedup.get(name)
            if seq is not None:
                tracker.record_persisted(name, seq)
        tracker.reset_pushed()
        accepted = []
        i = 0
        while i < len(entries):
            last = i  # a run of entries that follow one another: one decision, by the last
            while follows and last + 1 < len(entries) and follows[last + 1]:
                last += 1
            e = entries[last]
            st = tracker.check(e.producer_name, e.sequence_id, e.highest_sequence_id)
            if st is DedupStatus.NOT_DUP:
                tracker.record_persisted(e.producer_name, e.sequence_id, e.highest_sequence_id)
                accepted.extend(range(i, last + 1))
            i = last + 1
        for name in {e.producer_name for e in entries}:
            highest = tracker.highest_persisted(name)
            if highest is not None:
                state.note_dedup(name, highest, now)
    state.prune(
        now,
        dedup_inactive_ms=policies.dedup_producer_inactivity_minutes * 60_000,
        sink_batches_max=policies.sink_batches_max,
        sink_batches_max_age_ms=policies.sink_batches_max_age_minutes * 60_000,
    )
    lg = state.open_ledger
    if blob_ledger is not None and (lg is None or lg.ledger_id != blob_ledger):
        raise Abort(LEDGER_MISMATCH)
    if lg is not None and blob_ledger is None and _is_full(lg, policies, now):
        _close_ledger(ml, state, lg, now, indexes)
        lg = None
    if lg is None:
        lg = LedgerInfo(ledger_id=state.next_ledger_id, created_ms=now, fragments=[])
        state.next_ledger_id += 1
        state.ledgers.append(lg)
    out: list[Position | None] = [None] * len(entries)
    run: list[int] = []
    for i in [*accepted, -1]:
        if run and (i < 0 or i != run[-1] + 1 or blobs[i] != blobs[run[-1]]):
            _add_fragment(lg, entries, offsets, blobs[run[0]], run, out)
            run = []
        if i >= 0:
            run.append(i)
    closed = False
    if _is_full(lg, policies, now):
        _close_ledger(ml, state, lg, now, indexes)
        closed = True
    return out, lg.ledger_id, closed


_BLOB_KEYS: dict[tuple[TopicName, str], str] = {}


def _blob_key(topic: TopicName, blob: str) -> str:
    """``paths.data_blob(topic, blob)``, remembered: a producer names the blob it appends to
    in every commit (the id checked and the key formatted once, not once per commit)."""
    k = (topic, blob)
    key = _BLOB_KEYS.get(k)
    if key is None:
        if len(_BLOB_KEYS) >= 4096:
            _BLOB_KEYS.clear()
        key = _BLOB_KEYS[k] = paths.data_blob(topic, blob)
    return key


#: A publish's own check of the state before its entries are appended, given the commit's
#: time: it raises (a domain error, or ``Abort``) to refuse, and may change the state (renew a
#: lease, record a sink batch).
Guard = Callable[[ManifestState, int], None]


class Publish:
    """One manifest commit that publishes written entries (module docstring).

    ``entries[i]`` is stored in blob ``blobs[i]`` at ``offsets[i]``; ``guard`` runs first in
    every attempt; ``follows`` and ``blob_ledger`` are :func:`apply_entries`'. ``durable``:
    the entries' blobs are still being synced by the caller (``before_link`` waits for it),
    so the journal record names them as its dependencies (FORMAT.md, "Journal"); staged
    blobs, durable before the commit, need not be named. After :meth:`commit`, ``ledger_id``
    is the ledger the entries went to and ``closed`` whether it was closed after them.
    """

    __slots__ = (
        "blob_ledger",
        "blobs",
        "closed",
        "dedup",
        "durable",
        "entries",
        "follows",
        "guard",
        "indexes",
        "ledger_id",
        "ml",
        "offsets",
        "policies",
    )

    def __init__(
        self,
        ml: ManagedLedger,
        entries: list[PendingEntry],
        blobs: list[str],
        offsets: list[int],
        *,
        policies: Policies,
        dedup: bool,
        guard: Guard | None = None,
        follows: list[bool] | None = None,
        blob_ledger: int | None = None,
        durable: bool = False,
    ) -> None:
        self.ml = ml
        self.entries = entries
        self.blobs = blobs
        self.offsets = offsets
        self.policies = policies
        self.dedup = dedup
        self.guard = guard
        self.follows = follows
        self.blob_ledger = blob_ledger
        self.durable = durable
        #: The ledger index blobs the last attempt's rollover names (written before it).
        self.indexes: list[tuple[str, bytes]] = []
        self.ledger_id: int | None = None
        self.closed = False

    def change(self, state: ManifestState) -> list[Position | None]:
        """The manifest change: the guard, then :func:`apply_entries`."""
        now = self.ml.clock()
        if self.guard is not None:
            self.guard(state, now)
        out, self.ledger_id, self.closed = apply_entries(
            self.ml,
            state,
            self.entries,
            self.blobs,
            self.offsets,
            policies=self.policies,
            now=now,
            dedup=self.dedup,
            follows=self.follows,
            blob_ledger=self.blob_ledger,
            indexes=self.indexes,
        )
        return out

    def before_write(self, state: ManifestState) -> None:
        """Write the attempt's index blobs. Each is named uniquely per attempt and never
        replaced: a writer that goes on to lose the manifest race cannot touch the index the
        winner's manifest names."""
        store = self.ml.store
        for key, data in self.indexes:
            if not store.put_if_absent(key, data) and store.get(key) != data:
                raise CommitConflict(f"ledger index {store.url(key)} exists already")

    def depends_on(self) -> list[tuple[str, int]]:
        """The data files (store keys, with the length each must have) the published state
        names, for the journal record of a ``durable`` publish on a store that appends."""
        if not (self.durable and self.ml.store.supports_append):
            return []
        topic = self.ml.topic
        blobs, entries, offsets = self.blobs, self.entries, self.offsets
        if len(blobs) == 1:  # (a producer's usual commit: one entry)
            return [(_blob_key(topic, blobs[0]), offsets[0] + entries[0].size)]
        ends: dict[str, int] = {}
        for e, blob, off in zip(entries, blobs, offsets):
            key = _blob_key(topic, blob)
            ends[key] = max(ends.get(key, 0), off + e.size)
        return sorted(ends.items())

    def commit(self, before_link: Callable[[], None] | None = None) -> Any:
        """Commit: each entry's position (None: a dropped duplicate), or the value of the
        ``Abort`` that stopped it (:data:`LEDGER_MISMATCH`: ``blob_ledger`` is no longer the open
        ledger; a guard's own value). ``before_link`` runs once the manifest's bytes are
        durable, before they become visible (the producer waits there for its data fsync)."""
        _, result = self.ml.manifest.commit(
            self.change,
            before_write=self.before_write,
            before_link=before_link,
            durable_with=self.depends_on(),
        )
        return result
