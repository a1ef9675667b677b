"""Helpers of the bulk send path: turn an Arrow table into entry-sized record batches.

Everything here is vectorised; the only Python loops run per entry, never per message (except
for delayed messages, which Pulsar never batches and so cost one entry each).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
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


def value_offsets(values: pa.Array) -> np.ndarray:
    """The offsets of a binary array as int64 numpy (zero-copy view of Arrow's buffer)."""
    raw = np.frombuffer(values.buffers()[1], np.int32)
    return raw[values.offset : values.offset + len(values) + 1]


def split_points(offsets: np.ndarray, max_messages: int, max_bytes: int) -> list[int]:
    """Row indexes where entries start, greedily filling up to the count and byte limits.

    ``offsets`` are the value offsets of the rows (n+1 of them; a binary array's offsets
    buffer, which is the running total of value lengths, so nothing is summed here). An entry
    ends once it holds ``max_messages`` messages or at least ``max_bytes`` of values (the
    message that crosses the byte limit is the entry's last, as in Pulsar's batcher).
    """
    n = len(offsets) - 1
    starts = [0]
    pos = 0
    while True:
        by_bytes = int(np.searchsorted(offsets, offsets[pos] + max_bytes, side="left"))
        end = min(pos + max_messages, max(by_bytes, pos + 1), n)
        if end >= n:
            return starts
        starts.append(end)
        pos = end
