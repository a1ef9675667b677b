"""Retention, message TTL and subscription expiry: what keeps a topic from growing forever.

:func:`enforce_retention` runs, per managed ledger (every partition of a partitioned topic):

1. **Subscription expiry** (``subscription_expiration_minutes`` > 0): a durable subscription
   with no live consumer whose last activity (register, renew, acknowledge, close) is older
   than the limit is deleted, as Pulsar's broker expires inactive subscriptions.
2. **TTL** (``message_ttl_seconds`` > 0): every durable subscription acknowledges,
   cumulatively, the entries whose publish time is older than the TTL (Pulsar expires by
   ``now > publish_time + ttl``). Entries are scanned in ledger order and the scan stops at the
   first entry that has not expired, so an older entry behind a newer one waits.
3. **Trimming**: the consumed position is the lowest mark-delete position over the durable
   subscriptions (with no durable subscription everything counts as consumed, as in Pulsar).
   Closed ledgers whose entries are all consumed are examined oldest first; one is deleted if
   it is outside retention, and the scan stops at the first one that is not (Pulsar's
   ``internalTrimLedgers``):

   - time: ``retention_time_minutes >= 0`` and ``now - closed > retention_time_minutes``;
   - size: ``retention_size_mb >= 0`` and the managed ledger's total size minus the ledgers
     deleted so far, this one included, is still ``>= retention_size_mb`` MB;
   - ``-1`` disables a limit (both ``-1``: keep everything); ``0``/``0`` deletes consumed
     ledgers at once. The open ledger is never deleted.

   The manifest is committed first (the ledgers leave the list, ``trimmedBefore`` and
   ``trimmedMessages`` grow, ``trimmedLast`` becomes the last entry deleted), then the
   ledgers' data blobs and index files are deleted, so a
   crash in between leaves unreferenced files, never a manifest naming missing ones. Readers
   positioned in a deleted ledger get :class:`~filepulsar.storage.errors.DataLossError`.

Runs may race (two ``maintain`` scopes covering one namespace, or an operator's command
beside a running job): every change is a versioned commit, so a ledger is deleted by one run
only, and a run that finds the files of a ledger it read in the manifest gone checks the newest
manifest: a ledger another run deleted meanwhile counts as done (TTL scans on past it, the
orphan sweep skips it), never as damage.

Known races, both narrow and both Pulsar-like in effect: a consumer registering on a
subscription at the moment expiry deletes it finds the subscription gone (it re-creates it at
its initial position); a producer whose open blob belonged to a ledger another writer rolled
over, and which retention deleted before that producer's next commit, fails that commit.
Producer leases and TTL compare wall clocks of different machines: keep them loosely
synchronised (consumer leases do not depend on them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from filepulsar.dispatch.clock import wall_ms
from filepulsar.storage import jsontext, paths
from filepulsar.storage.blobstore import BlobNotFound
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.catalog import SegmentRef, StoredHead, retained_heads
from filepulsar.storage.compaction import COMPACTION_SUBSCRIPTION
from filepulsar.storage.cursor import SubscriptionState
from filepulsar.storage.errors import (
    CorruptDataError,
    DataLossError,
    FilePulsarError,
    SubscriptionNotFound,
    TopicNotFound,
)
from filepulsar.storage.fragments import Fragment
from filepulsar.storage.ledger import ManagedLedger, Position
from filepulsar.storage.manifest import LedgerInfo, ManifestState
from filepulsar.storage.names import TopicName
from filepulsar.storage.policies import Policies, effective_policies
from filepulsar.storage.subscriptions import (
    SubscriptionStore,
    delete_subscription,
    list_subscriptions,
)
from filepulsar.storage.topics import list_namespaces, list_topics, managed_ledgers
from filepulsar.storage.versioned import Abort

log = logging.getLogger(__name__)

_MB = 1024 * 1024
#: ``progress(done, total)``: managed ledgers processed so far, of how many.
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class DeletedLedger:
    """A ledger retention removed from a managed ledger."""

    topic: str
    ledger_id: int
    entries: int
    messages: int
    size: int
    closed_ms: int

    @classmethod
    def of(cls, topic: TopicName, lg: LedgerInfo) -> DeletedLedger:
        """The record of closed ledger ``lg`` of ``topic``."""
        assert lg.closed_ms is not None
        return cls(str(topic), lg.ledger_id, lg.entries, lg.messages, lg.size, lg.closed_ms)


@dataclass(frozen=True)
class ExpiredSubscription:
    """A subscription deleted because nobody used it for longer than the expiry limit."""

    topic: str
    subscription: str
    last_active_ms: int


@dataclass(frozen=True)
class TtlAcknowledgement:
    """A subscription whose cursor TTL moved forward to ``(ledger_id, entry_id)``."""

    topic: str
    subscription: str
    ledger_id: int
    entry_id: int


@dataclass
class RetentionReport:
    """What one :func:`enforce_retention` run did.

    ``failures`` lists ``(topic, error message)`` for managed ledgers that could not be
    processed when every topic was asked for (the run goes on with the others).
    """

    now_ms: int
    managed_ledgers: int = 0
    deleted_ledgers: list[DeletedLedger] = field(default_factory=list)
    expired_subscriptions: list[ExpiredSubscription] = field(default_factory=list)
    ttl_acknowledged: list[TtlAcknowledgement] = field(default_factory=list)
    deleted_files: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)

    @property
    def deleted_messages(self) -> int:
        return sum(d.messages for d in self.deleted_ledgers)

    @property
    def deleted_bytes(self) -> int:
        return sum(d.size for d in self.deleted_ledgers)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (for the command line)."""
        d = asdict(self)
        d["deleted_messages"] = self.deleted_messages
        d["deleted_bytes"] = self.deleted_bytes
        return d


