"""The managed ledger of one topic or partition: ledgers of entries on a blob store (read side).

Writers append entry bytes to a blob of their own, then publish them with one manifest commit
that assigns entry ids (a *fragment*: a run of entries in one blob). A blob belongs to exactly
one ledger, so retention can delete a ledger's blobs with it. Readers see only what a manifest
version names, so nothing uncommitted is ever visible.

This module owns the closed-ledger index file and reading (:class:`ManagedLedger`,
:class:`ReadEntry`; positions are :class:`~filepulsar.storage.position.Position`, re-exported
here); :mod:`filepulsar.storage.commit` applies written entries to a manifest and
:mod:`filepulsar.storage.writer` writes one producer session's entries.
"""

from __future__ import annotations

import bisect
import json
import logging
import operator
import threading
from array import array
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

import pyarrow as pa

from filepulsar.dispatch.lru import LruCache
from filepulsar.storage import jsontext, paths
from filepulsar.storage.blobstore import BlobNotFound
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.entry import (
    CHECKSUM,
    COLUMN_BITS,
    MAX_ENTRY_SIZE,
    R_FLAGS,
    R_OFFSET,
    R_PAYLOAD,
    R_SIZE,
    EntryFormatError,
    EntryHeader,
    RawEntry,
    Record,
    complete,
    entry_offsets,
    header_of,
    iter_records,
    raw_entry,
    record_of,
    single_row_of,
)
from filepulsar.storage.errors import (
    BlobStoreError,
    BlobTruncated,
    ChecksumError,
    CorruptDataError,
    DataLossError,
)
from filepulsar.storage.fragments import Fragment
from filepulsar.storage.manifest import LedgerInfo, ManifestState, ManifestStore
from filepulsar.storage.names import TopicName
from filepulsar.storage.position import EARLIEST as EARLIEST  # re-exported
from filepulsar.storage.position import Position

log = logging.getLogger(__name__)

_MAX_CACHED_FRAGMENTS = 1024
#: A scan of one-entry fragments fetches the bytes of each blob's for this many fragments
#: at once (:meth:`ManagedLedger._spans`), across gaps under ``_SPAN_GAP`` bytes, at most
#: ``_SPAN_BYTES`` a blob.
_SPAN_FRAGMENTS = 256
_SPAN_GAP = 4096
_SPAN_BYTES = 256 * 1024
#: A live read of at most this many whole fragments at the open ledger's end fetches each by
#: itself (:meth:`ManagedLedger._read_tail`): a look of a topic several producers write finds
#: a few, each in another writer's blob, and the walk that finds blobs' runs costs more
#: than it spares there.
_TAIL_FRAGMENTS = 8
_first_entry = operator.attrgetter("first_entry")


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
        d = jsontext.loads_stored(body)
        # (Fragment.from_json checks each fragment: its blob a valid name, its counts and
        # offsets ints >= 0.)
        frags = [Fragment.from_json(f) for f in d["fragments"]]
        ok = d["ledger"] == ledger_id
    except CorruptDataError as e:
        raise CorruptDataError(str(e), ledger_id=ledger_id) from e
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptDataError(f"{what} is unreadable: {e}", ledger_id=ledger_id) from e
    if not ok:
        raise CorruptDataError(f"{what} holds another ledger", ledger_id=ledger_id)
    return frags


#: Called with the error when a reader that skips lost data passes a damaged or missing part.
OnReadError = Callable[[Exception], None]


_NOT_ASKED: Any = object()

_new_object = object.__new__


