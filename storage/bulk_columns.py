"""The bulk writers' input columns: what ``send_table`` and the Spark sink accept, stored.

:func:`normalize` checks and converts the input columns of a bulk write (``Producer.send_table``,
the Spark sink's task writer) to the stored column types of the entry format
(``filepulsar.storage.entry.MESSAGE_SCHEMA``), naming the column that is missing, unknown or of the
wrong type; :func:`stored_columns` picks the stored columns of normalized rows. The entry cutter
(``filepulsar.storage.batcher``) cuts the normalized rows into entries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from filepulsar.storage.entry import MESSAGE_SCHEMA
from filepulsar.storage.errors import InvalidConfiguration

BULK_COLUMNS = (
    "value",
    "key",
    "ordering_key",
    "properties",
    "event_time",
    "sequence_id",
    "deliver_at",
)


def normalize(data: pa.Table | pa.RecordBatch | Sequence[Any]) -> pa.Table:
    """Check and convert the input of ``send_table`` to stored column types.

    Accepts a table or record batch with a ``value`` column (binary or string) and any of
    ``key`` (string), ``ordering_key`` (binary or string), ``properties`` (map<string,string>),
    ``event_time`` and ``deliver_at`` (int64 ms or timestamp), ``sequence_id`` (integer); or a
    plain sequence of bytes values.

    Raises
    ------
    InvalidConfiguration
        Naming the column that is missing, unknown or of the wrong type.
    """
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    elif not isinstance(data, pa.Table):
        try:
            data = pa.table({"value": pa.array(data, pa.binary())})
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
            raise InvalidConfiguration("send_table needs a pyarrow Table or a list of bytes") from e
    unknown = [c for c in data.column_names if c not in BULK_COLUMNS]
    if unknown:
        raise InvalidConfiguration(
            f"unknown column(s) {unknown} for send_table: allowed are {', '.join(BULK_COLUMNS)}"
        )
    if "value" not in data.column_names:
        raise InvalidConfiguration("send_table needs a 'value' column (binary or string)")
    cols: dict[str, pa.ChunkedArray] = {}
    for name in data.column_names:
        col = data.column(name)
        cols[name] = _convert(name, col)
    return pa.table(cols)


def _convert(name: str, col: pa.ChunkedArray) -> pa.ChunkedArray:
    t = col.type
    want = MESSAGE_SCHEMA.field(name).type if name != "deliver_at" else pa.int64()
    try:
        if name in ("value", "ordering_key"):
            if (
                pa.types.is_binary(t)
                or pa.types.is_large_binary(t)
                or pa.types.is_string(t)
                or pa.types.is_large_string(t)
            ):
                return col.cast(pa.binary())
        elif name == "key":
            if pa.types.is_string(t) or pa.types.is_large_string(t):
                return col.cast(pa.string())
        elif name == "properties":
            if (
                pa.types.is_map(t)
                and pa.types.is_string(t.key_type)
                and pa.types.is_string(t.item_type)
            ):
                return col
        elif name in ("event_time", "deliver_at"):
            if pa.types.is_timestamp(t):
                return pc.cast(col, pa.timestamp("ms", tz=t.tz), safe=False).cast(pa.int64())
            if pa.types.is_integer(t):
                return col.cast(pa.int64())
        elif name == "sequence_id" and pa.types.is_integer(t):
            return col.cast(pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise InvalidConfiguration(f"column {name!r} of type {t} cannot be converted: {e}") from e
    raise InvalidConfiguration(f"column {name!r} has type {t}; expected {_expected(name, want)}")


def _expected(name: str, want: pa.DataType) -> str:
    return {
        "value": "binary or string",
        "ordering_key": "binary or string",
        "key": "string",
        "properties": "map<string, string>",
        "event_time": "int64 ms or timestamp",
        "deliver_at": "int64 ms or timestamp",
        "sequence_id": "an integer type",
    }.get(name, str(want))


def stored_columns(table: pa.Table) -> pa.RecordBatch:
    """The stored columns of ``table`` (schema order, all-null optional columns dropped)."""
    names = ["value"] + [
        f.name
        for f in list(MESSAGE_SCHEMA)[1:]
        if f.name in table.column_names
        and (f.name == "sequence_id" or table.column(f.name).null_count < table.num_rows)
    ]
    schema = pa.schema([MESSAGE_SCHEMA.field(n) for n in names])
    arrays = [
        c.chunk(0) if c.num_chunks == 1 else c.combine_chunks()
        for c in (table.column(n) for n in names)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