def enforce_retention(
    store: BlobStore,
    topic: str | TopicName | None = None,
    *,
    now: int | None = None,
    progress: Progress | None = None,
    dry_run: bool = False,
) -> RetentionReport:
    """Apply subscription expiry, TTL and retention to one topic or to every topic.

    Parameters
    ----------
    store
        The root holding the topics.
    topic
        A topic (every partition of a partitioned one), a single partition, or None for every
        topic of every namespace under the root.
    now
        Epoch milliseconds to judge ages against (default: the wall clock).
    progress
        Called as ``progress(done, total)`` with counts of managed ledgers: once before the
        first (``done`` 0) and after each (for a progress bar).
    dry_run
        Change nothing; report what a run now would do: the subscriptions it would expire,
        the cursors TTL would move and the ledgers retention would then delete (judged as if
        those had happened; ``deleted_files`` stays 0).

    Returns
    -------
    RetentionReport
        The ledgers, files and subscriptions deleted and the cursors TTL moved (or, with
        ``dry_run``, that would be).

    Raises
    ------
    TopicNotFound
        If ``topic`` is given and does not exist.
    FilePulsarError
        If ``topic`` is given and processing it fails (with every topic, failures are
        reported in :attr:`RetentionReport.failures` instead).
    """
    now_ms = wall_ms() if now is None else int(now)
    report = RetentionReport(now_ms=now_ms)
    _each(
        store,
        topic,
        "retention",
        report.failures,
        lambda t: _enforce_one(store, t, now_ms, report, dry_run),
        progress,
    )
    return report


def _enforce_one(
    store: BlobStore, topic: TopicName, now: int, report: RetentionReport, dry_run: bool = False
) -> None:
    def clock() -> int:  # every age in one run is judged at the same instant
        return now

    pol = effective_policies(store, topic)
    ml = ManagedLedger(store, topic, clock=clock)
    try:
        m = ml.state()  # read once; the steps below do not change the manifest until _trim's commit
    except TopicNotFound:
        return  # a partition deleted under us
    report.managed_ledgers += 1
    trim = pol.retention_time_minutes >= 0 or pol.retention_size_mb >= 0
    if not (trim or pol.subscription_expiration_minutes > 0 or pol.message_ttl_seconds > 0):
        return  # infinite retention, no TTL, no expiry: nothing to do
    subs = _load_subscriptions(ml)
    if pol.subscription_expiration_minutes > 0:
        _expire_subscriptions(ml, subs, pol, now, report, dry_run)
    floor = None  # with dry_run: where TTL would have moved every cursor to, at least
    if pol.message_ttl_seconds > 0:
        floor = _apply_ttl(ml, m, subs, pol, now, report, dry_run)
    if trim:
        _trim(ml, m, subs, pol, now, report, dry_run, floor)