class ReadEntry:
    """A committed, verified entry and where it is (``topic`` names the managed ledger).

    Holds the entry as its :data:`~filepulsar.storage.entry.Record` (an exact tuple the cyclic
    GC stops tracking), not as a :class:`RawEntry` and its header: an entry a process keeps
    (its entry cache and Key_Shared runs, 50,000 and more, most of them only scanned) is
    then one object the GC goes over at every full pass, not three. :attr:`header` is built
    the first time it is asked for (a delivery asks), :attr:`raw` each time (equal, not the
    same object); :attr:`size` is the stored bytes.
    Equal to an entry of the same ledger, entry, raw entry, topic and key hash; unhashable.
    """

    __slots__ = (
        "_header",
        "_position",
        "_rec",
        "_row",
        "entry_id",
        "key_hash",
        "ledger_id",
        "size",
        "topic",
    )

    ledger_id: int
    entry_id: int
    topic: str
    #: The sticky-key hash of the entry, once a Key_Shared dispatch computed it (the object
    #: is shared by the consumers of a process: see storage.entry_cache).
    key_hash: int | None
    #: The entry's stored bytes (:attr:`RawEntry.size`).
    size: int
    _rec: Record
    #: :attr:`position`, once asked for (dispatch asks for it each time it scans the entry).
    _position: Position | None
    #: :attr:`header`, once asked for.
    _header: EntryHeader | None
    #: :meth:`single_row`'s answer, once asked for (``_NOT_ASKED`` before).
    _row: Any

    def __init__(
        self,
        ledger_id: int,
        entry_id: int,
        raw: RawEntry,
        topic: str = "",
        key_hash: int | None = None,
    ) -> None:
        self._set(ledger_id, entry_id, record_of(raw), topic)
        self.key_hash = key_hash

    @classmethod
    def of_record(cls, ledger_id: int, entry_id: int, rec: Record, topic: str) -> ReadEntry:
        """The entry ``rec`` (from :func:`~filepulsar.storage.entry.iter_records`) at
        ``ledger_id:entry_id`` of ``topic`` (no :class:`RawEntry` built)."""
        e = _new_object(cls)
        e.ledger_id = ledger_id
        e.entry_id = entry_id
        e._rec = rec
        e.topic = topic
        e.size = rec[R_SIZE]
        e.key_hash = e._position = e._header = None
        e._row = _NOT_ASKED
        return e

    def _set(self, ledger_id: int, entry_id: int, rec: Record, topic: str) -> None:
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self._rec = rec
        self.topic = topic
        self.size = rec[R_SIZE]
        self._position = self._header = None
        self._row = _NOT_ASKED

    @property
    def raw(self) -> RawEntry:
        """The entry as a :class:`RawEntry` (built per call: keep it where used twice)."""
        return raw_entry(self._rec, self.header)

    @property
    def header(self) -> EntryHeader:
        """``raw.header`` (built once, without the :class:`RawEntry`)."""
        h = self._header
        if h is None:
            h = self._header = header_of(self._rec)
        return h

    @property
    def flags(self) -> int:
        """``raw.flags``."""
        return self._rec[R_FLAGS]

    @property
    def offset(self) -> int:
        """``raw.offset``: where the entry starts in its blob."""
        return self._rec[R_OFFSET]

    @property
    def position(self) -> Position:
        """Where the entry is."""
        p = self._position
        if p is None:
            p = self._position = Position(self.ledger_id, self.entry_id)
        return p

    def _key(self) -> tuple[Any, ...]:
        return (self.ledger_id, self.entry_id, self._rec, self.topic, self.key_hash)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, ReadEntry)
        return self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]  # (mutable: key_hash and the memos)

    def __repr__(self) -> str:
        return (
            f"ReadEntry(ledger_id={self.ledger_id!r}, entry_id={self.entry_id!r}, "
            f"raw={self.raw!r}, topic={self.topic!r}, key_hash={self.key_hash!r})"
        )

    def __getstate__(self) -> tuple[Any, ...]:
        return (self.ledger_id, self.entry_id, self._rec, self.topic, self.key_hash)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        ledger_id, entry_id, rec, topic, key_hash = state
        self._set(ledger_id, entry_id, rec, topic)
        self.key_hash = key_hash

    def single_value(self) -> bytes | None:
        """:meth:`RawEntry.single_value`, without a :class:`RawEntry` built where the flags
        say the entry stores a column beside its value (every keyed send's entry): None."""
        if self._rec[R_FLAGS] & COLUMN_BITS:
            return None
        return self.raw.single_value()

    def single_row(self) -> dict[str, Any] | None:
        """:meth:`RawEntry.single_row`, decoded once per entry object: a Key_Shared dispatch
        hashes its key and a receiver queue delivers its value, and the consumers of a process
        share the object (:mod:`filepulsar.storage.entry_cache`). Read-only: every caller
        shares the dict."""
        row = self._row
        if row is _NOT_ASKED:
            r = self._rec
            row = self._row = single_row_of(r[R_FLAGS], r[4], r[5], r[6], r[R_PAYLOAD])
        return row

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
        h = self.header
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
        #: ``str(topic)``, formatted once (every entry read names it).
        self.topic_str = str(topic)
        self.partition = topic.partition_index
        # blob id -> its data blob's key, checked and formatted once per blob.
        self._blob_keys: dict[str, str] = {}
        self.manifest = ManifestStore(store, topic, clock=clock)
        self.clock = self.manifest.clock
        # Closed ledger's index blob -> its fragments (the 256 last used).
        self._indexes: LruCache[str, list[Fragment]] = LruCache(256)
        # (blob, offset) of a fragment → byte offsets of its entries, as far as located (+ their
        # end; a list that only ever grows: see _extend_offsets). A fragment only ever grows at
        # its end (storage.commit._extends), so the offsets of a shorter version of it are a
        # prefix of the longer one's. An ``array`` of int64, not a list: one object the
        # cyclic GC never goes over (a process reading one-entry fragments through
        # iter_entries keeps one a fragment, 1024 per managed ledger; read_entries keeps none
        # for them: see _read_list).
        self._offsets: LruCache[tuple[str, int], array[int]] = LruCache(_MAX_CACHED_FRAGMENTS)
        self._lock = threading.Lock()  # (guards both caches)

    def state(self, *, refresh: bool = True, drain: bool = True) -> ManifestState:
        """The newest manifest state (shared: read-only); ``refresh`` and ``drain`` as
        :meth:`~filepulsar.storage.versioned.VersionedStore.latest`'s."""
        return self.manifest.latest(refresh=refresh, drain=drain)

    def deleted_by_retention(self, e: DataLossError) -> bool:
        """Whether ``e`` (a read's) names a ledger retention has deleted: trimmed in the
        newest manifest, read strictly. A reader that read the manifest before the deletion
        then raced retention, and reads on after it; otherwise the data is lost."""
        return 0 <= e.ledger_id < self.manifest.latest(strict=True).trimmed_before

    # ------------------------------------------------------------------ reading
    def fragments(self, lg: LedgerInfo) -> list[Fragment]:
        """The fragments of ``lg`` (from the manifest if open, its index blob if closed)."""
        if lg.is_open:
            return lg.fragments or []
        assert lg.index is not None
        with self._lock:
            frags = self._indexes.get(lg.index)
        if frags is not None:
            return frags
        key = paths.topic_key(self.topic, lg.index)
        try:
            raw = self.store.get(key)
        except BlobNotFound as e:
            raise DataLossError(
                f"index of ledger {lg.ledger_id} of {self.topic} is gone ({key})",
                ledger_id=lg.ledger_id,
            ) from e
        try:
            frags = decode_index(raw, lg.ledger_id, key)
        except CorruptDataError as e:
            raise CorruptDataError(
                f"{self.topic}: {e}", topic=str(self.topic), ledger_id=lg.ledger_id
            ) from e
        with self._lock:
            self._indexes.put(lg.index, frags)
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
        if end is None and max_bytes is None and on_error is None:
            got = self._read_new(state, start, max_entries)
            if got is None:
                got = self._read_tail(state, start, max_entries)
            if got is not None:
                return got
            return self._read_list(state, start, max_entries)
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

        A fragment is fetched whole the first time and its entries located from their framing
        (the offsets are cached), so later reads of a few entries fetch only those bytes --
        reading a 100 MB fragment a few entries at a time stays linear. Each entry is verified
        (checksum, header) when it is reached, so only the entries read are checked; a
        fragment whose framing is damaged is verified whole, to say where.

        With ``on_error`` (a reader told to skip what is lost), a deleted ledger, a missing
        blob or a corrupt entry is passed to it (the error names what is skipped) and reading
        goes on: after a damaged entry at the next one, or -- when the damage hides where the
        next entries start -- at the next fragment.
        """
        if 0 <= start.ledger_id < state.trimmed_before:
            lost = self._trimmed(state, start)
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
                        budget -= e.size
                    if (left is not None and left <= 0) or (budget is not None and budget <= 0):
                        return

    def _read_list(
        self, state: ManifestState, start: Position, max_entries: int | None
    ) -> list[ReadEntry]:
        """:meth:`iter_entries` with no end, byte budget or ``on_error``, as a list (a scan
        of a backlog: about 120 entries a read). A fragment of one entry (every commit of a
        topic several producers write at a low rate, their blobs interleaved) is that
        entry's bytes: verified in one step, with no generator of :meth:`_read_span` and
        no offsets looked up or cached for it (one entry has nothing to locate), its bytes
        fetched with those of the next ones in its blob (:meth:`_spans`); a larger
        fragment read whole is taken from such a span too where one holds it (verified
        whole); the rest (a fragment read in part, or one no span holds, or the open
        ledger's last, which may grow) goes through :meth:`_read_span`."""
        if 0 <= start.ledger_id < state.trimmed_before:
            raise self._trimmed(state, start)
        out: list[ReadEntry] = []
        append = out.append
        left = 1 if max_entries is None or max_entries < 1 else max_entries
        unbounded = max_entries is None
        topic = self.topic_str
        of_record = ReadEntry.of_record
        fetch = self._fetch
        for lg in state.ledgers_from(start.ledger_id):
            # The bytes of the fragments of a blob, fetched at once for a window of the
            # fragments (see _spans), up to ``spans_to``.
            spans: dict[str, tuple[int, int, memoryview]] = {}
            spans_to = 0
            if not lg.entries:
                continue
            ledger_id = lg.ledger_id
            first = start.entry_id if ledger_id == start.ledger_id else 0
            last = lg.entries - 1
            frags = self.fragments(lg)
            # (The open ledger's last fragment may grow: a live reader reads its growth from
            # its cached offsets, so it goes through _read_span, which caches them.)
            growing = len(frags) - 1 if lg.is_open else -1
            # (The fragment holding ``first``: fragments are in entry order.)
            at = max(bisect.bisect_right(frags, first, key=_first_entry) - 1, 0)
            for i in range(at, len(frags)):
                frag = frags[i]
                fe = frag.first_entry
                if fe > last:
                    break
                if fe + frag.count <= first:
                    continue
                a = max(first, fe) - fe
                b = min(last, fe + frag.count - 1) - fe
                lo = frag.offset
                hi = lo + frag.length
                data: memoryview | None = None
                if (
                    i != growing
                    and a == 0
                    and b == frag.count - 1
                    and (unbounded or left >= frag.count)
                ):
                    # A whole fragment (of one entry, or a commit of several): its bytes
                    # from the span of its blob that holds them, if one does.
                    if i >= spans_to:
                        spans_to = i + (
                            _SPAN_FRAGMENTS if unbounded else min(_SPAN_FRAGMENTS, left)
                        )
                        spans = self._spans(frags, i, min(spans_to, len(frags)), growing)
                    span = spans.get(frag.blob)
                    if span is not None and span[0] <= lo and hi <= span[1]:
                        data = span[2][lo - span[0] : hi - span[0]]
                    elif frag.count == 1:
                        data = fetch(ledger_id, frag, 0, 1, lo, hi)
                        assert data is not None  # (no on_error: a failed fetch raises)
                if data is None:
                    n = len(out)
                    out.extend(
                        self._read_span(ledger_id, frag, a, b, None if unbounded else left, None)
                    )
                    got = len(out) - n
                elif frag.count == 1:
                    try:
                        for rec in iter_records(data, 1, lo):
                            append(of_record(ledger_id, fe, rec, topic))
                    except EntryFormatError:
                        # (Verified again where the error is named, and raised.)
                        out.extend(self._verify(ledger_id, frag, 0, 1, lo, data))
                        raise
                    got = 1
                else:
                    # (Verified whole, as _read_span verifies a fragment it reads whole.)
                    out.extend(self._verify(ledger_id, frag, 0, frag.count, lo, data))
                    got = frag.count
                if not unbounded:
                    left -= got
                    if left <= 0:
                        return out
        return out

    def _spans(
        self, frags: Sequence[Fragment], i: int, j: int, growing: int
    ) -> dict[str, tuple[int, int, memoryview]]:
        """The bytes of the fragments among ``frags[i:j]`` (but ``growing``, the open
        ledger's last), fetched once per blob where two or more of them follow each other in
        it (gaps under :data:`_SPAN_GAP` bytes, :data:`_SPAN_BYTES` in all at most): by blob,
        ``(lo, hi, bytes [lo, hi))``. A topic several producers write, each commit of a few
        entries, interleaves their blobs fragment by fragment, and a fetch per fragment (a
        system call, or a request) cost more than its entries' own work. A blob whose fetch
        fails is left out: each of its fragments' own fetch then says what is wrong and
        where."""
        runs: dict[str, list[int]] = {}  # blob -> [lo, hi, fragments]
        ended: set[str] = set()
        for k in range(i, j):
            f = frags[k]
            blob = f.blob
            if blob in ended:
                continue
            lo, hi = f.offset, f.offset + f.length
            r = runs.get(blob)
            if k == growing:
                ended.add(blob)
            elif r is None:
                runs[blob] = [lo, hi, 1]
            elif lo < r[1] or lo - r[1] > _SPAN_GAP or hi - r[0] > _SPAN_BYTES:
                ended.add(blob)
            else:
                r[1] = hi
                r[2] += 1
        out: dict[str, tuple[int, int, memoryview]] = {}
        for blob, (lo, hi, n) in runs.items():
            if n < 2:
                continue
            try:
                data = self.store.get_range_view(self._data_blob(blob), lo, hi)
            except BlobStoreError:
                continue
            out[blob] = (lo, hi, memoryview(data))
        return out

    def _trimmed(self, state: ManifestState, start: Position) -> DataLossError:
        return DataLossError(
            f"{self.topic}: ledger {start.ledger_id} was deleted by retention; the "
            f"first remaining ledger is {state.trimmed_before}",
            ledger_id=start.ledger_id,
        )

    def _read_new(
        self, state: ManifestState, start: Position, max_entries: int | None
    ) -> list[ReadEntry] | None:
        """:meth:`read_entries` of what a live reader reads, in one fetch: entries from
        ``start`` on in the open ledger's last fragment, where the offsets of the fragment's
        entries up to ``start`` are cached (a reader read up to it). None where that is not
        the case, or the framing of the new bytes does not hold the entries the manifest
        says: the general path reads them (and says what is wrong and where)."""
        lg = state.open_ledger
        if lg is None or lg.ledger_id != start.ledger_id or start.ledger_id < state.trimmed_before:
            return None
        frags = lg.fragments
        if not frags:
            return None
        frag = frags[-1]
        a = start.entry_id - frag.first_entry
        if a < 0 or a >= frag.count or frag.first_entry + frag.count != lg.entries:
            return None  # (not the last fragment's, or the ledger's entries end elsewhere)
        key = (frag.blob, frag.offset)
        end = frag.offset + frag.length
        with self._lock:
            offs = self._offsets.get(key)  # (as far as located; see _extend_offsets)
        if offs is None:
            return None
        known = len(offs) - 1
        b = frag.count - 1
        if max_entries is not None:
            b = min(b, a + max(max_entries, 1) - 1)
        ledger_id = start.ledger_id
        if known == frag.count and offs[known] == end:
            lo, hi = offs[a], offs[b + 1]  # (located already: by another reader)
            data = self._fetch(ledger_id, frag, a, b - a + 1, lo, hi)
        elif a == known and known < frag.count and offs[known] < end:
            # The fragment grew by the entries wanted (and maybe more) since its offsets were
            # cached: its new bytes, fetched once, locate them.
            lo = offs[known]
            grown = self._fetch(ledger_id, frag, known, frag.count - known, lo, end)
            if grown is None:
                return None
            if b == frag.count - 1:
                # Every new entry is wanted (the common case): one pass verifies them and
                # locates them (no pass over their framing first, no generator per entry).
                # Damaged: None, and the general path says what is wrong and where.
                got = self._located(ledger_id, frag.first_entry + a, grown, frag.count - known, lo)
                if got is None:
                    return None
                out, located = got
                located.append(end)
                self._extend_offsets(key, offs, known, located)
                return out
            tail = entry_offsets(grown, frag.count - known, lo)
            if tail is None:
                return None
            self._extend_offsets(key, offs, known, tail)
            data = grown[: tail[b - known + 1] - lo]
        else:
            return None
        if data is None:
            return None
        return list(self._verify(ledger_id, frag, a, b - a + 1, lo, data))

    def _read_tail(
        self, state: ManifestState, start: Position, max_entries: int | None
    ) -> list[ReadEntry] | None:
        """:meth:`read_entries` of what a live reader of a topic several producers write
        reads: a few whole fragments (at most :data:`_TAIL_FRAGMENTS`) at the open ledger's
        end, from the first entry of one of them, each fetched and verified in one step
        (most hold one entry: a commit each), with none of :meth:`_read_list`'s walk. None
        where that is not the case (``start`` inside a fragment, more fragments, more than
        ``max_entries`` entries, a damaged entry): :meth:`_read_list` reads them (a backlog's
        blobs a run each; and says what is wrong and where). The last fragment's offsets are
        cached as :meth:`_read_span` caches them, so that :meth:`_read_new` reads its
        growth."""
        lg = state.open_ledger
        first = start.entry_id
        if lg is None or lg.ledger_id != start.ledger_id or start.ledger_id < state.trimmed_before:
            return None
        n = lg.entries - first
        if n <= 0 or (max_entries is not None and n > max(max_entries, 1)):
            return None
        frags = lg.fragments
        if not frags:
            return None
        i = len(frags) - 1
        stop = max(0, len(frags) - _TAIL_FRAGMENTS)
        while i > stop and frags[i].first_entry > first:
            i -= 1
        if frags[i].first_entry != first or frags[-1].first_entry + frags[-1].count != lg.entries:
            return None
        ledger_id = lg.ledger_id
        out: list[ReadEntry] = []
        located: list[int] = []
        for frag in frags[i:]:
            lo = frag.offset
            data = self._fetch(ledger_id, frag, 0, frag.count, lo, lo + frag.length)
            assert data is not None  # (no on_error: a failed fetch raises)
            got = self._located(ledger_id, frag.first_entry, data, frag.count, lo)
            if got is None:
                return None
            out += got[0]
            located = got[1]  # (the last fragment's are cached)
        last = frags[-1]
        located.append(last.offset + last.length)
        self._cache_offsets((last.blob, last.offset), located)
        return out

    def _located(
        self, ledger_id: int, entry_id: int, data: bytes | memoryview, count: int, lo: int
    ) -> tuple[list[ReadEntry], list[int]] | None:
        """The ``count`` entries ``data`` holds (a blob's bytes from ``lo``), the first of
        them ``entry_id``, verified in one pass, and where each starts in the blob (no pass
        over their framing first, no generator per entry). None if one is damaged: the
        general path reads them again and says what is wrong and where."""
        topic = self.topic_str
        of_record = ReadEntry.of_record
        out: list[ReadEntry] = []
        located: list[int] = []
        try:
            for r in iter_records(data, count, lo):
                located.append(r[R_OFFSET])
                out.append(of_record(ledger_id, entry_id, r, topic))
                entry_id += 1
        except EntryFormatError:
            return None
        return out, located

    def _extend_offsets(
        self, key: tuple[str, int], offs: array[int], known: int, tail: list[int]
    ) -> array[int]:
        """The offsets of a grown fragment, cached: those of its first ``known`` entries in
        ``offs`` (cached) and ``tail`` (its new entries' offsets and their end, from
        ``offs[known]`` on). Extended in place where no other reader did meanwhile, not
        copied (a fragment gains an entry per commit, up to ``ledger_max_entries``: a copy
        per read grew with it). A cached list only ever grows so, by one slice assignment:
        each index a reader of it uses (up to the ``known`` it took) keeps its offset."""
        with self._lock:
            if self._offsets.peek(key) is offs and len(offs) == known + 1:
                offs[known:] = array("q", tail)
                return offs
        offs = offs[:known]
        offs.extend(tail)
        self._cache_offsets(key, offs)
        return offs

    def _read_span(
        self,
        ledger_id: int,
        frag: Fragment,
        a: int,
        b: int,
        left: int | None,
        budget: int | None,
        on_error: OnReadError | None = None,
    ) -> Iterator[ReadEntry]:
        """Entries ``a..b`` (indexes within ``frag``), cut to ``left`` entries / ``budget``
        bytes (at least one), each verified as it is reached (lazily: a reader that stops
        early checks no more)."""
        key = (frag.blob, frag.offset)
        end = frag.offset + frag.length
        with self._lock:
            offs = self._offsets.get(key)  # (as far as located; see _extend_offsets)
        data = None
        data_lo = frag.offset
        known = len(offs) - 1 if offs is not None else 0
        if offs is not None and known > frag.count:
            # Known up to a longer version of this fragment (a reader on an older state).
            offs = offs[: frag.count + 1] if offs[frag.count] == end else None
        elif offs is not None and known < frag.count and offs[known] < end:
            # The fragment grew since its offsets were cached: locate only the new entries.
            data_lo = offs[known]
            data = self._fetch(ledger_id, frag, known, frag.count - known, data_lo, end, on_error)
            if data is None:
                return
            tail = entry_offsets(data, frag.count - known, data_lo)
            if tail is None:  # damaged: the whole fragment's path says where
                offs, data, data_lo = None, None, frag.offset
            else:
                offs = self._extend_offsets(key, offs, known, tail)
        elif offs is not None and (known != frag.count or offs[known] != end):
            offs = None
        if offs is None:
            # First read of this fragment: fetch it whole and locate its entries. A read of
            # the whole fragment (a scan, a Spark task) locates them by verifying every one;
            # a read of some of them from their framing alone (no checksum pass over bytes
            # that may not be read). A damaged framing is verified whole too, which reports
            # (or skips, with on_error) the damage exactly where it is. Offsets found by
            # verifying are cached once every entry verified.
            data_lo = frag.offset
            data = self._fetch(ledger_id, frag, 0, frag.count, frag.offset, end, on_error)
            if data is None:
                return
            whole = a == 0 and b == frag.count - 1 and left is None and budget is None
            located = None if whole else entry_offsets(data, frag.count, frag.offset)
            if located is None:
                found: list[int] = []
                for e in self._verify(ledger_id, frag, 0, frag.count, frag.offset, data, on_error):
                    found.append(e.offset)
                    if a <= e.entry_id - frag.first_entry <= b:
                        yield e
                if len(found) == frag.count:
                    self._cache_offsets(key, [*found, end])
                return
            offs = self._cache_offsets(key, located)
        if left is not None:
            b = min(b, a + max(left, 1) - 1)
        if budget is not None:
            stop = a
            while stop < b and offs[stop + 1] - offs[a] < budget:
                stop += 1
            b = stop
        lo, hi = offs[a], offs[b + 1]
        if data is None or lo < data_lo:
            data = self._fetch(ledger_id, frag, a, b - a + 1, lo, hi, on_error)
            if data is None:
                return
        else:
            data = data[lo - data_lo : hi - data_lo]
        yield from self._verify(ledger_id, frag, a, b - a + 1, lo, data, on_error)

    def _cache_offsets(self, key: tuple[str, int], offs: list[int] | array[int]) -> array[int]:
        """Remember where a fragment's entries start (the least recently used forgotten);
        what is kept."""
        if not isinstance(offs, array):
            offs = array("q", offs)
        with self._lock:
            self._offsets.put(key, offs)
        return offs

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
        data = self._fetch(ledger_id, frag, index, count, lo, hi, on_error)
        if data is None:
            return []
        return list(self._verify(ledger_id, frag, index, count, lo, data, on_error))

    def _data_blob(self, blob: str) -> str:
        """The key of data blob ``blob`` (:func:`paths.data_blob`, checked once per blob)."""
        key = self._blob_keys.get(blob)
        if key is None:
            key = paths.data_blob(self.topic, blob)
            if len(self._blob_keys) >= _MAX_CACHED_FRAGMENTS:
                self._blob_keys.clear()
            self._blob_keys[blob] = key
        return key

    def _where(self, ledger_id: int, frag: Fragment, index: int, count: int) -> str:
        first_entry = frag.first_entry + index
        key = self._data_blob(frag.blob)
        return (
            f"topic {self.topic}, ledger {ledger_id}, entries {first_entry}.."
            f"{first_entry + count - 1} ({self.store.root}/{key})"
        )

    def _fetch(
        self,
        ledger_id: int,
        frag: Fragment,
        index: int,
        count: int,
        lo: int,
        hi: int,
        on_error: OnReadError | None = None,
    ) -> memoryview | None:
        """Bytes ``[lo, hi)`` of ``frag``'s blob, holding its ``count`` entries from the
        ``index``-th (None: missing or truncated, passed to ``on_error``)."""
        key = self._data_blob(frag.blob)
        first_entry = frag.first_entry + index
        topic = self.topic_str
        if not 0 <= lo <= hi or hi - lo > count * MAX_ENTRY_SIZE:
            # Checked before reading: a damaged manifest must not make a reader allocate more
            # than the entries it names can hold.
            raise CorruptDataError(
                f"corrupt fragment in {self._where(ledger_id, frag, index, count)}: bytes "
                f"[{lo}, {hi}) cannot hold {count} entries",
                topic=topic,
                ledger_id=ledger_id,
                entry_id=first_entry,
            )
        try:
            # Committed fragment bytes never change: a local store may map them (no copy).
            return memoryview(self.store.get_range_view(key, lo, hi))
        except BlobNotFound as e:
            lost = DataLossError(
                f"{topic}: data of ledger {ledger_id} entries {first_entry}.."
                f"{first_entry + count - 1} is gone ({self.store.root}/{key})",
                ledger_id=ledger_id,
            )
            if on_error is None:
                raise lost from e
            on_error(lost)
            return None
        except BlobTruncated as e:
            # The blob lost bytes a commit published: damaged, like a failed checksum.
            damaged = CorruptDataError(
                f"corrupt data in {self._where(ledger_id, frag, index, count)}: the blob is "
                f"shorter than its fragment ({e})",
                topic=topic,
                ledger_id=ledger_id,
                entry_id=first_entry,
            )
            if on_error is None:
                raise damaged from e
            on_error(damaged)
            return None
        except BlobStoreError as e:
            # Not data loss (it may be transient): never skipped, always reported.
            raise BlobStoreError(
                f"reading {self._where(ledger_id, frag, index, count)} failed: {e}",
                topic=topic,
                ledger_id=ledger_id,
                entry_id=first_entry,
            ) from e

    def _verify(
        self,
        ledger_id: int,
        frag: Fragment,
        index: int,
        count: int,
        lo: int,
        data: memoryview,
        on_error: OnReadError | None = None,
    ) -> Iterator[ReadEntry]:
        """The ``count`` entries of ``frag`` from its ``index``-th held by ``data`` (its blob's
        bytes from ``lo``), each verified as it is reached; errors name the topic, ledger and
        entry (and go to ``on_error``, if given, reading going on after a damaged entry when
        its framing says where the next one starts)."""
        first_entry = frag.first_entry + index
        topic = self.topic_str
        pos, next_id, last_id = lo, first_entry, first_entry + count - 1
        while True:
            try:
                of_record = ReadEntry.of_record
                for rec in iter_records(data[pos - lo :], last_id - next_id + 1, pos):
                    yield of_record(ledger_id, next_id, rec, topic)
                    next_id += 1
                return
            except EntryFormatError as e:
                entry_id = min(next_id, last_id)
                lost_rest = e.resume is None and next_id < last_id
                cls = ChecksumError if e.kind == CHECKSUM else CorruptDataError
                err = cls(
                    f"corrupt entry in topic {topic}, ledger {ledger_id}, entry {entry_id} "
                    f"({self.store.root}/{self._data_blob(frag.blob)}): {e}"
                    + (f"; entries {entry_id}..{last_id} cannot be located" if lost_rest else ""),
                    topic=topic,
                    ledger_id=ledger_id,
                    entry_id=entry_id,
                )
                if on_error is None:
                    raise err from e
                on_error(err)
                if e.resume is None or next_id > last_id:
                    return
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
                    if e.header.publish_time >= publish_time:
                        return Position(e.ledger_id, e.entry_id)
        return None
