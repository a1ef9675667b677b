"""``admin.tenants()`` and ``admin.namespaces()``: tenants, namespaces and the namespace
policies (retention, TTL, backlog quota, deduplication, schema rules ...) as pulsar-admin's
``tenants`` and ``namespaces`` groups."""

from __future__ import annotations

import builtins
from typing import Any

from filepulsar.connector.admin.args import parse_seconds, require_bool
from filepulsar.connector.admin.pulsar_json import pulsar_policies
from filepulsar.connector.admin.units import parse_size, parse_time, whole
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.errors import AlreadyExists, NamespaceNotFound, NotEmpty
from filepulsar.storage.names import validate_segment
from filepulsar.storage.policies import (
    Policies,
    namespace_overrides,
    remove_namespace_policies,
    set_namespace_policies,
)
from filepulsar.storage.topics import (
    create_namespace,
    create_tenant,
    delete_namespace,
    delete_tenant,
    list_namespaces,
    list_tenants,
    split_namespace,
)

_MINUTE = 60


_MB = 1 << 20


#: The tenants and namespaces every Pulsar cluster has from its start (``public/default``
#: where short topic names live, ``pulsar/system`` of the system topics): listed on any root,
#: as ``pulsar-admin tenants list`` prints them on a fresh cluster.
BUILTIN_NAMESPACES = {"public": "public/default", "pulsar": "pulsar/system"}


def retention_values(time: str | int, size: str | int) -> tuple[int, int]:
    """(minutes, MB) of a retention given as Pulsar's ints or as strings (``"3d"``, a bare
    number seconds; ``"10G"``, a bare number bytes; ``-1`` unlimited), in whole units."""
    minutes = (
        time
        if isinstance(time, int) and not isinstance(time, bool)
        else whole(
            parse_time(time, "retention time", unlimited=True),
            _MINUTE,
            "minutes",
            "retention time",
            time,
        )
    )
    mb = (
        size
        if isinstance(size, int) and not isinstance(size, bool)
        else whole(
            parse_size(size, "retention size", unlimited=True),
            _MB,
            "megabytes",
            "retention size",
            size,
        )
    )
    return minutes, mb


def message_size(size: str | int) -> int:
    """Bytes from an int or a size string (``"1M"``)."""
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    return parse_size(size, "max message size")


def delay_ms(value: str | int, what: str) -> int:
    """Milliseconds from an int (ms) or a duration string (``"1s"``, ``"10m"``; a bare
    number is seconds, as pulsar-admin reads it)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return parse_time(value, what) * 1000


def delayed_delivery_values(
    enabled: bool, tick_time: str | int | None, max_delay: str | int | None
) -> dict[str, Any]:
    """The delayed-delivery policies to store (see ``Namespaces.set_delayed_delivery``)."""
    values: dict[str, Any] = {
        "delayed_delivery_enabled": require_bool(enabled, "delayed delivery status")
    }
    if tick_time is not None:
        values["delayed_delivery_tick_ms"] = delay_ms(tick_time, "delayed delivery tick time")
    if max_delay is not None:
        values["delayed_delivery_max_delay_ms"] = delay_ms(max_delay, "delayed delivery max delay")
    return values


class Tenants:
    """``admin.tenants()``: list, create, delete."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store

    def list(self) -> builtins.list[str]:
        """Every tenant, with the built-in ``public`` and ``pulsar`` (as on a fresh Pulsar
        cluster)."""
        return sorted(set(list_tenants(self.store)) | set(BUILTIN_NAMESPACES))

    def create(self, tenant: str) -> None:
        """Register a tenant (raises AlreadyExists, also for a built-in one)."""
        if tenant in BUILTIN_NAMESPACES:
            raise AlreadyExists(f"tenant {tenant} already exists (it is built in)")
        create_tenant(self.store, tenant)

    def delete(self, tenant: str) -> None:
        """Delete an empty tenant (raises TenantNotFound, NotEmpty; NotEmpty for a built-in
        one, which holds its built-in namespace)."""
        if tenant in BUILTIN_NAMESPACES:
            raise NotEmpty(
                f"tenant {tenant} still has namespaces ['{BUILTIN_NAMESPACES[tenant]}'] (built "
                "in); it cannot be deleted"
            )
        delete_tenant(self.store, tenant)


