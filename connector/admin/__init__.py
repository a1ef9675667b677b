"""The admin API, shaped like pulsar-admin's groups (``filepulsar.admin``).

::

    from filepulsar.admin import Admin
    admin = Admin("data/pulsar")                      # or s3://..., with storage_options=
    admin.namespaces().create("acme/orders")
    admin.namespaces().set_retention("acme/orders", time="3d", size="10G")
    admin.namespaces().set_deduplication_status("acme/orders", True)
    admin.topics().create_partitioned_topic("persistent://acme/orders/in", 4)
    admin.topics().get_stats("persistent://acme/orders/in")["subscriptions"]
    admin.topics().reset_cursor("persistent://acme/orders/in", "sub", timestamp=ts_ms)

Names follow Pulsar's Java admin client in snake_case (``createPartitionedTopic`` →
``create_partitioned_topic``); values use Pulsar's units: durations and sizes are ints in the
unit Pulsar's Java API uses, or strings as pulsar-admin writes them (``"3d"``, ``"10G"``,
``"-1"``; see :mod:`filepulsar.connector.admin.units`). Stats are dicts with Pulsar's key names.

There is no broker: tenants and namespaces exist once they hold a topic or policies (``create``
registers one explicitly); every operation works directly on the storage root, and cursor
operations (reset, skip, clear backlog, expire) are versioned commits of the subscription, so
they are safe while consumers are connected (connected Exclusive, Failover and Key_Shared
consumers restart from the new cursor on their next fetch; messages already in a client's
receive queue are still delivered). As in Pulsar, deleting a subscription or a topic is refused
while consumers (or producers) are connected unless ``force``.

The broker's periodic duties are here too (:meth:`Admin.enforce_retention`,
:meth:`Admin.sweep_orphans`), for ``filepulsar maintain`` and notebooks.

This module owns :class:`Admin` (the entry point and the broker's periodic duties); the groups
live by concept: :class:`~filepulsar.connector.admin.topics.Topics`,
:class:`~filepulsar.connector.admin.namespaces.Namespaces` and
:class:`~filepulsar.connector.admin.namespaces.Tenants`,
:class:`~filepulsar.connector.admin.schemas.Schemas`,
:class:`~filepulsar.connector.admin.topic_policies.TopicPolicies`; argument parsing in
:mod:`~filepulsar.connector.admin.args`.
"""

from __future__ import annotations

from typing import Any

# Re-exported: the admin groups are public here (``__all__``; also ``filepulsar.admin``).
from filepulsar.connector.admin.namespaces import Namespaces, Tenants
from filepulsar.connector.admin.schemas import Schemas
from filepulsar.connector.admin.topic_policies import TopicPolicies
from filepulsar.connector.admin.topics import Topics
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.errors import InvalidConfiguration
from filepulsar.storage.retention import (
    Progress,
    RetentionReport,
    SweepReport,
    enforce_retention,
    sweep_orphans,
)

__all__ = ["Admin", "Namespaces", "Tenants", "Topics"]


class Admin:
    """Administration of one storage root (pulsar-admin's ``PulsarAdmin``).

    Parameters
    ----------
    url
        The root: a path, ``file://``, ``s3://``, ``memory://`` ...
    storage_options
        fsspec options for the root's filesystem (an S3 endpoint, credentials).
    store
        An open :class:`~filepulsar.storage.blobstore.BlobStore` to use instead of ``url``.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        storage_options: dict[str, Any] | None = None,
        store: BlobStore | None = None,
    ) -> None:
        if store is None:
            if url is None:
                raise InvalidConfiguration("Admin needs a url (a storage root) or a store")
            store = open_blob_store(url, storage_options=storage_options)
        self.store = store

    def tenants(self) -> Tenants:
        return Tenants(self.store)

    def namespaces(self) -> Namespaces:
        return Namespaces(self.store)

    def topics(self) -> Topics:
        return Topics(self.store)

    def schemas(self) -> Schemas:
        return Schemas(self.store)

    def topic_policies(self) -> TopicPolicies:
        """A topic's own policies (pulsar-admin ``topicPolicies``)."""
        return TopicPolicies(self.store)

    def enforce_retention(
        self,
        topic: str | None = None,
        *,
        now: int | None = None,
        progress: Progress | None = None,
        dry_run: bool = False,
    ) -> RetentionReport:
        """Subscription expiry, message TTL and retention (the broker's periodic work) on one
        topic or every topic, or with ``dry_run`` what they would do; see
        :func:`filepulsar.storage.retention.enforce_retention`."""
        return enforce_retention(self.store, topic, now=now, progress=progress, dry_run=dry_run)

    def sweep_orphans(
        self,
        topic: str | None = None,
        *,
        min_age_ms: int,
        dry_run: bool = False,
        progress: Progress | None = None,
    ) -> SweepReport:
        """Delete files no manifest references, older than ``min_age_ms``; see
        :func:`filepulsar.storage.retention.sweep_orphans`."""
        return sweep_orphans(
            self.store, topic, min_age_ms=min_age_ms, dry_run=dry_run, progress=progress
        )

    def close(self) -> None:
        """Nothing to release (no connections); for pulsar-admin's shape."""

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
