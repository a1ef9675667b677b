"""``delay_until_due``: Pulsar's delayed delivery as a Spark operator (see
:mod:`filepulsar.dispatch.spark`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import (
    BinaryType,
    LongType,
    StructField,
    StructType,
)

from filepulsar.dispatch.delayed import DEFAULT_TICK_MS, should_delay_array
from filepulsar.dispatch.spark.available_now import end_available_now_when_drained
from filepulsar.dispatch.spark.blocks import (
    BLOCK_ONLY_SCHEMA,
    GROUP_COLUMN,
    BlockProcessor,
    block_bytes,
    blocks_frames,
    from_blocks,
    read_block,
    read_blocks,
    require_columns,
    settle_worker,
    to_blocks,
)

# ============================================================================================
# Delayed delivery
# ============================================================================================

_LAYOUT = 2
"""The state layout :class:`_DelayProcessor` writes (the names below); a checkpoint of layout 1
is moved to it on each group's first visit."""

_INDEX_STATE_SCHEMA = StructType([StructField("chunks", BinaryType(), False)])
_CHUNK_KEY_SCHEMA = StructType([StructField("chunk", LongType(), False)])
_CHUNK_VALUE_SCHEMA = StructType([StructField("rows", BinaryType(), False)])

# Layout 1 (until 2026-11): MapState "held", one entry per ``deliverAt // bucket_ms`` bucket,
# rewritten by every batch that added to it, and ValueState "index" of (bucket, earliest) pairs.
_V1_INDEX_STATE_SCHEMA = StructType([StructField("buckets", BinaryType(), False)])
_V1_BUCKET_KEY_SCHEMA = StructType([StructField("bucket", LongType(), False)])
_V1_BUCKET_VALUE_SCHEMA = StructType([StructField("rows", BinaryType(), False)])


def _deliver_at_ms(table: pa.Table) -> npt.NDArray[np.int64]:
    """``deliverAt`` in epoch ms (truncated, as Spark's ``unix_millis``); null becomes 0."""
    column = table.column("deliverAt")
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.timestamp("ms", tz=column.type.tz), safe=False)
    values = pc.fill_null(column.cast(pa.int64()), 0)
    return np.asarray(values.to_numpy(), dtype=np.int64)


def _levels(delta_ms: npt.NDArray[np.int64], bucket_ms: int) -> npt.NDArray[np.int64]:
    """The level of a held message due ``delta_ms`` from now: the bit length of
    ``delta_ms // bucket_ms`` (0 when due within ``bucket_ms``), so ``delta_ms`` is below the
    level's width ``bucket_ms << level``."""
    ticks = np.maximum(delta_ms, 0) // bucket_ms
    # frexp's exponent of a positive integer below 2**53 is its bit length, exactly.
    levels: npt.NDArray[np.int64] = np.where(ticks > 0, np.frexp(ticks)[1], 0).astype(np.int64)
    return levels


class _Chunks:
    """A group's index of held chunks: ids, earliest ``deliverAt`` ms, and the next id."""

    def __init__(self, stored: bytes | None) -> None:
        values = np.frombuffer(stored, dtype=np.int64) if stored else np.zeros(1, np.int64)
        self.next_id = int(values[0])
        pairs = values[1:].reshape(-1, 2)
        self.ids: list[int] = pairs[:, 0].tolist()
        self.earliest: list[int] = pairs[:, 1].tolist()

    def add(self, earliest_ms: int) -> int:
        chunk = self.next_id
        self.next_id += 1
        self.ids.append(chunk)
        self.earliest.append(earliest_ms)
        return chunk

    def due(self, limit_ms: int) -> list[int]:
        """Ids of the chunks holding something with ``deliverAt <= limit_ms``, earliest first."""
        pairs = sorted((e, c) for c, e in zip(self.ids, self.earliest) if e <= limit_ms)
        return [c for _, c in pairs]

    def remove(self, chunks: list[int]) -> None:
        gone = set(chunks)
        kept = [(c, e) for c, e in zip(self.ids, self.earliest) if c not in gone]
        self.ids = [c for c, _ in kept]
        self.earliest = [e for _, e in kept]

    def to_bytes(self) -> bytes:
        pairs = np.array([self.ids, self.earliest], dtype=np.int64).T.reshape(-1)
        return np.r_[np.int64(self.next_id), pairs].astype(np.int64).tobytes()


