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
    StatefulProcessor,
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
    block_bytes,
    blocks_frame,
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

_INDEX_STATE_SCHEMA = StructType([StructField("buckets", BinaryType(), False)])
_BUCKET_KEY_SCHEMA = StructType([StructField("bucket", LongType(), False)])
_BUCKET_VALUE_SCHEMA = StructType([StructField("rows", BinaryType(), False)])


def _deliver_at_ms(table: pa.Table) -> npt.NDArray[np.int64]:
    """``deliverAt`` in epoch ms (truncated, as Spark's ``unix_millis``); null becomes 0."""
    column = table.column("deliverAt")
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.timestamp("ms", tz=column.type.tz), safe=False)
    values = pc.fill_null(column.cast(pa.int64()), 0)
    return np.asarray(values.to_numpy(), dtype=np.int64)


class _DelayProcessor(StatefulProcessor):
    """Holds messages until their ``deliverAt`` passes the cutoff; releases them on timers.

    State (per group, a topic partition):

    * MapState ``held``: key ``bucket long`` (``deliverAt`` in ms ``// bucket_ms``), value
      ``rows binary`` -- the bucket's held messages, all columns, as one LZ4-compressed Arrow
      IPC stream;
    * ValueState ``index`` (``buckets binary``): the int64 pairs ``(bucket, earliest deliverAt
      ms)`` of the non-empty buckets, so a visit reads only buckets with something due;
    * processing-time timers at the earliest due time of what each write adds to a bucket.

    The due time of a message is ``deliverAt - tick`` (``deliverAt`` when strict): the first
    processing time at which :func:`filepulsar.dispatch.delayed.should_delay` lets it go.
    """

    def __init__(self, tick_ms: int, strict: bool, bucket_ms: int) -> None:
        self._tick_ms = tick_ms
        self._strict = strict
        self._bucket_ms = bucket_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        settle_worker()
        self._handle = handle
        self._index_state = handle.getValueState("index", _INDEX_STATE_SCHEMA)
        self._held = handle.getMapState("held", _BUCKET_KEY_SCHEMA, _BUCKET_VALUE_SCHEMA)

    # -- state -------------------------------------------------------------------------------

    def _load_index(self) -> dict[int, int]:
        stored = self._index_state.get() if self._index_state.exists() else None
        if not stored:
            return {}
        pairs = np.frombuffer(stored[0], dtype=np.int64).reshape(-1, 2)
        return {int(b): int(m) for b, m in pairs}

    def _save_index(self, index: dict[int, int]) -> None:
        if not index:
            self._index_state.clear()
            return
        pairs = np.array(sorted(index.items()), dtype=np.int64)
        self._index_state.update((pairs.tobytes(),))

    def _bucket(self, bucket: int) -> pa.Table:
        stored = self._held.getValue((bucket,))
        if stored is None:
            # The index and the map change in the same state commit; a gap is corruption.
            raise RuntimeError(f"delayed-delivery state lists bucket {bucket} but holds none")
        return read_block(stored[0])

    def _store_bucket(self, bucket: int, table: pa.Table) -> None:
        self._held.updateValue((bucket,), (block_bytes(table, compression="lz4"),))

    # -- the rule ----------------------------------------------------------------------------

    def _due_ms(self, deliver_at_ms: int) -> int:
        return deliver_at_ms - (0 if self._strict else self._tick_ms)

    def _hold(self, table: pa.Table, deliver: npt.NDArray[np.int64], index: dict[int, int]) -> None:
        buckets = deliver // self._bucket_ms
        order = np.argsort(buckets, kind="stable")
        buckets, deliver = buckets[order], deliver[order]
        table = table.take(pa.array(order))
        starts = np.flatnonzero(np.r_[True, buckets[1:] != buckets[:-1]])
        ends = np.r_[starts[1:], len(buckets)]
        for start, end in zip(starts.tolist(), ends.tolist()):
            bucket = int(buckets[start])
            rows = table.slice(start, end - start)
            earliest = int(deliver[start:end].min())
            if bucket in index:
                rows = pa.concat_tables([self._bucket(bucket), rows])
                index[bucket] = min(index[bucket], earliest)
            else:
                index[bucket] = earliest
            self._store_bucket(bucket, rows)
            self._handle.registerTimer(self._due_ms(earliest))

    def _release(self, now_ms: int, index: dict[int, int]) -> pa.Table | None:
        limit = now_ms + (0 if self._strict else self._tick_ms)
        released = []
        for bucket in sorted(b for b, earliest in index.items() if earliest <= limit):
            rows = self._bucket(bucket)
            deliver = _deliver_at_ms(rows)
            held = should_delay_array(deliver, now_ms, self._tick_ms, self._strict)
            released.append(rows.filter(pa.array(~held)))
            if held.any():
                self._store_bucket(bucket, rows.filter(pa.array(held)))
                index[bucket] = int(deliver[held].min())
                self._handle.registerTimer(self._due_ms(index[bucket]))
            else:
                self._held.removeKey((bucket,))
                del index[bucket]
        if not released:
            return None
        table = pa.concat_tables(released)
        return table.take(pc.sort_indices(table, sort_keys=[("deliverAt", "ascending")]))

    def _visit(self, now_ms: int, table: pa.Table | None) -> Iterator[pd.DataFrame]:
        index = self._load_index()
        before = dict(index)
        out = []
        if table is not None:
            deliver = _deliver_at_ms(table)
            held = should_delay_array(deliver, now_ms, self._tick_ms, self._strict)
            # What is not held goes out at once; the rest waits in state.
            out.append(table.filter(pa.array(~held)))
            if held.any():
                self._hold(table.filter(pa.array(held)), deliver[held], index)
        # Every visit releases what is due, so held messages follow the current options.
        released = self._release(now_ms, index)
        if released is not None:
            out.append(released)
        if index != before:
            self._save_index(index)
        for part in out:
            frame = blocks_frame(part)
            if frame is not None:
                yield frame

    def handleInputRows(
        self, key: Any, rows: Iterator[Any], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        table = read_blocks(rows)
        yield from self._visit(timerValues.getCurrentProcessingTimeInMs(), table)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        yield from self._visit(timerValues.getCurrentProcessingTimeInMs(), None)

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
        Width of the ``deliverAt`` buckets held messages are stored in. A release rewrites only
        partly due buckets; wider buckets mean fewer state entries, narrower ones less rewriting
        when timers fire often.
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
    Time mode ``ProcessingTime``, output mode ``Append``; state as listed on the processor
    (MapState ``held``, ValueState ``index``, timers); needs the RocksDB state store
    (``spark.sql.streaming.stateStore.providerClass``, see :mod:`filepulsar.dispatch.spark`).

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