@dataclass
class _Cursor:
    """A durable subscription as one run sees it: its store (whose cache a commit starts from)
    and its newest known state."""

    store: SubscriptionStore
    state: SubscriptionState


def _load_subscriptions(ml: ManagedLedger) -> dict[str, _Cursor]:
    """Every durable subscription of ``ml``, each read once (those deleted meanwhile left out)."""
    out: dict[str, _Cursor] = {}
    for name in list_subscriptions(ml.store, ml.topic):
        st = SubscriptionStore(ml.store, ml.topic, name, clock=ml.clock)
        try:
            out[name] = _Cursor(st, st.latest())
        except SubscriptionNotFound:
            continue  # deleted concurrently
    return out


def _expire_subscriptions(
    ml: ManagedLedger,
    subs: dict[str, _Cursor],
    pol: Policies,
    now: int,
    report: RetentionReport,
    dry_run: bool = False,
) -> None:
    """Delete the inactive subscriptions, from the store (unless ``dry_run``) and from
    ``subs``."""
    limit = pol.subscription_expiration_minutes * 60_000
    for name, cur in list(subs.items()):
        st = cur.state
        if name == COMPACTION_SUBSCRIPTION:
            continue  # the compactor's cursor is a system cursor, never inactive (as Pulsar)
        if st.live_consumers(now) or now - st.last_active_ms <= limit:
            continue
        if not dry_run:
            delete_subscription(ml.store, ml.topic, name)
        del subs[name]
        log.info(
            "%s subscription %r on %s (inactive since %d)",
            "would expire" if dry_run else "expired",
            name,
            ml.topic,
            st.last_active_ms,
        )
        report.expired_subscriptions.append(
            ExpiredSubscription(str(ml.topic), name, st.last_active_ms)
        )


def last_published_before(ml: ManagedLedger, m: ManifestState, cutoff: int) -> Position | None:
    """The last entry of the run of entries, from the first, published before ``cutoff``
    (epoch ms); None if the first entry is not. Used by TTL, expire-messages and reset-cursor
    by time; like Pulsar's, the scan stops at the first later entry."""
    last: Position | None = None
    for lg in m.ledgers:
        if not lg.entries:
            continue
        if lg.max_publish < cutoff:
            last = Position(lg.ledger_id, lg.entries - 1)
            continue
        try:
            for frag in ml.fragments(lg):
                end = frag.first_entry + frag.count - 1
                if frag.max_publish < cutoff:
                    last = Position(lg.ledger_id, end)
                    continue
                for e in ml.iter_entries(
                    m, Position(lg.ledger_id, frag.first_entry), end=Position(lg.ledger_id, end)
                ):
                    if e.header.publish_time >= cutoff:
                        return last
                    last = e.position
                return last
        except DataLossError:
            if not deleted_meanwhile(ml, lg):
                raise
            # Another run deleted it after ``m`` was read: every subscription had consumed
            # it, and nothing of it can be delivered any more; the scan goes on after it.
            last = Position(lg.ledger_id, lg.entries - 1)
            continue
        return last
    return last


def deleted_meanwhile(ml: ManagedLedger, lg: LedgerInfo) -> bool:
    """Whether closed ledger ``lg``, named by a manifest read earlier, has since been deleted
    by retention (another run's, racing this one): the newest manifest no longer lists it and
    trims past it. Its files being gone is then what a finished deletion looks like, not
    damage. Reads the newest manifest (strict)."""
    try:
        now = ml.manifest.latest(strict=True)
    except TopicNotFound:
        return True  # the whole topic went
    return lg.ledger_id < now.trimmed_before and now.ledger(lg.ledger_id) is None


#: The name TTL calls it by (tests replace it to act in the middle of a run).
_last_expired = last_published_before


