"""The journal engine: a versioned state on a local disk as records of the folder's journal
(FORMAT.md, "Journal"; the segments, locks and settling are
:mod:`~filepulsar.storage.versioned.journal`'s, the bytes :mod:`~.record`'s).

A commit appends one record under the folder's lock and flushes and marks it after letting
the lock go; a read takes the newest marked record after its last reading position. A folder
that still holds version files (the format before journals) is read through the
:class:`~filepulsar.storage.versioned.blob.BlobEngine` until a commit starts its journal
after the newest of them.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Generic

from filepulsar.storage.blobstore import BlobStoreError
from filepulsar.storage.errors import CommitConflict, CorruptDataError
from filepulsar.storage.forks import in_forked_child
from filepulsar.storage.versioned.blob import BlobEngine, MovedOn
from filepulsar.storage.versioned.envelope import DELTA_PREFIX, is_delta
from filepulsar.storage.versioned.journal import Cancelled, Journal
from filepulsar.storage.versioned.protocol import Abort, CommitRequest, NoBase, S, T
from filepulsar.storage.versioned.record import Record, Tail
from filepulsar.storage.versioned.watch import folder_stamp, recheck_interval_s

if TYPE_CHECKING:
    from filepulsar.storage.versioned.store import VersionedStore


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
        self.put(key, version, raw, state)
        return state

    def put(self, key: tuple[str, str], version: int, raw: bytes, state: object) -> None:
        """Keep ``state`` as the decoding of record ``raw`` of ``version`` in folder ``key``
        (a commit's own state: the process's other readers of the folder do not decode the
        record it wrote again), unless a newer one is kept."""
        with self._lock:
            if len(self._newest) >= self.limit:
                self._newest.clear()
            cur = self._newest.get(key)
            if cur is None or cur[0] <= version:
                self._newest[key] = (version, raw, state)


#: The process's shared decodes (stores whose class sets ``share_decodes``).
SHARED_DECODES = _SharedDecodes()


@in_forked_child
def _fresh_decodes_lock() -> None:
    """A child forked while a thread of its parent held the lock would wait for it for ever:
    a fresh lock (what it holds stays true in the child)."""
    SHARED_DECODES._lock = threading.Lock()


def _deltas(found: tuple[Record | None, object, Tail]) -> bool:
    """Whether a writer's base read (:meth:`Journal.tail_for_write`) holds a delta record."""
    rec, _, tail = found
    return (rec is not None and is_delta(rec.payload)) or any(
        is_delta(r.payload) for r in tail.inflight
    )


def _went_on(journal: Journal, version: int | None) -> bool:
    """Whether the folder went on as a journal: at all (``None``), or after ``version``."""
    if version is None:
        return bool(journal.segments())
    return os.path.exists(journal.path(version + 1))


