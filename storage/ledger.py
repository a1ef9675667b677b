"""The managed ledger of one topic or partition: ledgers of entries on a blob store.

Writers append entry bytes to a blob of their own, then publish them with one manifest commit
that assigns entry ids (a *fragment*: a run of entries in one blob). A blob belongs to exactly
one ledger, so retention can delete a ledger's blobs with it. Readers see only what a manifest
version names, so nothing uncommitted is ever visible.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from filepulsar.dispatch.dedup import DedupStatus, DedupTracker
from filepulsar.storage import jsontext, paths
from filepulsar.storage.blobstore import BlobNotFound
from filepulsar.storage.blobstore_local import Appender
from filepulsar.storage.blobstore_port import BlobStore
from filepulsar.storage.entry import (
    CHECKSUM,
    MAX_ENTRY_SIZE,
    EntryFormatError,
    RawEntry,
    complete,
    iter_entries,
)
from filepulsar.storage.errors import (
    BlobStoreError,
    BlobTruncated,
    ChecksumError,
    CommitConflict,
    CorruptDataError,
    DataLossError,
    ProducerFenced,
)
from filepulsar.storage.manifest import Fragment, LedgerInfo, ManifestState, ManifestStore
from filepulsar.storage.names import TopicName
from filepulsar.storage.policies import Policies
from filepulsar.storage.versioned_protocol import Abort

log = logging.getLogger(__name__)

_MISMATCH = "ledger-mismatch"
_MAX_CACHED_FRAGMENTS = 1024


@dataclass(frozen=True, order=True, slots=True)
class Position:
    """An entry's place in the managed ledger."""

    ledger_id: int
    entry_id: int


#: Before the first entry of any managed ledger.
EARLIEST = Position(-1, -1)


def encode_index(ledger_id: int, fragments: list[Fragment]) -> bytes:
    """A closed ledger's index file: ``{"ledger": id, "fragments": [...]}`` and a checksum line
    (the manifest's framing)."""
    body = json.dumps(
        {"ledger": ledger_id, "fragments": [f.to_json() for f in fragments]},
        separators=(",", ":"),
    ).encode()
    return jsontext.frame(body)


def decode_index(raw: bytes, ledger_id: int, where: str) -> list[Fragment]:
    """The fragments of ledger ``ledger_id`` from its index file ``where`` (a key).

    Files named with a nonce must carry the checksum line; older names may also hold the
    unframed JSON written before checksums existed.

    Raises
    ------
    CorruptDataError
        If the file is truncated or damaged, or describes another ledger; names ``where``.
    """
    parsed = paths.parse_ledger_index(where)
    legacy = (parsed is None or parsed[2] == "") and b"\ncrc32c=" not in raw
    what = f"index of ledger {ledger_id} ({where})"
    try:
        body = raw if legacy else jsontext.unframe(raw, what)
        d = jsontext.loads(body)
        frags = [Fragment.from_json(f) for f in d["fragments"]]
        ok = d["ledger"] == ledger_id and all(
            isinstance(f.blob, str)
            and all(
                isinstance(x, int) and x >= 0
                for x in (f.first_entry, f.count, f.offset, f.length, f.messages)
            )
            for f in frags
        )
    except CorruptDataError as e:
        raise CorruptDataError(str(e), ledger_id=ledger_id) from e
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptDataError(f"{what} is unreadable: {e}", ledger_id=ledger_id) from e
    if not ok:
        raise CorruptDataError(
            f"{what} holds another ledger or malformed fragments", ledger_id=ledger_id
        )
    return frags


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


#: Called with the error when a reader that skips lost data passes a damaged or missing part.
OnReadError = Callable[[Exception], None]


