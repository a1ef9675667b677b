"""Spark's columns of the source, built from decoded entries with Arrow/numpy kernels.

Owns the conversion of one group of decoded entries (storage's column names) to the source
schema (:func:`to_spark`): message ids written from per-entry byte templates
(:func:`_ids_from_layouts`), timestamps, properties; which stored columns a task needs
(:func:`storage_columns`); and the row selections a task applies (the property filter,
trimming to a partial first or last entry, redelivery counts). Runs on executors, inside
:func:`filepulsar.connector.source.read.read_partition`.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from filepulsar.connector.schema import SOURCE_ARROW_SCHEMA, Columns, arrow_schema_of
from filepulsar.connector.source.partition import FilePulsarPartition
from filepulsar.storage.ledger import Position
from filepulsar.storage.names import TopicName
from filepulsar.storage.read_range import WHOLE

_US = pa.timestamp("us", tz="UTC")


_PROPS = SOURCE_ARROW_SCHEMA.field("properties").type


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


#: The storage columns (:data:`filepulsar.storage.reader.READ_SCHEMA`) each source column is built
#: from.
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


_SCHEMAS: dict[tuple[Columns, int], tuple[pa.Schema, pa.Schema]] = {}


def _schema_of(columns: Columns, full: pa.Schema) -> pa.Schema:
    """:func:`filepulsar.connector.schema.arrow_schema_of`, built once per query's columns (keyed by
    the full schema's identity: hashing a schema costs more than building a small batch)."""
    got = _SCHEMAS.get((columns, id(full)))
    if got is not None and got[0] is full:
        return got[1]
    schema = arrow_schema_of(columns, full)
    if len(_SCHEMAS) >= 64:
        _SCHEMAS.clear()
    _SCHEMAS[(columns, id(full))] = (full, schema)
    return schema


@functools.lru_cache(maxsize=256)
def _topic(name: str) -> TopicName:
    return TopicName.parse(name)


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
    its value columns, :func:`filepulsar.connector.values.types.decode_columns`) and its ``full``
    Arrow schema.
    """
    schema = _schema_of(columns, full)
    n = table.num_rows
    if not n:
        return pa.RecordBatch.from_pylist([], schema=schema)
    topic = _topic(topic_name)

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


def filter_by_properties(table: pa.Table, filt: Any) -> pa.Table:
    """The rows of ``table`` whose properties hold, for every ``(name, allowed)`` of ``filt``,
    one of the allowed values (the source's property filter)."""
    if not filt or not table.num_rows:
        return table
    mask = None
    props = table.column("properties")
    for name, allowed in filt:
        vals = pc.map_lookup(props, pa.scalar(name), "first")
        ok = pc.fill_null(pc.is_in(vals, value_set=pa.array(list(allowed), pa.string())), False)
        mask = ok if mask is None else pc.and_(mask, ok)
    return table.filter(mask)


def trim_to_range(table: pa.Table, p: FilePulsarPartition) -> pa.Table:
    """Drop messages outside (start, end] at message granularity (partial entries), or, for
    listed entries, outside their slices."""
    if p.positions:
        return _slice(table, p.slices) if p.slices and table.num_rows else table
    if p.start[2] == WHOLE and p.end[2] == WHOLE:
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
    return table if mask is None else _keep(table, mask)


def _keep(table: pa.Table, mask: pa.ChunkedArray | pa.Array) -> pa.Table:
    """``table.filter(mask)`` without its copy when the dropped rows are none, a head or a
    tail (a range's partial first and last entries): a filter copies every column, the map of
    properties at about 2.6 us a row, for every table of every micro-batch."""
    n = table.num_rows
    keep = np.asarray(mask.to_numpy(zero_copy_only=False), dtype=np.bool_)
    dropped = np.flatnonzero(~keep)
    if not len(dropped):
        return table
    k = len(dropped)
    if dropped[-1] == k - 1:  # the first k rows
        return table.slice(k)
    if dropped[0] == n - k:  # the last k rows
        return table.slice(0, n - k)
    return table.filter(mask)


def _slice(table: pa.Table, slices: tuple[tuple[int, int, int, int], ...]) -> pa.Table:
    """Only batch indexes ``lo .. hi-1`` of each ``(ledger, entry, lo, hi)`` entry."""
    led = table.column("ledger_id").to_numpy()
    ent = table.column("entry_id").to_numpy()
    bidx = table.column("batch_index").to_numpy()
    drop = np.zeros(table.num_rows, np.bool_)
    for lg, en, lo, hi in slices:
        drop |= (led == lg) & (ent == en) & ((bidx < lo) | (bidx >= hi))
    return table.filter(pa.array(~drop)) if drop.any() else table


def redelivery_counts(table: pa.Table, counts: dict[Position, int]) -> pa.Array:
    """Each row's redelivery count, from its entry's (one dictionary look-up per entry)."""
    ledger = table.column("ledger_id").to_numpy()
    entry = table.column("entry_id").to_numpy()
    starts, run = _runs(ledger, entry)
    per_run = np.fromiter(
        (
            counts.get(Position(lg, en), 0)
            for lg, en in zip(ledger[starts].tolist(), entry[starts].tolist())
        ),
        np.int32,
        len(starts),
    )
    return pa.array(per_run[run] if len(run) else per_run)
