"""The rates, sizes and times of pulsar-admin's topic stats, computed from a managed ledger's
manifest (no broker keeps counters here): what ``admin.topics().get_stats`` adds to the
message counts.

1. :func:`publish_rates`: ``msgRateIn`` / ``msgThroughputIn`` over the last
   :data:`RATE_WINDOW_MS` (Pulsar's stats interval, ``statsUpdateFrequencyInSecs`` = 60), from
   the publish times and sizes of the fragments written in it.
2. :func:`backlog_of`: a subscription's ``backlogSize`` (stored bytes after its mark-delete
   position) and ``earliestMsgPublishTimeInBacklog`` (the oldest publish time after it; 0
   with no backlog), in one walk; :func:`earliest_time` the earliest of such times.
3. :func:`last_publish_time`: ``lastPublishTimeStamp`` (Pulsar 4.1's PIP-431).

Pure functions over a state read once; the admin's stats are their only caller.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from filepulsar.storage.ledger import ManagedLedger, Position
from filepulsar.storage.manifest import ManifestState

#: The window the publish rates are averaged over (Pulsar's default stats interval).
RATE_WINDOW_MS = 60_000


def publish_rates(
    ml: ManagedLedger, m: ManifestState, now_ms: int, window_ms: int = RATE_WINDOW_MS
) -> tuple[float, float]:
    """(messages/s, bytes/s) published in the ``window_ms`` before ``now_ms``; a fragment
    partly in the window counts in proportion to its publish-time span inside it. Reads the
    index of a closed ledger only if it was written to within the window."""
    cut = now_ms - window_ms
    msgs = 0.0
    size = 0.0
    for lg in reversed(m.ledgers):
        if lg.entries and lg.max_publish < cut:
            break
        for f in ml.fragments(lg):
            if f.max_publish < cut:
                continue
            span = f.max_publish - f.min_publish
            inside = 1.0 if span <= 0 or f.min_publish >= cut else (f.max_publish - cut) / span
            msgs += f.messages * inside
            size += f.length * inside
    secs = window_ms / 1000
    return round(msgs / secs, 3), round(size / secs, 3)


def _after(
    ml: ManagedLedger, m: ManifestState, mark_delete: Position
) -> Iterator[tuple[int, int, float]]:
    """(stored bytes, earliest publish time, share after ``mark_delete``) of each part of the
    topic after ``mark_delete``: a later ledger whole, from the manifest's totals (its index
    is not read); in the mark-delete position's own ledger, each fragment it holds."""
    md_l, md_e = mark_delete
    for lg in m.ledgers_from(md_l):
        if not lg.entries:
            continue
        if lg.ledger_id > md_l:
            yield lg.size, lg.min_publish, 1.0
            continue
        for f in ml.fragments(lg):
            last = f.first_entry + f.count - 1
            if f.first_entry > md_e:
                yield f.length, f.min_publish, 1.0
            elif last > md_e:
                yield f.length, f.min_publish, (last - md_e) / f.count


def backlog_of(ml: ManagedLedger, m: ManifestState, mark_delete: Position) -> tuple[int, int]:
    """A subscription's ``backlogSize`` and ``earliestMsgPublishTimeInBacklog``, in one walk
    after ``mark_delete``: the stored bytes of the entries after it (a fragment cut by it:
    its share), as Pulsar's estimated backlog size; and the earliest publish time (ms) after
    it (of the fragment holding the next message: at most that early), 0 with no backlog
    (Pulsar's value then)."""
    size = 0.0
    earliest = 0
    for stored, first, share in _after(ml, m, mark_delete):
        size += stored * share
        if not earliest:
            earliest = first
    return round(size), earliest


def earliest_time(times: Iterable[int]) -> int:
    """The earliest of ``times`` that is set (Pulsar's 0 means none), 0 if none is."""
    return min((t for t in times if t), default=0)


def last_publish_time(m: ManifestState) -> int:
    """The latest publish time (ms) of a stored message; 0 if none is stored."""
    for lg in reversed(m.ledgers):
        if lg.entries:
            return lg.max_publish
    return 0
