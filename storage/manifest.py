"""Managed-ledger state and its atomic, versioned commits.

State lives in ``manifest/<version>.json``; each file holds the full state (not a delta), so a
reader needs only the newest one. A commit writes version ``v+1`` with put-if-absent; losing the
race reloads the newest state and re-applies the change. Versions are created strictly in order
and garbage collection deletes old ones in ascending order, so if version ``v`` exists and
``v+1`` does not, ``v`` is the newest.

File format: the first line is the state as compact JSON, the second ``crc32c=<8 hex digits>``
over the first line's bytes. ``commitId`` is random per attempt: a writer told it lost the race
reads the winning version and recognises its own write (object stores can report a retried
conditional PUT as lost although its first try succeeded).
"""

from __future__ import annotations

import json
import logging
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import crc32c

from filepulsar.storage import paths
from filepulsar.storage.blobstore import BlobNotFound, BlobStore, BlobStoreError
from filepulsar.storage.errors import (
    CommitConflict,
    CorruptDataError,
    FilePulsarError,
    IncompatibleFormat,
    TopicNotFound,
)
from filepulsar.storage.names import TopicName

log = logging.getLogger(__name__)

MANIFEST_FORMAT = 1
KEEP_VERSIONS = 64
GC_EVERY = 32
MAX_COMMIT_ATTEMPTS = 200

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


