"""The blob engine: a versioned state as one file per version, ``<folder>/<version>.json``,
each written with put-if-absent into the slot after the newest (FORMAT.md, "Commit protocol").

Used on every store; on a local disk only for a folder with no journal (the format before
journals, or a store opened with ``journal=False``), and to read such a folder before its
journal starts. Its parts: the walk to the newest version (:meth:`BlobEngine.latest`), the
commit loop with its turns (:meth:`BlobEngine.commit`), settling a put whose reply was lost
or whose slot garbage collection freed (:meth:`BlobEngine._settle`), and garbage collection
with its grace (:meth:`BlobEngine.gc`). The store it serves (:class:`VersionedStore`) holds the
cached newest state and stamps new versions.

The protocol is correct under any staleness of any writer or reader and any garbage
collection (FORMAT.md, "Commit protocol", says why). Its invariants:

- Versions are deleted only by :meth:`BlobEngine.gc` (or with the whole folder when the topic
  or subscription is deleted), in ascending order, stopping at the first failure, and only
  below the newest ``keep_versions``; so the newest version is never deleted. The grace only
  makes a GC stop earlier.
- Only *original* versions (written into a slot never used before) are cached, returned, or
  built upon; a writer that finds its version may sit in a freed slot removes it.
- Turn files (``<folder>/<version>.turn``) are advisory: they only delay puts.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import logging
import os
import random
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic

from filepulsar.dispatch.clock import Clock
from filepulsar.storage import paths
from filepulsar.storage.blobstore import BlobNotFound, BlobStoreError
from filepulsar.storage.errors import CommitConflict, CommitOutcomeUnknown, FilePulsarError
from filepulsar.storage.versioned.protocol import (
    CONTENDED_MS,
    GC_EVERY,
    GC_GRACE_MS,
    KEEP_VERSIONS,
    LOCAL_QUEUE_WAIT_MS,
    TURN_AFTER_LOSSES,
    TURN_MS,
    Abort,
    CommitRequest,
    FlockWaiter,
    S,
    T,
)

if TYPE_CHECKING:
    from filepulsar.storage.versioned.store import VersionedStore

log = logging.getLogger(__name__)

#: How many polls of the version a writer waiting out another's commit turn makes between two
#: looks at the turn file (:meth:`BlobEngine._wait_for`).
_TURN_RECHECK = 4


class MovedOn(Exception):
    """Raised by :meth:`BlobEngine.latest` when the folder went on as a journal (its
    ``went_on`` says so): the journal engine reads it instead."""


@dataclass(frozen=True, slots=True)
class BlobPolicy:
    """Garbage collection and fairness of a :class:`BlobEngine`: every ``gc_every``-th version's
    writer deletes the versions older than the newest ``keep_versions + 1`` that are also
    older than ``gc_grace_ms`` (0: no grace); a writer that lost ``turn_after`` races in a row
    asks for a turn, which the others leave it for at most ``turn_ms``.

    Raises
    ------
    ValueError
        If ``keep_versions``, ``gc_every`` or ``turn_after`` is below 1.
    """

    keep_versions: int = KEEP_VERSIONS
    gc_every: int = GC_EVERY
    gc_grace_ms: int = GC_GRACE_MS
    turn_after: int = TURN_AFTER_LOSSES
    turn_ms: int = TURN_MS

    def __post_init__(self) -> None:
        if self.keep_versions < 1 or self.gc_every < 1 or self.turn_after < 1:
            raise ValueError(
                "keep_versions, gc_every and turn_after must be >= 1, got "
                f"{self.keep_versions}, {self.gc_every}, {self.turn_after}"
            )


def _never(version: int | None) -> bool:
    return False


class BlobEngine(Generic[S]):
    """The versions of ``vs``'s folder as files (an
    :class:`~filepulsar.storage.versioned.protocol.Engine`).

    ``policy`` sets garbage collection and fairness, ``sleep`` the back-off between lost races
    (see :class:`VersionedStore`); ``waits`` is the clock deadlines are read from. ``went_on``
    (set by the journal engine that reads a folder through this one before its journal
    starts) tells whether the folder went on as a journal: after version ``v``, or at all
    (``None``).
    """

    def __init__(
        self,
        vs: VersionedStore[S],
        *,
        policy: BlobPolicy,
        sleep: Callable[[float], None] | None,
        waits: Clock,
    ) -> None:
        # (A proxy: the store owns its engine, and a cycle would keep a journal's files open
        # until the garbage collector ran, not until the store is let go.)
        self.vs = weakref.proxy(vs)
        self.store = vs.store
        self.folder = vs.folder
        self.what = vs.what
        self.clock = vs.clock
        # Deadlines and waits (backoff, turns): the clock itself when it is a whole Clock.
        self._waits = waits
        self.policy = policy
        # The back-off between lost races (tests that schedule pass a no-op).
        self.sleep: Callable[[float], None] = sleep or self._waits.sleep
        self._contended_until = 0  # clock ms: check turn files before puts until then
        # (version, updated ms) of versions GC read: later GCs find the grace's prefix in it.
        self._gc_marks: list[tuple[int, int]] = []
        # (version, bytes) of the version a lost race just read in the slot it lost: the walk
        # to the newest that follows loads it without a second GET when it is still newest.
        self._winner: tuple[int, bytes] | None = None
        self.went_on: Callable[[int | None], bool] = _never

    def key(self, version: int) -> str:
        return paths.versioned_file(self.folder, version)

    def turn_key(self, version: int) -> str:
        """The turn file by which a writer asks the others to leave it slot ``version + 1``."""
        return paths.turn_file(self.folder, version)

    # ------------------------------------------------------------------ reading
    def create(self, initial: S) -> bool:
        return self.store.put_if_absent(self.key(0), initial.encode())

    def exists(self) -> bool:
        return bool(self.list_versions())

    def stored(self) -> Iterator[tuple[str, bytes]]:
        for v in self.list_versions():
            raw = self.get_raw(v)
            if raw is not None:
                yield self.store.url(self.key(v)), raw

    def list_versions(self) -> list[int]:
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

    def get_raw(self, version: int) -> bytes | None:
        try:
            return self.store.get(self.key(version))
        except BlobNotFound:
            return None

    def load(self, version: int) -> tuple[S, bytes] | None:
        known, self._winner = self._winner, None
        raw = known[1] if known is not None and known[0] == version else self.get_raw(version)
        if raw is None:
            return None
        return self.vs.decode(raw, f"{self.store.root}/{self.key(version)}"), raw

    def _unchanged(self, entry: tuple[S, bytes, int]) -> bool:
        """Whether the cached version's file is still there, byte for byte (1 GET).

        If so, no version above it was ever deleted (versions go oldest first, and a cached
        version is original), so nothing seen above it can be off the live chain."""
        return self.get_raw(entry[0].version) == entry[1]

    def latest(self, *, strict: bool, hint: int, drain: bool = True) -> S:
        """The newest version, walked to from the cached one (or listed); see
        :meth:`VersionedStore.latest` for ``strict`` and ``hint`` (``drain`` is for a
        watched journal: nothing here).

        Raises
        ------
        MovedOn
            If the folder went on as a journal (``went_on``).
        """
        for _ in range(10):
            seen = self.clock()  # what this pass finds newest was the newest after this time
            entry = self.vs.cache
            loaded: tuple[S, bytes] | None
            if entry is None:
                # The highest version listed is original: a slot is freed only below
                # ``keep_versions`` newer versions, and the newest is never deleted.
                versions = self.list_versions()
                if not versions:
                    if self.went_on(None):
                        raise MovedOn  # migrated to a journal meanwhile
                    raise self.vs.not_found(f"{self.what} does not exist")
                loaded = self.load(versions[-1])
            else:
                v = entry[0].version
                if self.went_on(v):
                    raise MovedOn  # the folder went on as a journal
                if hint <= v and not self.store.exists(self.key(v + 1)):
                    if strict:
                        if self._unchanged(entry):
                            if self.vs.cache is entry:  # proven newest now: note when
                                self.vs.cache = (entry[0], entry[1], seen)
                            return entry[0]
                    elif self.store.exists(self.key(v)):
                        return entry[0]
                    self.vs.drop(entry)  # garbage-collected under us: list again
                    continue
                v = max(v + 1, hint)  # any version seen above the cached one will do
                while self.store.exists(self.key(v + 1)):
                    v += 1
                loaded = self.load(v)
                if (
                    loaded is not None
                    and not self._recent(entry, seen)
                    and not self._unchanged(entry)
                ):
                    loaded = None  # versions were freed meanwhile: v may be off the chain
                if loaded is None:
                    self.vs.drop(entry)
            if loaded is None:
                continue
            self.vs.set_cache((loaded[0], loaded[1], seen))
            return loaded[0]
        raise CommitConflict(f"could not read a stable state of {self.what}")

    def _recent(self, entry: tuple[S, bytes, int], now: int) -> bool:
        """Whether ``entry`` was seen newest less than half the GC grace before ``now``: then
        no slot above it has been freed (FORMAT.md, "GC grace"), and every version found
        above it is original without re-reading it."""
        return bool(self.policy.gc_grace_ms) and now - entry[2] < self.policy.gc_grace_ms // 2

    # ------------------------------------------------------------------ committing
    def commit(self, req: CommitRequest[S, T]) -> tuple[S, T]:
        """:meth:`VersionedStore.commit` by put-if-absent (``durable_with`` is for journals:
        a version file is whole once linked)."""
        with self.local_queue() as queued:
            return self._commit(req, queued)

    @contextlib.contextmanager
    def local_queue(self) -> Iterator[bool]:
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
        waiter = FlockWaiter(fd)
        held = waiter.wait(LOCAL_QUEUE_WAIT_MS / 1000)
        try:
            yield True
        finally:
            if held:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            # else: the waiter thread owns the descriptor and closes it

    def _commit(self, req: CommitRequest[S, T], queued: bool) -> tuple[S, T]:
        change, before_write, before_link = req.change, req.before_write, req.before_link
        timeout_ms = req.timeout_ms
        # Behind another writer, our cached version is most likely stale: find the newest
        # (a HEAD or two) rather than lose a put.
        self.vs.latest(refresh=queued or self.vs.cache is None)
        deadline = self._waits.monotonic() + timeout_ms / 1000
        attempt = -1
        losses = 0
        my_turn: int | None = None  # the version after which this commit holds a turn
        waited: set[int] = set()  # others' turns this commit already waited out
        rechecked = False  # whether a stale cache was already checked strictly
        try:
            while attempt < 3 or self._waits.monotonic() < deadline:
                attempt += 1
                entry = self.vs.cache
                if entry is None:
                    self.vs.latest()
                    continue
                if (
                    not rechecked
                    and self.policy.gc_grace_ms
                    and self.clock() - entry[2] > self.policy.gc_grace_ms // 2
                ):
                    # Last seen newest long ago: slots above it may be freed by now. A put is
                    # safe within half the grace of a strict check (FORMAT.md, "Commit protocol").
                    rechecked = True
                    self.vs.latest(refresh=True, strict=True)
                    continue
                base, base_raw, _ = entry
                if my_turn is None and losses >= self.policy.turn_after:
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
                    if self._wait_for(base.version + 1, self.policy.turn_ms, turn=base.version):
                        self.vs.latest(hint=base.version + 1)
                    else:
                        self.vs.latest()
                    continue
                state = self.vs.private_copy(base, base_raw)
                try:
                    result = change(state)
                except Abort as a:
                    # Decisions not to write must rest on the newest state, not a stale cache.
                    if self.vs.latest(refresh=True, strict=True).commit_id != base.commit_id:
                        continue
                    return base, a.value
                except FilePulsarError:
                    if self.vs.latest(refresh=True, strict=True).commit_id != base.commit_id:
                        continue  # raised on a stale state: try the newest
                    raise
                raw = self.vs.next_version(state, base, before_write)
                put_at = self.clock()
                try:
                    won = self._settle(
                        entry, state, raw, self._put(state.version, raw, before_link)
                    )
                except CommitOutcomeUnknown as e:
                    if not req.idempotent:
                        raise
                    log.warning("%s; applying the change again (it is idempotent)", e)
                    continue
                if won:
                    self.vs.set_cache((state, raw, put_at))
                    if state.version % self.policy.gc_every == 0:
                        self.gc(state.version)
                    return state, result
                losses += 1
                self._contended_until = self.clock() + CONTENDED_MS
                if my_turn is not None and base.version >= my_turn:
                    my_turn = None  # the turn passed (a writer that had not seen it): ask again
                # Walk forward (or list, if our base was freed).
                try:
                    self.vs.latest(hint=base.version + 1)
                finally:
                    self._winner = None  # (what _settle read is for this walk only)
                if 1 <= losses < self.policy.turn_after:
                    # Spread the first retries; then turns order them.
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
        ``limit_ms`` (this writer's clock); return whether ``version`` exists.

        Polls ``version`` with a pause from 1 ms doubling to 20 ms, and never shorter than
        the last existence check took (an object store's request: polling faster than its
        round trip only adds requests, which the holder's commit needs more); the turn file
        (just seen by the caller) is looked at every ``_TURN_RECHECK`` polls, so that a
        holder that gave up without committing delays this writer by a few polls at most."""
        start = self.clock()
        pause = 0.001
        polls = 0
        while True:
            t0 = self._waits.monotonic()
            if self.store.exists(self.key(version)):
                return True
            took = self._waits.monotonic() - t0
            polls += 1
            if self.clock() - start >= limit_ms:
                return False
            if polls % _TURN_RECHECK == 0 and not self.store.exists(self.turn_key(turn)):
                return False
            self.sleep(max(pause, took))
            pause = min(pause * 2, 0.02)

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
            mine = self.get_raw(v + 1)
            if mine is not None and mine != raw:
                self._winner = (v + 1, mine)  # (the walk that follows need not GET it again)
                return False  # another writer's version: a plain lost race
        if self._unchanged(base):
            # Our base was original and is still there: no version above it was ever
            # deleted, so our put hit a never-used slot (or, with no file of ours there, the
            # put never happened).
            return mine is not None
        # Our base is gone or replaced. Either garbage collection freed slot v+1 before our
        # put (our file is off the live chain), or it ran far ahead after our put (our
        # version was built upon). Whatever is at v+2 was built on the original at v+1.
        nxt = self.load(v + 2)
        if nxt is not None and nxt[0].prev_commit_id:
            if nxt[0].prev_commit_id == state.commit_id:
                return True
            self._remove_mine(v + 1, raw)
            self.vs.drop(base)
            return False
        if nxt is None and self.get_raw(v + 1) == raw:
            # v+2 was written (v could be freed only after it) and freed since; had our
            # version been built upon, it would have been freed before v+2. It was not.
            self._remove_mine(v + 1, raw)
            self.vs.drop(base)
            return False
        self.vs.drop(base)
        raise CommitOutcomeUnknown(
            f"commit to {self.what} at version {v + 1}: garbage collection removed the "
            "versions that tell whether it is committed; it may or may not be"
        )

    def _remove_mine(self, version: int, raw: bytes) -> None:
        """Delete our off-chain file at ``version`` if it is still ours (best effort: a
        file left behind is ignored by readers and deleted by a later GC)."""
        try:
            if self.get_raw(version) == raw:
                self.store.delete(self.key(version))
        except (OSError, BlobStoreError) as e:
            log.warning("could not remove an uncommitted version of %s: %s", self.what, e)

    def gc(self, version: int) -> None:
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
            doomed = [v for v in versions if v < version - self.policy.keep_versions]
            if turns and turns[-1] >= version - 2 * self.policy.gc_every:
                self._contended_until = self.clock() + CONTENDED_MS
            if doomed and self.policy.gc_grace_ms:
                doomed = doomed[: self._past_grace(doomed)]
            for v in doomed:
                self.store.delete(self.key(v))
            for t in turns:
                if t >= version - self.policy.keep_versions:
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
        limit = self.clock() - self.policy.gc_grace_ms

        def old(i: int) -> bool:
            try:
                loaded = self.load(candidates[i])
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
