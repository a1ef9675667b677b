"""The executor side of the Spark source: one task's messages as Arrow record batches.

Spark runs :func:`read_partition` in its Python workers with only the picklable
:class:`FilePulsarPartition` the driver planned (see :mod:`connector.source`). The hot path
never builds a Python object per message: entries are decoded into Arrow tables and every
column is built with Arrow/numpy kernels.

Reading streams: entries are fetched lazily and converted in groups of about
:data:`GROUP_ROWS` messages (the first group smaller, so Spark starts consuming early), and
each group goes to Spark as record batches of :data:`SPARK_BATCH_ROWS` rows.

Where a task's time goes (bench/bench_source.py reports it): checking each entry's CRC32C
and decoding its Arrow payload, one copy of each emitted column into the group's contiguous
arrays, and the columns the stored entries do not hold (``messageId``, ``topic``).
Fragments of local blobs are memory-mapped, not copied (``BlobStore.get_range_view``);
message ids are written from per-entry byte templates (:func:`_ids_from_layouts`). Spark
gets 10,000-row batches: handing it each entry's own arrays (no copy) costs Spark more in
per-batch work than the copy saves (a bare source handing Spark 1,000-row batches took a
median 1.45x the trigger time of 10,000-row ones here, on a loaded machine).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import InputPartition

from filepulsar.connector.schema import (
    SOURCE_ARROW_SCHEMA,
    Columns,
    arrow_schema_of,
    typed_schemas,
)
from filepulsar.connector.spark_schema import ValueSpec
from filepulsar.connector.spark_schema_decode import ValueDecoder, decode_columns
from filepulsar.storage.blobstore import BlobNotFound, open_blob_store
from filepulsar.storage.compaction import CompactedView, load_view
from filepulsar.storage.errors import CorruptDataError, DataLossError, TopicNotFound
from filepulsar.storage.ledger import ManagedLedger, Position, ReadEntry
from filepulsar.storage.manifest import ManifestState
from filepulsar.storage.names import TopicName
from filepulsar.storage.reader import ChunkAssembler

log = logging.getLogger(__name__)

#: ``n`` of an offset ``[ledger, entry, n]`` meaning "the whole entry".
WHOLE = -1
#: Rows per Arrow batch handed to Spark (Spark's own default for Arrow batches).
SPARK_BATCH_ROWS = 10_000
#: Messages decoded and converted together; the first group of a task is smaller so Spark
#: starts consuming while the rest is decoded.
GROUP_ROWS = 40_000
FIRST_GROUP_ROWS = 5_000
#: How many entries before a task's range are searched for the first chunks of a chunked
#: message whose last chunk lies in the range.
CHUNK_LOOKBACK_ENTRIES = 100_000

_US = pa.timestamp("us", tz="UTC")
_PROPS = SOURCE_ARROW_SCHEMA.field("properties").type


@dataclass(frozen=True)
class FilePulsarPartition(InputPartition):
    """One task's share: entries of one managed ledger, picklable.

    ``start`` is exclusive (an offset), ``end`` inclusive. ``positions`` (Shared/Key_Shared)
    lists explicit entries instead of a range; ``redelivery`` their redelivery counts.
    ``incarnation`` is the topic's as the driver saw it ("" unknown): a task that finds
    another one reads a topic deleted and created again, and reports that as data loss.
    ``start_latest``/``end_latest`` (batch reads) resolve "latest" when the task runs, so
    every action on a DataFrame reads the topic as it is then. ``loss_ok``: the range began
    at "earliest" or a time, so what retention deleted before it is not a loss.
    ``columns`` (name, nullable): the columns the read emits (``()``: every column).
    ``value``: a typed read's reader schema (``valueFormat`` struct or flatten; None: values
    as bytes). ``read_compacted``: read the topic's compacted view up to its horizon, then
    the topic after it.
    """

    root: str
    storage_options: dict[str, Any]
    topic: str
    start: tuple[int, int, int]
    end: tuple[int, int, int]
    positions: tuple[tuple[int, int, int], ...] = ()
    fail_on_data_loss: bool = True
    property_filter: tuple[tuple[str, tuple[str, ...]], ...] = ()
    incarnation: str = ""
    start_latest: bool = False
    end_latest: bool = False
    loss_ok: bool = False
    columns: Columns = ()
    value: ValueSpec | None = None
    read_compacted: bool = False


def data_loss(msg: str, fail_on_data_loss: bool) -> None:
    """Raise :class:`DataLossError` (``failOnDataLoss=true``) or log a warning and go on, as
    Spark's Kafka source does."""
    if fail_on_data_loss:
        raise DataLossError(msg + "; set failOnDataLoss=false to skip what is lost and read on")
    log.warning("failOnDataLoss=false, skipping lost data: %s", msg)


