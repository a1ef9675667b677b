"""Arrow-block transport shared by the Spark operators of :mod:`filepulsar.dispatch.spark`: rows
to one Arrow IPC stream per group and back (executor side, picklable by reference), and the
input checks the operators share.

An operator module uses it in four steps:

1. on the driver, :func:`require_columns` checks the input and :func:`to_blocks` turns it into
   ``(GROUP_COLUMN, BLOCK_COLUMN)`` rows, one per state group and input batch;
2. on the executor, its stateful processor (a :class:`BlockProcessor`, which keeps PySpark's
   driver-side worker quiet) calls :func:`settle_worker` once, reads a group's
   input with :func:`read_blocks` (or one cell with :func:`read_block`) and returns
   :func:`blocks_frames` of its output (Arrow-backed: no copy into PySpark's output), whose
   schema is :data:`BLOCK_ONLY_SCHEMA`;
3. on the driver again, :func:`from_blocks` turns those blocks back into rows of the input's
   schema, remembering them so a chained operator takes the blocks as they are;
4. state kept as Arrow bytes uses :func:`block_bytes` and :func:`read_block`.
"""

from __future__ import annotations

import functools
import gc
import json
import re
import sys
import weakref
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import StatefulProcessor
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    IntegerType,
    LongType,
    ShortType,
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
GROUP_COLUMN = "pulsar_group"
"""The column naming a block's state group (:func:`group_key`)."""
BLOCK_COLUMN = "pulsar_block"
"""The binary column holding one Arrow IPC stream."""
INTERNAL_COLUMNS = (GROUP_COLUMN, BLOCK_COLUMN)
"""The columns an operator's input must not have (:func:`require_columns` checks)."""

BLOCKS_SCHEMA = StructType(
    [StructField(GROUP_COLUMN, StringType(), True), StructField(BLOCK_COLUMN, BinaryType(), True)]
)
"""The schema of :func:`to_blocks`' output: group name and block."""
BLOCK_ONLY_SCHEMA = StructType([StructField(BLOCK_COLUMN, BinaryType(), True)])
"""The output schema of a stateful operator's processor: blocks only (:func:`blocks_frames`)."""


# ============================================================================================
# Arrow blocks: rows <-> one IPC stream per group (executor side, picklable by reference)
# ============================================================================================


_SETTLED = [False]


def settle_worker() -> None:
    """Take what this Python worker has loaded out of the garbage collector's sight (once).

    Spark's daemon runs a full ``gc.collect()`` after every task of a reused Python worker.
    With pandas, pyarrow and pyspark loaded, that walks some 75k long-lived objects: 25-100 ms
    per task, a third of the operators' Python CPU time in a py-spy profile of 100k-message
    batches. ``gc.freeze()`` moves every object alive now (modules, classes, this module's
    state) into a permanent generation that collections skip; objects made later are
    collected as before. Called on executors only, by the functions Spark runs there.
    """
    if not _SETTLED[0]:
        _SETTLED[0] = True
        gc.collect()
        gc.freeze()


# ============================================================================================
# The driver-side worker's status lines
# ============================================================================================

DRIVER_WORKER_MODULE = "pyspark.sql.streaming.transform_with_state_driver_worker"
"""The module PySpark runs in a Python process of its own on the driver, once per stateful
operator and query start, to call a processor's ``init`` for its state schema."""
DRIVER_WORKER_STATUS = "Streaming TransformWithStateInPandas Python worker"
"""How that module's status lines start; it prints them with ``print``, which Spark copies to
its own stderr whatever the log level."""


class _WithoutStatusLines:
    """A text stream passing on what is written to it except PySpark's driver-worker status
    lines (:data:`DRIVER_WORKER_STATUS`) and the empty line printed after each."""

    def __init__(self, stream: object) -> None:
        self._stream = stream
        self._after_status = False

    def write(self, text: str) -> int:
        dropped = text.startswith(DRIVER_WORKER_STATUS) or (self._after_status and text == "\n")
        self._after_status = text.startswith(DRIVER_WORKER_STATUS)
        if dropped:
            return len(text)
        return int(self._stream.write(text))  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


