"""The streaming source's partitions and subscription consumers (driver side).

Owns keeping a stream's partition list current (pattern discovery every
``patternAutoDiscoveryPeriodMs``, topics deleted or created again), registering the query's
subscription consumers (waiting out a consumer a just-stopped query still holds) and dropping
them, as the :class:`StreamConsumers` that
:class:`~filepulsar.connector.source.stream.FilePulsarStreamReader` owns; and the SIGTERM
handling that lets ``stop()`` release the consumers when Spark stops the query.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Any

from filepulsar.connector.source.offsets import resolve_offset
from filepulsar.connector.source.options import SourceOptions
from filepulsar.connector.source.plan import resolve_partitions
from filepulsar.dispatch.clock import Clock, poll
from filepulsar.dispatch.modes import ConsumerType, InitialPosition
from filepulsar.storage import ConsumerBusy, ManagedLedger, TopicName, TopicNotFound
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.manifest import ManifestStore
from filepulsar.storage.read_range import after, data_loss
from filepulsar.storage.subscription import SubscriptionConsumer, renew_due
from filepulsar.storage.subscriptions import SubscriptionStore

log = logging.getLogger(__name__)


_RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"


def _raise_exit(signum: int, frame: Any) -> None:
    # Spark may signal again while stop() runs: one exit is enough, let the cleanup finish.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def _stop_on_sigterm() -> None:
    """Let ``stop()`` run when Spark stops the query.

    Spark ends a streaming query's Python planner process (where this reader lives) with
    SIGTERM, which by default kills Python on the spot: ``stop()`` never ran, the consumers
    stayed registered until their lease lapsed, and a restarted query on an Exclusive or
    Failover subscription waited that long. Turning SIGTERM into ``SystemExit`` lets the
    runner's own ``finally: reader.stop()`` release them. Only in that process's main thread.
    """
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if getattr(spec, "name", None) != _RUNNER:
        return
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not _raise_exit:
        signal.signal(signal.SIGTERM, _raise_exit)


def _renewal_failed(c: SubscriptionConsumer, e: Exception) -> None:
    log.warning(
        "filepulsar source: renewing the lease of consumer %s on %s failed (%s); the next "
        "trigger tries again",
        c.consumer_name,
        c.topic,
        e,
    )


class StreamConsumers:
    """The partitions a stream reads and its subscription consumers, owned by
    :class:`~filepulsar.connector.source.stream.FilePulsarStreamReader` (driver side).

    ``partitions``, ``mls`` (a managed ledger per partition), ``consumers`` (per partition,
    with a subscription) and ``subs`` (the backlog report's subscription stores) are read by
    the reader; only this object adds and drops partitions.

    Parameters
    ----------
    opts, store
        The query's parsed options and its blob store.
    clock
        Where time is read and waited (pattern refresh, the busy-consumer wait).
    """

    def __init__(self, opts: SourceOptions, store: BlobStore, clock: Clock) -> None:
        self.opts = opts
        self.store = store
        self._time = clock
        self.mls: dict[str, ManagedLedger] = {}
        self.consumers: dict[str, SubscriptionConsumer] = {}
        self.partitions: list[TopicName] = []
        self.subs: dict[str, SubscriptionStore] = {}
        self._listed_at = 0.0
        self._started = False
        # Made at the first registration: the reader is pickled before (no lock in it).
        self._keeper: threading.Thread | None = None
        self._keeper_stop: threading.Event | None = None

    # -- topics and consumers
    def _due(self) -> bool:
        return self._time.monotonic() - self._listed_at >= self.opts.pattern_refresh_ms / 1000

    def refresh(self, *, force: bool = False, subscribe: bool = True) -> None:
        """List the query's partitions again (at start, then every
        ``patternAutoDiscoveryPeriodMs``): topics the pattern finds, partitions added to a
        topic, topics deleted (left out) or deleted and created again (a fresh manifest read,
        so a cached manifest of the old topic is never read on)."""
        if not subscribe:
            if not self.partitions or self._due():
                self.partitions = resolve_partitions(self.store, self.opts, wait=True)
                self._listed_at = self._time.monotonic()
            for t in self.partitions:
                if str(t) not in self.mls:
                    self.mls[str(t)] = ManagedLedger(self.store, t)
            return
        first = not self._started
        if first:
            self._started = True
            force = True
        if not force and not self._due():
            return
        self._listed_at = self._time.monotonic()
        tps = resolve_partitions(
            self.store, self.opts, create=first, wait=self.opts.wait_for_topics or not first
        )
        kept = []
        for t in tps:
            key = str(t)
            ml = self.mls.get(key)
            recreated = False
            if ml is not None and not first:
                try:
                    fresh = ManifestStore(self.store, t).latest()
                    seen = ml.state(refresh=False)
                except TopicNotFound:
                    continue  # deleted since the listing
                if fresh.incarnation != seen.incarnation:
                    recreated = True
                    self.drop(key)
                    ml = None
            if ml is None:
                self.mls[key] = ManagedLedger(self.store, t)
                if self.opts.subscription:
                    self.consumers[key] = self._subscribe(t, from_start=recreated)
            kept.append(t)
        for key in set(self.mls) - {str(t) for t in kept}:
            self.drop(key)
        self.partitions = kept
        if self.consumers:
            self._keep_leases()

    def _keep_leases(self) -> None:
        """Start the thread that renews the consumers' leases between Spark's calls, if not
        running.

        Spark calls this reader once a trigger (``latestOffset``) and once a batch
        (``commit``), not while a micro-batch runs: a batch longer than the lease (the first
        one on a loaded host, a slow sink) lapsed the consumers' leases, and another
        consumer could take over what they hold. A Pulsar consumer stays connected for as
        long as its process lives; this thread is that connection's keep-alive: a
        housekeeping pass (:func:`~filepulsar.storage.subscription.renew_due`) every sixth
        of the lease (at most 5 s), each consumer renewed only when a third of its lease has
        passed. It ends at :meth:`close` (and with the process)."""
        if self._keeper is not None and self._keeper.is_alive():
            return
        stop = self._keeper_stop = threading.Event()
        period = min(max(self.opts.lease_ms / 6000, 0.02), 5.0)

        def keep() -> None:
            while not stop.wait(period):
                renew_due(list(self.consumers.values()), _renewal_failed)

        self._keeper = threading.Thread(target=keep, name="filepulsar-source-leases", daemon=True)
        self._keeper.start()

    def drop(self, key: str) -> None:
        """Forget a partition that was deleted (or deleted and created again)."""
        self.mls.pop(key, None)
        self.subs.pop(key, None)
        c = self.consumers.pop(key, None)
        if c is not None:
            try:
                c.close()
            except Exception as e:  # its subscription went with the topic
                log.info("closing consumer of deleted %s: %s", key, e)

    def _subscribe(self, t: TopicName, *, from_start: bool = False) -> SubscriptionConsumer:
        _stop_on_sigterm()
        start = None
        initial = InitialPosition.Earliest if from_start else self.opts.initial_position
        if (
            self.opts.starting_given
            and self.opts.durable
            and not from_start
            and SubscriptionStore(self.store, t, self.opts.subscription or "").exists()
        ):
            log.warning(
                "filepulsar source: subscription %r on %s exists, so the query starts at "
                "its cursor; startingOffsets/startingTime only position a subscription the "
                "query creates",
                self.opts.subscription,
                t,
            )
        if not from_start and (
            self.opts.starting_offsets not in ("latest", "earliest")
            or self.opts.starting_time is not None
        ):
            ml = ManagedLedger(self.store, t)
            m = ml.state()
            off = resolve_offset(
                self.opts.starting_offsets, str(t), m, ml, self.opts, is_start=True
            )
            nxt = after(m, ml, off.task)
            start = nxt
        busy: list[ConsumerBusy] = []

        def attempt() -> SubscriptionConsumer | None:
            try:
                return SubscriptionConsumer(
                    self.store,
                    t,
                    self.opts.subscription or "",
                    sub_type=self.opts.subscription_type,
                    consumer_name=self.opts.consumer_name,
                    initial_position=initial,
                    priority_level=self.opts.priority_level,
                    key_shared_mode=self.opts.key_shared_mode,
                    sticky_ranges=list(self.opts.sticky_ranges)
                    if self.opts.sticky_ranges
                    else None,
                    durable=self.opts.durable,
                    lease_ms=self.opts.lease_ms,
                    start_position=start,
                    report_skip=self._retention_skip,
                )
            except ConsumerBusy as e:
                busy[:] = [e]
                return None

        # A query that just ended releases its consumer when Spark closes its Python planner
        # (shortly after termination); a live rival fails after the timeout.
        c = poll(
            attempt,
            self.opts.busy_timeout_ms / 1000,
            clock=self._time,
            first_delay_s=0.1,
            max_delay_s=0.1,
        )
        if c is None:
            raise busy[-1]
        return c

    def _retention_skip(self, line: str) -> None:
        """A non-durable consumer of this query met retention deleting what it had not read
        (Shared/Key_Shared: it fetches the claims): data loss, per ``failOnDataLoss``."""
        data_loss(line, self.opts.fail_on_data_loss)

    @property
    def claims_mode(self) -> bool:
        """Whether the query claims entries (a Shared or Key_Shared subscription)."""
        return bool(self.opts.subscription) and self.opts.subscription_type in (
            ConsumerType.Shared,
            ConsumerType.KeyShared,
        )

    def active(self, key: str) -> bool:
        """Whether this query's consumer of ``key`` may read (renewing its lease when due;
        True without a subscription)."""
        c = self.consumers.get(key)
        if c is None:
            return True
        c.renew_if_due()
        return c.is_active()

    def forget(self) -> None:
        """Forget the partitions (after :meth:`close`): the next :meth:`refresh` lists and
        subscribes as at the start."""
        self.mls = {}
        self._started = False

    def close(self) -> None:
        """Stop renewing the consumers' leases and unregister them. Never raises."""
        if self._keeper_stop is not None:
            self._keeper_stop.set()
        self._keeper = None
        for c in self.consumers.values():
            try:
                c.close()
            except Exception as e:  # never fail a query's shutdown on a lease cleanup
                log.warning("closing consumer of %s failed: %s", c.topic, e)
        self.consumers = {}
