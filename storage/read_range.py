"""One range of a topic's messages, as storage holds them: the one way out of the ledger.

A Spark read task (:func:`filepulsar.connector.source.read.read_partition`) asks one thing: the
messages of a range, as Arrow. Everything that takes knowing the ledger's geometry is here, so
the task never climbs back from storage into the connector:

1. The topic as it is now (:meth:`ManagedLedger.state`). A topic that is gone, or was deleted
   and created again since the range was planned (another incarnation), is data loss
   (:func:`data_loss`: an error, or a warning with ``fail_on_data_loss=False``).
2. Where reading starts after an exclusive offset ``[ledger, entry, n]`` (:func:`after`;
   ``n`` is :data:`WHOLE` after a whole entry, else the entry is read again and the caller trims
   the messages up to ``n``).
3. What retention deleted after the start is data loss (:func:`check_trimmed`), unless the range
   began at "earliest" or a time (``loss_ok``).
4. With ``read_compacted``, the compacted view up to its horizon, then the topic after it; the
   view's batch entries may hide older values of a key, which are dropped.
5. Entries in groups of about :data:`GROUP_ROWS` messages (the first group smaller, so the
   caller starts early), each group decoded into one table in :data:`READ_SCHEMA`'s names,
   chunked messages reassembled; a chunked message whose first chunks lie before the range is
   completed by looking back (:func:`chunk_lookback`) and emitted where its last chunk lies.

Damaged or missing entries inside the range raise :class:`DataLossError` /
:class:`CorruptDataError` naming their location, or are skipped and logged with it when the
caller said ``fail_on_data_loss=False`` (Spark's ``failOnDataLoss=false``).

Callers: :mod:`filepulsar.connector.source.read` (the task), and the driver's planning for
:func:`after`, :func:`check_trimmed`, :func:`data_loss` and :data:`WHOLE`.
"""

from __future__ import annotations

import bisect
import itertools
import logging
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from filepulsar.storage.blobstore import BlobNotFound
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.compaction import CompactedView, load_view
from filepulsar.storage.errors import CorruptDataError, DataLossError, TopicNotFound
from filepulsar.storage.ledger import ManagedLedger, Position, ReadEntry
from filepulsar.storage.manifest import ManifestState
from filepulsar.storage.names import TopicName
from filepulsar.storage.reader import ChunkAssembler, FetchMissing

log = logging.getLogger(__name__)


#: ``n`` of an offset ``[ledger, entry, n]`` meaning "the whole entry".
WHOLE = -1

#: Messages decoded together into one table; the first group of a range is smaller so the
#: caller starts consuming while the rest is decoded.
GROUP_ROWS = 40_000

FIRST_GROUP_ROWS = 5_000

#: How many entries before a range are searched for the first chunks of a chunked message
#: whose last chunk lies in the range.
CHUNK_LOOKBACK_ENTRIES = 100_000


@dataclass(frozen=True)
class MessageRange:
    """Which messages of one topic (or partition) to read.

    ``start`` is exclusive (an offset ``[ledger, entry, n]``), ``end`` inclusive.
    ``positions`` lists explicit entries ``(ledger, entry, redelivery count)`` instead of a
    range. ``start_latest`` / ``end_latest`` resolve "latest" when the range is read.
    ``incarnation`` is the topic's as the planner saw it (``""``: unknown); another one means
    the topic was deleted and created again, which is data loss. ``loss_ok``: the range began
    at "earliest" or a time, so what retention deleted before it is not a loss.
    ``read_compacted``: the compacted view up to its horizon, then the topic after it.
    """

    start: tuple[int, int, int]
    end: tuple[int, int, int]
    positions: tuple[tuple[int, int, int], ...] = ()
    start_latest: bool = False
    end_latest: bool = False
    fail_on_data_loss: bool = True
    loss_ok: bool = False
    incarnation: str = ""
    read_compacted: bool = False


# --------------------------------------------------------------------------- loss checks


def data_loss(msg: str, fail_on_data_loss: bool) -> None:
    """Raise :class:`DataLossError` (``failOnDataLoss=true``) or log a warning and go on, as
    Spark's Kafka source does."""
    if fail_on_data_loss:
        raise DataLossError(msg + "; set failOnDataLoss=false to skip what is lost and read on")
    log.warning("failOnDataLoss=false, skipping lost data: %s", msg)