def quiet_driver_worker() -> None:
    """In PySpark's driver-side worker (:data:`DRIVER_WORKER_MODULE`), drop its status lines.

    That process prints five lines per stateful operator and query start (the processor it
    received, the state server's port, the start and end of ``init``), each followed by an
    empty line, on stdout, which Spark copies to its stderr at any log level. The first one
    ("Starting ...") is printed before the processor is unpickled, so before any code of
    this package runs there: it stays. Elsewhere (executors, the driver) this does nothing.
    """
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if getattr(spec, "name", None) != DRIVER_WORKER_MODULE:
        return
    if not isinstance(sys.stdout, _WithoutStatusLines):
        sys.stdout = _WithoutStatusLines(sys.stdout)


class BlockProcessor(StatefulProcessor):
    """The operators' stateful processors: when PySpark's driver-side worker unpickles one
    (to read its state schema), that process's status lines are dropped
    (:func:`quiet_driver_worker`), whatever the processor holds (pickle calls no
    ``__setstate__`` for an instance whose ``__dict__`` is empty: it is rebuilt by
    :func:`_unpickled` instead)."""

    def __reduce__(self) -> tuple[object, ...]:
        return (_unpickled, (type(self), dict(self.__dict__)))


def _unpickled(cls: type[BlockProcessor], state: dict[str, object]) -> BlockProcessor:
    """A :class:`BlockProcessor` being unpickled (:meth:`BlockProcessor.__reduce__`)."""
    quiet_driver_worker()
    processor = cls.__new__(cls)
    processor.__dict__.update(state)
    return processor


def block_bytes(table: pa.Table | pa.RecordBatch, *, compression: str | None = None) -> bytes:
    """``table`` as one Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write(table)
    return sink.getvalue().to_pybytes()


def read_block(block: bytes | pa.Buffer) -> pa.Table:
    """The table one Arrow IPC stream (:func:`block_bytes`) holds."""
    return pa.ipc.open_stream(block, options=_READ).read_all()


def read_blocks(rows: Iterable[pd.DataFrame]) -> pa.Table | None:
    """All blocks of one group's input, concatenated (``None`` when there are none)."""
    tables = [read_block(b) for pdf in rows for b in pdf[BLOCK_COLUMN] if b is not None]
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return None
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


def blocks_array(parts: Sequence[pa.Table | pa.RecordBatch]) -> pa.BinaryArray:
    """``parts`` as one binary array of Arrow IPC streams (:func:`block_bytes`), one per part
    (the rows-to-blocks pass: one Arrow batch of Spark's, bounded by its
    ``spark.sql.execution.arrow.maxRecordsPerBatch``). More than one array holds (2 GiB)
    raises :class:`pyarrow.ArrowInvalid`; :func:`blocks_arrays` splits instead."""
    arrays = list(blocks_arrays(parts))
    if len(arrays) > 1:
        raise pa.ArrowInvalid(
            f"{len(parts)} Arrow blocks of one Arrow batch exceed one binary array's "
            f"{_MAX_BINARY_BYTES} bytes: lower spark.sql.execution.arrow.maxRecordsPerBatch"
        )
    return arrays[0] if arrays else pa.array([], pa.binary())


