"""The ledger catalog: closed ledgers kept out of the manifest head (manifest format 2).

Every commit rewrites the manifest head, so the head holds only what changes often (the open
ledger, the producers, dedup, sink batches) and names the closed ledgers by reference: a list
of immutable *segments*, each a blob ``catalog/<first>-<last>-<nonce>.catalog`` holding the
totals of closed ledgers ``first..last`` (as Pulsar's managed ledger writes its ledger list
only when a ledger rolls over or is trimmed, not on every add).

A segment holds at most :data:`SEGMENT_LEDGERS` ledgers and never changes. Segments are
tiered like a log-structured merge (:func:`segment_ledgers`): a commit that closes a ledger
writes that ledger alone as a new segment, and once the last segments of one tier hold
:data:`FANOUT` times their tier's size together they are written again as one segment of the
next tier (1, 8, 64, then a full 512); a retention run rewrites only the segment it cut into;
every other segment is carried over by name. So a ledger closed by a rollover is written at
most four times over its life (a rollover writes 1 ledger, every 8th 8, every 64th 64, every
512th 512), the bytes ever written grow linearly with the ledgers, and a head names the full
segments plus at most 7 of each smaller tier (21 short references). Segments of other sizes
(the last one of a head written before the tiers, a retention run's survivors) join the tier
their size puts them in.

Segments are written put-if-absent under a name random per write, *before* the head that
names them: a writer that loses the head's race (or dies) leaves an unreferenced segment, and
a merge leaves the segments it replaced. :func:`filepulsar.storage.retention.sweep_orphans` deletes
such a segment once no manifest version a reader may still load names it (:func:`retained_heads`)
and it is older than the sweep's minimum age. Readers cache segments by name (they never
change), so reading a new head costs one GET however long the history is.

File format (storage/FORMAT.md, "Ledger catalog"): framed like the manifest (a compact JSON
line, then ``crc32c=<8 hex>``), ``{"format": 2, "topic": ..., "partition": ...,
"ledgers": [<closed ledger>, ...]}`` with each ledger as in the manifest.
"""

from __future__ import annotations

import itertools
import json
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from filepulsar.dispatch.lru import LruCache
from filepulsar.storage import jsontext, paths
from filepulsar.storage.blobstore import BlobNotFound
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.errors import CorruptDataError, DataLossError
from filepulsar.storage.forks import in_forked_child
from filepulsar.storage.names import TopicName
from filepulsar.storage.versioned import GC_GRACE_MS, KEEP_VERSIONS

if TYPE_CHECKING:
    from filepulsar.storage.manifest import LedgerInfo

#: Most closed ledgers one segment holds (a *full* segment, never written again).
SEGMENT_LEDGERS = 512
#: Segments of one tier merged into one of the next (tiers of 1, 8, 64 and 512 ledgers).
FANOUT = 8
#: Segments kept in this process's cache (all topics); each holds up to SEGMENT_LEDGERS.
CACHE_SEGMENTS = 4096
CATALOG_FORMAT = 2


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """A segment as the head names it, ``[first, last, count, nonce]``: the blob
    ``catalog/<first>-<last>-<nonce>.catalog`` holds the ``count`` closed ledgers
    ``first..last`` (ids ascending, not necessarily contiguous)."""

    first: int
    last: int
    count: int
    nonce: str

    @property
    def name(self) -> str:
        """The blob's key relative to the topic folder."""
        return paths.catalog_segment_name(self.first, self.last, self.nonce)

    def to_json(self) -> list[Any]:
        return [self.first, self.last, self.count, self.nonce]

    @classmethod
    def from_json(cls, v: list[Any]) -> SegmentRef:
        first, last, count, nonce = v
        if not (
            all(isinstance(x, int) and not isinstance(x, bool) for x in (first, last, count))
            and 1 <= count <= last - first + 1
            and isinstance(nonce, str)
            and nonce
            and all(c in "0123456789abcdef" for c in nonce)
        ):
            raise ValueError(f"bad catalog reference {v!r}")
        return cls(first, last, count, nonce)