def check_trimmed(topic: str, m: ManifestState, start: Sequence[int], fail: bool) -> bool:
    """Report (raise or log) messages after offset ``start`` that retention deleted; whether
    there were any (then reading goes on after ``trimmedLast``)."""
    pos = (start[0], start[1])
    if pos[0] >= 0 and pos < m.trimmed_last:
        data_loss(
            f"{topic}: messages after {pos[0]}:{pos[1]} up to {m.trimmed_last[0]}:"
            f"{m.trimmed_last[1]} were deleted by retention (ledgers before "
            f"{m.trimmed_before}) before this query read them",
            fail,
        )
        return True
    return False


def recreated_message(topic: str, seen: str, now: str) -> str:
    """What a reader of a topic deleted and created again is told."""
    return (
        f"{topic} was deleted and created again (incarnation {seen} is now {now}): messages "
        "of the deleted topic this query had not read may have been lost"
    )


def after(m: ManifestState, ml: ManagedLedger, off: Sequence[int]) -> Position | None:
    """First entry to read after offset ``off`` (the entry of ``off`` itself if partial)."""
    if off[2] != WHOLE:
        return Position(off[0], off[1])
    return ml.next_position(m, Position(off[0], off[1]))


# --------------------------------------------------------------------------- the range


def read_range(
    store: BlobStore,
    topic: TopicName,
    r: MessageRange,
    columns: Collection[str] | None = None,
) -> Iterator[pa.Table]:
    """The messages of ``r`` as tables in :data:`~filepulsar.storage.reader.READ_SCHEMA`'s
    names (only ``columns`` of it, when given), in groups of about :data:`GROUP_ROWS`.

    Messages before a partial start offset are still in the first table (the caller trims by
    ``batch_index``); messages a compacted view hides are not.

    Raises
    ------
    DataLossError, CorruptDataError
        With ``r.fail_on_data_loss`` (the default); otherwise what is lost or damaged is
        skipped and logged with its location.
    """
    ml = ManagedLedger(store, topic)
    try:
        m = ml.state()
    except TopicNotFound:
        data_loss(
            f"{topic} was deleted before this task read it (root {store.root}); its messages "
            f"after {r.start[0]}:{r.start[1]} were lost",
            r.fail_on_data_loss,
        )
        return
    if r.incarnation and m.incarnation and m.incarnation != r.incarnation:
        data_loss(recreated_message(str(topic), r.incarnation, m.incarnation), r.fail_on_data_loss)
        return
    assembler = ChunkAssembler(chunk_lookback(ml, m, r.fail_on_data_loss))
    hidden: dict[Position, frozenset[int]] = {}
    entries = _entries(store, topic, ml, m, r, hidden)
    if entries is None:
        return
    for group in _groups(entries):
        table = assembler.feed(group, topic.partition_index, columns)
        if hidden:
            table = _hide(table, hidden)
            hidden.clear()
        yield table


def _entries(
    store: BlobStore,
    topic: TopicName,
    ml: ManagedLedger,
    m: ManifestState,
    r: MessageRange,
    hidden: dict[Position, frozenset[int]],
) -> Iterator[ReadEntry] | None:
    """The entries of ``r`` in order (None: nothing to read), noting in ``hidden`` the batch
    indexes a compacted view hides."""
    if r.positions:
        return (
            e
            for lid, eid, _ in r.positions
            for e in _iter(ml, m, Position(lid, eid), Position(lid, eid), r.fail_on_data_loss)
        )
    end_pos = m.last_position() if r.end_latest else Position(r.end[0], r.end[1])
    begin: list[int] = [*m.last_position(), WHOLE] if r.start_latest else list(r.start)
    view = load_view(store, topic, m.incarnation) if r.read_compacted else None
    if view is not None and Position(begin[0], begin[1]) < view.horizon:
        # The compacted view up to its horizon, then the topic after it: retention may have
        # deleted ledgers before the horizon, which the view stands for.
        horizon = [*view.horizon, WHOLE]
        if not r.loss_ok:
            check_trimmed(str(topic), m, horizon, r.fail_on_data_loss)
        entries = _view_entries(view, m, begin, end_pos, hidden)
        first = after(m, ml, horizon)
        if first is not None and first <= end_pos:
            rest = _iter(ml, m, first, end_pos, r.fail_on_data_loss)
            entries = itertools.chain(entries, rest)
        return entries
    if not r.loss_ok:
        check_trimmed(str(topic), m, begin, r.fail_on_data_loss)
    first = after(m, ml, begin)
    if first is None or first > end_pos:
        return None
    return _iter(ml, m, first, end_pos, r.fail_on_data_loss)