def blocks_arrays(parts: Iterable[pa.Table | pa.RecordBatch]) -> Iterator[pa.BinaryArray]:
    """``parts`` as binary arrays of Arrow IPC streams (:func:`block_bytes`), one stream per
    part, in order, as few arrays as hold them.

    Every stream is written, LZ4-compressed (:data:`_TRANSPORT`), into one buffer that an
    array then wraps, so each block's bytes are written once (no Python ``bytes`` per block,
    no copy into the array); PySpark hands an array of this kind to the JVM as it is
    (:func:`blocks_frames`). An array holds at most 2 GiB (Arrow's ``binary`` offsets, which
    Spark's ``BinaryType`` uses): the streams beyond start the next array. One stream over
    that raises :class:`pyarrow.ArrowInvalid` (a block of :data:`BLOCK_ROWS` messages of
    more than 2 GiB).
    """
    sink = pa.BufferOutputStream()
    offsets = [0]
    for part in parts:
        with pa.ipc.new_stream(sink, part.schema, options=_TRANSPORT) as writer:
            writer.write(part)
        end = sink.tell()
        if end > _MAX_BINARY_BYTES:
            data = sink.getvalue()
            last = data.slice(offsets[-1])
            if last.size > _MAX_BINARY_BYTES:
                raise pa.ArrowInvalid(
                    f"an Arrow block of {part.num_rows} messages is {last.size} bytes, more "
                    f"than one binary array's {_MAX_BINARY_BYTES}: messages this large cannot "
                    "pass through a stateful operator"
                )
            yield _binary_array(offsets, data)
            sink = pa.BufferOutputStream()
            sink.write(last)  # (this one block copied: it starts the next array)
            offsets = [0]
            end = last.size
        offsets.append(end)
    if len(offsets) > 1:
        yield _binary_array(offsets, sink.getvalue())


def _binary_array(offsets: list[int], data: pa.Buffer) -> pa.BinaryArray:
    return pa.Array.from_buffers(
        pa.binary(), len(offsets) - 1, [None, pa.array(offsets, pa.int32()).buffers()[1], data]
    )


_MAX_BINARY_BYTES = 2**31 - 1

_TRANSPORT = pa.ipc.IpcWriteOptions(compression="lz4", use_threads=False)
_READ = pa.ipc.IpcReadOptions(use_threads=False)  # (decompressed on the calling thread: no pool
# of Arrow's CPU threads started in every Python worker)
"""How blocks between the passes of an operator are written: LZ4-compressed (a reader
decompresses them whatever the option), on the calling thread. Spark copies each block
several times on its way (into and out of Arrow, into and out of the shuffle); compressed,
the bench's 100k-message micro-batch is 5.5 MB of blocks instead of 28 MB, and the JVM's
task threads spent 3.3-3.6 us a message of ``key_shared_assign`` instead of 4.4-5.0, its
garbage collector 0.13-0.23 instead of 0.3-0.6, for no more Python time (interleaved A/B,
docs/dispatch-operators.md, Speed)."""


def blocks_frames(*tables: pa.Table | pa.RecordBatch) -> Iterator[pd.DataFrame]:
    """A stateful operator's output: ``tables`` cut into blocks of at most :data:`BLOCK_ROWS`,
    in order, in as few frames as hold them (none when they hold no row): a frame's column
    holds at most 2 GiB (:func:`blocks_arrays`), and what one call outputs is not bounded by
    a micro-batch's input (``delay_until_due`` releases at once what came due together, held
    over many triggers); PySpark sends each frame a processor yields as its own Arrow batch.

    The column is backed by Arrow (``pd.ArrowDtype``), so PySpark's conversion of a
    processor's output to Arrow takes it without a copy; a column of Python ``bytes`` cost
    three copies of every block (in a py-spy profile of ``key_shared_assign``, a quarter of
    the state step's Python samples).
    """
    parts = (
        table.slice(start, BLOCK_ROWS)
        for table in tables
        for start in range(0, table.num_rows, BLOCK_ROWS)
    )
    for array in blocks_arrays(parts):
        blocks = pd.arrays.ArrowExtensionArray(array)
        yield pd.DataFrame({BLOCK_COLUMN: pd.Series(blocks, copy=False)})


