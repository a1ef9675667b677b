"""The ledger catalog: closed ledgers kept out of the manifest head (manifest format 2).

Every commit rewrites the manifest head, so the head holds only what changes often (the open
ledger, the producers, dedup, sink batches) and names the closed ledgers by reference: a list
of immutable *segments*, each a blob ``catalog/<first>-<last>-<nonce>.catalog`` holding the
totals of closed ledgers ``first..last`` (as Pulsar's managed ledger writes its ledger list
only when a ledger rolls over or is trimmed, not on every add).

A segment holds at most :data:`SEGMENT_LEDGERS` ledgers. A commit that closes a ledger
rewrites only the last, partly filled segment (a new blob with a new name); a retention run
rewrites only the segment it cut into; every other segment is carried over by name. So a
commit that does not roll over writes a head whose size depends on the number of segments
(one short reference per :data:`SEGMENT_LEDGERS` ledgers), and a rollover at most one
segment more.

Segments are written put-if-absent under a name random per write, *before* the head that
names them: a writer that loses the head's race (or dies) leaves an unreferenced segment,
which :func:`storage.retention.sweep_orphans` deletes once no manifest version names it and
it is older than the sweep's minimum age. Readers cache segments by name (they never change),
so reading a new head costs one GET however long the history is.

File format (storage/FORMAT.md, "Ledger catalog"): framed like the manifest (a compact JSON
line, then ``crc32c=<8 hex>``), ``{"format": 2, "topic": ..., "partition": ...,
"ledgers": [<closed ledger>, ...]}`` with each ledger as in the manifest.
"""

from __future__ import annotations

import itertools
import json
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from filepulsar.storage import jsontext, paths
from filepulsar.storage.blobstore import BlobNotFound
from filepulsar.storage.blobstore_port import BlobStore
from filepulsar.storage.errors import CorruptDataError, DataLossError
from filepulsar.storage.names import TopicName

if TYPE_CHECKING:
    from filepulsar.storage.manifest import LedgerInfo

#: Most closed ledgers one segment holds (a rollover rewrites at most this many).
SEGMENT_LEDGERS = 512
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


_cache: OrderedDict[tuple[str, str], list[LedgerInfo]] = OrderedDict()
_cache_lock = threading.Lock()
#: Closed-ledger lists of the last heads read in this process (all topics), by their references.
_resolved: OrderedDict[tuple[Any, ...], tuple[list[SegmentRef], tuple[LedgerInfo, ...]]]
_resolved = OrderedDict()
CACHE_HEADS = 64


def _cached(key: tuple[str, str]) -> list[LedgerInfo] | None:
    with _cache_lock:
        got = _cache.get(key)
        if got is not None:
            _cache.move_to_end(key)
        return got


def _remember(key: tuple[str, str], ledgers: list[LedgerInfo]) -> None:
    with _cache_lock:
        _cache[key] = ledgers
        while len(_cache) > CACHE_SEGMENTS:
            _cache.popitem(last=False)


class Catalog:
    """Reads and writes the catalog segments of one managed ledger.

    The ledgers a segment yields are shared by every state that names it (and cached for the
    process): closed ledgers never change, and callers treat states as read-only.
    """

    def __init__(self, store: BlobStore, topic: TopicName) -> None:
        self.store = store
        self.topic = topic
        self._dir = paths.topic_dir(topic)

    def key(self, ref: SegmentRef) -> str:
        return f"{self._dir}/{ref.name}"

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
                _resolved.move_to_end(key)
                return got
        refs = [SegmentRef.from_json(r) for r in raw_refs]
        closed: list[LedgerInfo] = []
        for ref in refs:
            closed.extend(self.load(ref))
        got = (refs, tuple(closed))
        with _cache_lock:
            _resolved[key] = got
            while len(_resolved) > CACHE_HEADS:
                _resolved.popitem(last=False)
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
    :data:`SEGMENT_LEDGERS` by ``write``. A run at the end joins the last segment if that one
    has room, so rollovers do not leave a trail of tiny segments. With ``write`` None nothing
    is written: returns the intact leading segments and the index of the first closed ledger
    they do not cover (those stay in the head). Costs O(len(refs) log n) plus what is written.
    """
    import bisect

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
        start = pos
        if pieces and pieces[-1][0] is not None and pieces[-1][2] == pos:
            last_ref = pieces[-1][0]
            if last_ref.count < SEGMENT_LEDGERS:
                start = pieces.pop()[1]
        pieces.append((None, start, n_closed))
    out: list[SegmentRef] = []
    for ref_, a, b in pieces:
        if ref_ is not None:
            out.append(ref_)
            continue
        for k in range(a, b, SEGMENT_LEDGERS):
            out.append(write(ledgers[k : min(b, k + SEGMENT_LEDGERS)]))
    return out, n_closed
