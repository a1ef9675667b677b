"""``dedup_by_sequence``: Pulsar's broker-side sequence-id deduplication as a Spark
operator (see :mod:`filepulsar.dispatch.spark`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import (
    LongType,
    StructField,
    StructType,
)

from filepulsar.dispatch.dedup import NO_SEQUENCE_ID, dedup_keep_mask
from filepulsar.dispatch.spark.blocks import (
    BLOCK_ONLY_SCHEMA,
    GROUP_COLUMN,
    BlockProcessor,
    blocks_frames,
    from_blocks,
    read_blocks,
    require_columns,
    settle_worker,
    to_blocks,
)

# ============================================================================================
# Deduplication
# ============================================================================================

_HIGHEST_STATE_SCHEMA = StructType([StructField("highest", LongType(), False)])


def _position_columns(by_partition: bool) -> list[str]:
    """Message order: the message id within a partition, publish time first across them."""
    position = ["ledgerId", "entryId", "batchIndex"]
    return position if by_partition else ["publishTime", "partition", *position]


class _DedupProcessor(BlockProcessor):
    """Per-producer highest persisted sequence id; drops what Pulsar's broker would drop.

    State (per group = ``by`` columns + producer): ValueState ``highest`` (``highest long``).
    Input and output are Arrow blocks of the input's rows.
    """

    def __init__(self, position_columns: list[str]) -> None:
        self._sort_keys = [(c, "ascending") for c in position_columns]

    def init(self, handle: StatefulProcessorHandle) -> None:
        settle_worker()
        self._state = handle.getValueState("highest", _HIGHEST_STATE_SCHEMA)

    def handleInputRows(
        self, key: Any, rows: Iterator[Any], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        table = read_blocks(rows)
        if table is None:
            return
        # A shuffle interleaves map outputs: restore message order before the running maximum
        # (and copy nothing when the blocks arrived in order).
        order = pc.sort_indices(table, sort_keys=self._sort_keys).to_numpy()
        if np.any(order[1:] < order[:-1]):
            table = table.take(pa.array(order))
        # A null id is as absent as the stored "none" marker: the row passes, state unmoved.
        sequence_ids = pc.fill_null(table.column("sequenceId"), NO_SEQUENCE_ID).to_numpy()
        stored = self._state.get() if self._state.exists() else None
        keep, highest = dedup_keep_mask(sequence_ids, int(stored[0]) if stored else None)
        if highest is not None and (stored is None or highest != stored[0]):
            self._state.update((highest,))
        yield from blocks_frames(table if keep.all() else table.filter(pa.array(keep)))

    def close(self) -> None:
        pass


def dedup_by_sequence(df: DataFrame, *, by: Sequence[str] = ("topic", "partition")) -> DataFrame:
    """Drop the messages Pulsar's broker deduplication would drop.

    Per producer (within each ``by`` scope) the operator keeps the highest persisted sequence
    id; a message is a duplicate when its ``sequenceId`` is not above that id and every earlier
    sequence id of the producer (:func:`dedup_keep_mask`). "Earlier" is the message order of a
    topic partition, ``(ledgerId, entryId, batchIndex)``, or when ``by`` leaves out
    ``partition``, ``(publishTime, partition, ledgerId, entryId, batchIndex)``.

    Only producer-assigned sequence ids are deduplicated, as by Pulsar's broker: a row whose
    ``sequenceId`` is negative or null (no id; the Spark sink stores ``-1`` for rows it wrote
    without a ``sequenceId`` column, all under one producer name per query) passes through
    untouched and does not move the producer's highest id. So dedup what producers that
    assign sequence ids wrote -- pulsar-client producers (their ids are ``last + 1`` when
    ``send`` is given none), the Spark sink with a ``sequenceId`` column -- where a retrying
    producer may have written a message twice. Topics another Spark query wrote without a
    ``sequenceId`` column (a retry topic, the output of an upstream job) need no dedup: that
    sink is exactly-once by its batch commit, and their rows pass through.

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
    require_columns(df, ["producerName", "sequenceId", *position, *by], "dedup_by_sequence")
    kept = (
        to_blocks(df, [*by, "producerName"])
        .groupBy(GROUP_COLUMN)
        .transformWithStateInPandas(_DedupProcessor(position), BLOCK_ONLY_SCHEMA, "Append", "None")
    )
    return from_blocks(kept, df.schema)
