"""Pulsar's dispatch semantics as Spark Structured Streaming operators.

Every function here takes a streaming DataFrame with the filepulsar source columns
(:data:`connector.schema.SOURCE_SCHEMA`; extra columns ride along) and returns one:

* :func:`key_shared_assign` -- the ``consumer`` of every message under a Key_Shared selector,
  stable across micro-batches and restarts; membership changes move only what Pulsar moves.
* :func:`delay_until_due` -- delayed delivery: messages whose ``deliverAt`` is past the cutoff
  are held in state and released by processing-time timers.
* :func:`dedup_by_sequence` -- broker-side deduplication by ``(producerName, sequenceId)``.
* :func:`route_retry_dlq` -- ``reconsumeLater``: failed messages as retry-letter or dead-letter
  copies, in the columns the filepulsar sink takes.

The rules are not re-implemented here: selectors, slots, sticky keys, the delay cutoff, the
backoff and the topic names come from the Spark-free modules of :mod:`dispatch`; this module
moves data to them.

Why the operators are shaped as they are
----------------------------------------
PySpark 4.3's ``transformWithStateInPandas`` worker regroups its input *row by row* in Python
(``itertuples`` and ``pd.DataFrame(rows)``), so its cost grows with rows times columns, whatever
the grouping (shared/reference/PYSPARK_NOTES.md: ~0.03 M msg/s with 10k keys). The operators
therefore never hand it messages one per row:

1. **Arrow blocks.** A stateless ``mapInArrow`` before the stateful operator cuts each Arrow
   record batch of the input into one block per state group and serialises it as an Arrow IPC
   stream in a single binary cell. The stateful operator then sees one row per group and input
   batch (about a hundred rows per million messages), works on whole blocks with pyarrow and
   numpy, and emits blocks; a second ``mapInArrow`` turns them back into rows with the input's
   schema. No JSON, no Python object per message, every column kept exactly.
2. **Coarse groups.** State is kept per topic partition (Key_Shared and delays: one selector or
   one delay tracker per partition, as Pulsar keeps one dispatcher per partition) or per
   ``(topic, partition, producerName)`` (dedup: Pulsar's per-topic producer map).
3. **Only what needs state goes through Python.** :func:`delay_until_due` sends to the stateful
   operator only the messages held at the batch's processing time; the rest bypass it on the
   JVM. :func:`route_retry_dlq` needs no state at all (Pulsar carries the retry count in the
   message's ``RECONSUMETIMES`` property) and is plain Spark SQL.

Driver and executors
--------------------
The public functions run on the driver and only build plans; they validate their options there
(a bad consumer list or range fails at once, not in a task). The ``mapInArrow`` functions are
module-level and the stateful processors hold only plain option values (strings, ints, lists),
so both pickle by reference to the executors, which import this module; selectors, kernels and
state handles are rebuilt on the executor in ``init``.

Memory: a stateful operator holds one group's share of a micro-batch at once (dedup sorts it
whole); bound micro-batches with the source's ``maxMessagesPerTrigger`` for very large backlogs.

State store
-----------
``transformWithStateInPandas`` needs the RocksDB state store provider
(``spark.sql.streaming.stateStore.providerClass =
org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider``) and ``protobuf``
(``>= 6.33``) in the Python workers. State lives in the query's checkpoint, so every operator
survives restarts from the same ``checkpointLocation``; the state layouts are listed on each
function. Changing an operator's options that name state (mode, grouping columns) or the input
columns needs a new checkpoint.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import (
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from filepulsar.dispatch.delayed import DEFAULT_TICK_MS, should_delay_array
from filepulsar.dispatch.hashing import sticky_key_array
from filepulsar.dispatch.modes import KeySharedMode
from filepulsar.dispatch.redelivery import (
    DEFAULT_MAX_RECONSUME_TIMES,
    PROPERTY_DELAY_TIME,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RECONSUME_TIMES,
    MultiplierRedeliveryBackoff,
    dead_letter_topic,
    retry_letter_topic,
)
from filepulsar.dispatch.selectors import (
    DEFAULT_CONSISTENT_HASHING_POINTS,
    ConsistentHashingSelector,
    ConsumerAssignError,
    StickyHashRangeSelector,
    StickyKeyConsumerSelector,
    selector_for_mode,
    selector_from_dict,
)

__all__ = [
    "BLOCK_ROWS",
    "NO_DATA_BATCHES_CONF",
    "KeySharedMode",
    "apply_consumers",
    "dedup_by_sequence",
    "dedup_keep_mask",
    "delay_until_due",
    "key_shared_assign",
    "route_retry_dlq",
]


NO_DATA_BATCHES_CONF = "spark.sql.streaming.noDataMicroBatches.enabled"
"""Spark setting that :func:`delay_until_due` needs ``"false"`` under ``Trigger.AvailableNow``."""

BLOCK_ROWS = 65_536
"""Most rows a stateful operator puts in one output block (one binary cell, one Arrow batch)."""

# Column names reach pandas through ``itertuples``, which renames fields that start with an
# underscore, so every name crossing into Python is a plain identifier.
_GROUP_COLUMN = "pulsar_group"
_BLOCK_COLUMN = "pulsar_block"
_INTERNAL_COLUMNS = (_GROUP_COLUMN, _BLOCK_COLUMN)

_BLOCKS_SCHEMA = StructType(
    [StructField(_GROUP_COLUMN, StringType(), True), StructField(_BLOCK_COLUMN, BinaryType(), True)]
)
_BLOCK_ONLY_SCHEMA = StructType([StructField(_BLOCK_COLUMN, BinaryType(), True)])


# ============================================================================================
# Arrow blocks: rows <-> one IPC stream per group (executor side, picklable by reference)
# ============================================================================================


def _block_bytes(table: pa.Table | pa.RecordBatch, *, compression: str | None = None) -> bytes:
    """``table`` as one Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write(table)
    return sink.getvalue().to_pybytes()