def _apply_ttl(
    ml: ManagedLedger,
    m: ManifestState,
    subs: dict[str, _Cursor],
    pol: Policies,
    now: int,
    report: RetentionReport,
    dry_run: bool = False,
) -> Position | None:
    """Acknowledge the expired entries on every subscription; ``subs`` gets the new states.
    With ``dry_run`` nothing is acknowledged: the cursors it would move are reported and the
    position they would move to is returned."""
    if not subs:
        return None
    target = _last_expired(ml, m, now - pol.message_ttl_seconds * 1000)
    if target is None:
        return None
    if dry_run:
        for name, cur in subs.items():
            if cur.state.mark_delete < target:
                report.ttl_acknowledged.append(
                    TtlAcknowledgement(str(ml.topic), name, target[0], target[1])
                )
        return target

    # Same as SubscriptionConsumer._next_fn (storage/subscription.py).
    def nxt(p: Position) -> Position | None:
        return ml.next_position(m, p)

    def change(s: SubscriptionState) -> bool:
        assert target is not None
        if s.mark_delete >= target:
            raise Abort(False)
        s.ack_cumulative(target, nxt)
        if s.dispatched < s.mark_delete:
            s.dispatched = s.mark_delete
        return True

    for name, cur in list(subs.items()):
        try:
            # A refresh (existence checks; a read only if a newer version exists) so that a
            # subscription deleted since it was loaded is not re-created by this commit.
            cur.store.latest()
            cur.state, moved = cur.store.commit(change)
        except SubscriptionNotFound:
            del subs[name]
            continue
        if moved:
            report.ttl_acknowledged.append(
                TtlAcknowledgement(str(ml.topic), name, target[0], target[1])
            )
    return None


def _consumed(
    subs: dict[str, _Cursor], m: ManifestState, floor: Position | None = None
) -> Position:
    """The position every durable subscription consumed (each taken as at least ``floor``)."""
    positions = [cur.state.mark_delete for cur in subs.values()]
    if floor is not None:
        positions = [max(p, floor) for p in positions]
    return min(positions) if positions else m.last_position()


def _trim(
    ml: ManagedLedger,
    m: ManifestState,
    subs: dict[str, _Cursor],
    pol: Policies,
    now: int,
    report: RetentionReport,
    dry_run: bool = False,
    floor: Position | None = None,
) -> None:
    if pol.retention_time_minutes < 0 and pol.retention_size_mb < 0:
        return  # infinite retention
    consumed = _consumed(subs, m, floor)
    total = sum(lg.size for lg in m.ledgers)
    to_delete: list[LedgerInfo] = []
    size_to_delete = 0
    for lg in m.ledgers:
        if lg.is_open:
            break
        if lg.entries and (lg.ledger_id, lg.entries - 1) > consumed:
            break
        size_to_delete += lg.size
        assert lg.closed_ms is not None
        expired = (
            pol.retention_time_minutes >= 0
            and now - lg.closed_ms > pol.retention_time_minutes * 60_000
        )
        over_quota = pol.retention_size_mb >= 0 and total - size_to_delete >= (
            pol.retention_size_mb * _MB
        )
        if not (expired or over_quota):
            break
        to_delete.append(lg)
    if not to_delete:
        return
    if dry_run:
        report.deleted_ledgers += [DeletedLedger.of(ml.topic, lg) for lg in to_delete]
        return
    index_files = _index_files(ml)
    files: dict[int, list[str]] = {}
    for lg in to_delete:
        files[lg.ledger_id] = _ledger_files(ml, lg, index_files.get(lg.ledger_id, []))
    ids = {lg.ledger_id for lg in to_delete}

    def change(state: ManifestState) -> list[LedgerInfo]:
        gone = [lg for lg in state.ledgers if lg.ledger_id in ids and not lg.is_open]
        if not gone:
            raise Abort([])
        state.ledgers = [lg for lg in state.ledgers if lg not in gone]
        state.trimmed_before = max(state.trimmed_before, max(lg.ledger_id for lg in gone) + 1)
        state.trimmed_messages += sum(lg.messages for lg in gone)
        # The last entry deleted: a reader positioned before it lost data (DataLossError in
        # the source and the readers, or skipped and logged with failOnDataLoss=false).
        held = [Position(lg.ledger_id, lg.entries - 1) for lg in gone if lg.entries]
        if held:
            last = max(held)
            if last > state.trimmed_last:
                state.trimmed_last = last
        return gone

    # ``m`` is stale from here on; ``gone`` comes from the committed state.
    _, gone = ml.manifest.commit(change)
    for lg in gone:
        for key in files[lg.ledger_id]:
            try:
                ml.store.delete(key)
                report.deleted_files += 1
            except BlobNotFound:
                pass
        report.deleted_ledgers.append(DeletedLedger.of(ml.topic, lg))
        log.info(
            "retention deleted ledger %d of %s (%d messages, %d bytes)",
            lg.ledger_id,
            ml.topic,
            lg.messages,
            lg.size,
        )


