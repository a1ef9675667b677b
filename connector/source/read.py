"""The executor side of the Spark source: one task's messages as Arrow record batches.

Spark runs :func:`read_partition` in its Python workers with only the picklable
:class:`~filepulsar.connector.source.partition.FilePulsarPartition` the driver planned (see
:mod:`filepulsar.connector.source.batch`). The hot path never builds a Python object per message:
entries are decoded into Arrow tables and every column is built with Arrow/numpy kernels
(:mod:`filepulsar.connector.source.columns`). The messages of the task's range come from
storage's one way out of the ledger (:func:`filepulsar.storage.read_range.read_range`: loss
checks, the compacted view, chunk reassembly and its lookback); this module trims, filters and
builds Spark's columns, and hands Spark batches.

Reading streams: storage reads entries lazily and decodes them in groups of about
:data:`~filepulsar.storage.read_range.GROUP_ROWS` messages (the first group smaller, so Spark
starts consuming early), and each group goes to Spark as record batches of about
:data:`SPARK_BATCH_ROWS` rows.

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

from collections.abc import Iterator

import pyarrow as pa

from filepulsar.connector.schema import SOURCE_ARROW_SCHEMA, typed_schemas
from filepulsar.connector.source.columns import (
    filter_by_properties,
    redelivery_counts,
    storage_columns,
    to_spark,
    trim_to_range,
)
from filepulsar.connector.source.partition import FilePulsarPartition
from filepulsar.connector.values.decode import ValueDecoder, decode_columns
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.ledger import Position
from filepulsar.storage.names import TopicName
from filepulsar.storage.read_range import read_range

#: Rows per Arrow batch handed to Spark (Spark's own default for Arrow batches).
SPARK_BATCH_ROWS = 10_000


# --------------------------------------------------------------------------- the task


def read_partition(p: FilePulsarPartition) -> Iterator[pa.RecordBatch]:
    """Messages of one task as Arrow record batches in the source schema (executor side).

    The messages of the task's range come from storage's one way out of the ledger
    (:func:`filepulsar.storage.read_range.read_range`: the topic's state and incarnation, the
    loss checks, the compacted view, chunk reassembly with its lookback); this function trims
    partial entries, filters by property, adds redelivery counts and builds Spark's columns.

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
    counts = {Position(lid, eid): c for lid, eid, c in p.positions} if p.positions else None
    decoder = ValueDecoder(p.value, store) if p.value is not None else None
    full = SOURCE_ARROW_SCHEMA
    decode = None
    if decoder is not None:
        full = typed_schemas(decoder.spec.columns(), decoder.spec.mode == "flatten")[1]

        def decode(table: pa.Table, t: TopicName) -> dict[str, pa.Array]:
            return decode_columns(decoder, table, t)

    for table in read_range(store, topic, p.message_range(), storage_columns(p)):
        table = filter_by_properties(trim_to_range(table, p), p.property_filter)
        if not table.num_rows:
            continue
        red = redelivery_counts(table, counts) if counts is not None else None
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
