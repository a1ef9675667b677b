"""Counting the Spark source's messages and bytes between offsets, for admission control.

Owns :class:`MessageMeter` (messages between offsets from manifest metadata, reading entries only to
cut inside a fragment of batch entries), the byte counterparts :func:`ml_bytes` and
:func:`cut_bytes`, and :func:`apportion` (a trigger's budget split over partitions by backlog,
as Spark's Kafka source does). Driver side, used by the stream reader's ``latestOffset``.
"""

from __future__ import annotations

from collections.abc import Iterator

from filepulsar.connector.source.offsets import PartitionOffset
from filepulsar.dispatch.lru import LruCache
from filepulsar.storage import ManagedLedger
from filepulsar.storage.fragments import Fragment
from filepulsar.storage.ledger import Position
from filepulsar.storage.manifest import LedgerInfo, ManifestState
from filepulsar.storage.read_range import WHOLE, after

#: Per-entry message counts kept by a driver's meter (fragments of batch entries it read).
_METER_FRAGMENTS = 256


class MessageMeter:
    """Counts messages between offsets on the driver from the manifests' metadata: a whole
    ledger's and a whole fragment's message counts are in the manifest (closed ledgers: in
    their index, read once and cached), and a fragment whose entries each hold one message
    (``messages == count``) or that is one entry counts exactly at any entry.

    Only a cut or a start inside a fragment of several *batch* entries needs per-entry
    counts; with ``exact`` that fragment's entries are read once and their counts kept
    (a rate-limited stream then continues from a fragment it already knows), otherwise
    the fragment's messages are spread evenly over its entries (an estimate, used for the
    backlog report only).
    """

    def __init__(self) -> None:
        self._counts: LruCache[tuple[str, int, int, int], list[int]] = LruCache(_METER_FRAGMENTS)
        self.entry_reads = 0  # fragments read for their per-entry counts (tests, logs)

    def _per_entry(
        self, ml: ManagedLedger, m: ManifestState, ledger_id: int, f: Fragment, exact: bool
    ) -> list[int] | None:
        if f.messages == f.count:
            return None  # one message each: callers count entries
        key = (f.blob, f.offset, f.length, ledger_id)
        hit = self._counts.get(key)
        if hit is not None:
            return hit
        if not exact:
            return None
        last = f.first_entry + f.count - 1
        got = ml.read_entries(m, Position(ledger_id, f.first_entry), end=Position(ledger_id, last))
        self.entry_reads += 1
        counts = [e.header.num_messages for e in got]
        self._counts.put(key, counts)
        return counts

    def span(
        self,
        ml: ManagedLedger,
        m: ManifestState,
        ledger_id: int,
        f: Fragment,
        a: int,
        b: int,
        exact: bool,
    ) -> int:
        """Messages in entries ``a..b`` (ledger entry ids) of fragment ``f``."""
        if a == f.first_entry and b == f.first_entry + f.count - 1:
            return f.messages
        if f.messages == f.count:
            return b - a + 1
        counts = self._per_entry(ml, m, ledger_id, f, exact)
        if counts is None:
            return round(f.messages * (b - a + 1) / f.count)
        return sum(counts[a - f.first_entry : b - f.first_entry + 1])

    def spans(
        self, ml: ManagedLedger, m: ManifestState, s: PartitionOffset, e: PartitionOffset
    ) -> Iterator[tuple[LedgerInfo, Fragment | None, int, int]]:
        """The entries of (s, e] as (ledger, fragment, first, last): a whole ledger comes as
        one span with fragment None (its totals are in the manifest)."""
        first = after(m, ml, s.task)
        if first is None:
            return
        for lg in m.ledgers_from(first.ledger_id):
            if not lg.entries or lg.ledger_id > e.ledger_id:
                continue
            lo = first.entry_id if lg.ledger_id == first.ledger_id else 0
            hi = min(lg.entries - 1, e.entry_id) if lg.ledger_id == e.ledger_id else lg.entries - 1
            if lo > hi:
                continue
            if lo == 0 and hi == lg.entries - 1:
                yield lg, None, lo, hi
                continue
            for f in ml.fragments(lg):
                fa, fb = max(lo, f.first_entry), min(hi, f.first_entry + f.count - 1)
                if fa <= fb:
                    yield lg, f, fa, fb

    def entry(
        self, ml: ManagedLedger, m: ManifestState, lg: LedgerInfo, eid: int, exact: bool = True
    ) -> int:
        """Messages in entry ``eid`` of ledger ``lg``."""
        for f in ml.fragments(lg):
            if f.first_entry <= eid < f.first_entry + f.count:
                return self.span(ml, m, lg.ledger_id, f, eid, eid, exact)
        return 1

    def messages(
        self,
        ml: ManagedLedger,
        m: ManifestState,
        s: PartitionOffset,
        e: PartitionOffset,
        *,
        exact: bool = False,
    ) -> int:
        """Messages in (s, e] (exact from metadata, see the class; else estimated)."""
        total = 0
        for lg, f, a, b in self.spans(ml, m, s, e):
            total += lg.messages if f is None else self.span(ml, m, lg.ledger_id, f, a, b, exact)
        if total and s.messages != WHOLE:
            total -= s.messages  # the start entry's messages read before
        if total and e.messages != WHOLE:
            lg_e = m.ledger(e.ledger_id)
            if lg_e is not None:
                total -= self.entry(ml, m, lg_e, e.entry_id, exact) - e.messages
        return max(0, total)

    def cut_messages(
        self,
        ml: ManagedLedger,
        m: ManifestState,
        s: PartitionOffset,
        e: PartitionOffset,
        quota: int,
    ) -> PartitionOffset:
        """The offset ``quota`` messages after ``s`` (at most ``e``), exact."""
        used = 0
        last = s
        for lg, f, a, b in self.spans(ml, m, s, e):
            touches = (s.messages != WHOLE and s.ledger_id == lg.ledger_id) or (
                e.messages != WHOLE and e.ledger_id == lg.ledger_id
            )
            if f is None and not touches and used + lg.messages <= quota:
                used += lg.messages  # a whole ledger: its total is in the manifest
                last = PartitionOffset(lg.ledger_id, lg.entries - 1, WHOLE, m.incarnation)
                if used == quota:
                    return last
                continue
            frags = [f] if f is not None else ml.fragments(lg)
            for fr in frags:
                fa, fb = max(a, fr.first_entry), min(b, fr.first_entry + fr.count - 1)
                if fa > fb:
                    continue
                c = self.span(ml, m, lg.ledger_id, fr, fa, fb, True)
                at_start = s.messages != WHOLE and Position(lg.ledger_id, fa) == s.position
                at_end = e.messages != WHOLE and Position(lg.ledger_id, fb) == e.position
                c -= s.messages if at_start else 0
                if at_end:
                    c -= self.span(ml, m, lg.ledger_id, fr, fb, fb, True) - e.messages
                if used + c <= quota:
                    used += c
                    last = PartitionOffset(
                        lg.ledger_id, fb, e.messages if at_end else WHOLE, m.incarnation
                    )
                    if used == quota:
                        return last
                    continue
                for eid in range(fa, fb + 1):  # the cut is in this fragment
                    n = self.span(ml, m, lg.ledger_id, fr, eid, eid, True)
                    skip = s.messages if (at_start and eid == fa) else 0
                    top = e.messages if (at_end and eid == fb) else n
                    room = quota - used
                    if top - skip >= room:
                        whole = skip + room >= n
                        return PartitionOffset(
                            lg.ledger_id, eid, WHOLE if whole else skip + room, m.incarnation
                        )
                    used += top - skip
                return PartitionOffset(lg.ledger_id, fb, WHOLE, m.incarnation)  # (counts disagreed)
        return e if used else last


