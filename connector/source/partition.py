"""One task of the Spark source, as the driver plans it and an executor reads it.

Owns :class:`FilePulsarPartition`: the picklable description of one task's range, the only
thing :func:`filepulsar.connector.source.read.read_partition` is given. It names a storage
:class:`~filepulsar.storage.read_range.MessageRange` (:meth:`FilePulsarPartition.message_range`)
plus what only Spark needs (columns, typed values, the property filter, claimed slices). The
offset value :data:`~filepulsar.storage.read_range.WHOLE` and the checks the driver's planning
and the tasks share (where reading starts after an offset, how lost data is reported) live in
:mod:`filepulsar.storage.read_range`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import InputPartition

from filepulsar.connector.schema import Columns
from filepulsar.connector.values.types import ValueSpec
from filepulsar.storage.read_range import MessageRange


@dataclass(frozen=True)
class FilePulsarPartition(InputPartition):
    """One task's share: entries of one managed ledger, picklable.

    ``start`` is exclusive (an offset), ``end`` inclusive. ``positions`` (Shared/Key_Shared)
    lists explicit entries instead of a range, with their redelivery counts; ``slices``
    ``(ledger, entry, lo, hi)`` says of a listed batch entry claimed in part that only its
    batch indexes ``lo .. hi-1`` are read.
    ``incarnation`` is the topic's as the driver saw it ("" unknown): a task that finds
    another one reads a topic deleted and created again, and reports that as data loss.
    ``start_latest``/``end_latest`` (batch reads) resolve "latest" when the task runs, so
    every action on a DataFrame reads the topic as it is then. ``loss_ok``: the range began
    at "earliest" or a time, so what retention deleted before it is not a loss.
    ``columns`` (name, nullable): the columns the read emits (``()``: every column).
    ``value``: a typed read's reader schema (``valueFormat`` struct or flatten; None: values
    as bytes). ``read_compacted``: read the topic's compacted view up to its horizon, then
    the topic after it.
    """

    root: str
    storage_options: dict[str, Any]
    topic: str
    start: tuple[int, int, int]
    end: tuple[int, int, int]
    positions: tuple[tuple[int, int, int], ...] = ()
    slices: tuple[tuple[int, int, int, int], ...] = ()
    fail_on_data_loss: bool = True
    property_filter: tuple[tuple[str, tuple[str, ...]], ...] = ()
    incarnation: str = ""
    start_latest: bool = False
    end_latest: bool = False
    loss_ok: bool = False
    columns: Columns = ()
    value: ValueSpec | None = None
    read_compacted: bool = False

    def message_range(self) -> MessageRange:
        """The storage range this task reads (:func:`filepulsar.storage.read_range.read_range`)."""
        return MessageRange(
            start=self.start,
            end=self.end,
            positions=self.positions,
            start_latest=self.start_latest,
            end_latest=self.end_latest,
            fail_on_data_loss=self.fail_on_data_loss,
            loss_ok=self.loss_ok,
            incarnation=self.incarnation,
            read_compacted=self.read_compacted,
        )
