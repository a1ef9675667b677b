"""``filepulsar maintain``: the broker's background duties, run by an operator's process.

There is no broker to trim topics on its own. :func:`run_once` does, for one scope (every
namespace, one tenant's, or one namespace), what Pulsar's broker does periodically: subscription
expiry, message TTL and retention (:func:`filepulsar.storage.retention.enforce_retention`), and
optionally deletes the files crashed writers left (``sweep_orphans``).

Several instances may run at once (on one machine or many, for high availability): a **lease**
per scope decides which one works. The lease is a small versioned state in the storage root,
``maintenance/<scope>/lease/`` (its state and folder are :mod:`filepulsar.storage.maintenance`'s),
committed with the same protocol as manifests and cursors
(:class:`filepulsar.storage.versioned.VersionedStore`), so two instances
never both take it. Its holder renews it before each run and after each topic, and releases it
on a clean exit; an instance that was killed keeps it until it expires (``lease_ms``, default
60 s), then another instance takes over. Instances that do not hold the lease stand by and try
again each round. Scopes are independent leases: ``maintain acme`` and ``maintain`` (every
namespace) may work at the same time, which is safe, because every change retention makes is a
versioned commit; the lease only keeps instances from doing the same work twice.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from filepulsar.connector.admin import Admin
from filepulsar.dispatch.clock import wall_ms
from filepulsar.storage import paths
from filepulsar.storage.errors import (
    FilePulsarError,
    NamespaceNotFound,
    TenantNotFound,
    TopicNotFound,
)
from filepulsar.storage.maintenance import LeaseState, lease_store
from filepulsar.storage.names import TopicName, validate_segment
from filepulsar.storage.topics import list_namespaces, list_topics
from filepulsar.storage.versioned import Abort

__all__ = ["DEFAULT_LEASE_MS", "Lease", "LeaseState", "Scope", "run_once"]

#: How long a lease lasts without renewal: how long a killed instance blocks the others.
DEFAULT_LEASE_MS = 60_000


@dataclass(frozen=True)
class Scope:
    """What one ``maintain`` covers: every namespace, one tenant's, or one namespace."""

    tenant: str | None = None
    namespace: str | None = None

    @classmethod
    def parse(cls, text: str | None) -> Scope:
        """``None`` or ``"all"``: every namespace; ``"tenant"``; ``"tenant/namespace"``.

        Raises
        ------
        InvalidTopicName
            If a part is not a valid tenant or namespace name, or there are more than two.
        """
        if text is None or text == "all":
            return cls()
        parts = text.split("/")
        if len(parts) > 2:
            raise _bad_scope(text)
        validate_segment(parts[0], "tenant")
        if len(parts) == 1:
            return cls(parts[0])
        validate_segment(parts[1], "namespace")
        return cls(parts[0], parts[1])

    def __str__(self) -> str:
        if self.tenant is None:
            return "all"
        return self.tenant if self.namespace is None else f"{self.tenant}/{self.namespace}"

    @property
    def lease_folder(self) -> str:
        """Where this scope's lease lives under the root."""
        return paths.maintenance_lease_dir(self.tenant, self.namespace)

    def namespaces(self, admin: Admin) -> list[str]:
        """``tenant/namespace`` of every namespace in the scope.

        Raises
        ------
        TenantNotFound, NamespaceNotFound
            If the scope names a tenant or namespace that does not exist.
        """
        every = list_namespaces(admin.store)
        if self.tenant is None:
            return every
        if self.namespace is None:
            mine = [ns for ns in every if ns.split("/", 1)[0] == self.tenant]
            if not mine and self.tenant not in admin.tenants().list():
                raise TenantNotFound(f"tenant {self.tenant} does not exist")
            return mine
        name = f"{self.tenant}/{self.namespace}"
        if name not in every:
            raise NamespaceNotFound(f"namespace {name} does not exist")
        return [name]


def _bad_scope(text: str) -> FilePulsarError:
    from filepulsar.storage.errors import InvalidTopicName

    return InvalidTopicName(f"scope {text!r} is not valid; give all, a tenant, or tenant/namespace")