def ml_bytes(ml: ManagedLedger, m: ManifestState, s: PartitionOffset, e: PartitionOffset) -> int:
    """Stored bytes of the entries in (s, e] (a part of a fragment: its share of it)."""
    total = 0
    for lg, f, a, b in MessageMeter().spans(ml, m, s, e):
        if f is None:
            total += lg.size
        else:
            total += f.length * (b - a + 1) // f.count
    return total


def cut_bytes(
    ml: ManagedLedger, m: ManifestState, s: PartitionOffset, e: PartitionOffset, quota: int
) -> PartitionOffset:
    """The offset about ``quota`` stored bytes after ``s`` (at least one entry, at most
    ``e``), at entry granularity from fragment sizes (no entry is read)."""
    used = 0
    for lg, f, a, b in MessageMeter().spans(ml, m, s, e):
        for fr in [f] if f is not None else ml.fragments(lg):
            fa, fb = max(a, fr.first_entry), min(b, fr.first_entry + fr.count - 1)
            if fa > fb:
                continue
            per = fr.length / fr.count
            size = per * (fb - fa + 1)
            if used + size <= quota:
                used += int(size)
                continue
            k = max(1, int((quota - used) // per)) if used == 0 else int((quota - used) // per)
            if k <= 0:  # the offset just before this entry (see _before)
                return PartitionOffset(lg.ledger_id, fa - 1, WHOLE, m.incarnation)
            return PartitionOffset(lg.ledger_id, fa + k - 1, WHOLE, m.incarnation)
    return e


def apportion(sizes: dict[str, int], budget: int) -> dict[str, int]:
    """Split ``budget`` over partitions in proportion to their ``sizes`` (backlogs), as
    Spark's Kafka source splits maxOffsetsPerTrigger (``KafkaMicroBatchStream.rateLimit``).

    Every partition with a backlog gets at least one (Kafka rounds a share under one up, so
    a small partition is never starved) and the others their share rounded down. Where
    Kafka then admits more or fewer than the limit, the shares here add up to
    ``min(budget, total)`` exactly: the units given to small partitions are taken back from
    the largest shares, and units left over go to the largest remainders. Only when the
    budget is smaller than the number of partitions with a backlog is it exceeded (each of
    them still gets one, as in Kafka).
    """
    total = sum(sizes.values())
    if total <= budget:
        return dict(sizes)
    share = {k: budget * v / total for k, v in sizes.items()}
    out = {k: (1 if 0 < x < 1 else int(x)) for k, x in share.items()}
    left = budget - sum(out.values())
    if left > 0:
        for k in sorted(share, key=lambda k: (out[k] - share[k], k))[:left]:
            out[k] += 1
    while left < 0:
        k = max(out, key=lambda k: (out[k], share[k], k))
        if out[k] <= 1:
            break  # fewer units than partitions with a backlog: one each, as Kafka
        out[k] -= 1
        left += 1
    return out
