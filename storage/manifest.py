"""Managed-ledger state and its atomic, versioned commits.

State lives in ``manifest/<version>.json``; each file holds the full state (not a delta), so a
reader needs only the newest one. A commit writes version ``v+1`` with put-if-absent and then
checks that it landed on the live chain (see :class:`VersionedStore` and FORMAT.md, "Commit
protocol": garbage collection frees old slots, so a writer far behind could otherwise put into
a freed slot); losing the race reloads the newest state and re-applies the change.

File format: the first line is the state as compact JSON, the second ``crc32c=<8 hex digits>``
over the first line's bytes (``jsontext.frame`` / ``jsontext.unframe``). ``commitId`` is random
per attempt: a writer told it lost the race reads the winning version and recognises its own write
(object stores can report a retried conditional PUT as lost although its first try succeeded).
``prevCommitId`` is the commit id of the version the commit was built on.

Format 2 (written since 2026-11) keeps the closed ledgers out of the head: the head names
immutable ledger-catalog segments (:mod:`storage.catalog`), so a commit costs the same with 10
or 10,000 closed ledgers. Format 1 files are still read; the first commit on a format-1 topic
writes its closed ledgers as catalog segments and a format-2 head (the upgrade). ``dedup`` and
``sinkBatches`` carry the time each entry was last used, and commits prune the entries unused
for longer than the topic's policies allow (:meth:`ManifestState.prune`).
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import json
import logging
import os
import random
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, MutableSequence, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, overload

from filepulsar.dispatch.clock import waits_of, wall_ms
from filepulsar.storage import jsontext, paths
from filepulsar.storage.blobstore import BlobNotFound, BlobStore, BlobStoreError
from filepulsar.storage.catalog import Catalog, SegmentRef, segment_ledgers
from filepulsar.storage.errors import (
    CommitConflict,
    CommitOutcomeUnknown,
    CorruptDataError,
    FilePulsarError,
    IncompatibleFormat,
    TopicNotFound,
)
from filepulsar.storage.names import TopicName

log = logging.getLogger(__name__)

MANIFEST_FORMAT = 2
#: Manifest formats this code reads (1: every ledger in the head; 2: closed ledgers in the
#: ledger catalog).
READABLE_FORMATS = (1, 2)
KEEP_VERSIONS = 64
GC_EVERY = 32
#: How long a commit keeps retrying lost races before it fails (Pulsar's producer send timeout
#: is 30 s by default; a commit that cannot win in that time reports CommitConflict).
COMMIT_TIMEOUT_MS = 30_000
#: Garbage collection never deletes a version younger than this (by the ``updated`` time of
#: the newest version it deletes, against the collecting writer's clock), so a writer paused
#: for less than it between two store calls always finds what settles its commit, and a
#: writer whose cached state is older than half of it re-reads the newest first. Four times
#: the commit timeout; clocks of writers must agree within a quarter of it (30 s).
GC_GRACE_MS = 120_000
#: Fairness: a writer that lost this many races in a row in one commit asks for a turn.
TURN_AFTER_LOSSES = 3
#: How long others leave a turn's slot to its holder (measured by each of them from when it
#: first saw the turn), so a holder that died delays the others once, by at most this.
TURN_MS = 2_000
#: How long after seeing contention (a lost race, a turn) a writer checks for turns before
#: each put; outside it a commit costs no more than 1 put + 1 GET.
CONTENDED_MS = 10_000
TURN_SUFFIX = paths.TURN_SUFFIX
#: Longest wait in the local commit queue (``VersionedStore._local_queue``), ms.
LOCAL_QUEUE_WAIT_MS = 250

T = TypeVar("T")


@dataclass(slots=True)
class Fragment:
    """A run of ``count`` entries stored back to back in one blob.

    Entries ``first_entry .. first_entry+count-1`` of the ledger occupy bytes
    ``[offset, offset+length)`` of ``blob``; ``messages`` counts the messages in them.
    """

    blob: str
    first_entry: int
    count: int
    offset: int
    length: int
    messages: int
    min_publish: int
    max_publish: int

    def to_json(self) -> list[Any]:
        return [
            self.blob,
            self.first_entry,
            self.count,
            self.offset,
            self.length,
            self.messages,
            self.min_publish,
            self.max_publish,
        ]

    @classmethod
    def from_json(cls, v: list[Any]) -> Fragment:
        return cls(*v)


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

    def to_json(self) -> dict[str, Any]:
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
        else:
            d["fragments"] = [f.to_json() for f in self.fragments or []]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LedgerInfo:
        frags = d.get("fragments")
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


@dataclass(slots=True)
class ProducerLease:
    """A connected producer: it renews ``expires_ms`` while alive."""

    name: str
    session: str
    access_mode: str
    epoch: int
    expires_ms: int

    def to_json(self) -> list[Any]:
        return [self.session, self.access_mode, self.epoch, self.expires_ms]

    @classmethod
    def from_json(cls, name: str, v: list[Any]) -> ProducerLease:
        return cls(name, v[0], v[1], v[2], v[3])


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
    topics created before it existed).

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
    trimmed_last: tuple[int, int] = (-1, -1)
    updated_ms: int = 0
    commit_id: str = ""
    prev_commit_id: str = ""
    incarnation: str = ""
    dedup_used: dict[str, int] = field(default_factory=dict)
    sink_used: dict[str, int] = field(default_factory=dict)
    catalog_refs: list[SegmentRef] = field(default_factory=list)
    catalog: Catalog | None = field(default=None, repr=False, compare=False)

    @property
    def open_ledger(self) -> LedgerInfo | None:
        return self.ledgers[-1] if self.ledgers and self.ledgers[-1].is_open else None

    @property
    def total_messages(self) -> int:
        """Messages ever added, including the ones retention has deleted."""
        return self.trimmed_messages + sum(lg.messages for lg in self.ledgers)

    def last_position(self) -> tuple[int, int]:
        """(ledger_id, entry_id) of the last entry ever added: the last remaining one, else the
        last one retention deleted, else (-1, -1) for a topic that never had any."""
        for lg in reversed(self.ledgers):
            if lg.entries:
                return (lg.ledger_id, lg.entries - 1)
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
        after that replays its last batch as new rows: at-least-once, see README).
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
        extra = {"incarnation": self.incarnation} if self.incarnation else {}
        body = json.dumps(
            {
                "format": MANIFEST_FORMAT,
                "topic": self.topic,
                "partition": self.partition,
                "version": self.version,
                "nextLedgerId": self.next_ledger_id,
                "catalog": [r.to_json() for r in refs],
                "ledgers": [lg.to_json() for lg in lgs[covered:]],
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
                **({"prevCommitId": self.prev_commit_id} if self.prev_commit_id else {}),
                **extra,
            },
            separators=(",", ":"),
        ).encode()
        return jsontext.frame(body)

    @classmethod
    @jsontext.malformed_is_corrupt("manifest")
    def decode(cls, raw: bytes, where: str, catalog: Catalog | None = None) -> ManifestState:
        """Parse and verify a manifest file (format 1 or 2); ``where`` names it in errors.

        ``catalog`` reads the ledger-catalog segments a format-2 head names (cached by name)
        and writes new ones when the state is encoded again.

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
        try:
            d = json.loads(body)
        except ValueError as e:
            raise CorruptDataError(f"manifest {where} is not valid JSON") from e
        fmt = d.get("format")
        if fmt not in READABLE_FORMATS:
            raise IncompatibleFormat(
                f"manifest {where} has format {fmt!r}; this code reads "
                f"{', '.join(map(str, READABLE_FORMATS))}"
            )
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
        ledgers = Ledgers(closed, (LedgerInfo.from_json(x) for x in d["ledgers"]))
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
            trimmed_last=tuple(d.get("trimmedLast", (-1, -1))),
            updated_ms=updated,
            commit_id=d.get("commitId", ""),
            prev_commit_id=d.get("prevCommitId", ""),
            incarnation=d.get("incarnation", ""),
            dedup_used=dedup_used,
            sink_used=sink_used,
            catalog_refs=refs,
            catalog=catalog,
        )