#: Most heads whose closed-ledger lists are kept (all topics).
CACHE_HEADS = 64
#: Segments' ledgers by (store root, segment key).
_cache: LruCache[tuple[str, str], list[LedgerInfo]] = LruCache(CACHE_SEGMENTS)
#: Closed-ledger lists of the last heads read in this process (all topics), by their references.
_resolved: LruCache[tuple[Any, ...], tuple[list[SegmentRef], tuple[LedgerInfo, ...]]]
_resolved = LruCache(CACHE_HEADS)
_cache_lock = threading.Lock()  # (guards both)


@in_forked_child
def _fresh_cache_lock() -> None:
    """A forked child gets a lock of its own (the caches' entries are kept: closed ledgers
    never change): the parent's copy may have been held by one of its threads at the fork,
    and would stay held in the child for ever."""
    global _cache_lock
    _cache_lock = threading.Lock()


def _cached(key: tuple[str, str]) -> list[LedgerInfo] | None:
    with _cache_lock:
        return _cache.get(key)


def _remember(key: tuple[str, str], ledgers: list[LedgerInfo]) -> None:
    with _cache_lock:
        _cache.put(key, ledgers)


class Catalog:
    """Reads and writes the catalog segments of one managed ledger.

    The ledgers a segment yields are shared by every state that names it (and cached for the
    process): closed ledgers never change, and callers treat states as read-only.
    """

    def __init__(self, store: BlobStore, topic: TopicName) -> None:
        self.store = store
        self.topic = topic
        self._dir = paths.topic_dir(topic)
        self._refs_text: tuple[tuple[SegmentRef, ...], str] = ((), "[]")

    def key(self, ref: SegmentRef) -> str:
        return f"{self._dir}/{ref.name}"

    def refs_json(self, refs: Sequence[SegmentRef]) -> str:
        """``refs`` as the head's compact JSON list. The last answer is kept: a commit that
        rolls nothing over names the very same reference objects again (shared by the
        states' copies), so it costs an identity check per reference."""
        last_refs, text = self._refs_text
        if len(last_refs) != len(refs) or any(a is not b for a, b in zip(last_refs, refs)):
            text = json.dumps([r.to_json() for r in refs], separators=(",", ":"))
            self._refs_text = (tuple(refs), text)
        return text

    def resolve(self, raw_refs: list[Any]) -> tuple[list[SegmentRef], tuple[LedgerInfo, ...]]:
        """The references a head lists (as parsed JSON) and the closed ledgers they hold, in
        order. The last answers are kept for the process (:data:`CACHE_HEADS`): a head that
        names the same segments as one read before (every commit but rollovers and trims)
        costs a dictionary lookup, not a walk over every closed ledger.

        Raises
        ------
        DataLossError, CorruptDataError
            As :meth:`load`.
        ValueError
            If a reference is malformed.
        """
        key = (self.store.root, self._dir, tuple(tuple(r) for r in raw_refs))
        with _cache_lock:
            got = _resolved.get(key)
        if got is not None:
            return got
        refs = [SegmentRef.from_json(r) for r in raw_refs]
        closed: list[LedgerInfo] = []
        for ref in refs:
            closed.extend(self.load(ref))
        got = (refs, tuple(closed))
        with _cache_lock:
            _resolved.put(key, got)
        return got

    def load(self, ref: SegmentRef) -> list[LedgerInfo]:
        """The closed ledgers of ``ref`` (cached by name; one GET the first time).

        Raises
        ------
        DataLossError
            If the segment is gone.
        CorruptDataError
            If it fails its checksum or does not hold the ledgers the head says it does.
        """
        key = self.key(ref)
        ck = (self.store.root, key)
        got = _cached(ck)
        if got is not None:
            return got
        try:
            raw = self.store.get(key)
        except BlobNotFound as e:
            raise DataLossError(
                f"ledger catalog segment of {self.topic} is gone ({self.store.url(key)}): "
                f"ledgers {ref.first}..{ref.last}"
            ) from e
        ledgers = decode_segment(raw, ref, f"{self.topic}: ledger catalog {self.store.url(key)}")
        _remember(ck, ledgers)
        return ledgers

    def write(self, ledgers: Sequence[LedgerInfo], topic: str, partition: int) -> SegmentRef:
        """Write ``ledgers`` (closed, ascending) as a new segment; return its reference."""
        from filepulsar.storage.errors import CommitConflict

        first, last = ledgers[0].ledger_id, ledgers[-1].ledger_id
        ref = SegmentRef(first, last, len(ledgers), uuid.uuid4().hex[:16])
        key = self.key(ref)
        data = encode_segment(ledgers, topic, partition)
        if not self.store.put_if_absent(key, data) and self.store.get(key) != data:
            raise CommitConflict(f"ledger catalog segment {self.store.url(key)} exists already")
        _remember((self.store.root, key), list(ledgers))
        return ref