class _DelayProcessor(BlockProcessor):
    """Holds messages until their ``deliverAt`` passes the cutoff; releases them on timers.

    State (per group, a topic partition), layout 2:

    * MapState ``chunks``: key ``chunk long`` (a number the group counts up), value ``rows
      binary`` -- held messages, all columns, as one LZ4-compressed Arrow IPC stream. A batch
      adds new chunks and never rewrites one: its held messages go into one chunk per
      ``(level, deliverAt bucket)``, where the level of a message due ``d`` ms from now is the
      bit length of ``d // bucket_ms`` and its bucket is ``due // (bucket_ms << level)``, so a
      batch writes a handful of chunks however widely its delays spread;
    * ValueState ``chunk_index`` (``chunks binary``): int64 values, the next chunk number
      then the pairs ``(chunk, earliest deliverAt ms)`` of the stored chunks;
    * processing-time timers at the earliest due time of every chunk.

    A chunk is read once, when its earliest message is due, and deleted; whatever in it is not
    due yet goes into new chunks at lower levels (a level-``L`` chunk spans ``bucket_ms << L``
    ms, so its remainder is due sooner than that: each message is moved at most about twice
    per level, only as its time comes).

    The due time of a message is ``deliverAt - tick`` (``deliverAt`` when strict): the first
    processing time at which :func:`filepulsar.dispatch.delayed.should_delay` lets it go.

    Layout 1 (MapState ``held`` of ``deliverAt // bucket_ms`` buckets, ValueState ``index``)
    is still declared: a group that has it has its messages moved into layout 2 on its first
    visit after a restart, and layout 1 is cleared.
    """

    def __init__(self, tick_ms: int, strict: bool, bucket_ms: int) -> None:
        self._tick_ms = tick_ms
        self._strict = strict
        self._bucket_ms = bucket_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        settle_worker()
        self._handle = handle
        self._index_state = handle.getValueState("chunk_index", _INDEX_STATE_SCHEMA)
        self._chunks = handle.getMapState("chunks", _CHUNK_KEY_SCHEMA, _CHUNK_VALUE_SCHEMA)
        self._v1_index = handle.getValueState("index", _V1_INDEX_STATE_SCHEMA)
        self._v1_held = handle.getMapState("held", _V1_BUCKET_KEY_SCHEMA, _V1_BUCKET_VALUE_SCHEMA)
        self._checked_v1: set[Any] = set()

    # -- state -------------------------------------------------------------------------------

    def _load_index(self) -> _Chunks:
        stored = self._index_state.get() if self._index_state.exists() else None
        return _Chunks(stored[0] if stored else None)

    def _save_index(self, index: _Chunks) -> None:
        if not index.ids:
            self._index_state.clear()
            return
        self._index_state.update((index.to_bytes(),))

    def _take_chunk(self, chunk: int) -> pa.Table:
        stored = self._chunks.getValue((chunk,))
        if stored is None:
            # The index and the map change in the same state commit; a gap is corruption.
            raise RuntimeError(f"delayed-delivery state lists chunk {chunk} but holds none")
        self._chunks.removeKey((chunk,))
        return read_block(stored[0])

    def _take_layout_1(self, key: Any) -> pa.Table | None:
        """A layout-1 group's held messages, removed from layout 1 (once per group and task)."""
        if key in self._checked_v1:
            return None
        self._checked_v1.add(key)
        stored = self._v1_index.get() if self._v1_index.exists() else None
        if not stored:
            return None
        tables = []
        for bucket in np.frombuffer(stored[0], dtype=np.int64).reshape(-1, 2)[:, 0].tolist():
            rows = self._v1_held.getValue((bucket,))
            if rows is None:
                raise RuntimeError(f"delayed-delivery state lists bucket {bucket} but holds none")
            tables.append(read_block(rows[0]))
            self._v1_held.removeKey((bucket,))
        self._v1_index.clear()
        return pa.concat_tables(tables) if tables else None

    # -- the rule ----------------------------------------------------------------------------

    def _due_ms(self, deliver_at_ms: npt.NDArray[np.int64] | int) -> Any:
        return deliver_at_ms - (0 if self._strict else self._tick_ms)

    def _hold(
        self, table: pa.Table, deliver: npt.NDArray[np.int64], now_ms: int, index: _Chunks
    ) -> None:
        due = self._due_ms(deliver)
        levels = _levels(due - now_ms, self._bucket_ms)
        buckets = due // (np.int64(self._bucket_ms) << levels)
        order = np.lexsort((buckets, levels))
        levels, buckets, deliver = levels[order], buckets[order], deliver[order]
        if np.any(order[1:] < order[:-1]):
            table = table.take(pa.array(order))
        cut = (levels[1:] != levels[:-1]) | (buckets[1:] != buckets[:-1])
        starts = np.flatnonzero(np.r_[True, cut])
        ends = np.r_[starts[1:], len(levels)]
        for start, end in zip(starts.tolist(), ends.tolist()):
            earliest = int(deliver[start:end].min())
            chunk = index.add(earliest)
            rows = table.slice(start, end - start)
            self._chunks.updateValue((chunk,), (block_bytes(rows, compression="lz4"),))
            self._handle.registerTimer(int(self._due_ms(earliest)))

    def _release(self, now_ms: int, index: _Chunks) -> pa.Table | None:
        limit = now_ms + (0 if self._strict else self._tick_ms)
        due = index.due(limit)
        if not due:
            return None
        index.remove(due)
        released = []
        for chunk in due:
            rows = self._take_chunk(chunk)
            deliver = _deliver_at_ms(rows)
            held = should_delay_array(deliver, now_ms, self._tick_ms, self._strict)
            released.append(rows.filter(pa.array(~held)))
            if held.any():
                self._hold(rows.filter(pa.array(held)), deliver[held], now_ms, index)
        table = pa.concat_tables(released)
        return table.take(pc.sort_indices(table, sort_keys=[("deliverAt", "ascending")]))

    def _visit(self, key: Any, now_ms: int, table: pa.Table | None) -> Iterator[pd.DataFrame]:
        index = self._load_index()
        before = (index.next_id, len(index.ids))
        out = []
        moved = self._take_layout_1(key)
        if moved is not None:
            self._hold(moved, _deliver_at_ms(moved), now_ms, index)
        if table is not None:
            deliver = _deliver_at_ms(table)
            held = should_delay_array(deliver, now_ms, self._tick_ms, self._strict)
            # What is not held goes out at once; the rest waits in state.
            out.append(table.filter(pa.array(~held)) if held.any() else table)
            if held.any():
                self._hold(table.filter(pa.array(held)), deliver[held], now_ms, index)
        # Every visit releases what is due, so held messages follow the current options.
        released = self._release(now_ms, index)
        if released is not None:
            out.append(released)
        if (index.next_id, len(index.ids)) != before:
            self._save_index(index)
        for part in out:
            yield from blocks_frames(part)

    def handleInputRows(
        self, key: Any, rows: Iterator[Any], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        table = read_blocks(rows)
        yield from self._visit(key, timerValues.getCurrentProcessingTimeInMs(), table)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        yield from self._visit(key, timerValues.getCurrentProcessingTimeInMs(), None)

    def close(self) -> None:
        pass


def delay_until_due(
    df: DataFrame,
    *,
    tick_ms: int = DEFAULT_TICK_MS,
    strict: bool = False,
    bucket_ms: int = 10_000,
    group_by: Sequence[str] = ("topic", "partition"),
) -> DataFrame:
    """Hold messages whose ``deliverAt`` is in the future; emit them once they are due.

    A message is held when :func:`filepulsar.dispatch.delayed.should_delay` says so at the
    micro-batch's processing time: ``deliverAt > now + tick_ms``, or ``deliverAt > now`` when
    ``strict`` (null, zero or negative ``deliverAt`` never delays). Every message goes through the
    operator, which lets a message that is not held out in the same batch (``df`` is read
    once: a pipeline upstream of it runs once per batch). Held messages go into state and come
    out, with all their
    columns unchanged, in the first batch whose processing time makes them due, fired by
    processing-time timers at ``deliverAt - tick_ms`` (``deliverAt`` when strict). Every visit
    of a group also releases whatever is due under the *current* options, so a restart with
    another ``tick_ms`` or ``strict`` applies to messages already held.

    Parameters
    ----------
    df
        Streaming DataFrame with ``deliverAt`` (timestamp) and the ``group_by`` columns.
    tick_ms
        Pulsar's ``delayedDeliveryTickTimeMillis``: a message may go out up to one tick early.
    strict
        ``isDelayedDeliveryDeliverAtTimeStrict``: never deliver before ``deliverAt``.
    bucket_ms
        Width of the finest buckets held messages are stored in (messages due within
        ``2 * bucket_ms``); a bucket twice as far away is twice as wide, so a batch writes a
        few state entries however its delays spread. A batch only adds entries; an entry is
        read once, when its earliest message is due, and what is not due yet moves to finer
        buckets. Narrower buckets mean less moving when timers fire often.
    group_by
        Columns of one delay tracker (default: one per topic partition, as Pulsar's
        dispatcher).

    Returns
    -------
    DataFrame
        The input's columns: messages not held, then released ones (by ``deliverAt``).

    Raises
    ------
    ValueError
        If ``deliverAt`` or a ``group_by`` column is missing, or an option is out of range.

    Notes
    -----
    Time mode ``ProcessingTime``, output mode ``Append``; state layout 2 as listed on the
    processor (MapState ``chunks``, ValueState ``chunk_index``, timers; a checkpoint written
    with layout 1, before 2026-11, is moved to it as each group is next visited); needs the
    RocksDB state store (``spark.sql.streaming.stateStore.providerClass``, see
    :mod:`filepulsar.dispatch.spark`).

    Under a ``processingTime`` trigger (no-data micro-batches on, Spark's default) a held
    message is emitted within one trigger interval of its due time. Under
    ``Trigger.AvailableNow`` a run ends once its source is drained, after a last batch that
    releases what is due by then; messages not due yet stay held, and a later run from the
    same checkpoint emits them once due. Spark 4.3 itself would run empty batches for ever
    after a processing-time ``transformWithState``; calling this function adds a listener to
    the session that ends such a run (:mod:`filepulsar.dispatch.spark.available_now`). Under Spark
    Connect it cannot: set :data:`NO_DATA_BATCHES_CONF` to ``"false"`` before ``start()``
    (timers then fire only in batches that carry data).
    """
    if tick_ms < 0:
        raise ValueError(f"tick_ms must be >= 0, got {tick_ms}")
    if bucket_ms < 1:
        raise ValueError(f"bucket_ms must be >= 1, got {bucket_ms}")
    require_columns(df, ["deliverAt", *group_by], "delay_until_due")
    end_available_now_when_drained(df.sparkSession)
    processor = _DelayProcessor(int(tick_ms), bool(strict), int(bucket_ms))
    # One branch: every row goes through the operator, which passes what is not held at
    # once. (A JVM filter letting those bypass it, unioned back, would use ``df`` twice and
    # so run everything upstream of it -- source scans, stateful operators -- twice.)
    out = (
        to_blocks(df, group_by)
        .groupBy(GROUP_COLUMN)
        .transformWithStateInPandas(processor, BLOCK_ONLY_SCHEMA, "Append", "ProcessingTime")
    )
    return from_blocks(out, df.schema)
