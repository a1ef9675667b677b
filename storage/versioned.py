"""The commit protocol's engine: :class:`VersionedStore` (FORMAT.md, "Commit protocol")."""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Generic

from filepulsar.dispatch.clock import waits_of, wall_ms
from filepulsar.storage import paths
from filepulsar.storage.blobstore import BlobNotFound, BlobStoreError
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.errors import (
    CommitConflict,
    CommitOutcomeUnknown,
    FilePulsarError,
    TopicNotFound,
)
from filepulsar.storage.journal import Cancelled, Journal, Record
from filepulsar.storage.versioned_protocol import (
    COMMIT_TIMEOUT_MS,
    CONTENDED_MS,
    GC_EVERY,
    GC_GRACE_MS,
    KEEP_VERSIONS,
    LOCAL_QUEUE_WAIT_MS,
    TURN_AFTER_LOSSES,
    TURN_MS,
    Abort,
    S,
    T,
    _FlockWaiter,
)
from filepulsar.storage.watch import folder_stamp, recheck_interval_s

log = logging.getLogger(__name__)


class _SharedDecodes:
    """The newest record decoded in each journal folder, shared by every store of the process
    that reads the folder (the consumers of one subscription in a process each read every new
    state of it: decoded once, not once per consumer). A hit needs the same version and the
    same bytes; decoded states are read-only (see :meth:`VersionedStore.latest`)."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._newest: dict[tuple[str, str], tuple[int, bytes, object]] = {}
        self._lock = threading.Lock()

    def decode(self, key: tuple[str, str], version: int, raw: bytes, decode: Callable[[], S]) -> S:
        hit = self._newest.get(key)
        if hit is not None and hit[0] == version and hit[1] == raw:
            return hit[2]  # type: ignore[return-value]
        state = decode()
        with self._lock:
            if len(self._newest) >= self.limit:
                self._newest.clear()
            cur = self._newest.get(key)
            if cur is None or cur[0] <= version:
                self._newest[key] = (version, raw, state)
        return state


#: The process's shared decodes (stores whose class sets ``share_decodes``).
SHARED_DECODES = _SharedDecodes()


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

    #: Whether the states this store decodes from its journal are shared with the other
    #: stores of the process that read the same folder (:data:`SHARED_DECODES`).
    share_decodes = False

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
        # On a local disk: the folder's journal (FORMAT.md, "Journal"), and the reading
        # position after the cached state's record (replaced together with the cache, under
        # the lock).
        directory = store.journal_dir(folder)
        self._journal = (
            Journal(directory, store.local_path, what) if directory is not None else None
        )
        self._jpos: tuple[int, int, int, int] | None = None
        self._jlock = threading.RLock()
        # The folder's inotify stamp taken before the last read of the journal, and when
        # (monotonic s): while it is unchanged and younger than the watch's re-check
        # interval, a look needs no read (storage/watch.py's folder_stamp).
        self._jstamp: tuple[tuple[int, int] | None, float] = (None, 0.0)

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
        if self._journal is None:
            return self.store.put_if_absent(self.key(0), initial.encode())
        if self._list_versions():
            return False  # created in the format before journals
        self.store.journal_dir(self.folder, create=True)
        return self._journal.create(initial.encode())

    def exists(self) -> bool:
        if self._cache is not None:
            return True
        return bool(self._list_versions()) or (
            self._journal is not None and bool(self._journal.segments())
        )

    def stored(self) -> Iterator[tuple[str, bytes]]:
        """Every stored version's bytes with where they are, oldest first as far as the
        store lists them (maintenance: which blobs any stored version names)."""
        for v in self._list_versions():  # files (the format before journals) are older
            raw = self._get_raw(v)
            if raw is not None:
                yield self.store.url(self.key(v)), raw
        if self._journal is not None:
            with self._journal_errors("read"):
                for rec in self._journal.records():
                    yield f"{self._journal.path(rec.segment)}@{rec.offset}", rec.payload

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
        if self._journal is not None and (self._jpos is not None or self._journal.segments()):
            return self._journal_latest()
        for _ in range(10):
            seen = self.clock()  # what this pass finds newest was the newest after this time
            entry = self._cache
            loaded: tuple[S, bytes] | None
            if entry is None:
                # The highest version listed is original: a slot is freed only below
                # ``keep_versions`` newer versions, and the newest is never deleted.
                versions = self._list_versions()
                if not versions:
                    if self._journal is not None and self._journal.segments():
                        return self._journal_latest()  # migrated to a journal meanwhile
                    raise self.not_found(f"{self.what} does not exist")
                loaded = self._load(versions[-1])
            else:
                v = entry[0].version
                if self._journal is not None and os.path.exists(self._journal.path(v + 1)):
                    return self._journal_latest()  # the folder went on as a journal
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

    @contextlib.contextmanager
    def _journal_errors(self, operation: str) -> Iterator[None]:
        """OS errors of the journal as the store's errors: the folder gone is ``not_found``
        (the topic or subscription was deleted), anything else a :class:`BlobStoreError`
        naming the folder."""
        try:
            yield
        except FileNotFoundError as e:
            raise self.not_found(f"{self.what} does not exist") from e
        except OSError as e:
            raise BlobStoreError(
                f"{operation} failed for {self.store.url(self.folder)}: {e}"
            ) from e

    def change_stamp(self) -> tuple[int, int] | None:
        """A value that changes whenever a commit may have landed in this store's folder, or
        None when this process cannot tell (no journal, or the folder not watched): see
        :func:`storage.watch.folder_stamp`. Take it before a look; an equal stamp at the next
        look says nothing landed meanwhile, as far as this host can see (bound the trust
        by :func:`storage.watch.recheck_interval_s` for other hosts' writes)."""
        if self._journal is None:
            return None
        return folder_stamp(self._journal.dir)

    def _journal_latest(self) -> S:
        """The newest state of a journal folder (the reading position moves with the cache)."""
        assert self._journal is not None
        with self._jlock, self._journal_errors("read"):
            stamp = folder_stamp(self._journal.dir)
            now = time.monotonic()
            if (
                stamp is not None
                and self._jstamp[0] == stamp
                and now - self._jstamp[1] < recheck_interval_s()
                and self._cache is not None
                and self._jpos is not None
            ):
                return self._cache[0]  # nothing landed since the last read (inotify)
            seen = self.clock()
            rec, pos = self._journal.read_from(self._jpos)
            self._jstamp = (stamp, now)
            if pos is None:
                self._cache = None
                self._jpos = None
                raise self.not_found(f"{self.what} does not exist")
            if rec is not None:
                self._cache = (self._decode_record(rec), rec.payload, seen)
            elif self._cache is None or self._jpos is None:
                raise CommitConflict(f"could not read a stable state of {self.what}")
            self._jpos = pos
            return self._cache[0]

    def _decode_record(self, rec: Record) -> S:
        """A journal record's state: decoded here, or (``share_decodes``) taken from the
        process's :data:`SHARED_DECODES` when another store of the folder decoded it."""
        assert self._journal is not None
        journal = self._journal

        def decode() -> S:
            return self.decode(rec.payload, f"{journal.path(rec.segment)}@{rec.offset}")

        if not self.share_decodes:
            return decode()
        key = (self.store.root, self.folder)
        return SHARED_DECODES.decode(key, rec.version, rec.payload, decode)

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
        before_link: Callable[[], None] | None = None,
        timeout_ms: int = COMMIT_TIMEOUT_MS,
        idempotent: bool = False,
        durable_with: Sequence[tuple[str, int]] = (),
    ) -> tuple[S, T]:
        """Apply ``change`` to a private copy of the newest state and commit it atomically.

        ``change`` mutates the state it is given and returns a value; it may run several times
        (once per attempt) and must depend only on that state and its own inputs. It may raise
        :class:`Abort` to stop without writing (the commit then returns the unchanged, newest
        state and ``Abort.value``), or a domain error (a :class:`FilePulsarError`), which
        propagates. Both count only once a strict refresh has shown that the state they were
        raised on is the newest; otherwise ``change`` runs again on the newer state.
        ``before_write`` runs after a successful change and before the put (used to write
        blobs the new state names). ``before_link`` runs on each put after the new version's
        bytes are written and durable but before they become visible under the version's
        name (the producer waits there for the fsync of the data the version names, so
        that fsync overlaps with writing the version; on a store whose ``put_if_absent``
        has no such hook it runs just before the put); if it raises, nothing is committed.

        ``durable_with`` names files (store keys, with the length each must have) that the
        new state depends on: on a local disk's journal, a record its writer left unmarked is
        settled as committed only if they are all there (FORMAT.md, "Journal").

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
        if self._journal is not None:
            return self._journal_commit(change, before_write, before_link, timeout_ms, durable_with)
        with self._local_queue() as queued:
            return self._commit(change, before_write, before_link, timeout_ms, idempotent, queued)

    def _journal_commit(
        self,
        change: Callable[[S], T],
        before_write: Callable[[S], None] | None,
        before_link: Callable[[], None] | None,
        timeout_ms: int,
        durable_with: Sequence[tuple[str, int]],
    ) -> tuple[S, T]:
        """:meth:`commit` on a local disk: one record appended to the folder's journal under
        its lock, then flushed and marked after the lock is let go (FORMAT.md, "Journal").
        The base read under the lock is the newest record: committed, or in flight (its
        writer is flushing it). A change built on a record in flight that is then cancelled
        runs again; so does one that aborts or raises on such a base, unless the records in
        flight are all committed once waited for."""
        journal = self._journal
        assert journal is not None
        deadline = time.monotonic() + timeout_ms / 1000
        # This store's lock first, for the whole commit: threads sharing it share the
        # journal's descriptors (a folder lock taken twice through one descriptor would not
        # exclude, nor would a record's byte lock).
        with self._jlock, self._journal_errors("commit"):
            left_ms = max(timeout_ms, 1)
            while True:
                try:
                    return self._journal_attempt(
                        journal, change, before_write, before_link, durable_with, left_ms, deadline
                    )
                except Cancelled:
                    left_ms = int((deadline - time.monotonic()) * 1000)
                    if left_ms <= 0:
                        raise CommitConflict(
                            f"commit to {self.what}: records it built on were cancelled until "
                            f"its timeout ({timeout_ms} ms)"
                        ) from None

    def _journal_attempt(
        self,
        journal: Journal,
        change: Callable[[S], T],
        before_write: Callable[[S], None] | None,
        before_link: Callable[[], None] | None,
        durable_with: Sequence[tuple[str, int]],
        lock_ms: int,
        deadline: float,
    ) -> tuple[S, T]:
        """One attempt of :meth:`_journal_commit` (raises :class:`Cancelled` to try again)."""
        seen = self.clock()
        ticket = None
        try:
            with journal.locked(lock_ms):
                found = journal.tail_for_write(self._jpos, deadline)
                if found is None:
                    return self._journal_start(change, before_write, before_link, durable_with)
                rec, here, tail = found
                if rec is not None:
                    base, base_raw = self._decode_record(rec), rec.payload
                    if rec.marked:  # (cache and position move to committed states only)
                        self._cache = (base, base_raw, seen)
                        self._jpos = here
                elif self._cache is not None and self._jpos is not None:
                    base, base_raw = self._cache[0], self._cache[1]  # nothing new since
                    self._jpos = here
                else:
                    raise CommitConflict(f"could not read a stable state of {self.what}")
                state = self._private_copy(base, base_raw)
                try:
                    result = change(state)
                    raw = self._next_version(state, base, before_write)
                except Exception as e:
                    # Decided on a base in flight: it counts once that base is committed.
                    if tail.inflight and not journal.settled(here[0], tail, deadline):
                        raise Cancelled("a record it built on was cancelled") from e
                    if isinstance(e, Abort):
                        return base, e.value
                    raise
                ticket = journal.begin(
                    here[0], tail, state.version, raw, durable_with, before_link, deadline
                )
                if not ticket.locked:  # not pipelined: completed under the lock
                    pos = journal.finish(ticket, before_link, deadline)
            if ticket.locked:
                pos = journal.finish(ticket, before_link, deadline)
        except BaseException:
            if ticket is not None:
                journal.cancel(ticket)  # interrupted between begin and finish
            raise
        self._cache = (state, raw, seen)
        self._jpos = pos
        return state, result

    def _journal_start(
        self,
        change: Callable[[S], T],
        before_write: Callable[[S], None] | None,
        before_link: Callable[[], None] | None,
        durable_with: Sequence[tuple[str, int]],
    ) -> tuple[S, T]:
        """Under the journal's lock, in a folder with no segment: the folder holds versions
        as files (the format before journals), or nothing. Its newest version is the base;
        the journal starts after it (a new segment)."""
        journal = self._journal
        assert journal is not None
        seen = self.clock()
        versions = self._list_versions()
        if not versions:
            raise self.not_found(f"{self.what} does not exist")
        loaded = self._load(versions[-1])
        if loaded is None:
            raise CommitConflict(f"{self.what} changed under its lock")
        base, base_raw = loaded
        state = self._private_copy(base, base_raw)
        try:
            result = change(state)
        except Abort as a:
            return base, a.value
        raw = self._next_version(state, base, before_write)
        pos = journal.start_segment(state.version, raw, durable_with, before_link)
        self._cache = (state, raw, seen)
        self._jpos = pos
        return state, result

    def _private_copy(self, base: S, base_raw: bytes) -> S:
        """A copy of ``base`` for a change to mutate: the state's own copy() where it has one
        (equal to decoding the base's bytes, without the decoding), else decoded."""
        copy = getattr(base, "copy", None)
        return copy() if copy is not None else self.decode(base_raw, "cache")

    def _next_version(self, state: S, base: S, before_write: Callable[[S], None] | None) -> bytes:
        """Stamp ``state`` (changed from ``base``) as the version after it, run
        ``before_write``, and encode it."""
        state.version = base.version + 1
        state.updated_ms = self.clock()
        state.prev_commit_id = base.commit_id
        if before_write is not None:
            before_write(state)
        state.commit_id = uuid.uuid4().hex
        return state.encode()

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
        before_link: Callable[[], None] | None,
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
                state = self._private_copy(base, base_raw)
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
                raw = self._next_version(state, base, before_write)
                put_at = self.clock()
                try:
                    won = self._settle(
                        entry, state, raw, self._put(state.version, raw, before_link)
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

    def _put(self, version: int, raw: bytes, before_link: Callable[[], None] | None) -> bool:
        put = self.store.put_if_absent
        if before_link is None:
            return put(self.key(version), raw)
        if getattr(put, "accepts_before_link", False):
            return put(self.key(version), raw, before_link=before_link)  # type: ignore[call-arg]
        before_link()
        return put(self.key(version), raw)

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