class Namespaces:
    """``admin.namespaces()``: namespaces and their policies (``tenant/namespace``)."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store

    def list(self, tenant: str) -> builtins.list[str]:
        """The namespaces of ``tenant`` (with the built-in ``public/default`` or
        ``pulsar/system``)."""
        validate_segment(tenant, "tenant")
        found = {ns for ns in list_namespaces(self.store) if ns.split("/", 1)[0] == tenant}
        if tenant in BUILTIN_NAMESPACES:
            found.add(BUILTIN_NAMESPACES[tenant])
        return sorted(found)

    def create(self, namespace: str) -> None:
        """Register a namespace (raises AlreadyExists)."""
        create_namespace(self.store, namespace)

    def delete(self, namespace: str, *, force: bool = False) -> None:
        """Delete a namespace; with ``force`` also its topics (raises NotEmpty otherwise)."""
        delete_namespace(self.store, namespace, force=force)

    def _set(self, namespace: str, **values: Any) -> None:
        tenant, ns = split_namespace(namespace)
        set_namespace_policies(self.store, tenant, ns, **values)

    def get_policies(self, namespace: str) -> dict[str, Any]:
        """The namespace's effective policies (defaults with its overrides), by name."""
        tenant, ns = split_namespace(namespace)
        return Policies().merged(namespace_overrides(self.store, tenant, ns)).__dict__.copy()

    def get_pulsar_policies(self, namespace: str) -> dict[str, Any]:
        """The namespace's policies as ``pulsar-admin namespaces policies`` prints them
        (Pulsar's field names; only what was set), see
        :func:`~filepulsar.connector.admin.pulsar_json.pulsar_policies`.

        Raises
        ------
        NamespaceNotFound
            If the namespace has no topics, no policies and is not built in (pulsar-admin:
            404 "Namespace does not exist").
        """
        tenant, ns = split_namespace(namespace)
        name = f"{tenant}/{ns}"
        if name not in BUILTIN_NAMESPACES.values() and name not in list_namespaces(self.store):
            raise NamespaceNotFound(f"namespace {name} does not exist")
        return pulsar_policies(self.get_overrides(namespace))

    def get_overrides(self, namespace: str) -> dict[str, Any]:
        """Only what was set on the namespace."""
        tenant, ns = split_namespace(namespace)
        return namespace_overrides(self.store, tenant, ns)

    def set_retention(
        self, namespace: str, time: str | int = 0, size: str | int = 0
    ) -> dict[str, int]:
        """Pulsar's ``setRetention``: keep consumed messages for ``time`` and up to ``size``.

        ``time``: minutes as an int (Pulsar's ``retentionTimeInMinutes``) or a duration string
        (``"3d"``; a bare number is seconds, as pulsar-admin reads it); ``size``: MB as an int
        (``retentionSizeInMB``) or a size string (``"10G"``; a bare number is bytes). ``-1``:
        unlimited. The stored policy is in whole minutes and MB. Returns what was stored.
        """
        minutes, mb = retention_values(time, size)
        self._set(namespace, retention_time_minutes=minutes, retention_size_mb=mb)
        return {"retentionTimeInMinutes": minutes, "retentionSizeInMB": mb}

    def get_retention(self, namespace: str) -> dict[str, int]:
        p = self.get_policies(namespace)
        return {
            "retentionTimeInMinutes": p["retention_time_minutes"],
            "retentionSizeInMB": p["retention_size_mb"],
        }

    def remove_retention(self, namespace: str) -> None:
        tenant, ns = split_namespace(namespace)
        remove_namespace_policies(
            self.store, tenant, ns, "retention_time_minutes", "retention_size_mb"
        )

    def set_message_ttl(self, namespace: str, ttl: str | int) -> int:
        """Message TTL: seconds as an int, or a duration (``"1h"``); 0 disables it."""
        seconds = parse_seconds(ttl, "message TTL")
        self._set(namespace, message_ttl_seconds=seconds)
        return seconds

    def remove_message_ttl(self, namespace: str) -> None:
        tenant, ns = split_namespace(namespace)
        remove_namespace_policies(self.store, tenant, ns, "message_ttl_seconds")

    def set_deduplication_status(self, namespace: str, enabled: bool) -> None:
        self._set(namespace, deduplication_enabled=require_bool(enabled, "deduplication status"))

    def set_delayed_delivery(
        self,
        namespace: str,
        enabled: bool,
        tick_time: str | int | None = None,
        max_delay: str | int | None = None,
    ) -> None:
        """Pulsar's ``setDelayedDeliveryMessages``: on or off, the tick and (PIP-315) the
        longest delay a producer may ask for, each ms as an int or a duration such as
        ``"1s"`` (``max_delay`` 0: no limit)."""
        self._set(namespace, **delayed_delivery_values(enabled, tick_time, max_delay))

    def remove_delayed_delivery(self, namespace: str) -> None:
        """Back to the defaults (on, 1 s tick, no max delay)."""
        tenant, ns = split_namespace(namespace)
        remove_namespace_policies(
            self.store,
            tenant,
            ns,
            "delayed_delivery_enabled",
            "delayed_delivery_tick_ms",
            "delayed_delivery_max_delay_ms",
        )

    def set_subscription_expiration_time(self, namespace: str, minutes: str | int) -> int:
        """Delete subscriptions inactive for this long: minutes as an int (Pulsar's unit) or a
        duration (``"2d"``); 0 disables expiry."""
        if isinstance(minutes, int) and not isinstance(minutes, bool):
            value = minutes
        else:
            value = whole(
                parse_time(minutes, "subscription expiration time", default_unit="m"),
                _MINUTE,
                "minutes",
                "subscription expiration time",
                minutes,
            )
        self._set(namespace, subscription_expiration_minutes=value)
        return value

    def set_max_message_size(self, namespace: str, size: str | int) -> int:
        """The largest message producers may send: bytes as an int, or a size (``"1M"``)."""
        value = message_size(size)
        self._set(namespace, max_message_size=value)
        return value

    def set_auto_topic_creation(
        self,
        namespace: str,
        allow: bool,
        topic_type: str = "non-partitioned",
        default_num_partitions: int | None = None,
    ) -> None:
        """Pulsar's ``setAutoTopicCreation``: whether producers and consumers create missing
        topics, of which type (``non-partitioned`` or ``partitioned``), with how many
        partitions."""
        values: dict[str, Any] = {
            "allow_auto_topic_creation": require_bool(allow, "auto topic creation"),
            "auto_topic_creation_type": topic_type,
        }
        if default_num_partitions is not None:
            values["default_num_partitions"] = default_num_partitions
        self._set(namespace, **values)

    def remove_auto_topic_creation(self, namespace: str) -> None:
        tenant, ns = split_namespace(namespace)
        remove_namespace_policies(
            self.store,
            tenant,
            ns,
            "allow_auto_topic_creation",
            "auto_topic_creation_type",
            "default_num_partitions",
        )