@dataclass(slots=True)
class ReadEntry:
    """A committed, verified entry and where it is (``topic`` names the managed ledger)."""

    ledger_id: int
    entry_id: int
    raw: RawEntry
    topic: str = ""

    def stored(self, columns: Collection[str] | None = None) -> pa.RecordBatch:
        """The entry's stored columns, or those of ``columns`` (see :meth:`RawEntry.stored`).

        Raises
        ------
        CorruptDataError
            Naming the topic, ledger and entry, if the payload does not decode.
        """
        try:
            return self.raw.stored(columns)
        except EntryFormatError as e:
            raise CorruptDataError(
                f"corrupt entry in topic {self.topic}, ledger {self.ledger_id}, entry "
                f"{self.entry_id}: {e}",
                topic=self.topic,
                ledger_id=self.ledger_id,
                entry_id=self.entry_id,
            ) from e

    def messages(self) -> pa.Table:
        """The entry's messages in ``MESSAGE_SCHEMA`` (see :meth:`RawEntry.messages`); decode
        failures raise :class:`CorruptDataError` with the location, as :meth:`stored`."""
        h = self.raw.header
        return complete(self.stored(), [h.sequence_id], [h.num_messages])


class ManagedLedger:
    """One managed ledger (a non-partitioned topic or one partition).

    Cheap to construct; holds a manifest cache and an LRU of closed-ledger indexes.
    """

    def __init__(
        self, store: BlobStore, topic: TopicName, *, clock: Callable[[], int] | None = None
    ):
        self.store = store
        self.topic = topic
        self.partition = topic.partition_index
        self.manifest = ManifestStore(store, topic, clock=clock)
        self.clock = self.manifest.clock
        self._indexes: OrderedDict[str, list[Fragment]] = OrderedDict()
        # (blob, offset, length) of a fragment → byte offsets of its entries (+ the end)
        self._offsets: OrderedDict[tuple[str, int, int], list[int]] = OrderedDict()
        self._lock = threading.Lock()

    def state(self, *, refresh: bool = True) -> ManifestState:
        return self.manifest.latest(refresh=refresh)

    # ------------------------------------------------------------------ reading
    def fragments(self, lg: LedgerInfo) -> list[Fragment]:
        """The fragments of ``lg`` (from the manifest if open, its index blob if closed)."""
        if lg.is_open:
            return lg.fragments or []
        assert lg.index is not None
        with self._lock:
            frags = self._indexes.get(lg.index)
            if frags is not None:
                self._indexes.move_to_end(lg.index)
                return frags
        key = paths.topic_key(self.topic, lg.index)
        try:
            raw = self.store.get(key)
        except BlobNotFound as e:
            raise DataLossError(
                f"index of ledger {lg.ledger_id} of {self.topic} is gone ({key})"
            ) from e
        try:
            frags = decode_index(raw, lg.ledger_id, key)
        except CorruptDataError as e:
            raise CorruptDataError(
                f"{self.topic}: {e}", topic=str(self.topic), ledger_id=lg.ledger_id
            ) from e
        with self._lock:
            self._indexes[lg.index] = frags
            while len(self._indexes) > 256:
                self._indexes.popitem(last=False)
        return frags

    def next_position(self, state: ManifestState, pos: Position) -> Position | None:
        """The position after ``pos`` (EARLIEST gives the first entry), or None at the end."""
        for lg in state.ledgers_from(pos.ledger_id):
            if lg.ledger_id == pos.ledger_id:
                if pos.entry_id + 1 < lg.entries:
                    return Position(lg.ledger_id, pos.entry_id + 1)
                continue
            if lg.entries:
                return Position(lg.ledger_id, 0)
        return None

    def read_entries(
        self,
        state: ManifestState,
        start: Position,
        *,
        end: Position | None = None,
        max_entries: int | None = None,
        max_bytes: int | None = None,
        on_error: OnReadError | None = None,
    ) -> list[ReadEntry]:
        """Committed entries from ``start`` (inclusive) to ``end`` (inclusive), in order.

        Stops after ``max_entries`` entries or once ``max_bytes`` stored bytes are reached (at
        least one entry is returned if any is available).

        Raises
        ------
        DataLossError
            If ``start`` lies in a ledger retention deleted, or a blob is missing.
        ChecksumError, CorruptDataError
            Naming the topic, ledger and entry that failed verification.
        """
        return list(
            self.iter_entries(
                state,
                start,
                end=end,
                max_entries=max_entries,
                max_bytes=max_bytes,
                on_error=on_error,
            )
        )

    def iter_entries(
        self,
        state: ManifestState,
        start: Position,
        *,
        end: Position | None = None,
        max_entries: int | None = None,
        max_bytes: int | None = None,
        on_error: OnReadError | None = None,
    ) -> Iterator[ReadEntry]:
        """Lazy form of :meth:`read_entries`.

        A fragment is read whole (and verified) the first time; its entry offsets are then
        cached, so later reads of a few entries fetch and verify only those bytes — reading a
        100 MB fragment a few entries at a time stays linear.

        With ``on_error`` (a reader told to skip what is lost), a deleted ledger, a missing
        blob or a corrupt entry is passed to it (the error names what is skipped) and reading
        goes on: after a damaged entry at the next one, or -- when the damage hides where the
        next entries start -- at the next fragment.
        """
        if 0 <= start.ledger_id < state.trimmed_before:
            lost = DataLossError(
                f"{self.topic}: ledger {start.ledger_id} was deleted by retention; the "
                f"first remaining ledger is {state.trimmed_before}"
            )
            if on_error is None:
                raise lost
            on_error(lost)
        left = max_entries
        budget = max_bytes
        for lg in state.ledgers_from(start.ledger_id):
            if not lg.entries:
                continue
            if end is not None and lg.ledger_id > end.ledger_id:
                return
            first = start.entry_id if lg.ledger_id == start.ledger_id else 0
            last = lg.entries - 1
            if end is not None and lg.ledger_id == end.ledger_id:
                last = min(last, end.entry_id)
            for frag in self.fragments(lg):
                f_end = frag.first_entry + frag.count - 1
                if f_end < first or frag.first_entry > last:
                    continue
                a = max(first, frag.first_entry) - frag.first_entry
                b = min(last, f_end) - frag.first_entry
                for e in self._read_span(lg.ledger_id, frag, a, b, left, budget, on_error):
                    yield e
                    if left is not None:
                        left -= 1
                    if budget is not None:
                        budget -= e.raw.size
                    if (left is not None and left <= 0) or (budget is not None and budget <= 0):
                        return

    def _read_span(
        self,
        ledger_id: int,
        frag: Fragment,
        a: int,
        b: int,
        left: int | None,
        budget: int | None,
        on_error: OnReadError | None = None,
    ) -> list[ReadEntry]:
        """Entries ``a..b`` (indexes within ``frag``), cut to ``left`` entries / ``budget``
        bytes (at least one)."""
        key = (frag.blob, frag.offset, frag.length)
        with self._lock:
            offs = self._offsets.get(key)
            if offs is not None:
                self._offsets.move_to_end(key)
        if offs is None:
            whole = self._read_fragment(ledger_id, frag, on_error)
            if len(whole) < frag.count:  # damaged entries were skipped: nothing to cache
                return [e for e in whole if a <= e.entry_id - frag.first_entry <= b]
            offs = [e.raw.offset for e in whole] + [frag.offset + frag.length]
            with self._lock:
                self._offsets[key] = offs
                while len(self._offsets) > _MAX_CACHED_FRAGMENTS:
                    self._offsets.popitem(last=False)
            return whole[a : b + 1]
        if left is not None:
            b = min(b, a + max(left, 1) - 1)
        if budget is not None:
            stop = a
            while stop < b and offs[stop + 1] - offs[a] < budget:
                stop += 1
            b = stop
        return self._read_entries_at(ledger_id, frag, a, b - a + 1, offs[a], offs[b + 1], on_error)

    def _read_fragment(
        self, ledger_id: int, frag: Fragment, on_error: OnReadError | None = None
    ) -> list[ReadEntry]:
        return self._read_entries_at(
            ledger_id, frag, 0, frag.count, frag.offset, frag.offset + frag.length, on_error
        )

    def _read_entries_at(
        self,
        ledger_id: int,
        frag: Fragment,
        index: int,
        count: int,
        lo: int,
        hi: int,
        on_error: OnReadError | None = None,
    ) -> list[ReadEntry]:
        """Read and verify ``count`` entries of ``frag`` from its ``index``-th, at bytes
        ``[lo, hi)`` of its blob; errors name the topic, ledger and entry (and go to
        ``on_error``, if given, with reading going on as :meth:`iter_entries` says)."""
        key = paths.data_blob(self.topic, frag.blob)
        first_entry = frag.first_entry + index
        topic = str(self.topic)
        where = (
            f"topic {topic}, ledger {ledger_id}, entries {first_entry}.."
            f"{first_entry + count - 1} ({self.store.root}/{key})"
        )
        if not 0 <= lo <= hi or hi - lo > count * MAX_ENTRY_SIZE:
            # Checked before reading: a damaged manifest must not make a reader allocate more
            # than the entries it names can hold.
            raise CorruptDataError(
                f"corrupt fragment in {where}: bytes [{lo}, {hi}) cannot hold {count} entries",
                topic=topic,
                ledger_id=ledger_id,
                entry_id=first_entry,
            )
        try:
            # Committed fragment bytes never change: a local store may map them (no copy).
            data = memoryview(self.store.get_range_view(key, lo, hi))
        except BlobNotFound as e:
            lost = DataLossError(
                f"{topic}: data of ledger {ledger_id} entries {first_entry}.."
                f"{first_entry + count - 1} is gone ({self.store.root}/{key})"
            )
            if on_error is None:
                raise lost from e
            on_error(lost)
            return []
        except BlobTruncated as e:
            # The blob lost bytes a commit published: damaged, like a failed checksum.
            damaged = CorruptDataError(
                f"corrupt data in {where}: the blob is shorter than its fragment ({e})",
                topic=topic,
                ledger_id=ledger_id,
                entry_id=first_entry,
            )
            if on_error is None:
                raise damaged from e
            on_error(damaged)
            return []
        except BlobStoreError as e:
            # Not data loss (it may be transient): never skipped, always reported.
            raise BlobStoreError(
                f"reading {where} failed: {e}",
                topic=topic,
                ledger_id=ledger_id,
                entry_id=first_entry,
            ) from e
        out: list[ReadEntry] = []
        pos, next_id, last_id = lo, first_entry, first_entry + count - 1
        while True:
            try:
                for raw in iter_entries(data[pos - lo :], last_id - next_id + 1, pos):
                    out.append(ReadEntry(ledger_id, next_id, raw, topic))
                    next_id += 1
                return out
            except EntryFormatError as e:
                entry_id = min(next_id, last_id)
                lost_rest = e.resume is None and next_id < last_id
                cls = ChecksumError if e.kind == CHECKSUM else CorruptDataError
                err = cls(
                    f"corrupt entry in topic {topic}, ledger {ledger_id}, entry {entry_id} "
                    f"({self.store.root}/{key}): {e}"
                    + (f"; entries {entry_id}..{last_id} cannot be located" if lost_rest else ""),
                    topic=topic,
                    ledger_id=ledger_id,
                    entry_id=entry_id,
                )
                if on_error is None:
                    raise err from e
                on_error(err)
                if e.resume is None or next_id > last_id:
                    return out
                next_id += 1  # skip the damaged entry, go on after it
                pos = e.resume

    def find_by_publish_time(self, state: ManifestState, publish_time: int) -> Position | None:
        """The first entry whose publish time is >= ``publish_time`` (None if none is)."""
        for lg in state.ledgers:
            if not lg.entries or lg.max_publish < publish_time:
                continue
            for frag in self.fragments(lg):
                if frag.max_publish < publish_time:
                    continue
                for e in self._read_fragment(lg.ledger_id, frag):
                    if e.raw.header.publish_time >= publish_time:
                        return Position(e.ledger_id, e.entry_id)
        return None


