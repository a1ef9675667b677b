"""One task of the Spark source, as the driver plans it and an executor reads it.

Owns :class:`FilePulsarPartition` (the picklable description of one task's range, the only
thing :func:`filepulsar.connector.source.read.read_partition` is given), the offset value
:data:`WHOLE`, and the checks the driver's planning and the tasks share: where reading starts after
an offset (:func:`after`) and how lost data is reported (:func:`data_loss`,
:func:`check_trimmed`, :func:`recreated_message`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import InputPartition

from filepulsar.connector.schema import Columns
from filepulsar.connector.values.types import ValueSpec
from filepulsar.storage.errors import DataLossError
from filepulsar.storage.ledger import ManagedLedger, Position
from filepulsar.storage.manifest import ManifestState

log = logging.getLogger(__name__)


#: ``n`` of an offset ``[ledger, entry, n]`` meaning "the whole entry".
WHOLE = -1


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


def data_loss(msg: str, fail_on_data_loss: bool) -> None:
    """Raise :class:`DataLossError` (``failOnDataLoss=true``) or log a warning and go on, as
    Spark's Kafka source does."""
    if fail_on_data_loss:
        raise DataLossError(msg + "; set failOnDataLoss=false to skip what is lost and read on")
    log.warning("failOnDataLoss=false, skipping lost data: %s", msg)


def check_trimmed(topic: str, m: ManifestState, start: Sequence[int], fail: bool) -> None:
    """Report (raise or log) messages after offset ``start`` that retention deleted."""
    pos = (start[0], start[1])
    if pos[0] >= 0 and pos < tuple(m.trimmed_last):
        data_loss(
            f"{topic}: messages after {pos[0]}:{pos[1]} up to {m.trimmed_last[0]}:"
            f"{m.trimmed_last[1]} were deleted by retention (ledgers before "
            f"{m.trimmed_before}) before this query read them",
            fail,
        )


def recreated_message(topic: str, seen: str, now: str) -> str:
    return (
        f"{topic} was deleted and created again (incarnation {seen} is now {now}): messages "
        "of the deleted topic this query had not read may have been lost"
    )


def after(m: ManifestState, ml: ManagedLedger, off: Sequence[int]) -> Position | None:
    """First entry to read after offset ``off`` (the entry of ``off`` itself if partial)."""
    if off[2] != WHOLE:
        return Position(off[0], off[1])
    return ml.next_position(m, Position(off[0], off[1]))
