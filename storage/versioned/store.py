"""The commit protocol's face: :class:`VersionedStore` (FORMAT.md, "Commit protocol").

The store reads and commits one versioned state; how the versions are kept is its engine's
(:class:`~filepulsar.storage.versioned.protocol.Engine`): one file per version, written
put-if-absent (:mod:`~filepulsar.storage.versioned.blob`), or on a local disk the records of
the folder's journal (:mod:`~filepulsar.storage.versioned.journaled`). The store picks the
engine, keeps the newest state seen (the cache both engines read and move), and stamps each
new version (:mod:`~filepulsar.storage.versioned.envelope`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Generic

from filepulsar.dispatch.clock import waits_of, wall_ms
from filepulsar.storage import paths
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.errors import CorruptDataError, FilePulsarError, TopicNotFound
from filepulsar.storage.versioned import envelope
from filepulsar.storage.versioned.blob import BlobEngine, BlobPolicy
from filepulsar.storage.versioned.journal import Journal
from filepulsar.storage.versioned.journaled import JournalEngine
from filepulsar.storage.versioned.protocol import (
    COMMIT_TIMEOUT_MS,
    GC_EVERY,
    GC_GRACE_MS,
    KEEP_VERSIONS,
    TURN_AFTER_LOSSES,
    TURN_MS,
    CommitRequest,
    Engine,
    S,
    T,
)
from filepulsar.storage.versioned.watch import folder_stamp


class VersionedStore(Generic[S]):
    """Reads and commits a versioned JSON state in ``folder``, full state each version (on a
    journal, a change from the version before where :attr:`delta_every` says so).

    Used for managed-ledger manifests, subscription states, compaction states and maintenance
    leases. Thread-safe for readers; a commit may run concurrently with commits in other
    threads and processes. ``clock`` returns wall-clock milliseconds. On a local disk the
    versions are records of the folder's journal (:class:`JournalEngine`); elsewhere files
    ``<folder>/<version>.json`` written put-if-absent (:class:`BlobEngine`), for which
    ``keep_versions`` and ``gc_every`` set garbage collection: every ``gc_every``-th version's
    writer deletes the versions older than the newest ``keep_versions + 1`` that are also
    older than ``gc_grace_ms`` (tests shrink them to explore the protocol; ``gc_grace_ms=0``
    turns the grace off); ``turn_after`` and ``turn_ms`` set fairness (see :meth:`commit`).

    Costs per call with version files (HEAD = existence check, GET = read of one version):

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
    #: stores of the process that read the same folder
    #: (:data:`~filepulsar.storage.versioned.journaled.SHARED_DECODES`).
    share_decodes = False
    #: Delta records (FORMAT.md, "Delta records"): on a journal, a version whose number is
    #: not a multiple of this is written as its change from the version before it where the
    #: state can say it (its ``delta_from``); 0: full states only. Every store reads delta
    #: records of a state that folds them (its ``fold``: :meth:`fold`).
    delta_every = 0

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
        policy = BlobPolicy(
            keep_versions,
            gc_every,
            GC_GRACE_MS if gc_grace_ms is None else gc_grace_ms,
            turn_after,
            turn_ms,
        )
        self.store = store
        self.folder = folder
        self.decode = decode
        self.what = what
        self.not_found = not_found
        self.clock = clock or wall_ms
        #: The newest state seen, its exact bytes and a clock time at or before which it was
        #: the newest version, replaced as one tuple (thread-safe); the engines move it.
        self.cache: tuple[S, bytes, int] | None = None
        files = BlobEngine(self, policy=policy, sleep=sleep, waits=waits_of(clock))
        directory = store.journal_dir(folder)
        #: How the versions are kept: as files, or (a local disk) as a journal's records.
        self.engine: Engine[S] = (
            files
            if directory is None
            else JournalEngine(self, Journal(directory, store.local_path, what), files)
        )

    def key(self, version: int) -> str:
        """The key of version ``version`` kept as a file."""
        return paths.versioned_file(self.folder, version)

    # ------------------------------------------------------------------ reading
    def create(self, initial: S) -> bool:
        """Write ``initial`` as version 0 if absent. True if this call created it."""
        envelope.stamp_first(initial, self.clock())
        return self.engine.create(initial)

    def exists(self) -> bool:
        return self.cache is not None or self.engine.exists()

    def stored(self) -> Iterator[tuple[str, bytes]]:
        """Every stored version's bytes with where they are, oldest first as far as the
        store lists them (maintenance: which blobs any stored version names)."""
        return self.engine.stored()

    def change_stamp(self, *, drain: bool = True) -> tuple[int, int] | None:
        """A value that changes whenever a commit may have landed in this store's folder, or
        None when this process cannot tell (versions kept as files, or the folder not
        watched): see :func:`~filepulsar.storage.versioned.watch.folder_stamp`. Take it
        before a look; an equal stamp at the next look says nothing landed meanwhile, as far
        as this host can see (bound the trust by ``recheck_interval_s`` for other hosts).
        ``drain``: as :func:`~filepulsar.storage.versioned.watch.folder_stamp`'s."""
        engine = self.engine
        if not isinstance(engine, JournalEngine):
            return None
        return folder_stamp(engine.journal.dir, drain=drain)

    def latest(
        self, *, refresh: bool = True, strict: bool = False, hint: int = -1, drain: bool = True
    ) -> S:
        """The newest committed state (cached; ``refresh`` checks for newer versions).

        An idle refresh costs two existence checks. ``strict`` proves the answer was the
        newest version when this call looked (a GET instead of the second existence check):
        decisions not to write rest on it. ``hint`` is a version known to have existed (the
        walk to the newest starts there instead of at the cached one). ``drain=False``, on a
        watched journal: whether anything landed since the last read is told without reading
        the process's queued events first, for a caller that reads them itself before it
        looks (:func:`~filepulsar.storage.versioned.watch.folder_stamp`'s ``drain``): a
        commit marked after the last read of the events is found by the look after the next
        one. The returned object is shared: treat it as read-only.

        Raises
        ------
        TopicNotFound
            If there is no version at all (the topic or subscription does not exist).
        """
        entry = self.cache
        if entry is not None and not refresh:
            return entry[0]
        return self.engine.latest(strict=strict, hint=hint, drain=drain)

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
        return self.engine.commit(
            CommitRequest(change, before_write, before_link, timeout_ms, idempotent, durable_with)
        )

    # ------------------------------------------------------------------ for the engines
    def set_cache(self, loaded: tuple[S, bytes, int]) -> None:
        """Cache ``loaded`` unless a newer version is cached already."""
        cur = self.cache
        if cur is None or loaded[0].version >= cur[0].version:
            self.cache = loaded

    def drop(self, entry: tuple[S, bytes, int]) -> None:
        """Forget the cached ``entry`` (found freed or replaced), unless already replaced."""
        if self.cache is entry:
            self.cache = None

    def private_copy(self, base: S, base_raw: bytes) -> S:
        """A copy of ``base`` for a change to mutate: the state's own copy() where it has one
        (equal to decoding the base's bytes, without the decoding), else decoded."""
        copy = getattr(base, "copy", None)
        return copy() if copy is not None else self.decode(base_raw, "cache")

    def next_version(
        self,
        state: S,
        base: S,
        before_write: Callable[[S], None] | None,
        *,
        delta: bool = False,
    ) -> bytes:
        """Stamp ``state`` (changed from ``base``) as the version after it, run
        ``before_write``, and encode it (:func:`envelope.stamp_next`): with ``delta`` (a
        journal record) as its change from ``base`` where :attr:`delta_every` and the state
        allow it."""
        every = self.delta_every
        if not (delta and every):
            return envelope.stamp_next(state, base, self.clock(), before_write)

        def encode(s: S) -> bytes:
            if s.version % every:
                d: bytes | None = s.delta_from(base)  # type: ignore[attr-defined]
                if d is not None:
                    return d
            return s.encode()

        return envelope.stamp_next(state, base, self.clock(), before_write, encode)

    def fold(self, base: S, payload: bytes, where: str, *, in_place: bool = False) -> S:
        """The state a delta record ``payload`` (at ``where``) makes of ``base``, the state of
        the version before it (a new object: ``base`` is not changed; ``in_place``: ``base``
        itself changed, for a state nobody else holds).

        Raises
        ------
        NoBase
            If ``base`` is not the version and commit the delta was built on.
        CorruptDataError
            If the delta is malformed.
        """
        fold: Callable[..., S] | None = getattr(base, "fold", None)
        if fold is None:
            raise CorruptDataError(
                f"{self.what}: a delta record at {where}, for a state that has none"
            )
        return fold(payload, where, in_place=in_place)
