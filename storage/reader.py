"""Reading messages: entries → Arrow tables without a per-message Python loop, and a tailing
reader over a (partitioned) topic.

Entry-level fields (publish time, producer, ledger/entry ids, batch index) are spread to the
messages with numpy ``repeat``/``arange``; only chunked messages (rare, large) are handled one
by one when they are reassembled. A fetch of a few messages (a consumer woken by one commit)
needs no table at all: :class:`MessageRows` gives the same values per column as Python lists.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from filepulsar.dispatch.clock import waits_of
from filepulsar.storage import paths
from filepulsar.storage.blobstore import BlobNotFound
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.compaction import CompactedView, ViewEntry, load_view
from filepulsar.storage.entry import (
    MESSAGE_SCHEMA,
    SMALL_ROWS,
    complete,
    numpy_to_arrow,
    schema_subset,
    small_int_array,
    strings_to_arrow,
)
from filepulsar.storage.errors import DataLossError
from filepulsar.storage.ledger import EARLIEST, ManagedLedger, Position, ReadEntry
from filepulsar.storage.manifest import ManifestState
from filepulsar.storage.messageid import MessageId
from filepulsar.storage.names import TopicName
from filepulsar.storage.retention_skips import RetentionSkips
from filepulsar.storage.schemas import version_of
from filepulsar.storage.topics import ensure_topic, require_topic
from filepulsar.storage.versioned.watch import CommitWaiter

log = logging.getLogger(__name__)

#: Columns of a table of read messages (storage-level names; times are epoch ms).
READ_SCHEMA = pa.schema(
    [
        *MESSAGE_SCHEMA,
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("ledger_id", pa.int64(), nullable=False),
        pa.field("entry_id", pa.int64(), nullable=False),
        pa.field("batch_index", pa.int32(), nullable=False),
        pa.field("publish_time", pa.int64(), nullable=False),
        pa.field("producer_name", pa.string(), nullable=False),
        pa.field("deliver_at", pa.int64()),
        pa.field("schema_version", pa.int64()),
    ]
)


def read_schema(columns: Collection[str] | None = None) -> pa.Schema:
    """:data:`READ_SCHEMA`, or the part of it naming ``columns`` (in schema order; built
    once per set of names)."""
    return schema_subset(READ_SCHEMA, columns)


def _run_table(run: list[ReadEntry], columns: Collection[str] | None) -> pa.Table:
    """Messages of entries that share their stored columns, in MESSAGE_SCHEMA (or the part
    of it naming ``columns``)."""
    table = pa.Table.from_batches([e.stored(columns) for e in run])
    return complete(
        table,
        [e.header.sequence_id for e in run],
        [e.header.num_messages for e in run],
        columns,
    )


def entries_to_table(
    entries: Sequence[ReadEntry], partition: int, columns: Collection[str] | None = None
) -> pa.Table:
    """All messages of ``entries`` (in order) as a table in :data:`READ_SCHEMA`.

    ``columns`` (names of :data:`READ_SCHEMA`, at least one) narrows the table to those
    columns, in schema order: only they are decoded and built (a payload is not even
    decompressed when no stored column is asked for; the entries' checksums were verified).

    Chunk entries are returned as they are stored (one row per chunk); see
    :class:`ChunkAssembler` to rebuild the messages.

    Raises
    ------
    CorruptDataError
        Naming the topic, ledger and entry whose payload does not decode.
    ValueError
        If ``columns`` names no column of :data:`READ_SCHEMA` (the table would have no rows).
    """
    schema = read_schema(columns)
    if not schema.names:
        raise ValueError(
            f"columns {sorted(columns or ())} name none of the read columns {READ_SCHEMA.names}"
        )
    if not entries:
        return schema.empty_table()
    want = set(schema.names)
    n = len(entries)
    counts = np.fromiter((e.header.num_messages for e in entries), np.int64, n)
    total = int(counts.sum())
    cols: list[Any] = []
    if any(name in want for name in MESSAGE_SCHEMA.names):
        parts = []
        run: list[ReadEntry] = []
        for e in entries:
            if run and run[-1].flags & ~0xFF != e.flags & ~0xFF:
                parts.append(_run_table(run, columns))
                run = []
            run.append(e)
        parts.append(_run_table(run, columns))
        msgs = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        cols.extend(msgs.columns)

    # The header-derived columns follow the stored ones in READ_SCHEMA.
    derived = schema.names[len(cols) :]
    if total <= SMALL_ROWS:
        # A few messages (what a consumer woken by one commit reads): packed directly from
        # the values MessageRows derives, rather than through NumPy.
        few = MessageRows(entries, partition, stored=False)
        for name in derived:
            values = few.column(name)
            if name == "producer_name":
                cols.append(strings_to_arrow(values))
            else:
                cols.append(small_int_array(values, schema.field(name).type))
        return pa.Table.from_arrays(cols, schema=schema)

    # Each entry's value repeated for each of its messages (one entry takes the constant
    # directly, without the per-entry arrays).
    def spread(value_of: Callable[[ReadEntry], int]) -> np.ndarray:
        if n == 1:
            return np.full(total, value_of(entries[0]), dtype=np.int64)
        return np.repeat(np.fromiter(map(value_of, entries), np.int64, n), counts)

    for name in derived:
        if name == "partition":
            cols.append(numpy_to_arrow(np.full(total, partition, dtype=np.int32)))
        elif name == "batch_index":
            if n == 1:
                within = np.arange(total, dtype=np.int64)
            else:
                starts = np.cumsum(counts) - counts
                within = np.arange(total, dtype=np.int64) - np.repeat(starts, counts)
            batched = spread(lambda e: e.header.batched).astype(np.bool_)
            cols.append(numpy_to_arrow(np.where(batched, within, -1).astype(np.int32)))
        elif name == "producer_name":
            # A small dictionary spread by index (no Python string per message).
            if n == 1:
                cols.append(strings_to_arrow([entries[0].header.producer_name] * total))
            else:
                names: dict[str, int] = {}
                per_entry = [names.setdefault(e.header.producer_name, len(names)) for e in entries]
                codes = np.repeat(np.asarray(per_entry, np.int32), counts)
                cols.append(strings_to_arrow(list(names)).take(numpy_to_arrow(codes)))
        else:
            value_of, null_if = _HEADER_INTS[name]
            arr = spread(value_of)
            cols.append(numpy_to_arrow(arr, mask=None if null_if is None else null_if(arr)))
    return pa.Table.from_arrays(cols, schema=schema)


#: The int64 header-derived columns of READ_SCHEMA: each entry's value (all its messages
#: share it) and when that value means null (the predicate takes one value or a NumPy array).
_HEADER_INTS: dict[str, tuple[Callable[[ReadEntry], int], Callable[[Any], Any] | None]] = {
    "ledger_id": (lambda e: e.ledger_id, None),
    "entry_id": (lambda e: e.entry_id, None),
    "publish_time": (lambda e: e.header.publish_time, None),
    # Null unless the message was delayed / written with a schema (as Pulsar's metadata).
    "deliver_at": (lambda e: e.header.deliver_at, lambda v: v == 0),
    "schema_version": (lambda e: version_of(e.header.schema_version), lambda v: v < 0),
}


class MessageRows:
    """The messages of a few entries as Python values per :data:`READ_SCHEMA` column, built
    per column when first asked for, without an Arrow table.

    What a consumer woken by one commit delivers: ``column(name)`` equals
    ``entries_to_table(entries, partition).column(name).to_pylist()`` (a test compares every
    column over real entries), and building that table instead cost about 0.5 ms more per
    receive when the process had been idle (cold caches; ``bench.latency_breakdown``).
    Chunk entries are rows as they are stored, as in :func:`entries_to_table`.

    The payloads are decoded and validated here, as :func:`entries_to_table` does them, so a
    damaged one raises :class:`~filepulsar.storage.errors.CorruptDataError` (naming the topic,
    ledger and entry) when the entries are read, not when a message is looked at. ``stored=False``
    skips them: only the header-derived columns can then be asked for.
    """

    __slots__ = ("_cols", "_entries", "_partition", "_stored", "num_rows")

    def __init__(
        self,
        entries: Sequence[ReadEntry],
        partition: int,
        *,
        stored: bool = True,
        num_rows: int | None = None,
    ) -> None:
        self._entries = list(entries)
        self._partition = partition
        #: (``num_rows``: the messages of ``entries``, where the caller knows them: entries
        #: of one message each.)
        self.num_rows = (
            sum([e.header.num_messages for e in self._entries]) if num_rows is None else num_rows
        )
        # Per entry its stored columns, or (one message with only a value) that value.
        self._stored: list[pa.RecordBatch | bytes | dict[str, Any]] | None = (
            [_stored_or_value(e) for e in self._entries] if stored else None
        )
        self._cols: dict[str, list[Any]] = {}

    def column(self, name: str) -> list[Any]:
        """One value per message (None for null).

        Raises
        ------
        KeyError
            If ``name`` is not a column of :data:`READ_SCHEMA`, or is a stored column and
            the rows were built with ``stored=False``.
        """
        col = self._cols.get(name)
        if col is None:
            col = self._cols[name] = self._build(name)
        return col

    def _build(self, name: str) -> list[Any]:
        es = self._entries
        if name in _MESSAGE_NAMES:
            if self._stored is None:
                raise KeyError(f"{name!r} is a stored column; these rows were built without them")
            out: list[Any] = []
            for e, batch in zip(es, self._stored):
                h = e.header
                if isinstance(batch, bytes):
                    one = {"value": batch, "sequence_id": h.sequence_id}
                    out.append(one.get(name))
                    continue
                if isinstance(batch, dict):
                    out.append(h.sequence_id if name == "sequence_id" else batch.get(name))
                    continue
                i = batch.schema.get_field_index(name)
                if i >= 0:
                    out.extend(batch.column(i).to_pylist())
                elif name == "sequence_id":  # not stored: the entry's, counted up
                    out.extend(range(h.sequence_id, h.sequence_id + h.num_messages))
                else:
                    out.extend([None] * h.num_messages)
            return out
        if name == "partition":
            return [self._partition] * self.num_rows
        if name == "batch_index":
            return [k if e.header.batched else -1 for e in es for k in range(e.header.num_messages)]
        if name == "producer_name":
            return [e.header.producer_name for e in es for _ in range(e.header.num_messages)]
        rule = _HEADER_INTS.get(name)
        if rule is None:
            raise KeyError(
                f"{name!r} is not a read column; they are {', '.join(READ_SCHEMA.names)}"
            )
        value_of, null_if = rule
        out = []
        for e in es:
            v = value_of(e)
            out.extend([None if null_if is not None and null_if(v) else v] * e.header.num_messages)
        return out

    def sizes(self) -> np.ndarray:
        """Payload bytes per message (0 for a null value)."""
        values = self.column("value")
        return np.fromiter((0 if v is None else len(v) for v in values), np.int64, len(values))


_MESSAGE_NAMES = frozenset(MESSAGE_SCHEMA.names)


def _stored_or_value(e: ReadEntry) -> pa.RecordBatch | bytes | dict[str, Any]:
    """An entry's stored columns: read without pyarrow where the entry is one message with
    a value alone (the value) or with a key and/or ordering key too (its columns by name),
    else the record batch."""
    value = e.single_value()
    if value is not None:
        return value
    row = e.single_row()
    return e.stored() if row is None else row


@dataclass
class _Pending:
    num_chunks: int
    first: Position
    rows: dict[int, pa.Table] = field(default_factory=dict)


#: ``fetch_missing(uuid, before, chunk_ids)``: entries holding those chunks of message ``uuid``,
#: looked for before position ``before`` (see :class:`ChunkAssembler`).
FetchMissing = Callable[[str, Position, list[int]], Sequence[ReadEntry]]


class ChunkAssembler:
    """Rebuilds chunked messages from chunk rows, across calls.

    A message appears once its last chunk has been seen, with the id of its last chunk and the
    concatenated value. Incomplete messages are kept meanwhile (:attr:`pending` counts them).

    A reader that starts in the middle of a chunked message (a Spark task or micro-batch whose
    range begins after the message's first chunks) passes ``fetch_missing``: when a last chunk
    arrives without the earlier ones, it is asked for them, and the message is emitted whole
    where its last chunk lies. Without it, or if they cannot be found, the message is dropped.
    """

    def __init__(self, fetch_missing: FetchMissing | None = None) -> None:
        self._pending: dict[str, _Pending] = {}
        self._fetch = fetch_missing

    def feed(
        self,
        entries: Sequence[ReadEntry],
        partition: int,
        columns: Collection[str] | None = None,
    ) -> pa.Table:
        """Messages of ``entries``, with chunks reassembled (possibly from earlier calls).

        ``columns`` narrows the table as in :func:`entries_to_table`; keep it the same from
        call to call (chunks kept from an earlier call are joined with this call's).
        """
        if not any(e.header.chunk is not None for e in entries):
            return entries_to_table(entries, partition, columns)
        out = []
        plain: list[ReadEntry] = []
        for e in entries:
            c = e.header.chunk
            if c is None:
                plain.append(e)
                continue
            if plain:
                out.append(entries_to_table(plain, partition, columns))
                plain = []
            row = entries_to_table([e], partition, columns)
            p = self._pending.get(c.uuid)
            if p is None:
                p = self._pending[c.uuid] = _Pending(c.num_chunks, e.position)
            p.rows[c.chunk_id] = row
            if c.chunk_id == c.num_chunks - 1:
                del self._pending[c.uuid]
                if len(p.rows) != c.num_chunks and self._fetch is not None:
                    missing = [i for i in range(c.num_chunks) if i not in p.rows]
                    for fe in self._fetch(c.uuid, p.first, missing):
                        fc = fe.header.chunk
                        if fc is not None and fc.uuid == c.uuid and fc.chunk_id not in p.rows:
                            p.rows[fc.chunk_id] = entries_to_table([fe], partition, columns)
                if len(p.rows) != c.num_chunks:
                    continue  # a chunk is missing (e.g. before the start position): drop it
                if "value" in row.column_names:
                    parts = [p.rows[i].column("value")[0].as_py() for i in range(c.num_chunks)]
                    value = pa.array([b"".join(parts)], pa.binary())
                    row = row.set_column(0, READ_SCHEMA.field("value"), value)
                out.append(row)
        if plain:
            out.append(entries_to_table(plain, partition, columns))
        return pa.concat_tables(out) if out else read_schema(columns).empty_table()

    @property
    def pending(self) -> int:
        return len(self._pending)


class _PartitionCursor:
    def __init__(
        self, ml: ManagedLedger, start: MessageId, inclusive: bool, compacted: bool = False
    ):
        self.ml = ml
        self.assembler = ChunkAssembler()
        self.skip_upto: MessageId | None = None
        self.last_only: Position | None = None
        self.compacted = compacted
        self.view: CompactedView | None = None
        self.queue: deque[ViewEntry] = deque()
        #: Retention passing this cursor: the messages it deleted unread, counted and logged.
        self.skips = RetentionSkips(ml, f"reader of {ml.topic}")
        self.last: Position = EARLIEST
        self.seek(start, inclusive)

    @property
    def skipped(self) -> int:
        """Messages retention deleted after this cursor's position before it read them."""
        return self.skips.skipped

    def _skip_trimmed(self, state: ManifestState) -> bool:
        """If retention deleted messages after ``last`` that this cursor had not read, count
        them, log them once and move past them. Whether it did."""
        trimmed = self.skips.passed(state, self.last)
        if trimmed is None:
            return False
        self.last = trimmed
        self.skip_upto = self.last_only = None
        return True

    def _load_view(self) -> None:
        """With ``compacted``: the view entries after ``last``, read before the topic after
        the view's horizon (storage.compaction)."""
        self.view, self.queue = None, deque()
        if not self.compacted:
            return
        view = load_view(self.ml.store, self.ml.topic, self.ml.state().incarnation)
        if view is None or (self.last.ledger_id, self.last.entry_id) >= view.horizon:
            return
        self.view = view
        last = (self.last.ledger_id, self.last.entry_id)
        self.queue = deque(ve for ve in view.index if ve.position > last)

    def _read_view(self, max_entries: int) -> pa.Table:
        view = self.view
        assert view is not None
        taken = [self.queue.popleft() for _ in range(min(max_entries, len(self.queue)))]
        try:
            entries = [view.read(ve) for ve in taken]
        except BlobNotFound:
            # A newer compaction replaced this view and deleted it: go on from the newest.
            self._load_view()
            return READ_SCHEMA.empty_table()
        if taken:
            self.last = taken[-1].position
        if not self.queue:
            self.last = max(self.last, view.horizon)
            self.view = None
        table = self.assembler.feed(entries, self.ml.partition)
        hidden = {ve.position: ve.obscured for ve in taken if ve.obscured}
        if hidden and table.num_rows:
            ledger = table.column("ledger_id").to_pylist()
            entry = table.column("entry_id").to_pylist()
            bidx = table.column("batch_index").to_pylist()
            keep = [
                b not in hidden.get(Position(lg, e), ()) for lg, e, b in zip(ledger, entry, bidx)
            ]
            table = table.filter(pa.array(keep))
        return table

    def seek(self, start: MessageId, inclusive: bool) -> None:
        self.assembler = ChunkAssembler()
        self.skip_upto = None
        self.last_only = None
        if start == MessageId.earliest or start.ledger_id < 0:
            self.last = EARLIEST
        elif start == MessageId.latest:
            lid, eid = self.ml.state().last_position()
            if inclusive and eid >= 0:
                # Pulsar: latest, inclusive, is the last message (of the last entry's batch).
                self.last = Position(lid, eid - 1)
                self.last_only = Position(lid, eid)
            else:
                self.last = Position(lid, eid)
        else:
            pos = Position(start.ledger_id, start.entry_id)
            # Re-read the start entry and filter it by batch index.
            self.last = Position(pos.ledger_id, pos.entry_id - 1)
            if inclusive:
                self.skip_upto = MessageId(
                    start.partition, start.ledger_id, start.entry_id, start.batch_index - 1
                )
            else:
                self.skip_upto = start
        self.skips.start_at(self.ml.state(), self.last)
        self._load_view()

    def _read_entries(self, max_entries: int) -> list[ReadEntry] | None:
        """The next entries after ``last``; what retention deleted meanwhile is skipped
        (counted and logged), also when it is deleted between reading the manifest and the
        entries. Each such race moves ``last`` past what retention deleted, so trying again
        makes progress: it goes on until it reads (a third race in one call is logged)."""
        races = 0
        while True:
            state = self.ml.state()
            self._skip_trimmed(state)
            nxt = self.ml.next_position(state, self.last)
            if nxt is None:
                return None
            try:
                entries = self.ml.read_entries(state, nxt, max_entries=max_entries)
            except DataLossError:
                if not self._skip_trimmed(self.ml.manifest.latest(strict=True)):
                    raise  # missing, not deleted by retention: damage
                races += 1
                if races == 3:
                    log.warning(
                        "reader of %s: retention deleted the entries it was about to read "
                        "three times in one read; it reads on after them",
                        self.ml.topic,
                    )
                continue
            self.skips.read(state, entries)
            return entries

    def read(self, max_entries: int) -> pa.Table | None:
        if self.view is not None:
            table = self._read_view(max_entries)
            if self.view is None:  # the view is done: the topic's count after its horizon
                self.skips.start_at(self.ml.state(), self.last)
        else:
            entries = self._read_entries(max_entries)
            if not entries:
                return None
            self.last = Position(entries[-1].ledger_id, entries[-1].entry_id)
            table = self.assembler.feed(entries, self.ml.partition)
        if self.last_only is not None:
            lo, self.last_only = self.last_only, None
            at = (table.column("ledger_id").to_numpy() == lo.ledger_id) & (
                table.column("entry_id").to_numpy() == lo.entry_id
            )
            if at.any():
                at[np.flatnonzero(at)[-1]] = False  # keep the entry's last message
                table = table.filter(numpy_to_arrow(~at))
        if self.skip_upto is not None:
            s = self.skip_upto
            self.skip_upto = None
            ledger = table.column("ledger_id").to_numpy()
            entry = table.column("entry_id").to_numpy()
            bidx = table.column("batch_index").to_numpy()
            before = (ledger < s.ledger_id) | (
                (ledger == s.ledger_id)
                & ((entry < s.entry_id) | ((entry == s.entry_id) & (bidx <= s.batch_index)))
            )
            table = table.filter(numpy_to_arrow(~before))
        return table


class Reader:
    """Reads a topic (every partition of a partitioned one) from a start position, tailing.

    ``start_message_id``: ``MessageId.earliest``, ``MessageId.latest`` or a message id (for a
    partitioned topic an id applies to its own partition; the others start at earliest).
    ``read_compacted``: a partition read from before its compaction horizon gives the
    compacted view (``filepulsar.storage.compaction``) up to the horizon, then the messages after
    it. ``clock``: wall ms for the managed ledger; a :class:`filepulsar.dispatch.clock.ManualClock`
    also drives ``read_batch``'s waiting. Messages retention deletes before the reader reaches
    them are skipped, logged and counted (:attr:`skipped_by_retention`).
    """

    def __init__(
        self,
        store: BlobStore,
        topic: str | TopicName,
        start_message_id: MessageId = MessageId.earliest,
        *,
        start_message_id_inclusive: bool = False,
        clock: Callable[[], int] | None = None,
        auto_create: bool = False,
        read_compacted: bool = False,
    ) -> None:
        self.topic = TopicName.parse(topic) if isinstance(topic, str) else topic
        self._inclusive = start_message_id_inclusive
        # read_batch waits on the clock when it is a whole Clock (a ManualClock in tests).
        self._waits = waits_of(clock)
        n = (
            ensure_topic(store, self.topic, auto_create=True)
            if auto_create
            else require_topic(store, self.topic)
        )
        topics = [self.topic.partition(i) for i in range(n)] if n else [self.topic]
        self._cursors = []
        for t in topics:
            ml = ManagedLedger(store, t, clock=clock)
            start = start_message_id
            if start.partition >= 0 and start.partition != t.partition_index and n:
                start = MessageId.earliest
            self._cursors.append(
                _PartitionCursor(ml, start, start_message_id_inclusive, read_compacted)
            )
        self._next = 0
        self._skipped_before_close = 0
        # Woken when a commit lands in a partition's manifest folder (inotify on a local
        # disk; polling elsewhere: storage.versioned.watch). Made before the first look.
        self._waiter = CommitWaiter(
            store, [paths.manifest_dir(t) for t in topics], clock=self._waits
        )

    def read_batch(self, max_entries: int = 100, timeout_ms: int | None = 0) -> pa.Table:
        """Messages of up to ``max_entries`` entries from one partition (round-robin).

        Waits up to ``timeout_ms`` for new data (None: forever); returns an empty table if none
        arrived.
        """
        deadline = None if timeout_ms is None else self._waits.monotonic() + timeout_ms / 1000
        if timeout_ms != 0:
            self._waiter.restart()
        while True:
            for _ in range(len(self._cursors)):
                cur = self._cursors[self._next]
                self._next = (self._next + 1) % len(self._cursors)
                table = cur.read(max_entries)
                if table is not None and table.num_rows:
                    return table
            if deadline is None:
                self._waiter.wait()
                continue
            left = deadline - self._waits.monotonic()
            if left <= 0:
                return READ_SCHEMA.empty_table()
            self._waiter.wait(left)

    def wait(self, timeout: float | None = None) -> None:
        """Wait until a commit may have landed on the topic, at most ``timeout`` seconds (see
        :class:`~filepulsar.storage.versioned.watch.CommitWaiter`; a look that found nothing
        since the previous wait is followed by this, never by a fixed sleep)."""
        self._waiter.wait(timeout)

    def restart_wait(self) -> None:
        """Start a new wait sequence (the next polling pause is 1 ms again)."""
        self._waiter.restart()

    @property
    def skipped_by_retention(self) -> int:
        """Messages retention deleted after this reader's position before it read them
        (every partition's). Each such skip is also logged as a warning, once, with the
        range of entries; the reader goes on at the first message that remains (as Pulsar's
        readers do)."""
        return self._skipped_before_close + sum(cur.skipped for cur in self._cursors)

    def has_message_available(self) -> bool:
        for cur in self._cursors:
            if cur.queue:
                return True
            if cur.ml.next_position(cur.ml.state(), cur.last) is not None:
                return True
        return False

    def seek(self, target: MessageId | int) -> None:
        """Move to a message id (that message included only if the reader was created with
        ``start_message_id_inclusive``), or to the first message published at or after
        ``target`` ms."""
        for cur in self._cursors:
            if isinstance(target, MessageId):
                mid = target
                if (
                    target.partition >= 0
                    and target.partition != cur.ml.partition
                    and len(self._cursors) > 1
                ):
                    continue
                cur.seek(mid, inclusive=self._inclusive)
            else:
                pos = cur.ml.find_by_publish_time(cur.ml.state(), int(target))
                if pos is None:
                    cur.seek(MessageId.latest, inclusive=False)
                else:
                    cur.seek(MessageId(cur.ml.partition, pos.ledger_id, pos.entry_id), True)

    def close(self) -> None:
        self._skipped_before_close = self.skipped_by_retention
        self._waiter.close()
        self._cursors = []
