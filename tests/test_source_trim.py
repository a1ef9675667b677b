"""The source's trim of a range's partial first and last entries
(:func:`filepulsar.connector.source.columns.trim_to_range`): the same rows as a filter, without
copying a table it leaves whole or cuts at its head or tail."""

from __future__ import annotations

import pyarrow as pa
import pytest

from filepulsar.connector.source.columns import trim_to_range
from filepulsar.connector.source.partition import FilePulsarPartition
from filepulsar.storage.read_range import WHOLE

pytestmark = pytest.mark.unit

_PROPS = pa.map_(pa.string(), pa.string())


def _table(entries: list[tuple[int, int, int]]) -> pa.Table:
    """Rows of ``(ledger, entry, messages)`` entries, batch indexes 0.. (-1: not batched)."""
    led, ent, bidx = [], [], []
    for lg, en, count in entries:
        for i in range(count):
            led.append(lg)
            ent.append(en)
            bidx.append(i if count > 1 else -1)
    n = len(led)
    return pa.table(
        {
            "value": pa.array([f"v{i}".encode() for i in range(n)], pa.binary()),
            "key": pa.array([f"k{i % 3}" for i in range(n)], pa.string()),
            "properties": pa.array([[("p", str(i))] for i in range(n)], _PROPS),
            "ledger_id": pa.array(led, pa.int64()),
            "entry_id": pa.array(ent, pa.int64()),
            "batch_index": pa.array(bidx, pa.int32()),
        }
    )


def _partition(start: tuple[int, int, int], end: tuple[int, int, int]) -> FilePulsarPartition:
    return FilePulsarPartition(
        root="memory://trim", storage_options={}, topic="t", start=start, end=end
    )


def _rows(table: pa.Table) -> list[tuple[int, int, int]]:
    return list(
        zip(
            table.column("ledger_id").to_pylist(),
            table.column("entry_id").to_pylist(),
            table.column("batch_index").to_pylist(),
            strict=True,
        )
    )


ENTRIES = [(3, 0, 4), (3, 1, 1), (3, 2, 5), (4, 0, 3)]


@pytest.mark.parametrize(
    ("start", "end"),
    [
        ((3, 0, 2), (4, 0, WHOLE)),  # head of the table
        ((3, 0, WHOLE), (4, 0, 1)),  # tail
        ((3, 0, 2), (4, 0, 1)),  # both
        ((3, 2, 3), (3, 2, 4)),  # the middle: one entry, both ends inside it
        ((2, 9, 1), (5, 0, 2)),  # boundary entries outside the table
    ],
)
def test_trim_keeps_exactly_the_messages_inside_the_range(
    start: tuple[int, int, int], end: tuple[int, int, int]
) -> None:
    table = _table(ENTRIES)
    out = trim_to_range(table, _partition(start, end))

    def inside(row: tuple[int, int, int]) -> bool:
        num = max(row[2], 0) + 1
        if start[2] != WHOLE and row[:2] == start[:2] and num <= start[2]:
            return False
        return not (end[2] != WHOLE and row[:2] == end[:2] and num > end[2])

    assert _rows(out) == [r for r in _rows(table) if inside(r)]
    assert out.column("value").to_pylist() == [
        v for r, v in zip(_rows(table), table.column("value").to_pylist(), strict=True) if inside(r)
    ]


def test_a_table_without_the_partial_entries_is_not_copied() -> None:
    table = _table(ENTRIES)
    assert trim_to_range(table, _partition((2, 9, 1), (5, 0, 2))) is table


def test_a_trimmed_head_or_tail_shares_the_table_buffers() -> None:
    table = _table(ENTRIES)
    values = table.column("value").chunk(0).buffers()[2].address
    for start, end in [((3, 0, 2), (4, 0, WHOLE)), ((3, 0, WHOLE), (4, 0, 1))]:
        out = trim_to_range(table, _partition(start, end))
        assert out.column("value").chunk(0).buffers()[2].address == values