def _read_block(block: bytes | pa.Buffer) -> pa.Table:
    return pa.ipc.open_stream(block).read_all()


def _read_blocks(rows: Iterable[pd.DataFrame]) -> pa.Table | None:
    """All blocks of one group's input, concatenated (``None`` when there are none)."""
    tables = [_read_block(b) for pdf in rows for b in pdf[_BLOCK_COLUMN] if b is not None]
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return None
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


def _blocks_frame(table: pa.Table) -> pd.DataFrame | None:
    """A stateful operator's output: ``table`` cut into blocks of at most :data:`BLOCK_ROWS`."""
    if not table.num_rows:
        return None
    blocks = [
        _block_bytes(table.slice(start, BLOCK_ROWS))
        for start in range(0, table.num_rows, BLOCK_ROWS)
    ]
    return pd.DataFrame({_BLOCK_COLUMN: blocks})


def _split_into_blocks(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` before a stateful operator: rows -> ``(group, block)`` rows.

    The first input column is the group key (:func:`_group_key`); the others are the rows. A
    batch whose rows all share one group (the usual case: the source reads one partition per
    task) is serialised as it is; otherwise its rows are first stably sorted by group.
    """
    for batch in batches:
        if not batch.num_rows:
            continue
        groups = pc.dictionary_encode(batch.column(0))
        rows = pa.RecordBatch.from_arrays(batch.columns[1:], schema=batch.schema.remove(0))
        if len(groups.dictionary) == 1:
            names, blocks = [groups.dictionary[0].as_py()], [_block_bytes(rows)]
        else:
            codes = groups.indices.to_numpy(zero_copy_only=False)
            order = np.argsort(codes, kind="stable")
            codes = codes[order]
            ordered = rows.take(pa.array(order))
            starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
            ends = np.r_[starts[1:], len(codes)]
            names = [groups.dictionary[int(codes[s])].as_py() for s in starts]
            blocks = [_block_bytes(ordered.slice(s, e - s)) for s, e in zip(starts, ends)]
        yield pa.RecordBatch.from_arrays(
            [pa.array(names, pa.string()), pa.array(blocks, pa.binary())],
            names=[_GROUP_COLUMN, _BLOCK_COLUMN],
        )


def _explode_blocks(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` after a stateful operator: block rows -> the rows they hold."""
    for batch in batches:
        column = batch.column(0)
        for i in range(len(column)):
            block = column[i].as_buffer()
            if block is None:
                continue
            yield from pa.ipc.open_stream(block)


def _to_blocks(df: DataFrame, group_columns: Sequence[str]) -> DataFrame:
    keyed = df.select(_group_key(df, group_columns), *[df[c] for c in df.columns])
    return keyed.mapInArrow(_split_into_blocks, _BLOCKS_SCHEMA)


def _from_blocks(blocks: DataFrame, schema: StructType) -> DataFrame:
    return blocks.select(_BLOCK_COLUMN).mapInArrow(_explode_blocks, schema)


def _group_key(df: DataFrame, columns: Sequence[str]) -> Column:
    """One string naming the state group; a JSON array keeps it unambiguous."""
    if not columns:
        return F.lit("[]").alias(_GROUP_COLUMN)
    return F.to_json(F.array(*[df[c].cast("string") for c in columns])).alias(_GROUP_COLUMN)


def _require(df: DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(
            f"{what}: input lacks column(s) {missing}; it has {df.columns} "
            "(the filepulsar source columns are in connector.schema.SOURCE_SCHEMA)"
        )
    clash = [c for c in _INTERNAL_COLUMNS if c in df.columns]
    if clash:
        raise ValueError(f"{what}: input column(s) {clash} clash with this module's own columns")


# ============================================================================================
# Key_Shared
# ============================================================================================

_SELECTOR_STATE_SCHEMA = StructType([StructField("selector", StringType(), False)])


def _new_selector(mode: KeySharedMode, consistent: bool, points: int) -> StickyKeyConsumerSelector:
    return selector_for_mode(
        mode, use_consistent_hashing=consistent, consistent_hashing_points=points
    )


def apply_consumers(
    selector: StickyKeyConsumerSelector,
    consumers: Sequence[str],
    *,
    sticky_ranges: Mapping[str, Sequence[tuple[int, int]]] | None = None,
) -> bool:
    """Bring a selector's membership to ``consumers`` the way Pulsar's broker would.

    Consumers that left are removed first, in the order they joined; then the new ones join
    in the order listed. The selector's own join/leave rules decide which hash ranges move, so
    a consumer that stays keeps everything Pulsar would let it keep. For the consistent-hashing
    selector ``consumers`` is a multiset (several consumers may share a name; surplus instances
    leave highest name index first). For the sticky selector a consumer whose ranges changed
    leaves and joins again with its new ranges.

    Runs wherever it is called (the Key_Shared processor calls it on executors); Spark-free.

    Parameters
    ----------
    selector
        The selector to change in place.
    consumers
        Consumer names wanted after the change.
    sticky_ranges
        For a :class:`~dispatch.selectors.StickyHashRangeSelector`: each consumer's inclusive
        hash ranges; required for every listed consumer.

    Returns
    -------
    bool
        Whether the membership changed.

    Raises
    ------
    ConsumerAssignError
        If the selector refuses a change (duplicate name for auto-split, missing or
        overlapping sticky ranges, a range that cannot be split).
    """
    changed = False
    if isinstance(selector, ConsistentHashingSelector):
        wanted = Counter(consumers)
        live: dict[str, list[int]] = {}
        for name, index in selector.instances():
            live.setdefault(name, []).append(index)
        for name, indexes in live.items():
            for index in sorted(indexes, reverse=True)[: max(0, len(indexes) - wanted[name])]:
                selector.remove_consumer(name, name_index=index)
                changed = True
        have = Counter(selector.consumers())
        for name in consumers:
            if have[name] < wanted[name]:
                selector.add_consumer(name)
                have[name] += 1
                changed = True
        return changed
    if len(set(consumers)) != len(consumers):
        raise ConsumerAssignError(
            f"consumer names must be unique for the {selector.kind} selector, got {consumers}"
        )
    if isinstance(selector, StickyHashRangeSelector):
        ranges = dict(sticky_ranges or {})
        missing = [name for name in consumers if not ranges.get(name)]
        if missing:
            raise ConsumerAssignError(f"sticky consumers {missing} have no hash ranges")
        wanted_ranges = {n: sorted((int(s), int(e)) for s, e in ranges[n]) for n in consumers}
        current = selector.ranges()
        for name in list(current):
            if sorted(current[name]) != wanted_ranges.get(name):
                selector.remove_consumer(name)
                changed = True
        present = set(selector.consumers())
        for name in consumers:
            if name not in present:
                selector.add_consumer(name, wanted_ranges[name])
                changed = True
        return changed
    for name in selector.consumers():
        if name not in consumers:
            selector.remove_consumer(name)
            changed = True
    present = set(selector.consumers())
    for name in consumers:
        if name not in present:
            selector.add_consumer(name)
            changed = True
    return changed


class _KeySharedProcessor(StatefulProcessor):
    """One selector per state group (a topic partition), advanced to this run's consumers.

    State (per group): ValueState ``selector`` (``selector string``), the selector's
    :meth:`~dispatch.selectors.StickyKeyConsumerSelector.to_dict` as JSON. Input and output are
    Arrow blocks; the output blocks have the input columns plus ``consumer``.
    """

    def __init__(
        self,
        mode: KeySharedMode,
        consistent: bool,
        consumers: list[str],
        sticky_ranges: dict[str, list[tuple[int, int]]] | None,
        points: int,
    ) -> None:
        self._mode = mode
        self._consistent = consistent
        self._consumers = consumers
        self._sticky_ranges = sticky_ranges
        self._points = points

    def init(self, handle: StatefulProcessorHandle) -> None:
        self._state = handle.getValueState("selector", _SELECTOR_STATE_SCHEMA)
        # Selectors by state text: the groups of one run usually share one membership history,
        # so the selector and its slot table are built once per task, not once per group.
        self._cache: dict[str | None, tuple[StickyKeyConsumerSelector, str]] = {}

    def _selector(self) -> StickyKeyConsumerSelector:
        stored = self._state.get() if self._state.exists() else None
        text = stored[0] if stored else None
        cached = self._cache.get(text)
        if cached is None:
            if text is None:
                selector = _new_selector(self._mode, self._consistent, self._points)
            else:
                selector = selector_from_dict(json.loads(text))
            apply_consumers(selector, self._consumers, sticky_ranges=self._sticky_ranges)
            cached = (selector, json.dumps(selector.to_dict(), separators=(",", ":")))
            self._cache[text] = cached
        selector, new_text = cached
        if new_text != text:
            self._state.update((new_text,))
        return selector

    def handleInputRows(
        self, key: Any, rows: Iterator[Any], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        selector = self._selector()
        names = pa.array(selector.consumers(), pa.string())
        out = []
        for pdf in rows:
            for block in pdf[_BLOCK_COLUMN]:
                table = _read_block(block)
                if not table.num_rows:
                    continue
                keys = sticky_key_array(
                    table.column("orderingKey") if "orderingKey" in table.column_names else None,
                    table.column("key") if "key" in table.column_names else None,
                    table.num_rows,
                )
                owner = selector.select_keys(keys)
                consumer = names.take(pa.array(owner, mask=owner < 0))
                out.append(_block_bytes(table.append_column("consumer", consumer)))
        if out:
            yield pd.DataFrame({_BLOCK_COLUMN: out})

    def close(self) -> None:
        pass


def key_shared_assign(
    df: DataFrame,
    consumers: Sequence[str],
    *,
    mode: KeySharedMode | str = KeySharedMode.AutoSplit,
    use_consistent_hashing: bool = True,
    sticky_ranges: Mapping[str, Sequence[tuple[int, int]]] | None = None,
    consistent_hashing_points: int = DEFAULT_CONSISTENT_HASHING_POINTS,
    group_by: Sequence[str] = ("topic", "partition"),
) -> DataFrame:
    """Add a ``consumer`` column: which Key_Shared consumer receives each message.

    The sticky key is the ordering key if set, else the key, else ``NONE_KEY``
    (:func:`dispatch.hashing.sticky_key_array`); its slot and owner come from
    :mod:`dispatch.selectors`, vectorised over each block. ``consumer`` is null when no consumer
    owns the slot (a sticky selector whose ranges leave it uncovered, or no consumers): in
    Pulsar the message waits.

    One selector is kept per ``group_by`` group -- by default per topic partition, as Pulsar
    keeps one dispatcher and selector per partition. In the first batch of a run in which a
    group has messages, its stored selector is brought to ``consumers`` by
    :func:`apply_consumers`: consumers that left are removed, new ones join, and Pulsar's
    algorithm alone decides which ranges change hands. A group without messages during a run
    applies the net change when it next has some, like a Pulsar partition that never saw a
    consumer come and go.

    Parameters
    ----------
    df
        Streaming DataFrame with ``key`` and/or ``orderingKey`` and the ``group_by`` columns;
        every column is kept.
    consumers
        Consumer names for this run, in joining order (order matters for auto-split and
        consistent hashing, as join order does in Pulsar).
    mode
        ``"AUTO_SPLIT"`` (default) or ``"STICKY"``, in either spelling
        (:class:`dispatch.modes.KeySharedMode`; ``"AutoSplit"``, ``"Sticky"``). It means
        what it means for a subscription.
    use_consistent_hashing
        ``AUTO_SPLIT`` only, Pulsar's broker setting
        ``subscriptionKeySharedUseConsistentHashing``: consistent hashing (default, as in
        Pulsar) or hash-range auto-split (false).
    sticky_ranges
        ``STICKY`` only: inclusive ``(start, end)`` ranges in ``[0, 65535]`` per consumer.
    consistent_hashing_points
        Ring points per consumer (Pulsar's default 100).
    group_by
        Columns whose values each own one selector; ``()`` keeps one selector for the whole
        stream (and one task does all the work).

    Returns
    -------
    DataFrame
        The input columns plus ``consumer`` (string).

    Raises
    ------
    ValueError
        On the driver: an unknown mode, a missing column, or consumers or sticky ranges that
        the selector refuses (:class:`~dispatch.selectors.ConsumerAssignError`).
    TypeError
        If ``consumers`` is a single string.

    Notes
    -----
    State: per group, ValueState ``selector`` (``selector string``); time mode ``None``, output
    mode ``Append``.
    """
    if isinstance(consumers, str):
        raise TypeError("consumers must be a sequence of names, not one string")
    names = list(consumers)
    ranges = None
    if isinstance(mode, str) and mode.strip().upper() == "CONSISTENT_HASHING":
        raise ValueError(
            "key_shared_assign: mode 'CONSISTENT_HASHING' is mode='AUTO_SPLIT' (consistent "
            "hashing is its default; use_consistent_hashing=False selects hash-range auto-split)"
        )
    mode = KeySharedMode.parse(mode, "key_shared_assign: mode")
    if mode is KeySharedMode.Sticky:
        if sticky_ranges is None:
            raise ValueError("mode='STICKY' needs sticky_ranges={consumer: [(start, end), ...]}")
        ranges = {n: [(int(s), int(e)) for s, e in r] for n, r in sticky_ranges.items()}
        unknown = sorted(set(ranges) - set(names))
        if unknown:
            raise ValueError(f"sticky_ranges names consumers {unknown} that are not in consumers")
    elif sticky_ranges is not None:
        raise ValueError(f"sticky_ranges only applies to mode='STICKY', not {mode.wire!r}")
    # Validate on the driver: the call the executors make, on a fresh selector.
    consistent = bool(use_consistent_hashing)
    apply_consumers(
        _new_selector(mode, consistent, consistent_hashing_points), names, sticky_ranges=ranges
    )
    if "key" not in df.columns and "orderingKey" not in df.columns:
        raise ValueError("key_shared_assign: input needs a 'key' or 'orderingKey' column")
    _require(df, list(group_by), "key_shared_assign")
    if "consumer" in df.columns:
        raise ValueError("key_shared_assign: input already has a 'consumer' column")
    processor = _KeySharedProcessor(mode, consistent, names, ranges, consistent_hashing_points)
    assigned = (
        _to_blocks(df, group_by)
        .groupBy(_GROUP_COLUMN)
        .transformWithStateInPandas(processor, _BLOCK_ONLY_SCHEMA, "Append", "None")
    )
    schema = StructType([*df.schema.fields, StructField("consumer", StringType(), True)])
    return _from_blocks(assigned, schema)


# ============================================================================================
# Deduplication
# ============================================================================================

_HIGHEST_STATE_SCHEMA = StructType([StructField("highest", LongType(), False)])


def dedup_keep_mask(
    sequence_ids: npt.ArrayLike, highest_persisted: int | None
) -> tuple[npt.NDArray[np.bool_], int | None]:
    """Pulsar's dedup decision for one producer's messages, in publish order, vectorised.

    A message is new when its sequence id is above the highest persisted before it: the
    producer's stored highest and every earlier sequence id in ``sequence_ids``. This equals
    :meth:`dispatch.dedup.DedupTracker.check` followed by ``record_persisted`` for each kept
    message, one message at a time (for messages that are all persisted, "pushed" and
    "persisted" coincide, so ``UNKNOWN`` cannot occur).

    Parameters
    ----------
    sequence_ids
        Integer sequence ids in the order the messages were written.
    highest_persisted
        The producer's highest persisted id before these messages, or ``None`` if unknown.

    Returns
    -------
    tuple
        ``(keep, highest)``: boolean mask of new messages and the new highest persisted id.
    """
    seq = np.asarray(sequence_ids, dtype=np.int64)
    if seq.size == 0:
        return np.zeros(0, dtype=np.bool_), highest_persisted
    running = np.maximum.accumulate(seq)
    keep = np.empty(seq.shape, dtype=np.bool_)
    keep[1:] = seq[1:] > running[:-1]
    keep[0] = True
    if highest_persisted is not None:
        keep &= seq > highest_persisted
    top = int(running[-1])
    return keep, top if highest_persisted is None else max(top, highest_persisted)


def _position_columns(by_partition: bool) -> list[str]:
    """Message order: the message id within a partition, publish time first across them."""
    position = ["ledgerId", "entryId", "batchIndex"]
    return position if by_partition else ["publishTime", "partition", *position]


class _DedupProcessor(StatefulProcessor):
    """Per-producer highest persisted sequence id; drops what Pulsar's broker would drop.

    State (per group = ``by`` columns + producer): ValueState ``highest`` (``highest long``).
    Input and output are Arrow blocks of the input's rows.
    """

    def __init__(self, position_columns: list[str]) -> None:
        self._sort_keys = [(c, "ascending") for c in position_columns]

    def init(self, handle: StatefulProcessorHandle) -> None:
        self._state = handle.getValueState("highest", _HIGHEST_STATE_SCHEMA)

    def handleInputRows(
        self, key: Any, rows: Iterator[Any], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        table = _read_blocks(rows)
        if table is None:
            return
        # A shuffle interleaves map outputs: restore message order before the running maximum
        # (and copy nothing when the blocks arrived in order).
        order = pc.sort_indices(table, sort_keys=self._sort_keys).to_numpy()
        if np.any(order[1:] < order[:-1]):
            table = table.take(pa.array(order))
        sequence_ids = table.column("sequenceId").to_numpy()
        stored = self._state.get() if self._state.exists() else None
        keep, highest = dedup_keep_mask(sequence_ids, int(stored[0]) if stored else None)
        if highest is not None and (stored is None or highest != stored[0]):
            self._state.update((highest,))
        frame = _blocks_frame(table if keep.all() else table.filter(pa.array(keep)))
        if frame is not None:
            yield frame

    def close(self) -> None:
        pass


def dedup_by_sequence(df: DataFrame, *, by: Sequence[str] = ("topic", "partition")) -> DataFrame:
    """Drop the messages Pulsar's broker deduplication would drop.

    Per producer (within each ``by`` scope) the operator keeps the highest persisted sequence
    id; a message is a duplicate when its ``sequenceId`` is not above that id and every earlier
    sequence id of the producer (:func:`dedup_keep_mask`). "Earlier" is the message order of a
    topic partition, ``(ledgerId, entryId, batchIndex)``, or when ``by`` leaves out
    ``partition``, ``(publishTime, partition, ledgerId, entryId, batchIndex)``.

    This differs from ``df.dropDuplicates(["producerName", "sequenceId"])``: that keeps the
    first row of each exact pair and remembers every pair it has seen, while Pulsar's rule also
    drops a lower id arriving after a higher one (out of order, or replayed by a producer that
    restarted from an old sequence id) and remembers one number per producer, so state stays
    small however long the stream runs.

    Parameters
    ----------
    df
        Streaming DataFrame with ``producerName``, ``sequenceId``, the message position columns
        and the ``by`` columns; every column is kept.
    by
        Columns scoping the producer map. The default, ``("topic", "partition")``, is Pulsar's
        (one map per topic partition); ``()`` compares a producer's sequence ids across the
        whole stream.

    Returns
    -------
    DataFrame
        The surviving rows, with the input's columns, in message order within a producer.

    Raises
    ------
    ValueError
        If a needed column is missing.

    Notes
    -----
    State: per ``(*by, producerName)``, ValueState ``highest`` (``highest long``); time mode
    ``None``, output mode ``Append``. Each group is one producer, handled per micro-batch as one
    block: an Arrow sort by position and a numpy running maximum.
    """
    position = _position_columns("partition" in by)
    _require(df, ["producerName", "sequenceId", *position, *by], "dedup_by_sequence")
    kept = (
        _to_blocks(df, [*by, "producerName"])
        .groupBy(_GROUP_COLUMN)
        .transformWithStateInPandas(_DedupProcessor(position), _BLOCK_ONLY_SCHEMA, "Append", "None")
    )
    return _from_blocks(kept, df.schema)


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
    processing time at which :func:`dispatch.delayed.should_delay` lets it go.
    """

    def __init__(self, tick_ms: int, strict: bool, bucket_ms: int) -> None:
        self._tick_ms = tick_ms
        self._strict = strict
        self._bucket_ms = bucket_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
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
        return _read_block(stored[0])

    def _store_bucket(self, bucket: int, table: pa.Table) -> None:
        self._held.updateValue((bucket,), (_block_bytes(table, compression="lz4"),))

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
            # The JVM sent only rows held at this same batch time; anything else goes out.
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
            frame = _blocks_frame(part)
            if frame is not None:
                yield frame

    def handleInputRows(
        self, key: Any, rows: Iterator[Any], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        table = _read_blocks(rows)
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

    A message is held when :func:`dispatch.delayed.should_delay` says so at the micro-batch's
    processing time: ``deliverAt > now + tick_ms``, or ``deliverAt > now`` when ``strict``
    (null, zero or negative ``deliverAt`` never delays). The test is made twice on the same
    batch timestamp: as a JVM filter that lets every message that is not held bypass the Python
    operator, and inside the operator. Held messages go into state and come out, with all their
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
    (MapState ``held``, ValueState ``index``, timers). Spark 4.3 asks for another micro-batch
    after every batch of a processing-time ``transformWithState``, so under
    ``Trigger.AvailableNow`` the query ends only with no-data batches off: set
    :data:`NO_DATA_BATCHES_CONF` to ``"false"`` before ``start()``. Timers then fire in batches
    that carry data; under a ``processingTime`` trigger (no-data batches on, the default) a
    held message is emitted within one trigger interval of its due time.
    """
    if tick_ms < 0:
        raise ValueError(f"tick_ms must be >= 0, got {tick_ms}")
    if bucket_ms < 1:
        raise ValueError(f"bucket_ms must be >= 1, got {bucket_ms}")
    _require(df, ["deliverAt", *group_by], "delay_until_due")
    deliver_ms = F.unix_millis(df["deliverAt"])
    now_ms = F.unix_millis(F.current_timestamp())
    cutoff = now_ms if strict else now_ms + F.lit(int(tick_ms))
    held = F.coalesce((deliver_ms > 0) & (deliver_ms > cutoff), F.lit(False))
    processor = _DelayProcessor(int(tick_ms), bool(strict), int(bucket_ms))
    released = (
        _to_blocks(df.filter(held), group_by)
        .groupBy(_GROUP_COLUMN)
        .transformWithStateInPandas(processor, _BLOCK_ONLY_SCHEMA, "Append", "ProcessingTime")
    )
    return df.filter(~held).unionByName(_from_blocks(released, df.schema))


# ============================================================================================
# Retry letter / dead letter
# ============================================================================================

_RETRY_OUTPUT_COLUMNS = ("value", "key", "orderingKey", "properties", "eventTime")
_RETRY_PROPERTIES = (
    PROPERTY_REAL_TOPIC,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RECONSUME_TIMES,
    PROPERTY_DELAY_TIME,
)


def _suffix(name_of: Any, subscription: str) -> str:
    """The fixed suffix of a default letter-topic name (checked to be a plain suffix)."""
    suffix = str(name_of("", subscription))
    if name_of("t", subscription) != "t" + suffix:
        raise AssertionError(f"{name_of.__name__} no longer appends a suffix")
    return suffix


def route_retry_dlq(
    df: DataFrame,
    *,
    subscription: str,
    failed_col: str = "failed",
    topic_col: str = "topic",
    delay_ms: int | None = None,
    backoff: MultiplierRedeliveryBackoff | None = None,
    max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
    retry_topic: str | None = None,
    dead_letter_topic_name: str | None = None,
) -> DataFrame:
    """Pulsar's ``reconsumeLater`` for the messages marked failed: retry or dead-letter copies.

    For every row whose ``failed_col`` is true (others are acknowledged and dropped), one copy
    is produced, as ``ConsumerImpl.reconsumeLater`` sends it:

    * properties gain ``REAL_TOPIC`` (the topic) and ``ORIGIN_MESSAGE_ID`` (``messageId``) unless
      present, ``RECONSUMETIMES`` (1 on the first retry, else the previous value + 1; a value
      that is not a number counts as absent) and ``DELAY_TIME`` (the delay in ms);
    * when ``RECONSUMETIMES > max_reconsume_times`` the copy goes to the dead-letter topic with
      no delay (:func:`dispatch.redelivery.retry_goes_to_dead_letter`), else to the retry topic
      with ``deliverAt = batch time + delay``;
    * the delay is ``delay_ms``, or ``backoff.next(n)`` with ``n`` the previous
      ``RECONSUMETIMES`` (0 on the first retry).

    No state is needed: the retry count travels in the message, as in Pulsar. The operator is
    Spark SQL only (no Python worker); ``current_timestamp()`` is the micro-batch's timestamp,
    recorded in the offset log, so a replayed batch computes the same ``deliverAt``.

    Parameters
    ----------
    df
        DataFrame with ``value``, ``messageId``, ``properties``, the topic and failed columns.
    subscription
        Subscription name, for the default topic names ``<topic>-<subscription>-RETRY`` and
        ``-DLQ`` (:func:`dispatch.redelivery.retry_letter_topic`, ``dead_letter_topic``), where
        ``<topic>`` is ``REAL_TOPIC`` when present (a message consumed from the retry topic).
    failed_col
        Boolean column marking failed messages (null counts as not failed).
    topic_col
        Column with the message's topic.
    delay_ms
        Fixed retry delay in ms (Pulsar's ``reconsumeLater(msg, delay, unit)``).
    backoff
        Instead of ``delay_ms``: delay from a :class:`MultiplierRedeliveryBackoff`.
    max_reconsume_times
        The dead-letter policy's ``maxRedeliverCount`` (16 when retry is on without a policy).
    retry_topic, dead_letter_topic_name
        Explicit topic names (``DeadLetterPolicy.retryLetterTopic`` / ``deadLetterTopic``).

    Returns
    -------
    DataFrame
        Columns the filepulsar sink takes: ``value``, ``key``, ``orderingKey``,
        ``properties``, ``eventTime`` (those present in the input), ``deliverAt`` and
        ``topic`` (the target), so it can be written with ``writeStream.format("filepulsar")``.

    Raises
    ------
    ValueError
        If not exactly one of ``delay_ms`` and ``backoff`` is given, a number is negative, or a
        needed column is missing.
    """
    if (delay_ms is None) == (backoff is None):
        raise ValueError("give exactly one of delay_ms= and backoff=")
    if delay_ms is not None and delay_ms < 0:
        raise ValueError(f"delay_ms must be >= 0, got {delay_ms}")
    if max_reconsume_times < 0:
        raise ValueError(f"max_reconsume_times must be >= 0, got {max_reconsume_times}")
    if not subscription:
        raise ValueError("subscription must be a non-empty name")
    _require(df, ["value", "messageId", "properties", topic_col, failed_col], "route_retry_dlq")
    props = F.coalesce(df["properties"], F.create_map().cast("map<string,string>"))
    previous = props.getItem(PROPERTY_RECONSUME_TIMES).try_cast("long")
    times = F.coalesce(previous + 1, F.lit(1)).cast("long")
    if backoff is not None:
        # backoff.next(n) for every n it distinguishes; above the last it stays at the maximum.
        table = [backoff.next(n) for n in range(backoff.max_multiplier_pow + 2)]
        n = F.least(F.greatest(times - 1, F.lit(0)), F.lit(len(table) - 1)).cast("int")
        delay = F.element_at(F.array(*[F.lit(int(v)) for v in table]), n + 1).cast("long")
    else:
        delay = F.lit(int(delay_ms or 0)).cast("long")
    real_topic = F.coalesce(props.getItem(PROPERTY_REAL_TOPIC), df[topic_col])
    to_dead_letter = times > F.lit(int(max_reconsume_times))
    retry_name = (
        F.lit(retry_topic)
        if retry_topic
        else F.concat(real_topic, F.lit(_suffix(retry_letter_topic, subscription)))
    )
    dead_name = (
        F.lit(dead_letter_topic_name)
        if dead_letter_topic_name
        else F.concat(real_topic, F.lit(_suffix(dead_letter_topic, subscription)))
    )
    kept = F.map_filter(props, lambda k, _: ~k.isin(*_RETRY_PROPERTIES))
    added = F.create_map(
        F.lit(PROPERTY_REAL_TOPIC),
        real_topic,
        F.lit(PROPERTY_ORIGIN_MESSAGE_ID),
        F.coalesce(props.getItem(PROPERTY_ORIGIN_MESSAGE_ID), df["messageId"]),
        F.lit(PROPERTY_RECONSUME_TIMES),
        times.cast("string"),
        F.lit(PROPERTY_DELAY_TIME),
        delay.cast("string"),
    )
    deliver_at = F.when(
        ~to_dead_letter,
        F.timestamp_millis(F.unix_millis(F.current_timestamp()) + delay),
    )
    failed = df.filter(F.coalesce(df[failed_col].cast("boolean"), F.lit(False)))
    return failed.select(
        *[failed[c] for c in _RETRY_OUTPUT_COLUMNS if c in df.columns and c != "properties"],
        F.map_concat(kept, added).alias("properties"),
        deliver_at.alias("deliverAt"),
        F.when(to_dead_letter, dead_name).otherwise(retry_name).alias("topic"),
    )
