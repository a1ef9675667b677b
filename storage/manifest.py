"""Managed-ledger state and its atomic, versioned commits.

State lives in ``manifest/<version>.json``; each file holds the full state, so a reader needs
only the newest one (on a local disk's journal, most records hold only the change from the version
before: :meth:`ManifestState.delta_from`, :meth:`ManifestState.fold`, FORMAT.md "Delta records").
A commit writes version ``v+1`` with put-if-absent and then
checks that it landed on the live chain (see :class:`~filepulsar.storage.versioned.VersionedStore`
and FORMAT.md, "Commit protocol": garbage collection frees old slots, so a writer far behind
could otherwise put into a freed slot); losing the race reloads the newest state and re-applies
the change.

File format: the first line is the state as compact JSON, the second ``crc32c=<8 hex digits>``
over the first line's bytes (``jsontext.frame`` / ``jsontext.unframe``). ``commitId`` is random
per attempt: a writer told it lost the race reads the winning version and recognises its own write
(object stores can report a retried conditional PUT as lost although its first try succeeded).
``prevCommitId`` is the commit id of the version the commit was built on.

Format 2 (written since 2026-11) keeps the closed ledgers out of the head: the head names
immutable ledger-catalog segments (:mod:`filepulsar.storage.catalog`), so a commit costs the same
with 10 or 10,000 closed ledgers. Format 1 files are still read; the first commit on a format-1
topic writes its closed ledgers as catalog segments and a format-2 head (the upgrade). ``dedup`` and
``sinkBatches`` carry the time each entry was last used, and commits prune the entries unused
for longer than the topic's policies allow (:meth:`ManifestState.prune`).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
import re
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator, MutableSequence, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, overload

import crc32c
import orjson

from filepulsar.dispatch.modes import ProducerAccessMode
from filepulsar.storage import jsontext, paths
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.catalog import Catalog, SegmentRef, segment_ledgers
from filepulsar.storage.errors import CorruptDataError, FilePulsarError, IncompatibleFormat
from filepulsar.storage.fragments import (
    BLOB_ID,
    Fragment,
    FragmentMemo,
    common_prefix,
)
from filepulsar.storage.jsontext import dumps_compact as _dumps
from filepulsar.storage.names import TopicName
from filepulsar.storage.position import EARLIEST, Position
from filepulsar.storage.versioned import NoBase, VersionedStore, envelope

MANIFEST_FORMAT = 2
#: Manifest formats this code reads (1: every ledger in the head; 2: closed ledgers in the
#: ledger catalog).
READABLE_FORMATS = (1, 2)


@dataclass(slots=True)
class LedgerInfo:
    """One ledger of the managed ledger. Open while ``closed_ms`` is None.

    An open ledger keeps its fragments in the manifest; a closed one keeps them in the immutable
    ``index`` blob and here only its totals.
    """

    ledger_id: int
    entries: int = 0
    messages: int = 0
    size: int = 0
    created_ms: int = 0
    closed_ms: int | None = None
    min_publish: int = 0
    max_publish: int = 0
    fragments: list[Fragment] | None = None
    index: str | None = None

    @property
    def is_open(self) -> bool:
        return self.closed_ms is None

    def to_json(self, fragments: bool = True) -> dict[str, Any]:
        """The ledger's JSON object; ``fragments=False`` leaves an open ledger's fragments
        out (the manifest writes them from its :class:`FragmentMemo`)."""
        d: dict[str, Any] = {
            "id": self.ledger_id,
            "entries": self.entries,
            "messages": self.messages,
            "size": self.size,
            "created": self.created_ms,
            "minPublish": self.min_publish,
            "maxPublish": self.max_publish,
        }
        if self.closed_ms is not None:
            d["closed"] = self.closed_ms
            d["index"] = self.index
        elif fragments:
            d["fragments"] = [f.to_json() for f in self.fragments or []]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LedgerInfo:
        """The ledger of a stored JSON object, checked.

        Raises
        ------
        ValueError, KeyError, TypeError
            If a field is missing or of the wrong type, or ``index`` is not the name of a
            ledger index under ``ledgers/`` (so no stored name reaches outside the topic's
            folder); decoders turn them into CorruptDataError naming their file.
        """
        frags = d.get("fragments")
        for k in ("id", "entries", "messages", "size", "created", "minPublish", "maxPublish"):
            if type(d[k]) is not int or not -_I64 <= d[k] < _I64:
                raise ValueError(f"ledger field {k!r} is not a 64-bit integer: {d[k]!r:.80}")
        if d["id"] < 0 or d["entries"] < 0 or d["messages"] < 0 or d["size"] < 0:
            raise ValueError(f"ledger {d['id']} has a negative id or count")
        closed, index = d.get("closed"), d.get("index")
        if closed is not None and type(closed) is not int:
            raise ValueError(f"ledger {d['id']}: 'closed' is not an integer: {closed!r:.80}")
        if index is not None and (
            type(index) is not str
            or not index.startswith("ledgers/")
            or not index.endswith(paths.INDEX_SUFFIX)
            or not BLOB_ID.fullmatch(index[8:])
        ):
            raise ValueError(f"ledger {d['id']}: 'index' {index!r:.120} is not a ledger index")
        if (closed is None) != (index is None):
            raise ValueError(f"ledger {d['id']} has only one of 'closed' and 'index'")
        if frags is not None and type(frags) is not list:
            raise ValueError(f"ledger {d['id']}: 'fragments' is not a list")
        return cls(
            ledger_id=d["id"],
            entries=d["entries"],
            messages=d["messages"],
            size=d["size"],
            created_ms=d["created"],
            closed_ms=d.get("closed"),
            min_publish=d["minPublish"],
            max_publish=d["maxPublish"],
            fragments=[Fragment.from_json(f) for f in frags] if frags is not None else None,
            index=d.get("index"),
        )


class ProducerLease(NamedTuple):
    """A connected producer: it renews ``expires_ms`` while alive, by a commit that replaces
    its lease with :meth:`renewed` (a lease never changes: states share them, and
    :meth:`ManifestState.copy` copies only the map)."""

    name: str
    session: str
    access_mode: ProducerAccessMode
    epoch: int
    expires_ms: int

    def to_json(self) -> list[Any]:
        return [self.session, self.access_mode.wire, self.epoch, self.expires_ms]

    def renewed(self, expires_ms: int) -> ProducerLease:
        """This lease, expiring at ``expires_ms``."""
        return ProducerLease(self.name, self.session, self.access_mode, self.epoch, expires_ms)

    @classmethod
    def from_json(cls, name: str, v: list[Any]) -> ProducerLease:
        return cls(name, v[0], _ACCESS_MODES[v[1]], v[2], v[3])


#: The stored spellings of the access modes, to the members (a manifest stores wire names).
_ACCESS_MODES = {m.wire: m for m in ProducerAccessMode}


def _lid(lg: LedgerInfo) -> int:
    return lg.ledger_id


class Ledgers(MutableSequence[LedgerInfo]):
    """A managed ledger's ledgers: a shared, read-only run of closed ledgers (from the
    catalog) followed by this state's own ones (the open ledger).

    Decoding a head therefore costs nothing per closed ledger; changing the shared run (a
    retention trim) first copies it. Behaves as a list of :class:`LedgerInfo`.
    """

    __slots__ = ("_head", "_tail")

    def __init__(self, head: Sequence[LedgerInfo] = (), tail: Iterable[LedgerInfo] = ()) -> None:
        self._head: Sequence[LedgerInfo] = head
        self._tail: list[LedgerInfo] = list(tail)

    def _own(self) -> list[LedgerInfo]:
        if self._head:
            self._tail = [*self._head, *self._tail]
            self._head = ()
        return self._tail

    def __len__(self) -> int:
        return len(self._head) + len(self._tail)

    def last(self) -> LedgerInfo | None:
        """The last ledger (None if there is none)."""
        if self._tail:
            return self._tail[-1]
        return self._head[-1] if self._head else None

    @overload
    def __getitem__(self, i: int) -> LedgerInfo: ...
    @overload
    def __getitem__(self, i: slice) -> list[LedgerInfo]: ...
    def __getitem__(self, i: int | slice) -> LedgerInfo | list[LedgerInfo]:
        n = len(self._head)
        if isinstance(i, slice):
            a, b, step = i.indices(n + len(self._tail))
            if step != 1:
                return list(self)[i]
            return [*self._head[a:b], *self._tail[max(0, a - n) : max(0, b - n)]]
        if i < 0:
            i += n + len(self._tail)
        if 0 <= i < n:
            return self._head[i]
        if i < 0:
            raise IndexError("ledger index out of range")
        return self._tail[i - n]

    @overload
    def __setitem__(self, i: int, v: LedgerInfo) -> None: ...
    @overload
    def __setitem__(self, i: slice, v: Iterable[LedgerInfo]) -> None: ...
    def __setitem__(self, i: Any, v: Any) -> None:
        self._own()[i] = v

    def __delitem__(self, i: int | slice) -> None:
        if self._head and isinstance(i, int) and (i == -1 or i == len(self) - 1) and self._tail:
            self._tail.pop()
            return
        del self._own()[i]

    def insert(self, i: int, v: LedgerInfo) -> None:
        if i >= len(self):
            self._tail.append(v)
        else:
            self._own().insert(i, v)

    def append(self, v: LedgerInfo) -> None:
        self._tail.append(v)

    def __iter__(self) -> Iterator[LedgerInfo]:
        yield from self._head
        yield from self._tail

    def __reversed__(self) -> Iterator[LedgerInfo]:
        yield from reversed(self._tail)
        yield from reversed(self._head)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        return f"Ledgers({list(self)!r})"


def _own_ledgers(lgs: Sequence[LedgerInfo]) -> Ledgers:
    """Ledgers to change: the closed ones shared (no change changes one in place), the open
    one copied with its own fragment list (the fragments are shared: a change replaces one,
    never changes it)."""
    head: Sequence[LedgerInfo]
    if isinstance(lgs, Ledgers):
        head, tail = lgs._head, list(lgs._tail)
    else:
        head, tail = (), list(lgs)
    if tail and tail[-1].closed_ms is None:
        lg = tail[-1]
        tail[-1] = LedgerInfo(
            lg.ledger_id,
            lg.entries,
            lg.messages,
            lg.size,
            lg.created_ms,
            None,
            lg.min_publish,
            lg.max_publish,
            list(lg.fragments or ()),
            lg.index,
        )
    return Ledgers(head, tail)


# What a state made by a fold shares with the state it was folded from
# (``ManifestState.shares``).
_SHARES_PRODUCERS = 1
_SHARES_DEDUP = 2  # dedup and dedup_used
_SHARES_SINK = 4  # sink_batches and sink_used
_SHARES_LEDGERS = 8  # the ledgers and the open ledger
_SHARES_ALL = 15

_new_state = object.__new__


@dataclass(slots=True)
class ManifestState:
    """The state of one managed ledger (one partition or one non-partitioned topic).

    ``trimmed_before`` is the first ledger id that may still exist: ledgers below it were
    deleted by retention; ``trimmed_last`` is the last entry position they held (a reader
    whose position is before it has lost data). ``dedup`` maps producer name → highest
    persisted sequence id; ``sink_batches`` maps a Spark query id → the last batch id it
    committed here; ``dedup_used`` and ``sink_used`` give each entry's last use (ms), by which
    :meth:`prune` bounds them. ``incarnation`` is a random id written at creation and never
    changed: a topic deleted and created again under the same name has a new one ("" in
    topics created before it existed). ``created_ms`` is when version 0 was written (the
    topic's, or partition's, creation time: PIP-431's ``topicCreationTimeStamp``), carried by
    every later version; None in manifests written before it was recorded.

    ``catalog_refs`` are the ledger-catalog segments the closed ledgers were read from (format
    2), and ``catalog`` writes new ones when the state is encoded (None: closed ledgers no
    segment covers stay in the head, as in format 1). ``ledgers`` always holds every ledger.
    """

    topic: str
    partition: int
    version: int = 0
    next_ledger_id: int = 0
    ledgers: MutableSequence[LedgerInfo] = field(default_factory=list)
    producers: dict[str, ProducerLease] = field(default_factory=dict)
    topic_epoch: int = 0
    dedup: dict[str, int] = field(default_factory=dict)
    sink_batches: dict[str, int] = field(default_factory=dict)
    trimmed_before: int = 0
    trimmed_messages: int = 0
    trimmed_last: Position = EARLIEST
    updated_ms: int = 0
    commit_id: str = ""
    prev_commit_id: str = ""
    incarnation: str = ""
    created_ms: int | None = None
    dedup_used: dict[str, int] = field(default_factory=dict)
    sink_used: dict[str, int] = field(default_factory=dict)
    catalog_refs: list[SegmentRef] = field(default_factory=list)
    catalog: Catalog | None = field(default=None, repr=False, compare=False)
    memo: FragmentMemo | None = field(default=None, repr=False, compare=False)
    #: What this state holds in common with the state it was folded from (bits of
    #: ``_SHARES_*``): a fold in place copies each of them before its first change to it.
    #: 0 for every state not made by :meth:`fold` (decoded, copied, built).
    shares: int = field(default=0, repr=False, compare=False)

    def copy(self) -> ManifestState:
        """A private copy to change, equal to decoding this state's encoding (what a commit
        builds on), without the decoding: what no change mutates in place is shared (closed
        ledgers, fragments, producers' leases, catalog refs), the rest is copied (the open
        ledger, the maps)."""
        updated = self.updated_ms
        dedup, dedup_used = self.dedup, self.dedup_used
        sink, sink_used = self.sink_batches, self.sink_used
        # Each map's uses name exactly its entries (in every decoded or folded state): copied
        # whole; else made so, a use a map lacks being the state's ``updated_ms``.
        if dedup_used.keys() == dedup.keys():
            dedup_used = dict(dedup_used)
        else:
            dedup_used = {n: dedup_used.get(n, updated) for n in dedup}
        if sink_used.keys() == sink.keys():
            sink_used = dict(sink_used)
        else:
            sink_used = {q: sink_used.get(q, updated) for q in sink}
        return self._carried(
            _own_ledgers(self.ledgers),
            dict(self.producers),  # (the leases shared: a change replaces one, never changes it)
            (dict(dedup), dedup_used),
            (dict(sink), sink_used),
            list(self.catalog_refs),
            0,
        )

    @property
    def open_ledger(self) -> LedgerInfo | None:
        lgs = self.ledgers
        last = lgs.last() if type(lgs) is Ledgers else (lgs[-1] if lgs else None)
        return last if last is not None and last.is_open else None

    @property
    def total_messages(self) -> int:
        """Messages ever added, including the ones retention has deleted."""
        return self.trimmed_messages + sum(lg.messages for lg in self.ledgers)

    def last_position(self) -> Position:
        """(ledger_id, entry_id) of the last entry ever added: the last remaining one, else the
        last one retention deleted, else (-1, -1) for a topic that never had any."""
        lgs = self.ledgers
        last = lgs.last() if type(lgs) is Ledgers else (lgs[-1] if lgs else None)
        if last is not None and last.entries:  # (the usual answer, without a walk)
            return Position(last.ledger_id, last.entries - 1)
        for lg in reversed(lgs):
            if lg.entries:
                return Position(lg.ledger_id, lg.entries - 1)
        return self.trimmed_last

    def ledger_index(self, ledger_id: int) -> int:
        """Index in ``ledgers`` of the first ledger whose id is >= ``ledger_id``."""
        return bisect.bisect_left(self.ledgers, ledger_id, key=_lid)

    def ledgers_from(self, ledger_id: int) -> Iterator[LedgerInfo]:
        """The ledgers whose id is >= ``ledger_id``, in order (found by bisection: the cost
        does not grow with the ledgers before it)."""
        lgs = self.ledgers
        for i in range(self.ledger_index(ledger_id), len(lgs)):
            yield lgs[i]

    def ledger(self, ledger_id: int) -> LedgerInfo | None:
        i = self.ledger_index(ledger_id)
        if i < len(self.ledgers) and self.ledgers[i].ledger_id == ledger_id:
            return self.ledgers[i]
        return None

    def note_dedup(self, name: str, sequence_id: int, now: int) -> None:
        """Record ``name``'s highest persisted sequence id, used at ``now``."""
        self.dedup[name] = sequence_id
        self.dedup_used[name] = now

    def note_sink_batch(self, writer_id: str, batch_id: int, now: int) -> None:
        """Record the last batch a Spark query committed here, at ``now``."""
        self.sink_batches[writer_id] = batch_id
        self.sink_used[writer_id] = now

    def prune(
        self,
        now: int,
        *,
        dedup_inactive_ms: int,
        sink_batches_max: int,
        sink_batches_max_age_ms: int,
    ) -> None:
        """Bound ``dedup`` and ``sink_batches`` (called by the commits that grow them).

        A producer's dedup entry goes once the producer has no lease here and has not
        published for ``dedup_inactive_ms`` (Pulsar's
        ``brokerDeduplicationProducerInactivityTimeoutMinutes``: a producer that comes back
        later starts afresh, its old sequence ids are no longer recognised as duplicates). A
        Spark query's last batch id goes once it is older than ``sink_batches_max_age_ms``,
        and beyond the ``sink_batches_max`` most recently used queries (a query restarted
        after that replays its last batch as new rows: at-least-once, see docs/spark-sink.md).
        """
        cut = now - dedup_inactive_ms
        for name in [n for n in self.dedup if self.dedup_used.get(n, now) < cut]:
            if name not in self.producers:
                del self.dedup[name]
                self.dedup_used.pop(name, None)
        for name in [n for n in self.dedup_used if n not in self.dedup]:
            del self.dedup_used[name]
        cut = now - sink_batches_max_age_ms
        gone = [q for q in self.sink_batches if self.sink_used.get(q, now) < cut]
        if len(self.sink_batches) - len(gone) > sink_batches_max:
            keep = sorted(
                (q for q in self.sink_batches if q not in set(gone)),
                key=lambda q: self.sink_used.get(q, now),
                reverse=True,
            )
            gone.extend(keep[sink_batches_max:])
        for q in gone:
            self.sink_batches.pop(q, None)
            self.sink_used.pop(q, None)
        for q in [q for q in self.sink_used if q not in self.sink_batches]:
            del self.sink_used[q]

    def encode(self) -> bytes:
        """The head's bytes (format 2). Closed ledgers no intact catalog segment covers are
        first written as new segments (with ``catalog``; ``catalog_refs`` is updated), else
        kept in the head."""
        lgs = self.ledgers
        n_closed = len(lgs) - (1 if self.open_ledger is not None else 0)
        catalog = self.catalog
        write = None
        if catalog is not None:
            topic, partition = self.topic, self.partition

            def write(chunk: Sequence[LedgerInfo]) -> SegmentRef:
                return catalog.write(chunk, topic, partition)

        refs, covered = segment_ledgers(lgs, n_closed, self.catalog_refs, write)
        self.catalog_refs = refs
        extra: dict[str, Any] = {"incarnation": self.incarnation} if self.incarnation else {}
        if self.created_ms is not None:
            extra["created"] = self.created_ms
        # Written piecewise, with the open ledger's fragments from the memo: the same bytes
        # as one json.dumps of the whole (compact separators join items with "," alone).
        memo = self.memo
        texts = []
        for lg in lgs[covered:]:
            if lg.closed_ms is None and memo is not None:
                d = lg.to_json(fragments=False)
                texts.append(f'{_dumps(d)[:-1]},"fragments":{memo.encode(lg)}}}')
            else:
                texts.append(_dumps(lg.to_json()))
        if catalog is not None:
            refs_text = catalog.refs_json(refs)
        else:
            refs_text = _dumps([r.to_json() for r in refs])
        head = _dumps(
            {
                "format": MANIFEST_FORMAT,
                "topic": self.topic,
                "partition": self.partition,
                "version": self.version,
                "nextLedgerId": self.next_ledger_id,
            }
        )
        head = f'{head[:-1]},"catalog":{refs_text}}}'
        tail = _dumps(
            {
                "producers": {n: p.to_json() for n, p in self.producers.items()},
                "topicEpoch": self.topic_epoch,
                "dedup": {
                    n: [s, self.dedup_used.get(n, self.updated_ms)] for n, s in self.dedup.items()
                },
                "sinkBatches": {
                    q: [b, self.sink_used.get(q, self.updated_ms)]
                    for q, b in self.sink_batches.items()
                },
                "trimmedBefore": self.trimmed_before,
                "trimmedMessages": self.trimmed_messages,
                "trimmedLast": list(self.trimmed_last),
                "updated": self.updated_ms,
                "commitId": self.commit_id,
                **envelope.prev_field(self),
                **extra,
            }
        )
        body = f'{head[:-1]},"ledgers":[{",".join(texts)}],{tail[1:]}'.encode()
        return envelope.frame(body)

    def delta_from(self, base: ManifestState) -> bytes | None:
        """This state (stamped as the version after ``base``) as a delta record: its change
        from ``base`` (FORMAT.md, "Delta records"), without encoding the whole state. None
        where a change is not one a delta says (a ledger added, closed or trimmed, the
        catalog or the topic's identity changed, a map's order moved): then the full state
        is written. The fragments it adds to the open ledger go into the store's fragment
        memo, as a fold's do (:meth:`FragmentMemo.folded
        <filepulsar.storage.fragments.FragmentMemo.folded>`)."""
        if (
            self.version != base.version + 1
            or self.prev_commit_id != base.commit_id
            or self.topic != base.topic
            or self.partition != base.partition
            or self.incarnation != base.incarnation
            or self.created_ms != base.created_ms
            or self.catalog_refs != base.catalog_refs
        ):
            return None
        ledger = _open_ledger_delta(self.ledgers, base.ledgers)
        if ledger is False:
            return None
        parts: dict[str, Any] = {
            "delta": DELTA_FORMAT,
            "version": self.version,
            "updated": self.updated_ms,
            "commitId": self.commit_id,
            "prevCommitId": self.prev_commit_id,
        }
        sets: dict[str, Any] = {
            k: v
            for k, v, was in (
                ("nextLedgerId", self.next_ledger_id, base.next_ledger_id),
                ("topicEpoch", self.topic_epoch, base.topic_epoch),
                ("trimmedBefore", self.trimmed_before, base.trimmed_before),
                ("trimmedMessages", self.trimmed_messages, base.trimmed_messages),
            )
            if v != was
        }
        if tuple(self.trimmed_last) != tuple(base.trimmed_last):
            sets["trimmedLast"] = list(self.trimmed_last)
        if sets:
            parts["set"] = sets
        # (Compared as they are held, not as their JSON: a commit changes one or two
        # entries of maps that name every producer of the topic.)
        for key, ops in (
            ("producers", _lease_delta(self.producers, base.producers)),
            (
                "dedup",
                _used_delta(
                    (self.dedup, self.dedup_used, self.updated_ms),
                    (base.dedup, base.dedup_used, base.updated_ms),
                ),
            ),
            (
                "sinkBatches",
                _used_delta(
                    (self.sink_batches, self.sink_used, self.updated_ms),
                    (base.sink_batches, base.sink_used, base.updated_ms),
                ),
            ),
        ):
            if ops is None:
                return None
            if ops:
                parts[key] = ops
        if ledger is not None:
            parts["open"] = ledger
            memo = self.memo
            if memo is not None:
                # The memo follows this commit's own fragments as it follows the folds of
                # others' records: a writer sharing the topic then parses only what came
                # since its last record when it next decodes a full head (else all the
                # open ledger's fragments: ~10x a fold, by each writer). A commit that does
                # not land leaves the memo ahead of the folds after it: they no longer
                # match it (the next head is parsed whole), nothing else.
                frags = self.ledgers[-1].fragments or []
                keep = ledger[6]
                memo.folded(base.ledgers[-1].fragments or [], keep, frags[keep:], ledger[7])
        return envelope.frame(_dumps(parts).encode())

    def fold(self, raw: bytes, where: str, *, in_place: bool = False) -> ManifestState:
        """The state the delta record ``raw`` (at ``where``) makes of this one, the version
        before it: a new state, this one not changed; or (``in_place``, for a state nobody
        else holds) this one changed. A delta found malformed may have changed some of it.

        The new state shares with this one the maps and ledgers the record does not change,
        and copies the others before it changes them (``shares``), so a fold costs what the
        record holds, not what the state holds; a fold in place does the same for what the
        state still shares. Both states stay read-only: a change goes to a :meth:`copy`.

        Raises
        ------
        NoBase
            If this state is not the version and commit the delta was built on.
        CorruptDataError
            If the checksum line is wrong or the delta is malformed.
        IncompatibleFormat
            If it is a delta format this code does not read.
        """
        # (jsontext.malformed_is_corrupt's turn of errors, without its call per record)
        try:
            d = jsontext.loads_stored(jsontext.unframe(raw, where, "manifest delta"))
            if type(d) is not dict:
                raise TypeError(f"a {type(d).__name__}, not an object")
            if d.get("delta") != DELTA_FORMAT:
                raise IncompatibleFormat(
                    f"manifest delta {where} has format {d.get('delta')!r}; this code reads "
                    f"{DELTA_FORMAT}"
                )
            version, updated, prev = d["version"], d["updated"], d["prevCommitId"]
            commit_id = d.get("commitId", "")
            # (envelope.check_stamp's checks in one expression; it says why where they fail.)
            if not (
                type(version) is int
                and type(updated) is int
                and type(commit_id) is str
                and type(prev) is str
                and 0 <= version < _I64
                and -_I64 <= updated < _I64
            ):
                envelope.check_stamp(d, prev_required=True)
                raise ValueError(f"'commitId' is not a string: {commit_id!r:.80}")
            if version != self.version + 1 or prev != self.commit_id:
                raise NoBase(
                    f"it follows version {version - 1} commit {prev!r:.40}, "
                    f"not version {self.version} commit {self.commit_id!r:.40}"
                )
            new = self if in_place else self._folded_copy()
            new.version = version
            new.updated_ms = updated
            new.commit_id = d["commitId"]  # (required in a delta)
            new.prev_commit_id = prev
            sets = d.get("set")
            if sets is not None:
                _fold_sets(new, sets)
            ops = d.get("producers")
            if ops is not None:
                if new.shares & _SHARES_PRODUCERS:
                    new.producers = dict(new.producers)  # (leases are replaced, never changed)
                    new.shares &= ~_SHARES_PRODUCERS
                producers = new.producers
                for name, v in _items(ops, "producers"):
                    if v is None:
                        del producers[name]
                    else:
                        producers[name] = ProducerLease.from_json(name, _lease(v))
            ops = d.get("dedup")
            if ops is not None:
                if new.shares & _SHARES_DEDUP:
                    new._own_map(_SHARES_DEDUP)
                _fold_used(new.dedup, new.dedup_used, ops, "dedup")
            ops = d.get("sinkBatches")
            if ops is not None:
                if new.shares & _SHARES_SINK:
                    new._own_map(_SHARES_SINK)
                _fold_used(new.sink_batches, new.sink_used, ops, "sinkBatches")
            op = d.get("open")
            if op is not None:
                _fold_open(new, op)
            return new
        except FilePulsarError:
            raise
        except jsontext.MALFORMED as e:
            raise jsontext.malformed("manifest delta", where, e) from e

    def fold_run(self, raws: Sequence[bytes]) -> ManifestState | None:
        """The state the delta records ``raws`` (in a row, the first built on this state)
        make of this one, in one pass, where each is a producer's usual commit: the envelope,
        producer leases set (a registration, a renewal), names of ``dedup`` set, the open
        ledger's counts and fragments changed. A new state,
        this one not changed; equal to folding them one by one (:meth:`fold`), without the
        intermediate states, nor the fragments a later record of the run drops or replaces
        (a fragment grown again). None where any record is not that, is malformed, or does
        not follow the one before it: nothing is changed then, and :meth:`fold` folds them
        (and says what is wrong)."""
        lgs = self.ledgers
        if type(lgs) is not Ledgers or not lgs._tail:
            return None
        tail = lgs._tail
        lg = tail[-1]
        if lg.closed_ms is not None:
            return None
        lid = lg.ledger_id
        frags = lg.fragments or []
        kept = len(frags)  # the fragments of this state kept, then ``added`` (JSON lists)
        added: list[Any] = []
        sets: list[dict[str, Any]] = []  # the runs' ``dedup`` changes
        leases: list[dict[str, Any]] = []  # the runs' ``producers`` changes
        op: list[Any] | None = None  # the last ``open``
        d: dict[str, Any] | None = None  # the last record
        version, commit_id = self.version, self.commit_id
        match, crc, loads = _RUN_RECORD.fullmatch, crc32c.crc32c, orjson.loads
        for raw in raws:
            # The record's text in the shape its writer writes (:meth:`delta_from`, compact
            # JSON, fields in order), which proves every type and range the folds check;
            # parsed once that holds.
            m = match(raw)
            if m is None:
                return None
            line, stored = m.groups()
            if int(stored, 16) != crc(line):
                return None
            try:
                d = loads(line)
            except orjson.JSONDecodeError:
                return None
            version += 1
            if d["version"] != version or d["prevCommitId"] != commit_id:
                return None
            commit_id = d["commitId"]
            pp = d.get("producers")
            if pp is not None:
                leases.append(pp)
            dd = d.get("dedup")
            if dd is not None:
                sets.append(dd)
            o = d.get("open")
            if o is not None:
                keep = o[6]
                if o[0] != lid:
                    return None
                if keep >= kept:  # (the fragments kept, some added by this run)
                    if keep > kept + len(added):
                        return None
                    # (a fresh list of the parse's: held by nothing else, never changed)
                    added = o[7] if keep == kept else [*added[: keep - kept], *o[7]]
                else:
                    added, kept = o[7], keep
                op = o
        if d is None:
            return None  # (no record)
        # The new state (as _folded_copy makes it, without its call): sharing this one's
        # maps and ledgers except what the run changes.
        memo = self.memo
        # (A use a map lacks is its state's ``updated_ms``, which the fold changes: given
        # here, as copy() gives it. A decoded or folded state lacks none.)
        updated, dedup, dedup_used = self.updated_ms, self.dedup, self.dedup_used
        if sets:
            dedup = dict(dedup)
            dedup_used = (
                dict(dedup_used)
                if len(dedup_used) == len(self.dedup)
                else {n: dedup_used.get(n, updated) for n in self.dedup}
            )
            for dd in sets:
                for name, (x, at) in dd.items():
                    dedup[name] = x
                    dedup_used[name] = at
            shares = _SHARES_ALL & ~_SHARES_DEDUP
        else:
            if len(dedup_used) != len(dedup):
                dedup_used = {n: dedup_used.get(n, updated) for n in dedup}
            shares = _SHARES_ALL
        producers = self.producers
        if leases:
            producers = dict(producers)  # (leases are replaced, never changed)
            for pp in leases:
                for name, v in pp.items():
                    producers[name] = ProducerLease.from_json(name, v)
            shares &= ~_SHARES_PRODUCERS
        sink_used = self.sink_used
        if len(sink_used) != len(self.sink_batches):
            sink_used = {q: sink_used.get(q, updated) for q in self.sink_batches}
        ledgers: MutableSequence[LedgerInfo] = lgs
        if op is not None:
            made = [Fragment(*f) for f in added]
            if memo is not None:
                memo.folded(frags, kept, made, added)
            own = _new_ledgers(Ledgers)
            own._head = lgs._head
            lg = LedgerInfo(
                lid,
                op[1],
                op[2],
                op[3],
                lg.created_ms,
                None,
                op[4],
                op[5],
                [*frags[:kept], *made] if kept < len(frags) else [*frags, *made],
                lg.index,
            )
            own._tail = [*tail[:-1], lg] if len(tail) > 1 else [lg]
            ledgers = own
            shares &= ~_SHARES_LEDGERS
        new = self._carried(
            ledgers,
            producers,
            (dedup, dedup_used),
            (self.sink_batches, sink_used),
            self.catalog_refs,
            shares,
        )
        new.version, new.updated_ms, new.commit_id, new.prev_commit_id = (
            version,
            d["updated"],
            commit_id,
            d["prevCommitId"],
        )
        return new

    def _folded_copy(self) -> ManifestState:
        """A new state holding this one's maps and ledgers (``shares`` says so): what a
        fold changes it copies first (copy on write), so a fold costs what its record
        changes, not what the state holds. This state is not changed."""
        updated, dedup_used, sink_used = self.updated_ms, self.dedup_used, self.sink_used
        # (A use a map lacks is its state's ``updated_ms``, which the fold changes: given
        # here, as copy() gives it. A decoded or folded state lacks none.)
        if len(dedup_used) != len(self.dedup):
            dedup_used = {n: dedup_used.get(n, updated) for n in self.dedup}
        if len(sink_used) != len(self.sink_batches):
            sink_used = {q: sink_used.get(q, updated) for q in self.sink_batches}
        return self._carried(
            self.ledgers,
            self.producers,
            (self.dedup, dedup_used),
            (self.sink_batches, sink_used),
            self.catalog_refs,
            _SHARES_ALL,
        )

    def _carried(
        self,
        ledgers: MutableSequence[LedgerInfo],
        producers: dict[str, ProducerLease],
        dedup: tuple[dict[str, int], dict[str, int]],
        sink: tuple[dict[str, int], dict[str, int]],
        catalog_refs: list[SegmentRef],
        shares: int,
    ) -> ManifestState:
        """A new state holding these (the maps with their uses) and this one's other fields.

        Every field by name, without the constructor: as fast as a positional call (a keyword
        call costs 2.3x; the constructor's default checks are all for nothing here), and no
        reordering of the fields can swap two of them. A field added and not set here is an
        AttributeError on first read (a test sets every field)."""
        new = _new_state(ManifestState)
        new.topic = self.topic
        new.partition = self.partition
        new.version = self.version
        new.next_ledger_id = self.next_ledger_id
        new.ledgers = ledgers
        new.producers = producers
        new.topic_epoch = self.topic_epoch
        new.dedup, new.dedup_used = dedup
        new.sink_batches, new.sink_used = sink
        new.trimmed_before = self.trimmed_before
        new.trimmed_messages = self.trimmed_messages
        new.trimmed_last = self.trimmed_last
        new.updated_ms = self.updated_ms
        new.commit_id = self.commit_id
        new.prev_commit_id = self.prev_commit_id
        new.incarnation = self.incarnation
        new.created_ms = self.created_ms
        new.catalog_refs = catalog_refs
        new.catalog = self.catalog
        new.memo = self.memo
        new.shares = shares
        return new

    def _own_map(self, bit: int) -> None:
        """Copy the map ``bit`` names (dedup or sink batches, with their uses) that this
        state shares, before a fold in place changes it."""
        if bit == _SHARES_DEDUP:
            self.dedup, self.dedup_used = dict(self.dedup), dict(self.dedup_used)
        else:
            self.sink_batches, self.sink_used = dict(self.sink_batches), dict(self.sink_used)
        self.shares &= ~bit

    def _own_open_ledger(self) -> None:
        """Give this state its own ledgers and open ledger (with its own fragment list),
        before a fold in place changes the open ledger; closed ledgers stay shared."""
        self.ledgers = _own_ledgers(self.ledgers)
        self.shares &= ~_SHARES_LEDGERS

    @classmethod
    @jsontext.malformed_is_corrupt("manifest")
    def decode(
        cls,
        raw: bytes,
        where: str,
        catalog: Catalog | None = None,
        memo: FragmentMemo | None = None,
    ) -> ManifestState:
        """Parse and verify a manifest file (format 1 or 2); ``where`` names it in errors.

        ``catalog`` reads the ledger-catalog segments a format-2 head names (cached by name)
        and writes new ones when the state is encoded again. ``memo`` (the store's) decodes
        only the open ledger's fragments added since its last decoding, and encodes likewise.

        Raises
        ------
        CorruptDataError
            If the checksum line is missing or wrong, the JSON does not parse, or a catalog
            segment does not hold what the head says.
        DataLossError
            If a catalog segment the head names is gone.
        IncompatibleFormat
            If the file was written by a newer format, or is format 2 and no ``catalog`` is
            given to read its segments.
        """
        body = jsontext.unframe(raw, f"manifest {where}")
        parsed = memo.parse(body) if memo is not None else None
        if parsed is not None:
            d, open_frags = parsed
        else:
            try:
                d = jsontext.loads_stored(body)
            except ValueError as e:
                raise CorruptDataError(f"manifest {where} is not valid JSON") from e
        fmt = envelope.check_format(d, "manifest", where, READABLE_FORMATS)
        _check_head(d, fmt)
        updated = d["updated"]
        raw_refs = d.get("catalog", []) if fmt == 2 else []
        refs: list[SegmentRef] = []
        closed: tuple[LedgerInfo, ...] = ()
        if raw_refs:
            if catalog is None:
                raise IncompatibleFormat(
                    f"manifest {where} names ledger-catalog segments; read it through its "
                    "ManifestStore"
                )
            refs, closed = catalog.resolve(raw_refs)
            refs = list(refs)
        if memo is None:
            ledgers = Ledgers(closed, (LedgerInfo.from_json(x) for x in d["ledgers"]))
        else:
            xs = d["ledgers"]
            last_frags = None if parsed is not None or not xs else xs[-1].get("fragments")
            if type(last_frags) is not list:
                last_frags = None  # (none, or not a list: LedgerInfo.from_json refuses it)
            if last_frags is not None:
                xs[-1]["fragments"] = None
            own = [LedgerInfo.from_json(x) for x in xs]
            if parsed is not None:
                own[-1].fragments = open_frags  # (the memo parsed them)
            elif last_frags is not None:  # remembered for the next head's parse
                own[-1].fragments = memo.decode(last_frags)
            ledgers = Ledgers(closed, own)
        if fmt == 1:
            dedup, dedup_used = d["dedup"], {n: updated for n in d["dedup"]}
            sink, sink_used = d["sinkBatches"], {q: updated for q in d["sinkBatches"]}
        else:
            dedup = {n: v[0] for n, v in d["dedup"].items()}
            dedup_used = {n: v[1] for n, v in d["dedup"].items()}
            sink = {q: v[0] for q, v in d["sinkBatches"].items()}
            sink_used = {q: v[1] for q, v in d["sinkBatches"].items()}
        return cls(
            topic=d["topic"],
            partition=d["partition"],
            version=d["version"],
            next_ledger_id=d["nextLedgerId"],
            ledgers=ledgers,
            producers={n: ProducerLease.from_json(n, v) for n, v in d["producers"].items()},
            topic_epoch=d["topicEpoch"],
            dedup=dedup,
            sink_batches=sink,
            trimmed_before=d["trimmedBefore"],
            trimmed_messages=d["trimmedMessages"],
            trimmed_last=Position(*d.get("trimmedLast", (-1, -1))),
            updated_ms=updated,
            commit_id=d.get("commitId", ""),
            prev_commit_id=d.get("prevCommitId", ""),
            incarnation=d.get("incarnation", ""),
            created_ms=d.get("created"),
            dedup_used=dedup_used,
            sink_used=sink_used,
            catalog_refs=refs,
            catalog=catalog,
            memo=memo,
        )