def encode_segment(ledgers: Sequence[LedgerInfo], topic: str, partition: int) -> bytes:
    body = json.dumps(
        {
            "format": CATALOG_FORMAT,
            "topic": topic,
            "partition": partition,
            "ledgers": [lg.to_json() for lg in ledgers],
        },
        separators=(",", ":"),
    ).encode()
    return jsontext.frame(body)


def decode_segment(raw: bytes, ref: SegmentRef, where: str) -> list[LedgerInfo]:
    """Parse and verify a segment against the reference that names it.

    Raises
    ------
    CorruptDataError
        If the checksum fails, the JSON is malformed, or the ledgers are not the ``count``
        closed ledgers ``first..last`` in ascending order.
    """
    from filepulsar.storage.manifest import LedgerInfo

    body = jsontext.unframe(raw, where)
    try:
        d = jsontext.loads(body)
        if d.get("format") != CATALOG_FORMAT:
            raise CorruptDataError(f"{where} has format {d.get('format')!r}, not 2")
        ledgers = [LedgerInfo.from_json(x) for x in d["ledgers"]]
    except CorruptDataError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise CorruptDataError(f"{where} is malformed: {type(e).__name__} {e}") from e
    ids = [lg.ledger_id for lg in ledgers]
    if (
        len(ids) != ref.count
        or not ids
        or ids[0] != ref.first
        or ids[-1] != ref.last
        or any(a >= b for a, b in itertools.pairwise(ids))
        or any(lg.is_open for lg in ledgers)
    ):
        raise CorruptDataError(
            f"{where} does not hold the {ref.count} closed ledgers {ref.first}..{ref.last} "
            "its manifest names"
        )
    return ledgers


def _lid(lg: LedgerInfo) -> int:
    return lg.ledger_id


def tier(count: int) -> int:
    """The tier of a segment of ``count`` ledgers: ``k`` for ``FANOUT**k <= count`` below the
    next tier's size (:func:`tier_size`), and -1 for a full segment (never merged again)."""
    if count >= SEGMENT_LEDGERS:
        return -1
    k = 0
    while tier_size(k + 1) <= count:
        k += 1
    return k


def tier_size(k: int) -> int:
    """The fewest ledgers a segment of tier ``k`` holds: ``FANOUT**k``, at most a full
    segment's :data:`SEGMENT_LEDGERS`."""
    return min(FANOUT**k, SEGMENT_LEDGERS)