def split_into_blocks(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` before a stateful operator: rows -> ``(group, block)`` rows.

    The first input column is the group key (:func:`group_key`); the others are the rows. A
    batch whose rows all share one group (the usual case: the source reads one partition per
    task) is serialised as it is; otherwise its rows are first stably sorted by group.
    """
    settle_worker()
    for batch in batches:
        if not batch.num_rows:
            continue
        groups = pc.dictionary_encode(batch.column(0))
        rows = pa.RecordBatch.from_arrays(batch.columns[1:], schema=batch.schema.remove(0))
        yield _grouped_blocks(groups, rows)


def split_rows(
    group_columns: Sequence[str], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` before a stateful operator whose group columns are strings or integers:
    rows -> ``(group, block)`` rows, the group names made here (:func:`group_names`).

    The rows cross from the JVM as they are, with no group column computed there for every
    row (a JSON string per row, the most expensive expression of the plan before).
    """
    settle_worker()
    for batch in batches:
        if batch.num_rows:
            yield _grouped_blocks(group_names(group_columns, batch), batch)


def _grouped_blocks(groups: pa.DictionaryArray, rows: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
    """``(group, block)`` rows: ``rows`` cut into one block per distinct value of ``groups``
    (the group names, one per row), each block keeping its rows' order."""
    if len(groups.dictionary) == 1:
        names, parts = [groups.dictionary[0].as_py()], [rows]
    else:
        codes = groups.indices.to_numpy(zero_copy_only=False)
        order = np.argsort(codes, kind="stable")
        codes = codes[order]
        ordered = rows.take(pa.array(order))
        starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
        ends = np.r_[starts[1:], len(codes)]
        names = [groups.dictionary[int(codes[s])].as_py() for s in starts]
        parts = [ordered.slice(s, e - s) for s, e in zip(starts, ends)]
    return pa.RecordBatch.from_arrays(
        [pa.array(names, pa.string()), blocks_array(parts)],
        names=[GROUP_COLUMN, BLOCK_COLUMN],
    )


def explode_blocks(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` after a stateful operator: block rows -> the rows they hold."""
    settle_worker()
    for block in _blocks_of(batches):
        yield from pa.ipc.open_stream(block, options=_READ)


def _blocks_of(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.Buffer]:
    """The blocks of ``mapInArrow`` input whose first column holds blocks (nulls skipped)."""
    for batch in batches:
        column = batch.column(0)
        for i in range(len(column)):
            block = column[i].as_buffer()
            if block is not None:
                yield block


def group_names(columns: Sequence[str], table: pa.Table | pa.RecordBatch) -> pa.DictionaryArray:
    """The group name of every row of ``table``, as :func:`group_key` makes it on the JVM:
    a JSON array of the ``columns`` cast to strings (``null`` for null).

    JSON is made once per distinct combination of values (a block holds a few). Only string
    and integer columns are handled (:func:`_python_keyable` checks); a string with a control
    character is escaped as Spark's ``to_json`` does (``\\n``, ``\\u001F``)."""
    if not columns:
        return pc.dictionary_encode(pa.array(["[]"] * table.num_rows, pa.string()))
    indexes, dictionaries = [], []
    combined: npt.NDArray[np.int64] | None = None
    for name in columns:
        encoded = pc.dictionary_encode(table.column(name))
        if isinstance(encoded, pa.ChunkedArray):
            encoded = encoded.combine_chunks()
        # Encoded first, cast after: each distinct value becomes a string once.
        values = [*encoded.dictionary.cast(pa.string()).to_pylist(), None]
        index = pc.fill_null(encoded.indices.cast(pa.int64()), len(values) - 1).to_numpy()
        indexes.append(index)
        dictionaries.append(values)
        if combined is None:
            combined = index
        else:  # one code per distinct combination so far, kept dense so it cannot overflow
            mixed = combined * len(values) + index
            combined = np.unique(mixed, return_inverse=True)[1].reshape(-1)
    assert combined is not None
    _, first, inverse = np.unique(combined, return_index=True, return_inverse=True)
    names = [
        _json_like_spark([values[int(index[row])] for values, index in zip(dictionaries, indexes)])
        for row in first.tolist()
    ]
    return pa.DictionaryArray.from_arrays(
        pa.array(inverse.reshape(-1), pa.int32()), pa.array(names, pa.string())
    )


def _json_like_spark(values: list[str | None]) -> str:
    """``to_json(array(...))`` of strings as Spark writes it (Jackson): compact, non-ASCII as
    is, control characters as short escapes or upper-case ``\\u00XX``."""
    text = json.dumps(values, ensure_ascii=False, separators=(",", ":"))
    if "\\u00" not in text:
        return text
    return _LOWER_HEX_ESCAPE.sub(lambda m: m.group(0).upper().replace("\\U", "\\u"), text)


_LOWER_HEX_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u00[0-9a-f]{2}")


def rekey_blocks(
    group_columns: Sequence[str], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` between two chained stateful operators: the first one's output blocks
    -> ``(group, block)`` rows for the second, with no row leaving Arrow."""
    settle_worker()
    for block in _blocks_of(batches):
        table = read_block(block)
        if table.num_rows:
            yield _grouped_blocks(group_names(group_columns, table), table)


# A stateful operator's output DataFrame -> its blocks: the next operator of a chain takes
# the blocks as they are instead of rows cut back into blocks (two JVM <-> Arrow conversions
# of every row fewer per link). Only the very DataFrame an operator returned is in here.
_CHAINED: weakref.WeakKeyDictionary[DataFrame, DataFrame] = weakref.WeakKeyDictionary()

_REKEYABLE = (StringType, ByteType, ShortType, IntegerType, LongType)


def _python_keyable(df: DataFrame, group_columns: Sequence[str]) -> bool:
    """Whether every group column is a string or an integer, whose group names Python makes
    exactly as the JVM's :func:`group_key` (:func:`group_names`)."""
    types = {f.name: f.dataType for f in df.schema.fields}
    return all(isinstance(types.get(c), _REKEYABLE) for c in group_columns)


def _chained_blocks(df: DataFrame, group_columns: Sequence[str]) -> DataFrame | None:
    """The blocks ``df`` was made from, when it is a stateful operator's output as returned
    and every group column is a string or an integer (whose group names Python makes)."""
    blocks = _CHAINED.get(df)
    if blocks is None or not _python_keyable(df, group_columns):
        return None
    return blocks


def to_blocks(df: DataFrame, group_columns: Sequence[str]) -> DataFrame:
    """``df`` as ``(group, block)`` rows (:data:`BLOCKS_SCHEMA`), one per ``group_columns``
    value and input batch; the blocks an operator's output came from when ``df`` is that
    output as returned (the chain stays in Arrow). Runs on the driver; builds a plan only.

    Group names of string and integer columns are made in Python from the rows' own columns
    (:func:`split_rows`); other types get theirs from a JVM projection first
    (:func:`group_key`, :func:`split_into_blocks`). Both spell a group the same way."""
    blocks = _chained_blocks(df, group_columns)
    if blocks is not None:
        rekey = functools.partial(rekey_blocks, tuple(group_columns))
        return blocks.mapInArrow(rekey, BLOCKS_SCHEMA)
    if _python_keyable(df, group_columns):
        return df.mapInArrow(functools.partial(split_rows, tuple(group_columns)), BLOCKS_SCHEMA)
    keyed = df.select(group_key(df, group_columns), *[df[c] for c in df.columns])
    return keyed.mapInArrow(split_into_blocks, BLOCKS_SCHEMA)


def from_blocks(blocks: DataFrame, schema: StructType) -> DataFrame:
    """A stateful operator's output blocks back as rows of ``schema``, remembered so that the
    next operator of a chain takes the blocks instead (:func:`to_blocks`)."""
    block_only = blocks.select(BLOCK_COLUMN)
    rows = block_only.mapInArrow(explode_blocks, schema)
    _CHAINED[rows] = block_only
    return rows


def group_key(df: DataFrame, columns: Sequence[str]) -> Column:
    """One string naming the state group; a JSON array keeps it unambiguous."""
    if not columns:
        return F.lit("[]").alias(GROUP_COLUMN)
    return F.to_json(F.array(*[df[c].cast("string") for c in columns])).alias(GROUP_COLUMN)


def require_columns(df: DataFrame, columns: Sequence[str], what: str) -> None:
    """Raise :class:`ValueError` naming ``what`` when ``df`` lacks one of ``columns`` or has
    one of :data:`INTERNAL_COLUMNS`."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(
            f"{what}: input lacks column(s) {missing}; it has {df.columns} "
            "(the filepulsar source columns are in connector.schema.SOURCE_SCHEMA)"
        )
    clash = [c for c in INTERNAL_COLUMNS if c in df.columns]
    if clash:
        raise ValueError(f"{what}: input column(s) {clash} clash with this module's own columns")