#: Stored integers are 64-bit (as Pulsar's ids): anything larger is damage.
_I64 = 1 << 63

#: The format of a manifest's delta records (FORMAT.md, "Delta records").
DELTA_FORMAT = 1
#: The types of a delta record's ``open``: ``[id, entries, messages, size, minPublish,
#: maxPublish, fragments kept, fragments added]``.
_OPEN_TYPES = (int, int, int, int, int, int, int, list)
# A delta record :meth:`ManifestState.fold_run` folds, as its writer writes it (compact JSON,
# its fields in order: FORMAT.md, "Delta records"): the envelope, ``producers`` leases set (a
# registration or a renewal; a removal is null: not here), ``dedup`` names set, the open
# ledger's change; then the checksum line. Its numbers of at most 18 digits (64-bit integers,
# >= 0 where the folds require it; a leading zero is the parse's to refuse, as JSON does), its
# strings without escapes (the parse checks the rest), blob ids as Fragment.from_json takes
# them (BLOB_ID). Group 1: line 1; group 2: the checksum. Every repeat is possessive where
# Python has them (3.11: ``*+``, a quarter faster): none can give back what it took, as what
# follows each can never start with what it repeats (a digit after digits, a quote after a
# string's characters, a comma or bracket after an item), so the text matched is the same.
_P = b"+" if sys.version_info >= (3, 11) else b""
_RUN_PARTS = {
    # an integer >= 0 of 64 bits (one counted run: a fifth faster)
    b"<N>": rb"[0-9]{1,18}" + _P,
    b"<Z>": rb"-?" + _P + rb"[0-9]{1,18}" + _P,  # an integer of 64 bits
    b"<S>": rb'"[^"\\\x00-\x1f]*' + _P + b'"',  # a string without escapes
    b"<B>": rb'"(?!\.\.?")[A-Za-z0-9_\-=:.%]{1,200}' + _P + b'"',  # a blob id (BLOB_ID)
    # a producer's access mode, as stored (its wire name)
    b"<M>": b'"(?:' + b"|".join(m.encode() for m in _ACCESS_MODES) + b')"',
    b"<+>": _P,
}
_RUN_RECORD = re.compile(
    functools.reduce(
        lambda text, part: text.replace(*part),
        _RUN_PARTS.items(),
        rb'(\{"delta":1,"version":<N>,"updated":<Z>,"commitId":<S>,"prevCommitId":<S>'
        rb'(?:,"producers":\{<L>(?:,<L>)*<+>\})?<+>'
        rb'(?:,"dedup":\{<S>:\[<Z>,<Z>\](?:,<S>:\[<Z>,<Z>\])*<+>\})?<+>'
        rb'(?:,"open":\[<N>,<N>,<N>,<N>,<N>,<N>,<N>,\[(?:<F>(?:,<F>)*<+>)?<+>\]\])?<+>\})'
        rb"\ncrc32c=([0-9a-f]{8})\n".replace(
            b"<F>", rb"\[<B>,<N>,<N>,<N>,<N>,<N>,<Z>,<Z>\]"
        ).replace(b"<L>", rb"<S>:\[<S>,<M>,<Z>,<Z>\]"),
    )
)