# ---------------------------------------------------------------------------- the lease
def default_holder() -> str:
    """``host:pid:random``: unique per process, readable in reports."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Lease:
    """The lease of one scope, held (or not) by ``holder``.

    ``clock`` gives wall-clock milliseconds (:func:`dispatch.clock.wall_ms`, the system's, by
    default; instances on different machines must agree within a fraction of ``lease_ms``, as the
    consumer leases do).
    """

    def __init__(
        self,
        admin: Admin,
        scope: Scope,
        holder: str,
        *,
        lease_ms: int = DEFAULT_LEASE_MS,
        clock: Callable[[], int] | None = None,
    ) -> None:
        if lease_ms < 1000:
            raise ValueError(f"lease_ms must be >= 1000, got {lease_ms}")
        self.holder = holder
        self.lease_ms = lease_ms
        self.clock = clock or wall_ms
        self._vs = lease_store(admin.store, scope.tenant, scope.namespace, what=f"lease of {scope}")
        #: The newest lease state this instance saw (who holds it, until when).
        self.state = LeaseState()

    def _ensure(self) -> None:
        try:
            self._vs.latest()
        except TopicNotFound:
            self._vs.create(LeaseState())

    def acquire(self) -> bool:
        """Take or renew the lease; False while another live instance holds it."""
        self._ensure()
        now = self.clock()

        def change(s: LeaseState) -> bool:
            if s.holder and s.holder != self.holder and s.expires_ms > now:
                raise Abort(False)
            if s.holder != self.holder or s.expires_ms <= now:
                s.acquired_ms = now  # a new term (also when our own lease had lapsed)
            s.holder = self.holder
            s.expires_ms = now + self.lease_ms
            return True

        self.state, got = self._vs.commit(change)
        return bool(got)

    def release(self) -> None:
        """Give the lease up at once (a clean exit), if this instance still holds it."""
        self._ensure()

        def change(s: LeaseState) -> None:
            if s.holder != self.holder or s.expires_ms <= self.clock():
                raise Abort(None)
            s.expires_ms = 0

        self.state, _ = self._vs.commit(change)


class LeaseLost(FilePulsarError):
    """The lease expired or went to another instance during a run (the run stops)."""


# ---------------------------------------------------------------------------- one run
@dataclass
class RunReport:
    """What one run did: every ledger, subscription, cursor and file it touched."""

    scope: str
    holder: str
    started_ms: int
    finished_ms: int = 0
    topics: int = 0
    managed_ledgers: int = 0
    deleted_ledgers: list[dict[str, Any]] = field(default_factory=list)
    expired_subscriptions: list[dict[str, Any]] = field(default_factory=list)
    ttl_acknowledged: list[dict[str, Any]] = field(default_factory=list)
    deleted_orphans: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, str]] = field(default_factory=list)
    lease_lost: bool = False

    def summary(self) -> dict[str, Any]:
        """The counts (one row of the table)."""
        return {
            "scope": self.scope,
            "topics": self.topics,
            "ledgers_deleted": len(self.deleted_ledgers),
            "messages_deleted": sum(d["messages"] for d in self.deleted_ledgers),
            "bytes_deleted": sum(d["size"] for d in self.deleted_ledgers),
            "subscriptions_expired": len(self.expired_subscriptions),
            "cursors_ttl_moved": len(self.ttl_acknowledged),
            "orphans_deleted": len(self.deleted_orphans),
            "orphan_bytes": sum(d["bytes"] for d in self.deleted_orphans),
            "failures": len(self.failures),
            "seconds": round((self.finished_ms - self.started_ms) / 1000, 3),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": "lease lost" if self.lease_lost else "done",
            "holder": self.holder,
            "started_ms": self.started_ms,
            "finished_ms": self.finished_ms,
            **self.summary(),
            "managed_ledgers": self.managed_ledgers,
            "details": {
                "deleted_ledgers": self.deleted_ledgers,
                "expired_subscriptions": self.expired_subscriptions,
                "ttl_acknowledged": self.ttl_acknowledged,
                "deleted_orphans": self.deleted_orphans,
                "failures": self.failures,
            },
        }


def run_once(
    admin: Admin,
    scope: Scope,
    lease: Lease,
    *,
    sweep_orphans: bool = False,
    orphan_min_age_ms: int = 24 * 3600 * 1000,
    progress: Callable[[int, int], None] | None = None,
) -> RunReport:
    """Retention, TTL and subscription expiry (and the orphan sweep) on every topic of
    ``scope``, renewing ``lease`` after each topic; the caller has acquired it.

    A failure on one topic is recorded in the report and the run goes on; a lease lost
    midway stops the run (``lease_lost``), leaving the remaining topics to the new holder.
    The report's start and finish times are read from the lease's clock.

    Raises
    ------
    TenantNotFound, NamespaceNotFound
        If the scope names a tenant or namespace that does not exist.
    """
    report = RunReport(str(scope), lease.holder, started_ms=lease.clock())
    topics: list[TopicName] = []
    for ns in scope.namespaces(admin):
        tenant, namespace = ns.split("/", 1)
        topics.extend(info.name for info in list_topics(admin.store, tenant, namespace))
    report.topics = len(topics)
    if progress:
        progress(0, len(topics))
    for i, topic in enumerate(topics):
        try:
            _one_topic(admin, topic, report, sweep_orphans, orphan_min_age_ms)
        except TopicNotFound:
            pass  # deleted while we worked: nothing to keep small
        except (FilePulsarError, OSError) as e:
            report.failures.append({"topic": str(topic), "error": str(e)})
        if progress:
            progress(i + 1, len(topics))
        if i + 1 < len(topics) and not lease.acquire():
            report.lease_lost = True
            break
    report.finished_ms = lease.clock()
    return report


def _one_topic(
    admin: Admin, topic: TopicName, report: RunReport, sweep: bool, min_age_ms: int
) -> None:
    r = admin.enforce_retention(str(topic))
    report.managed_ledgers += r.managed_ledgers
    report.deleted_ledgers += [vars(d) for d in r.deleted_ledgers]
    report.expired_subscriptions += [vars(s) for s in r.expired_subscriptions]
    report.ttl_acknowledged += [vars(a) for a in r.ttl_acknowledged]
    if sweep:
        s = admin.sweep_orphans(str(topic), min_age_ms=min_age_ms)
        report.deleted_orphans += [{"key": k, "bytes": n} for k, n in s.deleted]
