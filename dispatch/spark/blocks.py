"""Arrow-block transport shared by the Spark operators of :mod:`filepulsar.dispatch.spark`: rows
to one Arrow IPC stream per group and back (executor side, picklable by reference), and the
input checks the operators share.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    StringType,
    StructField,
    StructType,
)

NO_DATA_BATCHES_CONF = "spark.sql.streaming.noDataMicroBatches.enabled"
"""Spark setting that, ``"false"``, lets an AvailableNow run of :func:`delay_until_due` end by
itself (needed only where :mod:`filepulsar.dispatch.spark.available_now` cannot end it: Spark
Connect)."""

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