def segment_ledgers(
    ledgers: Sequence[LedgerInfo],
    n_closed: int,
    refs: list[SegmentRef],
    write: Callable[[Sequence[LedgerInfo]], SegmentRef] | None,
) -> tuple[list[SegmentRef], int]:
    """Cover the closed ledgers ``ledgers[:n_closed]`` with segments.

    ``refs`` are the segments the state was read with: each still intact (its ledgers all
    present, in place) is kept by name; the closed ledgers no intact segment covers (new ones,
    survivors of a segment retention cut into) are written as new segments of at most
    :data:`SEGMENT_LEDGERS` by ``write``. New ledgers at the end are a segment of their own
    (a rollover writes one ledger); then, while the last segments of one tier ``k``
    (:func:`tier`) hold :func:`tier_size` ``(k + 1)`` ledgers or more together, they are
    written again as one segment (as many full ones as they fill, and the rest). Ledgers
    closed one per rollover are so written once per tier, ``log_FANOUT(SEGMENT_LEDGERS) + 1``
    times in all, and at most ``FANOUT - 1`` segments of each tier follow the full ones. With
    ``write`` None nothing is written: returns the intact leading segments and the index of
    the first closed ledger they do not cover (those stay in the head). Costs
    O(len(refs) log n) plus what is written.
    """
    import bisect

    if (
        refs
        and sum(r.count for r in refs) == n_closed
        and ledgers[0].ledger_id == refs[0].first
        and ledgers[n_closed - 1].ledger_id == refs[-1].last
    ):
        # Every commit but rollovers and trims: the segments hold as many ledgers as are
        # closed, from the same first to the same last. Ledger ids only grow and a commit
        # only adds closed ledgers after the last or removes some, so none was added (the
        # last would be newer) and none removed (fewer would be closed): all are intact.
        return list(refs), n_closed
    pieces: list[tuple[SegmentRef | None, int, int]] = []  # (ref or None=loose, start, end)
    pos = 0
    for ref in refs:
        i = pos  # where an intact segment starts unless retention cut in before it
        if i >= n_closed or ledgers[i].ledger_id != ref.first:
            i = bisect.bisect_left(ledgers, ref.first, lo=pos, hi=n_closed, key=_lid)
        j = i + ref.count - 1
        if j >= n_closed or ledgers[i].ledger_id != ref.first or ledgers[j].ledger_id != ref.last:
            continue  # trimmed (partly): its survivors are covered anew
        if i > pos:
            pieces.append((None, pos, i))
        pieces.append((ref, i, j + 1))
        pos = j + 1
    if write is None:
        covered: list[SegmentRef] = []
        end = 0
        for ref_, a, b in pieces:
            if ref_ is None or a != end:
                break
            covered.append(ref_)
            end = b
        return covered, end
    if pos < n_closed:
        pieces.append((None, pos, n_closed))
    pieces = [p for piece in pieces for p in _chunks(piece)]
    while True:  # merge the last segments of one tier once they fill the next tier
        k = tier(pieces[-1][2] - pieces[-1][1]) if pieces else -1
        if k < 0:
            break
        n = 1
        while n < len(pieces) and tier(pieces[-n - 1][2] - pieces[-n - 1][1]) == k:
            n += 1
        a, b = pieces[-n][1], pieces[-1][2]
        if b - a < tier_size(k + 1):
            break
        del pieces[-n:]
        pieces.extend(_chunks((None, a, b)))
    out: list[SegmentRef] = []
    for ref_, a, b in pieces:
        out.append(ref_ if ref_ is not None else write(ledgers[a:b]))
    return out, n_closed


def _chunks(piece: tuple[SegmentRef | None, int, int]) -> list[tuple[SegmentRef | None, int, int]]:
    """A loose run as runs of at most :data:`SEGMENT_LEDGERS` (an intact segment as itself)."""
    ref, a, b = piece
    if ref is not None:
        return [piece]
    return [(None, k, min(b, k + SEGMENT_LEDGERS)) for k in range(a, b, SEGMENT_LEDGERS)]


@dataclass(frozen=True, slots=True)
class StoredHead:
    """A stored manifest version as the orphan sweep sees it: its version, its ``updated``
    time (ms, its writer's clock) and the catalog segments it names."""

    version: int
    updated_ms: int
    refs: tuple[SegmentRef, ...]


def retained_heads(heads: Sequence[StoredHead], now_ms: int) -> list[StoredHead]:
    """The stored versions a reader may still load, so the segments they name must stay.

    The same rule as the manifest's garbage collection (FORMAT.md, "GC grace"): the newest
    :data:`KEEP_VERSIONS` versions, and every version that was the newest less than
    :data:`GC_GRACE_MS` before ``now_ms`` (written then, or the version after it was). A
    reader loads a head's segments right after reading the head, so a version that stopped
    being the newest longer ago than the grace, below the newest 64, is one no reader still
    loads; one written by a writer that has not committed it yet names only segments of its
    own (young: kept by the sweep's minimum age) or segments of the newest version.
    ``heads`` may come in any order; the answer is ascending by version.
    """
    ordered = sorted(heads, key=lambda h: h.version)
    cutoff = now_ms - GC_GRACE_MS
    n = len(ordered)
    return [
        h
        for i, h in enumerate(ordered)
        if i >= n - KEEP_VERSIONS or h.updated_ms >= cutoff or ordered[i + 1].updated_ms >= cutoff
    ]