class Abort(Exception):
    """Raised by a commit's change function to give up without writing; ``value`` is returned."""

    def __init__(self, value: Any = None):
        super().__init__("commit aborted")
        self.value = value


class VersionedState(Protocol):
    """What a state committed by :class:`VersionedStore` provides."""

    version: int
    updated_ms: int
    commit_id: str
    prev_commit_id: str

    def encode(self) -> bytes: ...


S = TypeVar("S", bound=VersionedState)


class _FlockWaiter:
    """Takes an exclusive ``flock`` of ``fd`` on a thread, so that a caller can give up after
    a time. A caller that gave up leaves ``fd`` to the thread, which then unlocks (once it got
    the lock) and closes it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._mutex = threading.Lock()
        self._done = threading.Event()
        self._held = False
        self._abandoned = False
        threading.Thread(target=self._run, name="commit-queue", daemon=True).start()

    def _run(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            got = True
        except OSError:
            got = False
        with self._mutex:
            if not self._abandoned:
                self._held = got
                self._done.set()
                return
        if got:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)

    def wait(self, timeout_s: float) -> bool:
        """Whether the lock is held by the caller now; False: given up (or no lock)."""
        self._done.wait(timeout_s)
        with self._mutex:
            if self._done.is_set():
                if not self._held:
                    os.close(self.fd)
                return self._held
            self._abandoned = True
            return False


class VersionedStore(Generic[S]):
    """Reads and commits a versioned JSON state: ``<folder>/<version>.json``, full state each.

    Used for managed-ledger manifests and subscription states. Thread-safe for readers; a
    commit may run concurrently with commits in other threads and processes (the put-if-absent
    decides). ``clock`` returns wall-clock milliseconds. ``keep_versions`` and ``gc_every``
    set garbage collection: every ``gc_every``-th version's writer deletes the versions older
    than the newest ``keep_versions + 1`` that are also older than ``gc_grace_ms`` (tests
    shrink them to explore the protocol; ``gc_grace_ms=0`` turns the grace off).
    ``turn_after`` and ``turn_ms`` set fairness (see :meth:`commit`).

    The protocol is correct under any staleness of any writer or reader and any garbage
    collection (FORMAT.md, "Commit protocol", says why). Its invariants:

    - Versions are deleted only by :meth:`_gc` (or with the whole folder when the topic or
      subscription is deleted), in ascending order, stopping at the first failure, and only
      below the newest ``keep_versions``; so the newest version is never deleted. The grace
      only makes a GC stop earlier.
    - Only *original* versions (written into a slot never used before) are cached, returned,
      or built upon; a writer that finds its version may sit in a freed slot removes it.
    - Turn files (``<folder>/<version>.turn``) are advisory: they only delay puts.

    Costs per call (HEAD = existence check, GET = read of one version):

    - :meth:`latest` with nothing new: 2 HEADs (as cheap as ever; on a cache that GC made
      very stale this may return that cached, older state until the next GC, never a state
      off the live chain). With ``strict=True``: 1 HEAD + 1 GET, and the answer was the
      newest version at the time of the HEAD.
    - :meth:`latest` finding ``k`` newer versions: ``k+1`` HEADs + 2 GETs (the newest, and the
      cached version again to prove nothing was freed meanwhile; not needed, so 1 GET, when
      the cached version was seen newest less than half the grace ago).
    - :meth:`commit`, uncontended: 1 conditional put + 1 GET (the base again), plus a GC
      (1 LIST, a GET or a few to find the versions past the grace, deletes) every
      ``gc_every`` versions; a strict :meth:`latest` first if the cached state was last seen
      newest more than half the grace ago; an abort re-checks with a strict :meth:`latest`.
      While contended (``CONTENDED_MS`` after a lost race or a turn seen): 1 HEAD more (the
      turn file of the base).
    """

    def __init__(
        self,
        store: BlobStore,
        folder: str,
        decode: Callable[[bytes, str], S],
        *,
        what: str,
        clock: Callable[[], int] | None = None,
        not_found: type[FilePulsarError] = TopicNotFound,
        keep_versions: int = KEEP_VERSIONS,
        gc_every: int = GC_EVERY,
        gc_grace_ms: int | None = None,
        turn_after: int = TURN_AFTER_LOSSES,
        turn_ms: int = TURN_MS,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        if keep_versions < 1 or gc_every < 1 or turn_after < 1:
            raise ValueError(
                "keep_versions, gc_every and turn_after must be >= 1, got "
                f"{keep_versions}, {gc_every}, {turn_after}"
            )
        self.store = store
        self.folder = folder
        self.decode = decode
        self.what = what
        self.not_found = not_found
        self.clock = clock or wall_ms
        # Deadlines and waits (backoff, turns): the clock itself when it is a whole Clock.
        self._waits = waits_of(clock)
        self.keep_versions = keep_versions
        self.gc_every = gc_every
        self.gc_grace_ms = GC_GRACE_MS if gc_grace_ms is None else gc_grace_ms
        self.turn_after = turn_after
        self.turn_ms = turn_ms
        # The back-off between lost races (tests that schedule pass a no-op).
        self.sleep: Callable[[float], None] = sleep or self._waits.sleep
        # The newest state seen, its exact bytes and a clock time at or before which it was
        # the newest version, replaced as one tuple (thread-safe).
        self._cache: tuple[S, bytes, int] | None = None
        self._contended_until = 0  # clock ms: check turn files before puts until then
        # (version, updated ms) of versions GC read: later GCs find the grace's prefix in it.
        self._gc_marks: list[tuple[int, int]] = []

    def key(self, version: int) -> str:
        return paths.versioned_file(self.folder, version)

    def turn_key(self, version: int) -> str:
        """The turn file by which a writer asks the others to leave it slot ``version + 1``."""
        return paths.turn_file(self.folder, version)

    # ------------------------------------------------------------------ reading
    def create(self, initial: S) -> bool:
        """Write ``initial`` as version 0 if absent. True if this call created it."""
        initial.version = 0
        initial.updated_ms = self.clock()
        initial.prev_commit_id = ""
        return self.store.put_if_absent(self.key(0), initial.encode())

    def exists(self) -> bool:
        return self._cache is not None or bool(self._list_versions())

    def _list_versions(self) -> list[int]:
        return self._list()[0]

    def _list(self) -> tuple[list[int], list[int]]:
        """The versions and the turn files (by version) in the folder, ascending."""
        versions, turns = [], []
        for key in self.store.list(self.folder):
            v = paths.manifest_version(key)
            if v is not None:
                versions.append(v)
            elif (t := paths.turn_version(key)) is not None:
                turns.append(t)
        return sorted(versions), sorted(turns)

    def _get_raw(self, version: int) -> bytes | None:
        try:
            return self.store.get(self.key(version))
        except BlobNotFound:
            return None

    def _load(self, version: int) -> tuple[S, bytes] | None:
        raw = self._get_raw(version)
        if raw is None:
            return None
        return self.decode(raw, f"{self.store.root}/{self.key(version)}"), raw

    def _unchanged(self, entry: tuple[S, bytes, int]) -> bool:
        """Whether the cached version's file is still there, byte for byte (1 GET).

        If so, no version above it was ever deleted (versions go oldest first, and a cached
        version is original), so nothing seen above it can be off the live chain."""
        return self._get_raw(entry[0].version) == entry[1]

    def _drop(self, entry: tuple[S, bytes, int]) -> None:
        if self._cache is entry:
            self._cache = None

    def latest(self, *, refresh: bool = True, strict: bool = False, hint: int = -1) -> S:
        """The newest committed state (cached; ``refresh`` checks for newer versions).

        An idle refresh costs two existence checks. ``strict`` proves the answer was the
        newest version when this call looked (a GET instead of the second existence check):
        decisions not to write rest on it. ``hint`` is a version known to have existed (the
        walk to the newest starts there instead of at the cached one). The returned object is
        shared: treat it as read-only.

        Raises
        ------
        TopicNotFound
            If there is no version at all (the topic or subscription does not exist).
        """
        entry = self._cache
        if entry is not None and not refresh:
            return entry[0]
        for _ in range(10):
            seen = self.clock()  # what this pass finds newest was the newest after this time
            entry = self._cache
            loaded: tuple[S, bytes] | None
            if entry is None:
                # The highest version listed is original: a slot is freed only below
                # ``keep_versions`` newer versions, and the newest is never deleted.
                versions = self._list_versions()
                if not versions:
                    raise self.not_found(f"{self.what} does not exist")
                loaded = self._load(versions[-1])
            else:
                v = entry[0].version
                if hint <= v and not self.store.exists(self.key(v + 1)):
                    if strict:
                        if self._unchanged(entry):
                            if self._cache is entry:  # proven newest now: note when
                                self._cache = (entry[0], entry[1], seen)
                            return entry[0]
                    elif self.store.exists(self.key(v)):
                        return entry[0]
                    self._drop(entry)  # garbage-collected under us: list again
                    continue
                v = max(v + 1, hint)  # any version seen above the cached one will do
                while self.store.exists(self.key(v + 1)):
                    v += 1
                loaded = self._load(v)
                if (
                    loaded is not None
                    and not self._recent(entry, seen)
                    and not self._unchanged(entry)
                ):
                    loaded = None  # versions were freed meanwhile: v may be off the chain
                if loaded is None:
                    self._drop(entry)
            if loaded is None:
                continue
            self._set_cache((loaded[0], loaded[1], seen))
            return loaded[0]
        raise CommitConflict(f"could not read a stable state of {self.what}")

    def _recent(self, entry: tuple[S, bytes, int], now: int) -> bool:
        """Whether ``entry`` was seen newest less than half the GC grace before ``now``: then
        no slot above it has been freed (FORMAT.md, "GC grace"), and every version found
        above it is original without re-reading it."""
        return bool(self.gc_grace_ms) and now - entry[2] < self.gc_grace_ms // 2

    def _set_cache(self, loaded: tuple[S, bytes, int]) -> None:
        cur = self._cache
        if cur is None or loaded[0].version >= cur[0].version:
            self._cache = loaded

    # ------------------------------------------------------------------ committing
    def commit(
        self,
        change: Callable[[S], T],
        *,
        before_write: Callable[[S], None] | None = None,
        timeout_ms: int = COMMIT_TIMEOUT_MS,
        idempotent: bool = False,
    ) -> tuple[S, T]:
        """Apply ``change`` to a private copy of the newest state and commit it atomically.

        ``change`` mutates the state it is given and returns a value; it may run several times
        (once per attempt) and must depend only on that state and its own inputs. It may raise
        :class:`Abort` to stop without writing (the commit then returns the unchanged, newest
        state and ``Abort.value``), or a domain error (a :class:`FilePulsarError`), which
        propagates. Both count only once a strict refresh has shown that the state they were
        raised on is the newest; otherwise ``change`` runs again on the newer state.
        ``before_write`` runs after a successful change and before the put (used to write
        blobs the new state names).

        ``idempotent`` says that applying ``change`` to a state that already holds its effect
        changes nothing a caller relies on (an acknowledgement, a consumer joining or
        leaving, a lease renewal, a seek): when the outcome of an attempt cannot be told
        (:class:`CommitOutcomeUnknown`, after a pause longer than the GC grace) the change is
        then applied again to the newest state instead of failing.

        Fairness: a writer that lost ``turn_after`` races in a row in this commit writes a turn
        file (put-if-absent) naming the newest version it saw and commits on it at once (if
        that turn is held, it queues for one of the next versions: it waits, at most
        ``turn_ms``, for that version to appear, then commits on it), while writers that saw
        contention in the last ``CONTENDED_MS`` leave the slot after a turn file's version to
        its holder for at most ``turn_ms``. Turns only delay puts: safety does not rest on
        them.

        Raises
        ------
        CommitConflict
            If put-if-absent races were lost in a row for ``timeout_ms`` (wall time on this
            machine's monotonic clock, waits for turns included). After each of the first
            ``turn_after - 1`` lost races the writer waits a random time that grows with the
            losses; after that, turns order the writers.
        CommitOutcomeUnknown
            If this commit's version was written but the store no longer shows whether it is
            on the live chain (garbage collection removed the evidence while this writer was
            paused for longer than the GC grace) and the change is not ``idempotent``: the
            change may or may not be committed.
        """
        with self._local_queue() as queued:
            return self._commit(change, before_write, timeout_ms, idempotent, queued)

    @contextlib.contextmanager
    def _local_queue(self) -> Iterator[bool]:
        """On a local disk, queue this process's commit behind the commits of other processes
        and threads on the same folder (an exclusive ``flock`` of the folder); yield whether
        another writer held it when this one asked.

        Without the queue, N writers of one folder race for every slot: N-1 of them write,
        fsync and link a version in vain, then walk to the newest, which costs each commit
        several times a single writer's work (8 producers on one partition reached 0.4x of
        one). Queued, each put starts from the newest version and wins. The lock is advisory:
        safety rests on put-if-absent as before. A writer waits at most
        ``LOCAL_QUEUE_WAIT_MS`` (a holder stopped by a debugger, a nested commit on the same
        folder), then commits without it; object stores have no such lock (turns order
        writers there)."""
        directory = self.store.local_path(self.folder)
        if directory is None:
            yield False
            return
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:  # folder gone or unreadable: the commit reports what is wrong
            yield False
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass
        except OSError:  # a filesystem without flock: commit unqueued
            os.close(fd)
            yield False
            return
        else:
            try:
                yield False
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            return
        # Held by another writer: wait in the kernel's queue (woken the moment it is
        # released, no polling), on a helper thread so that the wait can be bounded.
        waiter = _FlockWaiter(fd)
        held = waiter.wait(LOCAL_QUEUE_WAIT_MS / 1000)
        try:
            yield True
        finally:
            if held:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            # else: the waiter thread owns the descriptor and closes it

    def _commit(
        self,
        change: Callable[[S], T],
        before_write: Callable[[S], None] | None,
        timeout_ms: int,
        idempotent: bool,
        queued: bool,
    ) -> tuple[S, T]:
        # Behind another writer, our cached version is most likely stale: find the newest
        # (a HEAD or two) rather than lose a put.
        self.latest(refresh=queued or self._cache is None)
        deadline = self._waits.monotonic() + timeout_ms / 1000
        attempt = -1
        losses = 0
        my_turn: int | None = None  # the version after which this commit holds a turn
        waited: set[int] = set()  # others' turns this commit already waited out
        rechecked = False  # whether a stale cache was already checked strictly
        try:
            while attempt < 3 or self._waits.monotonic() < deadline:
                attempt += 1
                entry = self._cache
                if entry is None:
                    self.latest()
                    continue
                if (
                    not rechecked
                    and self.gc_grace_ms
                    and self.clock() - entry[2] > self.gc_grace_ms // 2
                ):
                    # Last seen newest long ago: slots above it may be freed by now. A put is
                    # safe within half the grace of a strict check (FORMAT.md, "Commit protocol").
                    rechecked = True
                    self.latest(refresh=True, strict=True)
                    continue
                base, base_raw, _ = entry
                if my_turn is None and losses >= self.turn_after:
                    # Ask for the slot after the next one (the next one may already be taken)
                    # and keep racing meanwhile: a holder never waits.
                    my_turn = self._take_turn(base.version + 1)
                if (
                    base.version != my_turn
                    and base.version not in waited
                    and self.clock() < self._contended_until
                    and self.store.exists(self.turn_key(base.version))
                ):
                    # Another writer holds the turn after our base: leave it the slot.
                    waited.add(base.version)
                    if self._wait_for(base.version + 1, self.turn_ms, turn=base.version):
                        self.latest(hint=base.version + 1)
                    else:
                        self.latest()
                    continue
                state = self.decode(base_raw, "cache")  # private copy
                try:
                    result = change(state)
                except Abort as a:
                    # Decisions not to write must rest on the newest state, not a stale cache.
                    if self.latest(refresh=True, strict=True).commit_id != base.commit_id:
                        continue
                    return base, a.value
                except FilePulsarError:
                    if self.latest(refresh=True, strict=True).commit_id != base.commit_id:
                        continue  # raised on a stale state: try the newest
                    raise
                state.version = base.version + 1
                state.updated_ms = self.clock()
                state.prev_commit_id = base.commit_id
                if before_write is not None:
                    before_write(state)
                state.commit_id = uuid.uuid4().hex
                raw = state.encode()
                put_at = self.clock()
                try:
                    won = self._settle(
                        entry, state, raw, self.store.put_if_absent(self.key(state.version), raw)
                    )
                except CommitOutcomeUnknown as e:
                    if not idempotent:
                        raise
                    log.warning("%s; applying the change again (it is idempotent)", e)
                    continue
                if won:
                    self._set_cache((state, raw, put_at))
                    if state.version % self.gc_every == 0:
                        self._gc(state.version)
                    return state, result
                losses += 1
                self._contended_until = self.clock() + CONTENDED_MS
                if my_turn is not None and base.version >= my_turn:
                    my_turn = None  # the turn passed (a writer that had not seen it): ask again
                self.latest(hint=base.version + 1)  # walks forward, or lists if our base was freed
                if 1 <= losses < self.turn_after:  # spread the first retries; then turns order them
                    self.sleep(random.uniform(0, min(0.25, 0.002 * 2 ** min(losses, 7))))
            raise CommitConflict(
                f"commit to {self.what} lost {attempt + 1} races in a row in {timeout_ms} ms; "
                "too many writers?"
            )
        finally:
            if my_turn is not None:  # used or not, nobody need wait for it any more
                self._release_turn(my_turn)

    def _take_turn(self, version: int) -> int | None:
        """Write a turn file for the slot after ``version`` (or, if another writer holds that
        one, for the next slot, up to 4 ahead). Returns the version taken, or None."""
        for v in range(version, version + 4):
            try:
                if self.store.put_if_absent(self.turn_key(v), b"turn\n"):
                    return v
            except (OSError, BlobStoreError) as e:  # advisory: commit without a turn
                log.warning("could not take a commit turn on %s: %s", self.what, e)
                return None
        return None

    def _wait_for(self, version: int, limit_ms: int, *, turn: int) -> bool:
        """Wait until ``version`` exists while the turn file of ``turn`` does, at most
        ``limit_ms`` (this writer's clock); return whether ``version`` exists."""
        start = self.clock()
        pause = 0.001
        while not self.store.exists(self.key(version)):
            if self.clock() - start >= limit_ms or not self.store.exists(self.turn_key(turn)):
                return False
            self.sleep(pause)
            pause = min(pause * 2, 0.02)
        return True

    def _release_turn(self, version: int) -> None:
        """Delete this writer's unused turn file (best effort: others wait for it at most
        ``turn_ms``, and GC deletes it)."""
        try:
            self.store.delete(self.turn_key(version))
        except (OSError, BlobStoreError) as e:
            log.warning("could not release a commit turn on %s: %s", self.what, e)

    def _settle(self, base: tuple[S, bytes, int], state: S, raw: bytes, reported_won: bool) -> bool:
        """Whether our version ``state`` (bytes ``raw``, built on ``base``) is committed.

        True: it is original, on the live chain. False: it is not committed (a lost race, or a
        put into a slot garbage collection had freed, whose file is removed here; the cache is
        dropped). See FORMAT.md, "Commit protocol", for why each answer is sound.
        """
        v = base[0].version
        mine: bytes | None = raw
        if not reported_won:
            # An object store may report a lost race for a conditional PUT that in fact
            # succeeded (a retried request whose first reply was lost): look at the slot.
            mine = self._get_raw(v + 1)
            if mine is not None and mine != raw:
                return False  # another writer's version: a plain lost race
        if self._unchanged(base):
            # Our base was original and is still there: no version above it was ever
            # deleted, so our put hit a never-used slot (or, with no file of ours there, the
            # put never happened).
            return mine is not None
        # Our base is gone or replaced. Either garbage collection freed slot v+1 before our
        # put (our file is off the live chain), or it ran far ahead after our put (our
        # version was built upon). Whatever is at v+2 was built on the original at v+1.
        nxt = self._load(v + 2)
        if nxt is not None and nxt[0].prev_commit_id:
            if nxt[0].prev_commit_id == state.commit_id:
                return True
            self._remove_mine(v + 1, raw)
            self._drop(base)
            return False
        if nxt is None and self._get_raw(v + 1) == raw:
            # v+2 was written (v could be freed only after it) and freed since; had our
            # version been built upon, it would have been freed before v+2. It was not.
            self._remove_mine(v + 1, raw)
            self._drop(base)
            return False
        self._drop(base)
        raise CommitOutcomeUnknown(
            f"commit to {self.what} at version {v + 1}: garbage collection removed the "
            "versions that tell whether it is committed; it may or may not be"
        )

    def _remove_mine(self, version: int, raw: bytes) -> None:
        """Delete our off-chain file at ``version`` if it is still ours (best effort: a
        file left behind is ignored by readers and deleted by a later GC)."""
        try:
            if self._get_raw(version) == raw:
                self.store.delete(self.key(version))
        except (OSError, BlobStoreError) as e:
            log.warning("could not remove an uncommitted version of %s: %s", self.what, e)

    def _gc(self, version: int) -> None:
        """Delete versions older than ``version - keep_versions`` and the grace, oldest first.

        ``version`` must be a committed (original) version. Stops at the first failure, so
        versions are always deleted in ascending order: the commit protocol relies on it.
        The grace: a version is deleted only if it, or a version above it that is deleted
        too, was written more than ``gc_grace_ms`` ago by its ``updated`` time (the newest
        candidate is read; if it is younger, a binary search over the candidates finds the
        last one past the grace, a few GETs). Turn files below the versions kept are
        deleted too; turn files seen make this writer check turns for a while.
        """
        try:
            versions, turns = self._list()
            doomed = [v for v in versions if v < version - self.keep_versions]
            if turns and turns[-1] >= version - 2 * self.gc_every:
                self._contended_until = self.clock() + CONTENDED_MS
            if doomed and self.gc_grace_ms:
                doomed = doomed[: self._past_grace(doomed)]
            for v in doomed:
                self.store.delete(self.key(v))
            for t in turns:
                if t >= version - self.keep_versions:
                    break
                self.store.delete(self.turn_key(t))
        except (OSError, BlobStoreError) as e:  # best effort: the next GC retries
            log.warning("GC of old versions of %s stopped: %s", self.what, e)

    def _past_grace(self, candidates: list[int]) -> int:
        """How many of ``candidates`` (ascending) may go: the longest prefix whose last one
        was written more than the grace ago (a version read as missing or younger stops it;
        along the live chain ``updated`` grows, so a binary search finds the prefix).

        The highest candidate is read, then the lowest (1-2 GETs); if the answer lies
        between, a binary search reads a few more, narrowed by the versions this store read
        at earlier GCs (remembered with their times)."""
        limit = self.clock() - self.gc_grace_ms

        def old(i: int) -> bool:
            try:
                loaded = self._load(candidates[i])
            except FilePulsarError:
                return True  # unreadable and below the kept versions: let it go
            if loaded is None:
                return False
            self._gc_marks.append((candidates[i], loaded[0].updated_ms))
            return loaded[0].updated_ms < limit

        marks = self._gc_marks
        if old(len(candidates) - 1):
            n = len(candidates)
        elif not old(0):
            n = 0
        else:  # old(0) and not old(last): narrow the search with what earlier GCs read
            past = [v for v, t in marks if t < limit and v <= candidates[-1]]
            young = [v for v, t in marks if t >= limit and v >= candidates[0]]
            lo = max(1, bisect.bisect_right(candidates, max(past))) if past else 1
            hi = bisect.bisect_left(candidates, min(young)) if young else len(candidates) - 1
            hi = max(lo, min(hi, len(candidates) - 1))
            while lo < hi:  # the answer is in [lo, hi]
                mid = (lo + hi) // 2
                if old(mid):
                    lo = mid + 1
                else:
                    hi = mid
            n = lo
        first_kept = candidates[n] if n < len(candidates) else candidates[-1] + 1
        self._gc_marks = sorted(m for m in self._gc_marks if m[0] >= first_kept)[-64:]
        return n


class ManifestStore(VersionedStore[ManifestState]):
    """The versioned manifest of one managed ledger (topic or partition)."""

    def __init__(
        self, store: BlobStore, topic: TopicName, *, clock: Callable[[], int] | None = None
    ) -> None:
        self.catalog = Catalog(store, topic)
        catalog = self.catalog

        def decode(raw: bytes, where: str) -> ManifestState:
            return ManifestState.decode(raw, where, catalog)

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
        the partitions of a partitioned topic carry the topic's).
        """
        state = initial or ManifestState(
            topic=str(self.topic),
            partition=self.topic.partition_index,
            incarnation=incarnation or uuid.uuid4().hex,
        )
        state.catalog = self.catalog
        return super().create(state)