def check_trimmed(topic: str, m: ManifestState, start: Sequence[int], fail: bool) -> None:
    """Report (raise or log) messages after offset ``start`` that retention deleted."""
    pos = (start[0], start[1])
    if pos[0] >= 0 and pos < tuple(m.trimmed_last):
        data_loss(
            f"{topic}: messages after {pos[0]}:{pos[1]} up to {m.trimmed_last[0]}:"
            f"{m.trimmed_last[1]} were deleted by retention (ledgers before "
            f"{m.trimmed_before}) before this query read them",
            fail,
        )


def recreated_message(topic: str, seen: str, now: str) -> str:
    return (
        f"{topic} was deleted and created again (incarnation {seen} is now {now}): messages "
        "of the deleted topic this query had not read may have been lost"
    )


def after(m: ManifestState, ml: ManagedLedger, off: Sequence[int]) -> Position | None:
    """First entry to read after offset ``off`` (the entry of ``off`` itself if partial)."""
    if off[2] != WHOLE:
        return Position(off[0], off[1])
    return ml.next_position(m, Position(off[0], off[1]))


# --------------------------------------------------------------------------- columns


def _runs(ledger: np.ndarray, entry: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start row of each run of rows from one entry, and each row's run number."""
    n = len(ledger)
    change = np.empty(n, np.bool_)
    if n:
        change[0] = True
        np.not_equal(ledger[1:], ledger[:-1], out=change[1:])
        change[1:] |= entry[1:] != entry[:-1]
    return np.flatnonzero(change), np.cumsum(change) - 1


@functools.lru_cache(maxsize=64)
def _id_layout(lp: int, first: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Byte layout of the ids of one entry's rows with batch indexes ``first..first+k-1``
    (``first`` -1: one non-batched row) after a prefix of ``lp`` bytes: where each row starts
    (and the end), the suffixes in place with zeros for the prefixes, and where byte ``j`` of
    the prefix lies in each row (``k`` x ``lp``)."""
    sufs = [""] if first < 0 else [str(b) for b in range(first, first + k)]
    rowst = np.zeros(k + 1, np.int64)
    np.cumsum(np.fromiter(map(len, sufs), np.int64, k) + lp, out=rowst[1:])
    tpl = np.frombuffer("".join(["\0" * lp + s for s in sufs]).encode(), np.uint8)
    return rowst, tpl, rowst[:-1, None] + np.arange(lp)


def _ids_from_layouts(
    ledger: np.ndarray,
    entry: np.ndarray,
    part: int,
    bidx: np.ndarray,
    starts: np.ndarray,
    run: np.ndarray,
) -> pa.Array | None:
    """Message id strings of batch entries written straight into one byte buffer, or None
    when the rows are not whole runs of consecutive batch indexes (a property filter).

    Consecutive entries with the same prefix length, first batch index and message count
    share one byte layout (:func:`_id_layout`): their ids are one template repeated, with
    only the prefix bytes that differ between the entries written per row (numpy, no
    per-message Python and no per-message string join).
    """
    n = len(ledger)
    if not n:
        return None
    b0 = bidx[starts]
    if not np.array_equal(bidx, b0[run] + (np.arange(n) - starts[run])):
        return None
    counts = np.diff(starts, append=n)
    prefixes = [
        f"{lg}:{en}:{part}:" if b >= 0 else f"{lg}:{en}:{part}"
        for lg, en, b in zip(ledger[starts].tolist(), entry[starts].tolist(), b0.tolist())
    ]
    keys = list(zip(map(len, prefixes), b0.tolist(), counts.tolist()))
    cuts = [i for i in range(1, len(keys)) if keys[i] != keys[i - 1]]
    if len(cuts) > 16 + len(keys) // 8:
        return None  # entries of many shapes: the generic join is cheaper
    datas, offs = [], []
    base = 0
    for lo, hi in zip([0, *cuts], [*cuts, len(keys)]):
        lp, first, k = keys[lo]
        nr = hi - lo
        rowst, tpl0, where = _id_layout(lp, first, k)
        width = int(rowst[-1])
        ptab = np.frombuffer("".join(prefixes[lo:hi]).encode(), np.uint8).reshape(nr, lp)
        tpl = tpl0.copy()
        tpl[where] = ptab[0]
        block = np.empty((nr, width), np.uint8)
        block[:] = tpl
        if nr > 1:
            for j in np.flatnonzero((ptab != ptab[0]).any(axis=0)).tolist():
                block[:, where[:, j]] = ptab[:, j : j + 1]
        datas.append(block.reshape(-1))
        row0 = np.arange(base, base + nr * width, width, dtype=np.int64)
        offs.append((rowst[None, :-1] + row0[:, None]).reshape(-1))
        base += nr * width
    if base >= 2**31:
        return None
    offsets = np.empty(n + 1, np.int32)
    np.concatenate(offs, out=offsets[:-1], casting="unsafe")
    offsets[-1] = base
    data = np.concatenate(datas) if len(datas) > 1 else datas[0]
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _message_ids(ledger: np.ndarray, entry: np.ndarray, part: int, bidx: np.ndarray) -> pa.Array:
    """``ledger:entry:partition[:batchIndex]`` strings, as MessageId prints them."""
    starts, run = _runs(ledger, entry)
    n = len(ledger)
    if len(starts) * 4 > n:  # mostly one message per entry: format every field with Arrow
        sep = pa.scalar(":")
        plain = pc.binary_join_element_wise(
            pa.array(ledger).cast(pa.string()),
            pa.array(entry).cast(pa.string()),
            pa.array(np.full(n, part, np.int32)).cast(pa.string()),
            sep,
        )
        batched = pc.binary_join_element_wise(plain, pa.array(bidx).cast(pa.string()), sep)
        return pc.if_else(pa.array(bidx < 0), plain, batched)
    ids = _ids_from_layouts(ledger, entry, part, bidx, starts, run)
    if ids is not None:
        return ids
    # Batch entries: one prefix per entry, one suffix per batch index, joined by index.
    prefix = pa.array(
        [
            f"{lg}:{en}:{part}:" if b >= 0 else f"{lg}:{en}:{part}"
            for lg, en, b in zip(
                ledger[starts].tolist(), entry[starts].tolist(), bidx[starts].tolist()
            )
        ],
        pa.string(),
    )
    top = int(bidx.max()) if n else -1
    suffix = pa.array(["", *map(str, range(top + 1))], pa.string())
    return pc.binary_join_element_wise(
        prefix.take(pa.array(run)), suffix.take(pa.array(bidx + 1)), ""
    )


#: The storage columns (:data:`storage.reader.READ_SCHEMA`) each source column is built from.
_NEEDS: dict[str, tuple[str, ...]] = {
    "value": ("value",),
    "key": ("key",),
    "orderingKey": ("ordering_key",),
    "topic": (),
    "partition": ("partition",),
    "messageId": ("ledger_id", "entry_id", "batch_index"),
    "ledgerId": ("ledger_id",),
    "entryId": ("entry_id",),
    "batchIndex": ("batch_index",),
    "publishTime": ("publish_time",),
    "eventTime": ("event_time",),
    "properties": ("properties",),
    "producerName": ("producer_name",),
    "sequenceId": ("sequence_id",),
    "deliverAt": ("deliver_at",),
    "redeliveryCount": (),
}


def storage_columns(p: FilePulsarPartition) -> frozenset[str] | None:
    """The storage columns a task decodes: those its source columns are built from, and those
    trimming, the property filter and redelivery counts look at (None: every column)."""
    if not p.columns:
        return None
    located = ("ledger_id", "entry_id", "batch_index")
    typed = ("value", "schema_version")
    need = {
        c
        for name, _ in p.columns
        for c in (typed if p.value is not None and name == "value" else _NEEDS.get(name, typed))
    }
    if "schema_version" in need:
        need |= set(located)  # a value that does not decode is reported with its location
    if p.read_compacted:
        need |= set(located)  # the view hides messages by batch index
    if p.positions:
        need |= {"ledger_id", "entry_id"}  # redelivery counts, per entry
    elif p.start[2] != WHOLE or p.end[2] != WHOLE:
        need |= {"ledger_id", "entry_id", "batch_index"}  # trimming partial entries
    if p.property_filter:
        need.add("properties")
    # A table needs a column to count its rows (a read of only ``topic``, say): the cheapest.
    return frozenset(need or ("ledger_id",))


def _ms_to_ts(col: Any) -> Any:
    """Epoch milliseconds (int64) as Spark's timestamps (microseconds, UTC)."""
    n = len(col)
    if col.null_count == n:  # an optional time no message has (the common case)
        return pa.nulls(n, _US)
    if not col.null_count:
        us = np.multiply(col.to_numpy(), 1000)
        return pa.Array.from_buffers(_US, n, [None, pa.py_buffer(us)])
    return pc.multiply(col, 1000).cast(pa.int64()).cast(_US)


def to_spark(
    table: pa.Table,
    topic_name: str,
    redelivery: pa.Array | None,
    columns: Columns = (),
    decode: Any = None,
    full: pa.Schema = SOURCE_ARROW_SCHEMA,
) -> pa.RecordBatch:
    """Convert a storage READ_SCHEMA table to the source's Arrow schema (vectorised).

    ``columns`` (name, nullable) narrows the batch to those columns, in that order (``()``:
    every column); a column nobody asked for is never built (``messageId`` strings and the
    ``properties`` map are the costly ones). A typed read passes ``decode`` (the table ->
    its value columns, :func:`connector.spark_schema.decode_columns`) and its ``full``
    Arrow schema.
    """
    schema = arrow_schema_of(columns, full)
    n = table.num_rows
    if not n:
        return pa.RecordBatch.from_pylist([], schema=schema)
    topic = TopicName.parse(topic_name)

    def col(name: str) -> Any:
        # Only the columns asked for are made contiguous (the table holds one chunk per
        # entry run): a narrow read never copies the others.
        c = table.column(name)
        return c.chunk(0) if c.num_chunks == 1 else c.combine_chunks()

    def message_id() -> Any:
        return _message_ids(
            col("ledger_id").to_numpy(),
            col("entry_id").to_numpy(),
            topic.partition_index,
            col("batch_index").to_numpy(),
        )

    build: dict[str, Any] = {
        "value": lambda: col("value"),
        "key": lambda: col("key"),
        "orderingKey": lambda: col("ordering_key"),
        "topic": lambda: pa.repeat(pa.scalar(str(topic.base), pa.string()), n),
        "partition": lambda: col("partition"),
        "messageId": message_id,
        "ledgerId": lambda: col("ledger_id"),
        "entryId": lambda: col("entry_id"),
        "batchIndex": lambda: col("batch_index"),
        "publishTime": lambda: _ms_to_ts(col("publish_time")),
        "eventTime": lambda: _ms_to_ts(col("event_time")),
        "properties": lambda: col("properties").cast(_PROPS),
        "producerName": lambda: col("producer_name"),
        "sequenceId": lambda: col("sequence_id"),
        "deliverAt": lambda: _ms_to_ts(col("deliver_at")),
        "redeliveryCount": lambda: (
            redelivery if redelivery is not None else pa.array(np.zeros(n, np.int32))
        ),
    }
    decoded: dict[str, Any] = {}
    if decode is not None and any(name not in build or name == "value" for name in schema.names):
        decoded = decode(table, topic)
    arrays = [decoded[name] if name in decoded else build[name]() for name in schema.names]
    arrays = [c.chunk(0) if isinstance(c, pa.ChunkedArray) else c for c in arrays]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _filter(table: pa.Table, filt: Any) -> pa.Table:
    if not filt or not table.num_rows:
        return table
    mask = None
    props = table.column("properties")
    for name, allowed in filt:
        vals = pc.map_lookup(props, pa.scalar(name), "first")
        ok = pc.fill_null(pc.is_in(vals, value_set=pa.array(list(allowed), pa.string())), False)
        mask = ok if mask is None else pc.and_(mask, ok)
    return table.filter(mask)


def _trim(table: pa.Table, p: FilePulsarPartition) -> pa.Table:
    """Drop messages outside (start, end] at message granularity (partial entries)."""
    if p.positions or (p.start[2] == WHOLE and p.end[2] == WHOLE):
        return table
    led = table.column("ledger_id")
    ent = table.column("entry_id")
    mask = None
    # message number within its entry, counted from 1 (non-batched: 1)
    bidx = table.column("batch_index")
    num = pc.add(pc.max_element_wise(bidx, pa.scalar(0, pa.int32())), 1)
    if p.start[2] != WHOLE:
        at = pc.and_(pc.equal(led, p.start[0]), pc.equal(ent, p.start[1]))
        mask = pc.invert(pc.and_(at, pc.less_equal(num, p.start[2])))
    if p.end[2] != WHOLE:
        at = pc.and_(pc.equal(led, p.end[0]), pc.equal(ent, p.end[1]))
        keep = pc.invert(pc.and_(at, pc.greater(num, p.end[2])))
        mask = keep if mask is None else pc.and_(mask, keep)
    return table if mask is None else table.filter(mask)


def _redelivery(table: pa.Table, counts: dict[tuple[int, int], int]) -> pa.Array:
    """Each row's redelivery count, from its entry's (one dictionary look-up per entry)."""
    ledger = table.column("ledger_id").to_numpy()
    entry = table.column("entry_id").to_numpy()
    starts, run = _runs(ledger, entry)
    per_run = np.fromiter(
        (
            counts.get((lg, en), 0)
            for lg, en in zip(ledger[starts].tolist(), entry[starts].tolist())
        ),
        np.int32,
        len(starts),
    )
    return pa.array(per_run[run] if len(run) else per_run)


# --------------------------------------------------------------------------- entries


def _iter_range(
    ml: ManagedLedger, m: ManifestState, first: Position, last: Position, p: FilePulsarPartition
) -> Iterator[ReadEntry]:
    """Entries ``first..last`` as they are read. With ``failOnDataLoss=false`` what is lost
    (a missing blob, a damaged entry) is skipped and logged with its location."""
    if p.fail_on_data_loss:
        return ml.iter_entries(m, first, end=last)

    def skipped(e: Exception) -> None:
        log.warning("failOnDataLoss=false, skipped: %s", e)

    return ml.iter_entries(m, first, end=last, on_error=skipped)


def _lookback(ml: ManagedLedger, m: ManifestState, p: FilePulsarPartition) -> Any:  # FetchMissing
    """Find earlier chunks of a chunked message that began before this task's range."""

    def fetch(uuid: str, before: Position, missing: list[int]) -> list[ReadEntry]:
        need = set(missing)
        found: list[ReadEntry] = []
        scanned = 0
        try:
            for lg in reversed(m.ledgers):
                if lg.ledger_id > before.ledger_id or not lg.entries:
                    continue
                hi = before.entry_id - 1 if lg.ledger_id == before.ledger_id else lg.entries - 1
                while hi >= 0 and need and scanned < CHUNK_LOOKBACK_ENTRIES:
                    lo = max(0, hi - 255)
                    block = ml.read_entries(
                        m, Position(lg.ledger_id, lo), end=Position(lg.ledger_id, hi)
                    )
                    scanned += len(block)
                    for e in reversed(block):
                        c = e.raw.header.chunk
                        if c is not None and c.uuid == uuid and c.chunk_id in need:
                            need.discard(c.chunk_id)
                            found.append(e)
                    hi = lo - 1
                if not need or scanned >= CHUNK_LOOKBACK_ENTRIES:
                    break
        except (DataLossError, CorruptDataError) as e:
            if p.fail_on_data_loss:
                raise DataLossError(
                    f"{ml.topic}: earlier chunks of chunked message {uuid} cannot be read: {e}"
                ) from e
        if need:
            log.warning(
                "%s: chunks %s of chunked message %s (before %s:%s) not found; message skipped",
                ml.topic,
                sorted(need),
                uuid,
                before.ledger_id,
                before.entry_id,
            )
        return found[::-1]

    return fetch


def _groups(entries: Iterator[ReadEntry]) -> Iterator[list[ReadEntry]]:
    """Consecutive entries in groups of about GROUP_ROWS messages (the first smaller)."""
    group: list[ReadEntry] = []
    rows, target = 0, FIRST_GROUP_ROWS
    for e in entries:
        group.append(e)
        rows += e.raw.header.num_messages
        if rows >= target:
            yield group
            group, rows, target = [], 0, GROUP_ROWS
    if group:
        yield group


# --------------------------------------------------------------------------- the task


def read_partition(p: FilePulsarPartition) -> Iterator[pa.RecordBatch]:
    """Messages of one task as Arrow record batches in the source schema (executor side).

    Raises
    ------
    DataLossError, CorruptDataError
        With ``failOnDataLoss`` (the default); otherwise the damaged or missing entries are
        skipped and logged with their location.
    """
    if not isinstance(p, FilePulsarPartition):
        return  # PySpark's placeholder for a plan with no partitions: an empty range
    store = open_blob_store(p.root, storage_options=p.storage_options or None)
    topic = TopicName.parse(p.topic)
    ml = ManagedLedger(store, topic)
    try:
        m = ml.state()
    except TopicNotFound:
        data_loss(
            f"{topic} was deleted before this task read it (root {p.root}); its messages "
            f"after {p.start[0]}:{p.start[1]} were lost",
            p.fail_on_data_loss,
        )
        return
    if p.incarnation and m.incarnation and m.incarnation != p.incarnation:
        data_loss(recreated_message(str(topic), p.incarnation, m.incarnation), p.fail_on_data_loss)
        return
    assembler = ChunkAssembler(_lookback(ml, m, p))
    need = storage_columns(p)
    counts: dict[tuple[int, int], int] | None = None
    hidden: dict[tuple[int, int], frozenset[int]] = {}
    if p.positions:
        counts = {(lid, eid): c for lid, eid, c in p.positions}
        entries: Iterator[ReadEntry] = (
            e
            for lid, eid, _ in p.positions
            for e in _iter_range(ml, m, Position(lid, eid), Position(lid, eid), p)
        )
    else:
        end_pos = m.last_position() if p.end_latest else (p.end[0], p.end[1])
        begin: list[int] = [*m.last_position(), WHOLE] if p.start_latest else list(p.start)
        view = load_view(store, topic, m.incarnation) if p.read_compacted else None
        if view is not None and (begin[0], begin[1]) < view.horizon:
            # The compacted view up to its horizon, then the topic after it: retention may
            # have deleted ledgers before the horizon, which the view stands for.
            horizon = [*view.horizon, WHOLE]
            if not p.loss_ok:
                check_trimmed(str(topic), m, horizon, p.fail_on_data_loss)
            entries = _view_entries(view, m, begin, end_pos, hidden)
            first = after(m, ml, horizon)
            if first is not None and (first.ledger_id, first.entry_id) <= end_pos:
                entries = itertools.chain(entries, _iter_range(ml, m, first, Position(*end_pos), p))
        else:
            if not p.loss_ok:
                check_trimmed(str(topic), m, begin, p.fail_on_data_loss)
            first = after(m, ml, begin)
            if first is None or (first.ledger_id, first.entry_id) > end_pos:
                return
            entries = _iter_range(ml, m, first, Position(*end_pos), p)
    decoder = ValueDecoder(p.value, store) if p.value is not None else None
    full = SOURCE_ARROW_SCHEMA
    decode = None
    if decoder is not None:
        full = typed_schemas(decoder.spec.columns(), decoder.spec.mode == "flatten")[1]

        def decode(table: pa.Table, t: TopicName) -> dict[str, pa.Array]:
            return decode_columns(decoder, table, t)

    for group in _groups(entries):
        table = assembler.feed(group, topic.partition_index, need)
        if hidden:
            table = _hide(table, hidden)
            hidden.clear()
        table = _filter(_trim(table, p), p.property_filter)
        if not table.num_rows:
            continue
        red = _redelivery(table, counts) if counts is not None else None
        rb = to_spark(table, p.topic, red, p.columns, decode, full)
        for off in range(0, rb.num_rows, SPARK_BATCH_ROWS):
            yield rb.slice(off, SPARK_BATCH_ROWS)


def _view_entries(
    view: CompactedView,
    m: ManifestState,
    begin: Sequence[int],
    end_pos: tuple[int, int],
    hidden: dict[tuple[int, int], frozenset[int]],
) -> Iterator[ReadEntry]:
    """The compacted view's entries in (begin, min(end, horizon)] (from ``begin``'s own
    entry when the offset is inside it), noting in ``hidden`` the batch indexes each hides.
    A view replaced (and deleted) meanwhile is reloaded and read on after the last entry
    read, up to the first view's horizon (the topic after it comes next)."""
    lo = (begin[0], begin[1])
    inclusive = begin[2] != WHOLE
    hi = min(end_pos, view.horizon)
    last: tuple[int, int] | None = None
    while True:
        start = bisect.bisect_left(view.positions, lo if last is None else last)
        try:
            for ve in view.index[start:]:
                pos = ve.position
                if (pos == lo and not inclusive) or (last is not None and pos <= last):
                    continue
                if pos > hi:
                    return
                e = view.read(ve)
                if ve.obscured:
                    hidden[pos] = ve.obscured
                last = pos
                yield e
            return
        except BlobNotFound:
            newer = load_view(view.store, view.topic, m.incarnation)
            if newer is None or newer.state.blob == view.state.blob:
                raise
            view = newer


def _hide(table: pa.Table, hidden: dict[tuple[int, int], frozenset[int]]) -> pa.Table:
    """``table`` without the messages the compacted view hides (older values in a kept
    batch entry)."""
    if not table.num_rows:
        return table
    led = table.column("ledger_id").to_numpy()
    ent = table.column("entry_id").to_numpy()
    bidx = table.column("batch_index").to_numpy()
    drop = np.zeros(table.num_rows, np.bool_)
    for (lg, en), idx in hidden.items():
        drop |= (led == lg) & (ent == en) & np.isin(bidx, list(idx))
    return table.filter(pa.array(~drop)) if drop.any() else table