def _index_files(ml: ManagedLedger) -> dict[int, list[str]]:
    """The keys under ``ledgers/`` (one listing), by the ledger id their name starts with."""
    out: dict[int, list[str]] = {}
    for key in ml.store.list(paths.ledgers_dir(ml.topic)):
        parsed = paths.parse_ledger_index(key)
        if parsed is not None:
            out.setdefault(parsed[0], []).append(key)
    return out


def _ledger_files(ml: ManagedLedger, lg: LedgerInfo, index_files: list[str]) -> list[str]:
    """Keys of a closed ledger's data blobs and ``index_files`` (every version of its index)."""
    frags: list[Fragment] = []
    try:
        frags = ml.fragments(lg)
    except DataLossError as e:
        if deleted_meanwhile(ml, lg):
            log.debug("ledger %d of %s was deleted by another run", lg.ledger_id, ml.topic)
        else:
            log.warning("ledger %d of %s has no readable index: %s", lg.ledger_id, ml.topic, e)
    return sorted({paths.data_blob(ml.topic, f.blob) for f in frags}) + index_files


# --------------------------------------------------------------------------- orphan files

#: Default minimum age of an unreferenced file before :func:`sweep_orphans` deletes it.
ORPHAN_MIN_AGE_MS = 24 * 3600 * 1000


@dataclass
class SweepReport:
    """What one :func:`sweep_orphans` run deleted (or, with ``dry_run``, would delete)."""

    now_ms: int
    managed_ledgers: int = 0
    deleted: list[tuple[str, int]] = field(default_factory=list)  # (key, bytes)
    kept_young: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)

    @property
    def deleted_bytes(self) -> int:
        return sum(size for _, size in self.deleted)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["deleted_bytes"] = self.deleted_bytes
        return d