class LedgerWriter:
    """Writes one producer session's entries to a managed ledger and commits them.

    Not thread-safe: one writer thread per instance. The producer's lease in the manifest is
    checked and renewed by every commit; losing it raises :class:`ProducerFenced`.
    """

    def __init__(
        self,
        ml: ManagedLedger,
        *,
        producer_name: str,
        session: str,
        policies: Policies,
        durable: bool = True,
    ) -> None:
        self.ml = ml
        self.producer_name = producer_name
        self.session = session
        self.policies = policies
        self.durable = durable
        self._appender: Appender | None = None
        self._blob: str | None = None
        self._blob_seq = 0
        self._blob_ledger: int | None = None

    def _new_blob_id(self) -> str:
        self._blob_seq += 1
        return f"{self.session}-{self._blob_seq:06d}"

    def _write(self, entries: list[PendingEntry]) -> tuple[str, list[int]]:
        """Write the entries' bytes (not yet synced); return the blob id and their offsets."""
        store = self.ml.store
        parts = [p for e in entries for p in e.parts]
        if store.supports_append:
            if self._appender is None:
                self._blob = self._new_blob_id()
                self._blob_ledger = None
                self._appender = store.open_append(paths.data_blob(self.ml.topic, self._blob))
            base = self._appender.write_many(parts)
        else:
            self._blob = self._new_blob_id()
            self._blob_ledger = None
            store.put(paths.data_blob(self.ml.topic, self._blob), b"".join(parts))
            base = 0
        offsets = []
        pos = base
        for e in entries:
            offsets.append(pos)
            pos += e.size
        assert self._blob is not None
        return self._blob, offsets

    def _sync(self) -> None:
        if self._appender is not None and self.durable:
            self._appender.sync()

    def _start_sync(self) -> None:
        """Start the data fsync in the background; :meth:`_sync` (called by the commit
        before it writes the manifest that names the bytes) waits for it."""
        if self._appender is not None and self.durable:
            self._appender.start_sync()

    def _drop_blob(self) -> None:
        if self._appender is not None:
            self._appender.close()
        self._appender = None
        self._blob = None
        self._blob_ledger = None

    def append(
        self,
        entries: list[PendingEntry],
        *,
        dedup: bool,
        follows: list[bool] | None = None,
    ) -> list[Position | None]:
        """Write and commit ``entries`` in order; None marks a duplicate that was dropped.

        ``follows[i]`` makes entry ``i`` share entry ``i-1``'s dedup decision (the chunks of
        one message). Returns only once the entries are durable and committed.

        Raises
        ------
        ProducerFenced
            If this session's lease is gone or another producer holds the topic exclusively.
        """
        return self.append_stream([entries], dedup=dedup, follows=follows)

    def append_stream(
        self,
        groups: Iterable[list[PendingEntry]],
        *,
        dedup: bool,
        follows: list[bool] | None = None,
    ) -> list[Position | None]:
        """Like :meth:`append` for entries produced group by group.

        Each group is written as soon as it arrives and its buffers are released (set to
        ``[]``), so a large bulk write never holds all its bytes in memory; one sync and one
        commit publish everything at the end.
        """
        entries: list[PendingEntry] = []
        blobs: list[str] = []
        offsets: list[int] = []
        for group in groups:
            if not group:
                continue
            if entries and self._appender is not None and self.durable:
                # More than one group: write back what is already written while this one is
                # encoded and written, so the final sync has little left (bulk sends).
                self._appender.start_flush()
            blob, offs = self._write(group)
            for e in group:
                e.parts = []
            entries.extend(group)
            blobs.extend([blob] * len(group))
            offsets.extend(offs)
        if not entries:
            return []
        # The data fsync runs while the commit reads its base and applies the change; the
        # commit waits for it before it writes the manifest (FORMAT.md: data durable first).
        self._start_sync()
        while True:
            closed_after: list[bool] = [False]
            result = self._commit(entries, blobs, offsets, dedup, follows, closed_after)
            if result is _MISMATCH:
                # Another writer rolled the ledger our blob belongs to: copy our bytes into a
                # fresh blob (re-read from the old one, which stays an unreferenced orphan).
                blobs, offsets = self._rewrite(entries, blobs, offsets)
                continue
            assert isinstance(result, list)
            if closed_after[0] or not self.ml.store.supports_append:
                self._drop_blob()
            return result

    def _rewrite(
        self, entries: list[PendingEntry], blobs: list[str], offsets: list[int]
    ) -> tuple[list[str], list[int]]:
        store = self.ml.store
        self._drop_blob()
        for e, blob, off in zip(entries, blobs, offsets):
            e.parts = [store.get_range(paths.data_blob(self.ml.topic, blob), off, off + e.size)]
        blob, offs = self._write(entries)
        for e in entries:
            e.parts = []
        self._sync()
        return [blob] * len(entries), offs

    def _commit(
        self,
        entries: list[PendingEntry],
        blobs: list[str],
        offsets: list[int],
        dedup: bool,
        follows: list[bool] | None,
        closed_after: list[bool],
    ) -> list[Position | None] | str:
        pol = self.policies
        blob_ledger = self._blob_ledger
        indexes: list[tuple[str, bytes]] = []

        def change(state: ManifestState) -> list[Position | None]:
            now = self.ml.clock()
            lease = state.producers.get(self.producer_name)
            if lease is None or lease.session != self.session:
                raise ProducerFenced(
                    f"producer {self.producer_name!r} on {self.ml.topic} lost its registration "
                    "(lease expired or taken over)"
                )
            if lease.epoch != state.topic_epoch and lease.access_mode != "Shared":
                raise ProducerFenced(
                    f"producer {self.producer_name!r} on {self.ml.topic} was fenced by a newer "
                    "exclusive producer"
                )
            lease.expires_ms = now + pol.producer_lease_ms
            out, ledger_id, closed = apply_entries(
                self.ml,
                state,
                entries,
                blobs,
                offsets,
                policies=pol,
                now=now,
                dedup=dedup,
                follows=follows,
                blob_ledger=blob_ledger,
                indexes=indexes,
            )
            closed_after[0] = closed
            self._blob_ledger = ledger_id
            return out

        def before_write(state: ManifestState) -> None:
            # The entries' bytes are durable before any manifest names them.
            self._sync()
            # Named uniquely per attempt and never replaced: a writer that goes on to lose
            # the manifest race cannot touch the index the winner's manifest names.
            store = self.ml.store
            for key, data in indexes:
                if not store.put_if_absent(key, data) and store.get(key) != data:
                    raise CommitConflict(f"ledger index {store.url(key)} exists already")

        _, result = self.ml.manifest.commit(change, before_write=before_write)
        return result

    def renew_lease(self) -> None:
        """Extend this session's lease (an idle producer calls it periodically).

        Raises
        ------
        ProducerFenced
            If the lease is already gone.
        """
        name, session, lease_ms = self.producer_name, self.session, self.policies.producer_lease_ms

        def change(state: ManifestState) -> None:
            lease = state.producers.get(name)
            if lease is None or lease.session != session:
                raise ProducerFenced(
                    f"producer {name!r} on {self.ml.topic} lost its registration "
                    "(lease expired or taken over)"
                )
            lease.expires_ms = self.ml.clock() + lease_ms

        self.ml.manifest.commit(change)

    def close(self) -> None:
        self._drop_blob()


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
    lg.index = key[len(paths.topic_dir(ml.topic)) + 1 :]
    lg.fragments = None
    lg.closed_ms = now


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
    duplicates; ``follows[i]`` shares entry ``i-1``'s decision), rolls the open ledger over per
    ``policies`` (closing it records an index blob in ``indexes`` for ``before_write``), and
    adds one fragment per run of consecutive entries of one blob. ``blob_ledger`` is the ledger
    an appended-to blob already belongs to (None for a fresh blob); a mismatch raises
    ``Abort(_MISMATCH)``. Returns each entry's position (None: dropped duplicate), the ledger
    used, and whether it was closed after this append.
    """
    indexes.clear()
    accepted = list(range(len(entries)))
    if dedup:
        tracker = DedupTracker()
        for name, seq in state.dedup.items():
            tracker.record_persisted(name, seq)
        tracker.reset_pushed()
        accepted = []
        for i, e in enumerate(entries):
            if follows and follows[i] and i > 0:
                if accepted and accepted[-1] == i - 1:
                    accepted.append(i)
                continue
            if e.sequence_id < 0:
                accepted.append(i)
                continue
            st = tracker.check(e.producer_name, e.sequence_id, e.highest_sequence_id)
            if st is DedupStatus.NOT_DUP:
                tracker.record_persisted(e.producer_name, e.sequence_id, e.highest_sequence_id)
                accepted.append(i)
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
        raise Abort(_MISMATCH)
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


def new_session_id() -> str:
    """A unique id for a producer session (names its blobs)."""
    return uuid.uuid4().hex[:20]