def _iter(
    ml: ManagedLedger, m: ManifestState, first: Position, last: Position, fail: bool
) -> Iterator[ReadEntry]:
    """Entries ``first..last`` as they are read. With ``fail=False`` what is lost (a missing
    blob, a damaged entry) is skipped and logged with its location."""
    if fail:
        return ml.iter_entries(m, first, end=last)

    def skipped(e: Exception) -> None:
        log.warning("failOnDataLoss=false, skipped: %s", e)

    return ml.iter_entries(m, first, end=last, on_error=skipped)


def chunk_lookback(ml: ManagedLedger, m: ManifestState, fail: bool) -> FetchMissing:
    """A :class:`ChunkAssembler`'s ``fetch_missing``: the earlier chunks of a chunked message
    that began before the range, searched backwards from its first chunk seen, in blocks of
    256 entries, at most :data:`CHUNK_LOOKBACK_ENTRIES` entries."""

    def fetch(uuid: str, before: Position, missing: list[int]) -> list[ReadEntry]:
        need = set(missing)
        found: list[ReadEntry] = []
        scanned = 0
        try:
            for lg in reversed(m.ledgers):
                if lg.ledger_id > before.ledger_id or not lg.entries:
                    continue
                hi = before.entry_id - 1 if lg.ledger_id == before.ledger_id else lg.entries - 1
                while hi >= 0 and need and scanned < CHUNK_LOOKBACK_ENTRIES:
                    lo = max(0, hi - 255)
                    block = ml.read_entries(
                        m, Position(lg.ledger_id, lo), end=Position(lg.ledger_id, hi)
                    )
                    scanned += len(block)
                    for e in reversed(block):
                        c = e.header.chunk
                        if c is not None and c.uuid == uuid and c.chunk_id in need:
                            need.discard(c.chunk_id)
                            found.append(e)
                    hi = lo - 1
                if not need or scanned >= CHUNK_LOOKBACK_ENTRIES:
                    break
        except (DataLossError, CorruptDataError) as e:
            if fail:
                raise DataLossError(
                    f"{ml.topic}: earlier chunks of chunked message {uuid} cannot be read: {e}"
                ) from e
        if need:
            log.warning(
                "%s: chunks %s of chunked message %s (before %s:%s) not found; message skipped",
                ml.topic,
                sorted(need),
                uuid,
                before.ledger_id,
                before.entry_id,
            )
        return found[::-1]

    return fetch


def _groups(entries: Iterator[ReadEntry]) -> Iterator[list[ReadEntry]]:
    """Consecutive entries in groups of about GROUP_ROWS messages (the first smaller)."""
    group: list[ReadEntry] = []
    rows, target = 0, FIRST_GROUP_ROWS
    for e in entries:
        group.append(e)
        rows += e.header.num_messages
        if rows >= target:
            yield group
            group, rows, target = [], 0, GROUP_ROWS
    if group:
        yield group


def _view_entries(
    view: CompactedView,
    m: ManifestState,
    begin: Sequence[int],
    end_pos: Position,
    hidden: dict[Position, frozenset[int]],
) -> Iterator[ReadEntry]:
    """The compacted view's entries in (begin, min(end, horizon)] (from ``begin``'s own
    entry when the offset is inside it), noting in ``hidden`` the batch indexes each hides.
    A view replaced (and deleted) meanwhile is reloaded and read on after the last entry
    read, up to the first view's horizon (the topic after it comes next)."""
    lo = (begin[0], begin[1])
    inclusive = begin[2] != WHOLE
    hi = min(end_pos, view.horizon)
    last: Position | None = None
    while True:
        start = bisect.bisect_left(view.positions, lo if last is None else last)
        try:
            for ve in view.index[start:]:
                pos = ve.position
                if (pos == lo and not inclusive) or (last is not None and pos <= last):
                    continue
                if pos > hi:
                    return
                e = view.read(ve)
                if ve.obscured:
                    hidden[pos] = ve.obscured
                last = pos
                yield e
            return
        except BlobNotFound:
            newer = load_view(view.store, view.topic, m.incarnation)
            if newer is None or newer.state.blob == view.state.blob:
                raise
            view = newer


def _hide(table: pa.Table, hidden: dict[Position, frozenset[int]]) -> pa.Table:
    """``table`` without the messages the compacted view hides (older values in a kept
    batch entry)."""
    if not table.num_rows:
        return table
    led = table.column("ledger_id").to_numpy()
    ent = table.column("entry_id").to_numpy()
    bidx = table.column("batch_index").to_numpy()
    drop = np.zeros(table.num_rows, np.bool_)
    for (lg, en), idx in hidden.items():
        drop |= (led == lg) & (ent == en) & np.isin(bidx, list(idx))
    return table.filter(pa.array(~drop)) if drop.any() else table