class JournalEngine(Generic[S]):
    """The versions of ``vs``'s folder as records of ``journal``, and before its first
    segment as the files ``files`` reads (:class:`~filepulsar.storage.versioned.protocol.Engine`).

    Thread-safe through one lock for the whole of a read or commit: threads sharing it share
    the journal's descriptors (a folder lock taken twice through one descriptor would not
    exclude, nor would a record's byte lock)."""

    def __init__(self, vs: VersionedStore[S], journal: Journal, files: BlobEngine[S]) -> None:
        # (A proxy, and no reference from ``files`` back to this engine: a cycle would keep
        # the journal's files open until the garbage collector ran, not until the store is
        # let go.)
        self.vs = weakref.proxy(vs)
        self.journal = journal
        self.files = files
        files.went_on = functools.partial(_went_on, journal)
        self.what = vs.what
        self.clock = vs.clock
        # The reading position after the cached state's record (replaced together with the
        # store's cache, under the lock).
        self.pos: tuple[int, int, int, int] | None = None
        self.lock = threading.RLock()
        # The folder's inotify stamp taken before the last read of the journal, and when
        # (monotonic s): while it is unchanged and younger than the watch's re-check
        # interval, a look needs no read (storage/versioned/watch.py's folder_stamp).
        self._stamp: tuple[tuple[int, int] | None, float] = (None, 0.0)

    # ------------------------------------------------------------------ the Engine
    def create(self, initial: S) -> bool:
        if self.files.list_versions():
            return False  # created in the format before journals
        self.vs.store.journal_dir(self.vs.folder, create=True)
        return self.journal.create(initial.encode())

    def exists(self) -> bool:
        # (The journal first: one listing of its folder answers for every store written
        # since journals exist; the version files' walk only for one that has none.)
        return bool(self.journal.segments()) or bool(self.files.list_versions())

    def stored(self) -> Iterator[tuple[str, bytes]]:
        yield from self.files.stored()  # (files, the format before journals, are older)
        with self._errors("read"):
            for rec in self.journal.records():
                yield f"{self.journal.path(rec.segment)}@{rec.offset}", rec.payload

    def latest(self, *, strict: bool, hint: int, drain: bool = True) -> S:
        """The newest record (a journal read is always strict), or before the journal's first
        segment the newest version file. ``drain``: as :func:`folder_stamp`'s, for the stamp
        that says whether anything landed since the last read (False: for a caller that
        reads the process's queued events itself before it looks, as the push dispatcher
        does at the start of each round)."""
        if self.pos is not None or self.journal.segments():
            return self._read(drain)
        try:
            return self.files.latest(strict=strict, hint=hint)
        except MovedOn:
            return self._read()

    @contextlib.contextmanager
    def _errors(self, operation: str) -> Iterator[None]:
        """OS errors of the journal as the store's errors: the folder gone is ``not_found``
        (the topic or subscription was deleted), anything else a :class:`BlobStoreError`
        naming the folder."""
        try:
            yield
        except OSError as e:
            raise self._os_error(operation, e) from e

    def _os_error(self, operation: str, e: OSError) -> Exception:
        """The store's error for an OS error of the journal (see :meth:`_errors`)."""
        if isinstance(e, FileNotFoundError):
            return self.vs.not_found(f"{self.what} does not exist")
        return BlobStoreError(f"{operation} failed for {self.vs.store.url(self.vs.folder)}: {e}")

    def _read(self, drain: bool = True) -> S:
        """The newest state of a journal folder (the reading position moves with the cache;
        ``drain``: see :meth:`latest`)."""
        # (The OS errors turned as _errors turns them, without a generator context per look:
        # a consumer looks several times per record.)
        with self.lock:
            try:
                return self._look(drain)
            except OSError as e:
                raise self._os_error("read", e) from e

    def _look(self, drain: bool = True) -> S:
        """:meth:`_read` under the engine's lock (``drain``: see :meth:`latest`)."""
        stamp = folder_stamp(self.journal.dir, drain=drain)
        now = time.monotonic()
        cached, at = self.vs.cache, self.pos
        if cached is not None and at is not None:
            if (
                stamp is not None
                and self._stamp[0] == stamp
                and now - self._stamp[1] < recheck_interval_s()
            ):
                return cached[0]  # nothing landed since the last read (inotify)
            # The usual path, in one step: the marked records after the position in one
            # read and one scan, folded onto the cached state in one pass (its ``fold_run``:
            # delta records of the usual kind only). Anything else (None) reads and folds
            # as below, which is the spec of this step (tests drive both).
            seen = self.clock()
            got = self.journal.read_new(at)
            if got is not None:
                new, pos = got
                if not new:
                    self._stamp = (stamp, now)
                    self.pos = pos
                    return cached[0]
                run: Callable[[list[bytes]], S | None] | None = getattr(cached[0], "fold_run", None)
                if run is not None and not self.vs.share_decodes:
                    state = run([r.payload for r in new])
                    if state is not None:
                        self.vs.cache = (state, new[-1].payload, seen)
                        self._stamp = (stamp, now)
                        self.pos = pos
                        return state
            return self._look_on(stamp, now, seen, got, True)
        return self._look_on(stamp, now, self.clock(), None, False)

    def _look_on(
        self,
        stamp: tuple[int, int] | None,
        now: float,
        seen: int,
        got: tuple[list[Record], tuple[int, int, int, int]] | None,
        tried: bool,
    ) -> S:
        """:meth:`_look` past its usual path: ``stamp`` (taken at ``now``) and ``seen`` (the
        clock) taken before the read; ``got``: what :meth:`Journal.read_new` found, where
        it was ``tried`` already."""
        recs = self._collect()
        pos: tuple[int, int, int, int] | None
        if not tried and self.pos is not None and self.vs.cache is not None:
            got = self.journal.read_new(self.pos)  # (the usual path: one read, one scan)
        if got is not None:
            new, pos = got
            rec = new[-1] if new else None
            if recs is not None or (rec is not None and is_delta(rec.payload)):
                recs = new
        else:
            rec, pos = self.journal.read_from(self.pos, into=recs)
            if rec is not None and recs is None and is_delta(rec.payload):
                recs = []  # (a store that writes none reading deltas: read them all)
                rec, pos = self.journal.read_from(self.pos, into=recs)
        if pos is None:
            self.vs.cache = None
            self.pos = None
            raise self.vs.not_found(f"{self.what} does not exist")
        if rec is not None and recs is not None:
            state = self._state_of(recs, self._cached())
            if state is None:  # (the cached state is not the deltas' base: start over)
                recs.clear()
                rec, pos = self.journal.read_from(None, into=recs)
                if rec is None or pos is None:
                    raise CommitConflict(f"could not read a stable state of {self.what}")
                state = self._state_of(recs, None)
                if state is None:
                    raise CorruptDataError(
                        f"journal of {self.what}: no full record before the delta record "
                        f"at {self._where(rec)}"
                    )
            self.vs.cache = (state, rec.payload, seen)
        elif rec is not None:
            self.vs.cache = (self._decode_record(rec), rec.payload, seen)
        elif self.vs.cache is None or self.pos is None:
            raise CommitConflict(f"could not read a stable state of {self.what}")
        # The stamp (taken before the read) only once the look succeeded: a look that failed
        # (a record it cannot fold, no stable state) must not make the next one trust the
        # cache as current.
        self._stamp = (stamp, now)
        self.pos = pos
        return self.vs.cache[0]

    def _collect(self) -> list[Record] | None:
        """Where a read collects every record after the position (to fold delta records): for
        a store that writes them, a first read, or a state that folds them; else None (the
        newest record alone is decoded)."""
        cached = self.vs.cache
        if self.vs.delta_every or cached is None or self.pos is None:
            return []
        return [] if hasattr(cached[0], "fold") else None

    def _where(self, rec: Record) -> str:
        return f"{self.journal.path(rec.segment)}@{rec.offset}"

    def _cached(self) -> S | None:
        """The cached state, where the reading position is after its record."""
        cached = self.vs.cache
        return cached[0] if cached is not None and self.pos is not None else None

    def _state_of(self, recs: Sequence[Record], base: S | None) -> S | None:
        """The state of the newest of ``recs`` (records in a row, oldest first): decoded from
        the newest full record among them and the delta records after it folded on (FORMAT.md,
        "Delta records"), or, with no full record among them, the deltas folded onto ``base``
        (the state of the version before the first). None if ``recs`` is empty, or holds no
        full record and ``base`` is not the first delta's base.

        Raises
        ------
        CorruptDataError
            If a delta record does not follow the record before it, or is malformed: naming
            its segment and offset.
        """
        i = len(recs) - 1
        while i >= 0 and recs[i].payload.startswith(DELTA_PREFIX):  # (is_delta, inlined)
            i -= 1
        shared = self.vs.share_decodes
        if i < 0 and base is not None and recs and not shared:
            # Deltas only, onto the cached state: folded in one pass where the state can
            # (its ``fold_run``: None where any record is not the usual one).
            run: Callable[[list[bytes]], S | None] | None = getattr(base, "fold_run", None)
            if run is not None:
                state = run([r.payload for r in recs])
                if state is not None:
                    return state
        # Whether ``state`` is this call's alone (then folded in place, not copied again).
        owned = not shared
        if i >= 0:
            state = self._decode_record(recs[i])
        elif base is None or not recs:
            return None
        else:
            state, owned = base, False
        fold, path = self.vs.fold, self.journal.path
        for k in range(i + 1, len(recs)):
            rec = recs[k]
            where = f"{path(rec.segment)}@{rec.offset}"
            try:
                if shared:
                    state = self._fold_shared(state, rec, where)
                else:
                    state = fold(state, rec.payload, where, in_place=owned)
                    owned = True
            except NoBase as e:
                if i < 0 and k == 0:
                    return None  # ``base`` is not its base
                raise CorruptDataError(
                    f"journal record of version {rec.version} in {path(rec.segment)} "
                    f"at offset {rec.offset} does not follow the record before it: {e}"
                ) from e
        return state

    def _fold_shared(self, base: S, rec: Record, where: str) -> S:
        """The state of delta record ``rec`` (at ``where``) folded onto ``base``, shared as
        decodes are (:data:`SHARED_DECODES`: another store of the folder may have folded it)."""

        def fold() -> S:
            return self.vs.fold(base, rec.payload, where)

        key = (self.vs.store.root, self.vs.folder)
        return SHARED_DECODES.decode(key, rec.version, rec.payload, fold)

    def _decode_record(self, rec: Record) -> S:
        """A journal record's state: decoded here, or (``share_decodes``) taken from the
        process's :data:`SHARED_DECODES` when another store of the folder decoded it."""
        journal = self.journal

        def decode() -> S:
            return self.vs.decode(rec.payload, f"{journal.path(rec.segment)}@{rec.offset}")

        if not self.vs.share_decodes:
            return decode()
        key = (self.vs.store.root, self.vs.folder)
        return SHARED_DECODES.decode(key, rec.version, rec.payload, decode)

    # ------------------------------------------------------------------ committing
    def commit(self, req: CommitRequest[S, T]) -> tuple[S, T]:
        """:meth:`VersionedStore.commit` on a local disk (``idempotent`` is for the blob
        engine: a journal commit's outcome is always known): one record appended to the
        folder's journal under its lock, then flushed and marked after the lock is let go
        (FORMAT.md, "Journal").
        The base read under the lock is the newest record: committed, or in flight (its
        writer is flushing it). A change built on a record in flight that is then cancelled
        runs again; so does one that aborts or raises on such a base, unless the records in
        flight are all committed once waited for."""
        journal = self.journal
        timeout_ms = req.timeout_ms
        deadline = time.monotonic() + timeout_ms / 1000
        # This engine's lock first, for the whole commit (see the class). (The OS errors are
        # turned as _errors turns them, without a generator context per commit.)
        with self.lock:
            left_ms = max(timeout_ms, 1)
            while True:
                try:
                    return self._attempt(journal, req, left_ms, deadline)
                except Cancelled:
                    left_ms = int((deadline - time.monotonic()) * 1000)
                    if left_ms <= 0:
                        raise CommitConflict(
                            f"commit to {self.what}: records it built on were cancelled until "
                            f"its timeout ({timeout_ms} ms)"
                        ) from None
                except OSError as e:
                    raise self._os_error("commit", e) from e

    def _attempt(
        self, journal: Journal, req: CommitRequest[S, T], lock_ms: int, deadline: float
    ) -> tuple[S, T]:
        """One attempt of :meth:`commit` (raises :class:`Cancelled` to try again)."""
        change, before_write, before_link = req.change, req.before_write, req.before_link
        durable_with = req.durable_with
        seen = self.clock()
        ticket = None
        try:
            with journal.locked(lock_ms):
                recs = self._collect()
                found = journal.tail_for_write(self.pos, deadline, recs)
                if found is not None and recs is None and _deltas(found):
                    recs = []  # (a store that writes none building on deltas: read them all)
                    found = journal.tail_for_write(self.pos, deadline, recs)
                if found is None:
                    return self._start(req)
                rec, here, tail = found
                if rec is not None and recs is not None:
                    base, base_raw = self._chain(recs, tail, here, seen), rec.payload
                elif rec is not None:
                    base, base_raw = self._decode_record(rec), rec.payload
                    if rec.marked:  # (cache and position move to committed states only)
                        self.vs.cache = (base, base_raw, seen)
                        self.pos = here
                elif self.vs.cache is not None and self.pos is not None:
                    base, base_raw = self.vs.cache[0], self.vs.cache[1]  # nothing new since
                    self.pos = here
                else:
                    raise CommitConflict(f"could not read a stable state of {self.what}")
                state = self.vs.private_copy(base, base_raw)
                try:
                    result = change(state)
                    raw = self.vs.next_version(state, base, before_write, delta=True)
                except Exception as e:
                    # Decided on a base in flight: it counts once that base is committed.
                    if tail.inflight and not journal.settled(here[0], tail, deadline):
                        raise Cancelled("a record it built on was cancelled") from e
                    if isinstance(e, Abort):
                        return base, e.value
                    raise
                full: list[bytes] = []

                def encode_full() -> bytes:  # (a segment starts with a full state)
                    if not full:
                        full.append(raw if not is_delta(raw) else state.encode())
                    return full[0]

                ticket = journal.begin(
                    here[0],
                    tail,
                    state.version,
                    raw,
                    durable_with,
                    before_link,
                    deadline,
                    encode_full,
                )
                if full:
                    raw = full[0]
                if not ticket.locked:  # not pipelined: completed under the lock
                    pos = journal.finish(ticket, before_link, deadline)
            if ticket.locked:
                pos = journal.finish(ticket, before_link, deadline)
        except BaseException:
            if ticket is not None:
                journal.cancel(ticket)  # interrupted between begin and finish
            raise
        self.vs.cache = (state, raw, seen)
        self.pos = pos
        if self.vs.share_decodes:
            # (Read-only from here on, as the cache is: this process's readers of the
            # folder take it rather than decode the record again.)
            SHARED_DECODES.put((self.vs.store.root, self.vs.folder), state.version, raw, state)
        return state, result

    def _chain(
        self, recs: list[Record], tail: Tail, here: tuple[int, int, int, int], seen: int
    ) -> S:
        """Under the lock: the state to build on from the marked records read after the
        reading position (``recs``) and the records in flight after them (``tail``); the
        cache and position move to the newest marked one. Raises :class:`Cancelled` (to read
        again from the newest segment's start) where the cached state is not their base."""
        prior = self._cached()
        if recs:
            state = self._state_of(recs, prior)
            if state is None:
                self.vs.cache, self.pos = None, None
                raise Cancelled("the cached state is not the base of the records read")
            self.vs.cache = (state, recs[-1].payload, seen)
            self.pos = here
        elif prior is None:
            raise CommitConflict(f"could not read a stable state of {self.what}")
        else:
            state = prior
        if tail.inflight:
            flying = self._state_of(tail.inflight, state)
            if flying is None:
                self.vs.cache, self.pos = None, None
                raise Cancelled("the records in flight do not follow the newest marked one")
            state = flying
        return state

    def _start(self, req: CommitRequest[S, T]) -> tuple[S, T]:
        """Under the journal's lock, in a folder with no segment: the folder holds versions
        as files (the format before journals), or nothing. Its newest version is the base;
        the journal starts after it (a new segment)."""
        journal = self.journal
        seen = self.clock()
        versions = self.files.list_versions()
        if not versions:
            raise self.vs.not_found(f"{self.what} does not exist")
        loaded = self.files.load(versions[-1])
        if loaded is None:
            raise CommitConflict(f"{self.what} changed under its lock")
        base, base_raw = loaded
        state = self.vs.private_copy(base, base_raw)
        try:
            result = req.change(state)
        except Abort as a:
            return base, a.value
        raw = self.vs.next_version(state, base, req.before_write)
        pos = journal.start_segment(state.version, raw, req.durable_with, req.before_link)
        self.vs.cache = (state, raw, seen)
        self.pos = pos
        return state, result