@dataclass(slots=True)
class ManifestState:
    """The state of one managed ledger (one partition or one non-partitioned topic).

    ``trimmed_before`` is the first ledger id that may still exist: ledgers below it were
    deleted by retention; ``trimmed_last`` is the last entry position they held (a reader
    whose position is before it has lost data). ``dedup`` maps producer name → highest
    persisted sequence id; ``sink_batches`` maps a Spark query id → the last batch id it
    committed here.
    """

    topic: str
    partition: int
    version: int = 0
    next_ledger_id: int = 0
    ledgers: list[LedgerInfo] = field(default_factory=list)
    producers: dict[str, ProducerLease] = field(default_factory=dict)
    topic_epoch: int = 0
    dedup: dict[str, int] = field(default_factory=dict)
    sink_batches: dict[str, int] = field(default_factory=dict)
    trimmed_before: int = 0
    trimmed_messages: int = 0
    trimmed_last: tuple[int, int] = (-1, -1)
    updated_ms: int = 0
    commit_id: str = ""

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

    def ledger(self, ledger_id: int) -> LedgerInfo | None:
        lo, hi = 0, len(self.ledgers)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.ledgers[mid].ledger_id < ledger_id:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(self.ledgers) and self.ledgers[lo].ledger_id == ledger_id:
            return self.ledgers[lo]
        return None

    def encode(self) -> bytes:
        body = json.dumps(
            {
                "format": MANIFEST_FORMAT,
                "topic": self.topic,
                "partition": self.partition,
                "version": self.version,
                "nextLedgerId": self.next_ledger_id,
                "ledgers": [lg.to_json() for lg in self.ledgers],
                "producers": {n: p.to_json() for n, p in self.producers.items()},
                "topicEpoch": self.topic_epoch,
                "dedup": self.dedup,
                "sinkBatches": self.sink_batches,
                "trimmedBefore": self.trimmed_before,
                "trimmedMessages": self.trimmed_messages,
                "trimmedLast": list(self.trimmed_last),
                "updated": self.updated_ms,
                "commitId": self.commit_id,
            },
            separators=(",", ":"),
        ).encode()
        return body + b"\ncrc32c=%08x\n" % crc32c.crc32c(body)

    @classmethod
    def decode(cls, raw: bytes, where: str) -> ManifestState:
        """Parse and verify a manifest file; ``where`` names it in errors.

        Raises
        ------
        CorruptDataError
            If the checksum line is missing or wrong or the JSON does not parse.
        IncompatibleFormat
            If the file was written by a newer format.
        """
        body, sep, tail = raw.rstrip(b"\n").rpartition(b"\ncrc32c=")
        if not sep:
            raise CorruptDataError(f"manifest {where} has no checksum line")
        try:
            want = int(tail, 16)
        except ValueError as e:
            raise CorruptDataError(f"manifest {where} has a malformed checksum line") from e
        if crc32c.crc32c(body) != want:
            raise CorruptDataError(f"manifest {where} fails its checksum")
        try:
            d = json.loads(body)
        except ValueError as e:
            raise CorruptDataError(f"manifest {where} is not valid JSON") from e
        if d.get("format") != MANIFEST_FORMAT:
            raise IncompatibleFormat(
                f"manifest {where} has format {d.get('format')!r}; this code reads "
                f"{MANIFEST_FORMAT}"
            )
        return cls(
            topic=d["topic"],
            partition=d["partition"],
            version=d["version"],
            next_ledger_id=d["nextLedgerId"],
            ledgers=[LedgerInfo.from_json(x) for x in d["ledgers"]],
            producers={n: ProducerLease.from_json(n, v) for n, v in d["producers"].items()},
            topic_epoch=d["topicEpoch"],
            dedup=d["dedup"],
            sink_batches=d["sinkBatches"],
            trimmed_before=d["trimmedBefore"],
            trimmed_messages=d["trimmedMessages"],
            trimmed_last=tuple(d.get("trimmedLast", (-1, -1))),
            updated_ms=d["updated"],
            commit_id=d.get("commitId", ""),
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

    def encode(self) -> bytes: ...


S = TypeVar("S", bound=VersionedState)


class VersionedStore(Generic[S]):
    """Reads and commits a versioned JSON state: ``<folder>/<version>.json``, full state each.

    Used for managed-ledger manifests and subscription states. Thread-safe for readers; a
    commit may run concurrently with commits in other threads and processes (the put-if-absent
    decides). ``clock`` returns wall-clock milliseconds.
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
    ) -> None:
        self.store = store
        self.folder = folder
        self.decode = decode
        self.what = what
        self.not_found = not_found
        self.clock = clock or (lambda: int(time.time() * 1000))
        self._cached: S | None = None
        self._cached_raw: bytes = b""

    def key(self, version: int) -> str:
        return f"{self.folder}/{version:020d}{paths.MANIFEST_SUFFIX}"

    # ------------------------------------------------------------------ reading
    def create(self, initial: S) -> bool:
        """Write ``initial`` as version 0 if absent. True if this call created it."""
        initial.version = 0
        initial.updated_ms = self.clock()
        return self.store.put_if_absent(self.key(0), initial.encode())

    def exists(self) -> bool:
        return self._cached is not None or bool(self._list_versions())

    def _list_versions(self) -> list[int]:
        out = []
        for key in self.store.list(self.folder):
            v = paths.manifest_version(key)
            if v is not None:
                out.append(v)
        return sorted(out)

    def _load(self, version: int) -> tuple[S, bytes] | None:
        key = self.key(version)
        try:
            raw = self.store.get(key)
        except BlobNotFound:
            return None
        return self.decode(raw, f"{self.store.root}/{key}"), raw

    def latest(self, *, refresh: bool = True) -> S:
        """The newest committed state (cached; ``refresh`` checks for newer versions).

        An idle refresh costs two existence checks. The returned object is shared: treat it as
        read-only.

        Raises
        ------
        TopicNotFound
            If there is no version at all (the topic or subscription does not exist).
        """
        cached = self._cached
        if cached is not None and not refresh:
            return cached
        for _ in range(10):
            cached = self._cached
            if cached is None:
                versions = self._list_versions()
                if not versions:
                    raise self.not_found(f"{self.what} does not exist")
                v = versions[-1]
            else:
                v = cached.version
                if not self.store.exists(self.key(v + 1)):
                    if self.store.exists(self.key(v)):
                        return cached
                    self._cached = None  # garbage-collected under us: list again
                    continue
                v += 1
                while self.store.exists(self.key(v + 1)):
                    v += 1
            loaded = self._load(v)
            if loaded is None:
                self._cached = None
                continue
            self._set_cache(*loaded)
            return loaded[0]
        raise CommitConflict(f"could not read a stable state of {self.what}")

    def _set_cache(self, state: S, raw: bytes) -> None:
        cur = self._cached
        if cur is None or state.version >= cur.version:
            self._cached, self._cached_raw = state, raw

    # ------------------------------------------------------------------ committing
    def commit(
        self,
        change: Callable[[S], T],
        *,
        before_write: Callable[[S], None] | None = None,
        max_attempts: int = MAX_COMMIT_ATTEMPTS,
    ) -> tuple[S, T]:
        """Apply ``change`` to a private copy of the newest state and commit it atomically.

        ``change`` mutates the state it is given and returns a value; it may run several times
        (once per attempt) and must depend only on that state and its own inputs. It may raise
        :class:`Abort` to stop without writing (the commit then returns the unchanged, newest
        state and ``Abort.value``), or any domain error, which propagates; a domain error may
        come from a stale cached state, so callers that raise one on a possibly stale view
        should treat it as final only after a refresh (producers do, at registration).
        ``before_write`` runs after a successful change and before the put (used to write
        blobs the new state names).

        Raises
        ------
        CommitConflict
            If ``max_attempts`` put-if-absent races were lost in a row.
        """
        self.latest(refresh=self._cached is None)
        for attempt in range(max_attempts):
            base = self._cached
            assert base is not None
            state = self.decode(self._cached_raw, "cache")  # private copy
            try:
                result = change(state)
            except Abort as a:
                # Decisions not to write must rest on the newest state, not a stale cache.
                fresh = self.latest(refresh=True)
                if fresh.version != base.version:
                    continue
                return base, a.value
            state.version = base.version + 1
            state.updated_ms = self.clock()
            if before_write is not None:
                before_write(state)
            state.commit_id = uuid.uuid4().hex
            raw = state.encode()
            key = self.key(state.version)
            won = self.store.put_if_absent(key, raw)
            if not won:
                # An object store may report a lost race for a conditional PUT that in fact
                # succeeded (a retried request whose first reply was lost): look at the winner.
                loaded = self._load(state.version)
                won = loaded is not None and loaded[0].commit_id == state.commit_id
            if won:
                self._set_cache(state, raw)
                if state.version % GC_EVERY == 0:
                    self._gc(state.version)
                return state, result
            self._advance()
            if attempt > 3:
                time.sleep(random.uniform(0, min(0.05, 0.002 * attempt)))
        raise CommitConflict(
            f"commit to {self.what} lost {max_attempts} races in a row; too many writers?"
        )

    def _advance(self) -> None:
        """After a lost race: move the cache to the newest version."""
        cached = self._cached
        assert cached is not None
        v = cached.version + 1
        while self.store.exists(self.key(v + 1)):
            v += 1
        loaded = self._load(v)
        if loaded is None:
            self._cached = None
            self.latest()
        else:
            self._set_cache(*loaded)

    def _gc(self, version: int) -> None:
        """Delete versions older than ``version - KEEP_VERSIONS``, oldest first."""
        try:
            for v in self._list_versions():
                if v >= version - KEEP_VERSIONS:
                    break
                self.store.delete(self.key(v))
        except (OSError, BlobStoreError) as e:  # best effort: the next GC retries
            log.warning("GC of old versions of %s stopped: %s", self.what, e)


class ManifestStore(VersionedStore[ManifestState]):
    """The versioned manifest of one managed ledger (topic or partition)."""

    def __init__(
        self, store: BlobStore, topic: TopicName, *, clock: Callable[[], int] | None = None
    ) -> None:
        super().__init__(
            store,
            paths.manifest_dir(topic),
            ManifestState.decode,
            what=f"topic {topic}",
            clock=clock,
        )
        self.topic = topic

    def create(self, initial: ManifestState | None = None) -> bool:
        """Write version 0 (an empty ledger list) if absent. True if this call created it."""
        state = initial or ManifestState(
            topic=str(self.topic), partition=self.topic.partition_index
        )
        return super().create(state)