def sweep_orphans(
    store: BlobStore,
    topic: str | TopicName | None = None,
    *,
    min_age_ms: int = ORPHAN_MIN_AGE_MS,
    now: int | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> SweepReport:
    """Delete data blobs, ledger index files and ledger-catalog segments that no manifest
    references.

    Such files are left by writers that died between writing and committing (a producer
    killed mid-send, a Spark task whose batch never committed), by a producer that had to
    copy its bytes to a fresh blob after another writer rolled the ledger, by a retention
    run interrupted between its manifest commit and its deletions, and (catalog segments) by
    the rollovers and retention runs whose new segments replaced them. Readers never see them.

    A file is deleted only if it is unreferenced by the manifest read *after* listing it and
    older than ``min_age_ms`` (default 24 h): a writer commits what it wrote within one send
    or one Spark batch, so keep the age above the longest batch you run. A catalog segment
    must also be unnamed by every stored manifest version a reader may still load: the
    newest 64, and those that were the newest less than the commit protocol's GC grace
    (120 s) before ``now`` (:func:`filepulsar.storage.catalog.retained_heads`).

    Parameters are as :func:`enforce_retention`'s (``progress`` too); ``dry_run`` reports
    without deleting.
    A small ``min_age_ms`` is unsafe: it can delete a file a live writer wrote and has not
    committed yet, losing those messages.

    Raises
    ------
    ValueError
        If ``min_age_ms`` is negative.
    """
    if min_age_ms < 0:
        raise ValueError(f"min_age_ms must be >= 0 (milliseconds), got {min_age_ms!r}")
    now_ms = wall_ms() if now is None else int(now)
    report = SweepReport(now_ms=now_ms)
    cutoff = now_ms - min_age_ms
    _each(
        store,
        topic,
        "orphan sweep",
        report.failures,
        lambda t: _sweep_one(store, t, now_ms, cutoff, dry_run, report),
        progress,
    )
    return report


def _each(
    store: BlobStore,
    topic: str | TopicName | None,
    what: str,
    failures: list[tuple[str, str]],
    fn: Callable[[TopicName], None],
    progress: Progress | None = None,
) -> None:
    """Run ``fn`` on every managed ledger of ``topic`` (or of every topic under the root).
    A failure on a topic asked for by name raises; in a run over every topic it is logged and
    recorded in ``failures``, and the run goes on. ``progress(done, total)`` follows it."""
    if topic is not None:
        parts = managed_ledgers(store, topic)
        if progress:
            progress(0, len(parts))
        for i, p in enumerate(parts):
            fn(p)
            if progress:
                progress(i + 1, len(parts))
        return
    todo = []
    for ns in list_namespaces(store):
        tenant, namespace = ns.split("/", 1)
        for info in list_topics(store, tenant, namespace):
            todo.extend(info.managed_ledgers())
    if progress:
        progress(0, len(todo))
    for i, p in enumerate(todo):
        try:
            fn(p)
        except (FilePulsarError, OSError) as e:
            log.warning("%s of %s failed: %s", what, p, e)
            failures.append((str(p), str(e)))
        if progress:
            progress(i + 1, len(todo))


def _catalog_names(ml: ManagedLedger, now_ms: int) -> set[str]:
    """Keys of the catalog segments a reader may still load: those the stored manifest
    versions of :func:`~filepulsar.storage.catalog.retained_heads` name (read after the candidates
    were listed, so a segment committed in between is among them)."""
    heads: list[StoredHead] = []
    refs: tuple[SegmentRef, ...] = ()
    for where, raw in ml.manifest.stored():
        try:
            d = jsontext.loads(jsontext.unframe(raw, where))
            if "delta" not in d:  # (a delta record names the catalog of the head before it)
                refs = tuple(SegmentRef.from_json(r) for r in d.get("catalog", []))
            heads.append(StoredHead(d["version"], d["updated"], refs))
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise CorruptDataError(f"manifest {where} is malformed: {type(e).__name__} {e}") from e
    return {
        paths.topic_key(ml.topic, ref.name)
        for head in retained_heads(heads, now_ms)
        for ref in head.refs
    }


def _sweep_one(
    store: BlobStore,
    topic: TopicName,
    now_ms: int,
    cutoff_ms: int,
    dry_run: bool,
    report: SweepReport,
) -> None:
    # List first, read the manifest second: a file committed in between is then referenced.
    candidates = (
        store.list(paths.data_dir(topic))
        + store.list(paths.ledgers_dir(topic))
        + store.list(paths.catalog_dir(topic))
    )
    ml = ManagedLedger(store, topic)
    try:
        m = ml.state()
    except TopicNotFound:
        return  # deleted under us
    report.managed_ledgers += 1
    blobs: set[str] = set()
    indexes: set[str] = set()
    for lg in m.ledgers:
        if lg.index is not None:
            indexes.add(paths.topic_key(topic, lg.index))
        try:
            blobs.update(f.blob for f in ml.fragments(lg))
        except DataLossError:
            if not deleted_meanwhile(ml, lg):
                raise
            # deleted by a retention run since ``m`` was read: its files are that run's
    # A catalog segment stays while a manifest version a reader may still load names it.
    segments = _catalog_names(ml, now_ms)
    for key in candidates:
        blob = paths.blob_id_of(key)
        if (blob is not None and blob in blobs) or key in indexes or key in segments:
            continue
        if (
            blob is None
            and not key.endswith(paths.INDEX_SUFFIX)
            and not key.endswith(paths.CATALOG_SUFFIX)
        ):
            continue  # not ours: leave unknown files alone
        try:
            if store.mtime_ms(key) > cutoff_ms:
                report.kept_young += 1
                continue
            size = store.size(key)
            if not dry_run:
                store.delete(key)
        except BlobNotFound:
            continue  # deleted meanwhile
        report.deleted.append((key, size))