#: The integer fields a delta record's ``set`` may change, and their attributes.
_DELTA_INTS = {
    "nextLedgerId": "next_ledger_id",
    "topicEpoch": "topic_epoch",
    "trimmedBefore": "trimmed_before",
    "trimmedMessages": "trimmed_messages",
}


def _order_kept(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """Whether ``new`` keeps ``old``'s keys that it holds in their order, before any new
    one (else its JSON text would not be ``old``'s changed in place)."""
    keys = list(new)
    if len(keys) == len(old) and keys == list(old):
        return True
    kept = [k for k in old if k in new]
    return keys[: len(kept)] == kept


def _lease_delta(
    new: dict[str, ProducerLease], old: dict[str, ProducerLease]
) -> dict[str, Any] | None:
    """The changes that make the leases ``old`` into ``new``, as a delta record's
    ``producers`` (a name to null: removed; applied in order, removals first); None if
    ``new`` does not keep ``old``'s order (:func:`_order_kept`)."""
    if not _order_kept(new, old):
        return None
    out: dict[str, Any] = {k: None for k in old if k not in new}
    for k, p in new.items():
        was = old.get(k)
        if was is p:
            continue  # (a lease never changes: the same object, the same lease)
        if (
            was is None
            or p.expires_ms != was.expires_ms
            or p.session != was.session
            or p.access_mode is not was.access_mode
            or p.epoch != was.epoch
        ):
            out[k] = p.to_json()
    return out


def _used_delta(
    new: tuple[dict[str, int], dict[str, int], int], old: tuple[dict[str, int], dict[str, int], int]
) -> dict[str, Any] | None:
    """The changes that make a map with its last-use times (``(values, used, updated)``,
    stored as ``[value, used]`` with ``updated`` for a missing use) ``old`` into ``new``, as
    :func:`_lease_delta` says them."""
    values, used, updated = new
    was, was_used, was_updated = old
    if not _order_kept(values, was):
        return None
    out: dict[str, Any] = {k: None for k in was if k not in values}
    for k, v in values.items():
        u = used.get(k, updated)
        if k not in was or was[k] != v or was_used.get(k, was_updated) != u:
            out[k] = [v, u]
    return out


def _items(ops: Any, key: str) -> Iterable[tuple[str, Any]]:
    """A delta record's changes to map ``key`` (ValueError if they are not an object)."""
    if type(ops) is not dict:
        raise ValueError(f"{key!r} is not an object")
    return ops.items()


def _fold_sets(new: ManifestState, sets: Any) -> None:
    """A delta record's ``set`` applied to ``new`` (ValueError if malformed)."""
    if type(sets) is not dict:
        raise ValueError("'set' is not an object")
    for k, v in sets.items():
        if k == "trimmedLast":
            if type(v) is not list or len(v) != 2 or any(type(x) is not int for x in v):
                raise ValueError(f"'trimmedLast' is not [ledger, entry]: {v!r:.80}")
            new.trimmed_last = Position(v[0], v[1])
            continue
        if k not in _DELTA_INTS:
            raise ValueError(f"'set' holds an unknown field {k!r:.40}")
        if type(v) is not int or not -_I64 <= v < _I64:
            raise ValueError(f"{k!r} is not a 64-bit integer: {v!r:.80}")
        setattr(new, _DELTA_INTS[k], v)
    if new.next_ledger_id < 0:
        raise ValueError("'nextLedgerId' must be >= 0")


def _fold_used(values: dict[str, int], used: dict[str, int], ops: Any, key: str) -> None:
    """A delta record's changes to map ``key`` (dedup or sink batches, stored as ``[value,
    used]``) applied to ``values`` and their last uses ``used`` (ValueError if malformed)."""
    for name, v in _items(ops, key):
        if v is None:
            del values[name]
            used.pop(name, None)
        elif type(v) is list and len(v) == 2 and type(v[0]) is int and type(v[1]) is int:
            values[name] = v[0]
            used[name] = v[1]
        else:
            raise ValueError(f"{key!r} holds {v!r:.80}")


def _fold_open(new: ManifestState, op: Any) -> None:
    """A delta record's ``open`` applied to ``new``'s open ledger (ValueError if malformed).

    A state that shares its ledgers (``_SHARES_LEDGERS``) gets its own ones here, its open
    ledger replaced by a new one with a new fragment list built once (the fragments kept and
    those added); a state that owns them has its open ledger changed in place."""
    if type(op) is not list or tuple(map(type, op)) != _OPEN_TYPES:
        if type(op) is not list or len(op) != 8 or type(op[7]) is not list:
            raise ValueError(f"'open' is not [id, 6 counts, fragments]: {op!r:.80}")
        raise ValueError(f"'open' holds a count that is not an int >= 0: {op!r:.80}")
    lid, entries, messages, size, lo, hi, keep, raw = op
    # (Every count an int >= 0 and of 64 bits, checked in two C loops.)
    if min(op[:7]) < 0 or max(op[:7]) >= _I64:
        raise ValueError(f"'open' holds a count that is not an int >= 0: {op!r:.80}")
    lgs = new.ledgers
    head: Sequence[LedgerInfo]
    tail: Sequence[LedgerInfo]
    if type(lgs) is Ledgers:
        head, tail = lgs._head, lgs._tail
    else:
        head, tail = (), lgs
    lg = tail[-1] if tail else head[-1] if head else None  # (the open ledger, if open)
    if lg is None or lg.ledger_id != lid or lg.closed_ms is not None:
        raise ValueError(f"'open' names ledger {lid}, not the open ledger")
    frags = lg.fragments or []
    if keep > len(frags):
        raise ValueError(f"'open' keeps {keep} of {len(frags)} fragments")
    added = list(map(Fragment.from_json, raw))
    memo = new.memo
    if memo is not None:
        memo.folded(frags, keep, added, raw)
    if new.shares & _SHARES_LEDGERS:
        if not tail or tail[-1] is not lg:  # (not where a state of ours holds it)
            new._own_open_ledger()
            _fold_open(new, op)
            return
        # Copy on write, each list built once: the ledgers (the closed ones shared) and the
        # open ledger's fragments (the ones kept shared: a change replaces one, never
        # changes it).
        own = _new_ledgers(Ledgers)
        own._head = head
        own._tail = [
            *tail[:-1],
            LedgerInfo(
                lid,
                entries,
                messages,
                size,
                lg.created_ms,
                None,
                lo,
                hi,
                [*frags, *added] if keep == len(frags) else [*frags[:keep], *added],
                lg.index,
            ),
        ]
        new.ledgers = own
        new.shares &= ~_SHARES_LEDGERS
        return
    lg.entries, lg.messages, lg.size, lg.min_publish, lg.max_publish = (
        entries,
        messages,
        size,
        lo,
        hi,
    )
    # (The state's own list, changed in place: copy() and decode() make a fresh one.)
    if keep < len(frags):
        del frags[keep:]
    frags.extend(added)
    lg.fragments = frags


_new_ledgers = object.__new__


def _open_ledger_delta(
    new: MutableSequence[LedgerInfo], old: MutableSequence[LedgerInfo]
) -> list[Any] | Literal[False] | None:
    """The open ledger's change from ``old`` to ``new`` as a delta record's ``open``
    (``[id, entries, messages, size, minPublish, maxPublish, fragments kept, fragments
    added]``); None if no ledger changed; False if a change is not that (a ledger added,
    closed or removed)."""
    if len(new) != len(old) or not new:
        return False if len(new) != len(old) else None
    if isinstance(new, Ledgers) and isinstance(old, Ledgers):
        if new._head is not old._head and (new._head or old._head):
            return False
        a, b = new._tail, old._tail
    else:
        a, b = list(new), list(old)
    if len(a) != len(b):
        return False
    if not a:
        return None
    if not all(map(operator.is_, a[:-1], b[:-1])):
        return False
    lg, was = a[-1], b[-1]
    if lg is was:
        return None
    if (
        lg.closed_ms is not None
        or was.closed_ms is not None
        or lg.ledger_id != was.ledger_id
        or lg.created_ms != was.created_ms
        or lg.index is not None
    ):
        return False
    frags, before = lg.fragments or [], was.fragments or []
    keep = common_prefix(before, frags, operator.is_)
    if keep == len(frags) == len(before) and (
        lg.entries,
        lg.messages,
        lg.size,
        lg.min_publish,
        lg.max_publish,
    ) == (was.entries, was.messages, was.size, was.min_publish, was.max_publish):
        return None
    return [
        lg.ledger_id,
        lg.entries,
        lg.messages,
        lg.size,
        lg.min_publish,
        lg.max_publish,
        keep,
        [f.to_json() for f in frags[keep:]],
    ]


_HEAD_INTS = (
    "partition",
    "version",
    "nextLedgerId",
    "topicEpoch",
    "trimmedBefore",
    "trimmedMessages",
    "updated",
)


def _check_head(d: dict[str, Any], fmt: int) -> None:
    """Raise ValueError if a manifest head's fields have the wrong types (a checksum proves
    the bytes are as written, not that the writer was right): every use of the state can
    then trust them."""
    for k in _HEAD_INTS:
        if type(d[k]) is not int or not -_I64 <= d[k] < _I64:
            raise ValueError(f"{k!r} is not a 64-bit integer: {d[k]!r:.80}")
    if d["version"] < 0 or d["nextLedgerId"] < 0:
        raise ValueError("'version' and 'nextLedgerId' must be >= 0")
    if type(d["topic"]) is not str or type(d["ledgers"]) is not list:
        raise ValueError("'topic' must be a string and 'ledgers' a list")
    envelope.check_stamp(d)
    if type(d.get("incarnation", "")) is not str:
        raise ValueError(f"'incarnation' is not a string: {d['incarnation']!r:.80}")
    last = d.get("trimmedLast", [-1, -1])
    if type(last) is not list or len(last) != 2 or any(type(x) is not int for x in last):
        raise ValueError(f"'trimmedLast' is not [ledger, entry]: {last!r:.80}")
    for k in ("dedup", "sinkBatches"):
        m = d[k]
        if type(m) is not dict:
            raise ValueError(f"{k!r} is not an object")
        # Checked column by column with map/set (C loops): a dedup map can hold thousands of
        # producers, and every manifest a writer or reader loads is checked.
        vals = m.values()
        if fmt == 1:
            ok = set(map(type, vals)) <= {int}
        else:
            ok = (
                set(map(type, vals)) <= {list}
                and set(map(len, vals)) <= {2}
                and set(map(type, itertools.chain.from_iterable(vals))) <= {int}
            )
        if not ok:
            bad = next(
                v
                for v in vals
                if not (
                    type(v) is int
                    if fmt == 1
                    else type(v) is list and len(v) == 2 and all(type(x) is int for x in v)
                )
            )
            raise ValueError(f"{k!r} holds {bad!r:.80}")
    if type(d["producers"]) is not dict:
        raise ValueError("'producers' is not an object")
    for v in d["producers"].values():
        _lease(v)


def _lease(v: Any) -> list[Any]:
    """A stored producer lease ``v``, checked (ValueError if it has another shape)."""
    if not (
        type(v) is list
        and len(v) >= 4
        and type(v[0]) is str
        and type(v[1]) is str
        and v[1] in _ACCESS_MODES
        and type(v[2]) is int
        and type(v[3]) is int
    ):
        raise ValueError(f"a producer lease is {v!r:.80}")
    return v


class ManifestStore(VersionedStore[ManifestState]):
    """The versioned manifest of one managed ledger (topic or partition)."""

    #: A full head every this many versions, delta records between (on a journal). A full
    #: head costs every process following the topic a decoding (~10x a delta's fold: the
    #: open ledger's fragments, one per commit where several writers share the topic); a
    #: reader without the base folds at most this many deltas after the newest full head.
    delta_every = 256

    def __init__(
        self, store: BlobStore, topic: TopicName, *, clock: Callable[[], int] | None = None
    ) -> None:
        self.catalog = Catalog(store, topic)
        self.memo = FragmentMemo()
        catalog, memo = self.catalog, self.memo

        def decode(raw: bytes, where: str) -> ManifestState:
            return ManifestState.decode(raw, where, catalog, memo)

        super().__init__(
            store,
            paths.manifest_dir(topic),
            decode,
            what=f"topic {topic}",
            clock=clock,
        )
        self.topic = topic

    def create(self, initial: ManifestState | None = None, *, incarnation: str = "") -> bool:
        """Write version 0 (an empty ledger list) if absent. True if this call created it.

        ``incarnation`` identifies this creation of the topic (a new random id if not given;
        the partitions of a partitioned topic carry the topic's). The state records its
        creation time (``created_ms``, the clock's now) unless ``initial`` has one.
        """
        state = initial or ManifestState(
            topic=str(self.topic),
            partition=self.topic.partition_index,
            incarnation=incarnation or uuid.uuid4().hex,
        )
        if state.created_ms is None:
            state.created_ms = self.clock()
        state.catalog = self.catalog
        state.memo = self.memo
        return super().create(state)
