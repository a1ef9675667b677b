"""The executor side of the Spark source: one task's messages as Arrow record batches.

Spark runs :func:`read_partition` in its Python workers with only the picklable
:class:`~filepulsar.connector.source.partition.FilePulsarPartition` the driver planned (see
:mod:`filepulsar.connector.source.batch`). The hot path never builds a Python object per message:
entries are decoded into Arrow tables and every column is built with Arrow/numpy kernels
(:mod:`filepulsar.connector.source.columns`). This module owns the task: the entries of its range
(with the chunk lookback and the compacted view), grouping, and handing Spark batches.

Reading streams: entries are fetched lazily and converted in groups of about
:data:`GROUP_ROWS` messages (the first group smaller, so Spark starts consuming early), and
each group goes to Spark as record batches of about :data:`SPARK_BATCH_ROWS` rows.

Where a task's time goes (bench/bench_source.py reports it): checking each entry's CRC32C
and decoding its Arrow payload, one copy of each emitted column into the group's contiguous
arrays, and the columns the stored entries do not hold (``messageId``, ``topic``).
Fragments of local blobs are memory-mapped, not copied (``BlobStore.get_range_view``);
message ids are written from per-entry byte templates
(:func:`filepulsar.connector.source.columns._ids_from_layouts`). Spark
gets 10,000-row batches: handing it each entry's own arrays (no copy) costs Spark more in
per-batch work than the copy saves (a bare source handing Spark 1,000-row batches took a
median 1.45x the trigger time of 10,000-row ones here, on a loaded machine).
"""

from __future__ import annotations

import bisect
import itertools
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from filepulsar.connector.schema import SOURCE_ARROW_SCHEMA, typed_schemas
from filepulsar.connector.source.columns import (
    _filter,
    _redelivery,
    _trim,
    storage_columns,
    to_spark,
)
from filepulsar.connector.source.partition import (
    WHOLE,
    FilePulsarPartition,
    after,
    check_trimmed,
    data_loss,
    recreated_message,
)
from filepulsar.connector.values.decode import ValueDecoder, decode_columns
from filepulsar.storage.blobstore import BlobNotFound, open_blob_store
from filepulsar.storage.compaction import CompactedView, load_view
from filepulsar.storage.errors import CorruptDataError, DataLossError, TopicNotFound
from filepulsar.storage.ledger import ManagedLedger, Position, ReadEntry
from filepulsar.storage.manifest import ManifestState
from filepulsar.storage.names import TopicName
from filepulsar.storage.reader import ChunkAssembler

log = logging.getLogger(__name__)


#: Rows per Arrow batch handed to Spark (Spark's own default for Arrow batches).
SPARK_BATCH_ROWS = 10_000


#: Messages decoded and converted together; the first group of a task is smaller so Spark
#: starts consuming while the rest is decoded.
GROUP_ROWS = 40_000


FIRST_GROUP_ROWS = 5_000


#: How many entries before a task's range are searched for the first chunks of a chunked
#: message whose last chunk lies in the range.
CHUNK_LOOKBACK_ENTRIES = 100_000


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
        yield from _spark_batches(rb)


def _spark_batches(rb: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
    """``rb`` in slices of about :data:`SPARK_BATCH_ROWS` rows, all of one size (a group of
    40,800 rows goes as four of 10,200, not four of 10,000 and one of 800: Spark pays a fixed
    cost per batch, whatever its size)."""
    n = rb.num_rows
    k = max(1, n // SPARK_BATCH_ROWS)
    if k == 1:
        yield rb
        return
    size = -(-n // k)
    for off in range(0, n, size):
        yield rb.slice(off, size)


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
