"""``admin.topic_policies()``: a topic's own policies over its namespace's, set, shown and
removed as pulsar-admin's ``topicPolicies`` group (Pulsar's PIP-422 ``remove-*`` verbs: a
removed topic policy lets the namespace's apply again).

A partitioned topic has one set of topic policies for all its partitions (a partition's name
reaches its topic's). ``get_*`` shows the topic's own value (None when it has none, as
pulsar-admin prints ``null``) or, with ``applied``, the value in force.
"""

from __future__ import annotations

from typing import Any

from filepulsar.connector.admin.args import as_topic, parse_seconds
from filepulsar.connector.admin.namespaces import (
    delayed_delivery_values,
    message_size,
    retention_values,
)
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.policies import (
    effective_policies,
    remove_topic_policies,
    set_topic_policies,
    topic_overrides,
)
from filepulsar.storage.topics import require_topic

_RETENTION = ("retention_time_minutes", "retention_size_mb")
_DELAYED = ("delayed_delivery_enabled", "delayed_delivery_tick_ms", "delayed_delivery_max_delay_ms")


class TopicPolicies:
    """``admin.topic_policies()``: retention, message TTL, delayed delivery and the max
    message size of one topic (pulsar-admin ``topicPolicies``)."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store

    def _set(self, topic: str, **values: Any) -> None:
        t = as_topic(topic)
        require_topic(self.store, t.base)
        set_topic_policies(self.store, t, **values)

    def _remove(self, topic: str, *names: str) -> None:
        t = as_topic(topic)
        require_topic(self.store, t.base)
        remove_topic_policies(self.store, t, *names)

    def _view(self, topic: str, names: tuple[str, ...], applied: bool) -> dict[str, Any] | None:
        """The topic's own values of ``names`` (None if it sets none), or those in force."""
        t = as_topic(topic)
        require_topic(self.store, t.base)
        if applied:
            full = effective_policies(self.store, t).__dict__
            return {n: full[n] for n in names}
        own = topic_overrides(self.store, t)
        if not any(n in own for n in names):
            return None
        defaults = effective_policies(self.store, t).__dict__
        return {n: own.get(n, defaults[n]) for n in names}

    # ------------------------------------------------------------------ retention
    def set_retention(self, topic: str, time: str | int, size: str | int) -> dict[str, int]:
        """As ``namespaces().set_retention``, for this topic only; returns what was stored."""
        minutes, mb = retention_values(time, size)
        self._set(topic, retention_time_minutes=minutes, retention_size_mb=mb)
        return {"retentionTimeInMinutes": minutes, "retentionSizeInMB": mb}

    def get_retention(self, topic: str, applied: bool = False) -> dict[str, int] | None:
        v = self._view(topic, _RETENTION, applied)
        if v is None:
            return None
        return {
            "retentionTimeInMinutes": v["retention_time_minutes"],
            "retentionSizeInMB": v["retention_size_mb"],
        }

    def remove_retention(self, topic: str) -> None:
        self._remove(topic, *_RETENTION)

    # ------------------------------------------------------------------ message TTL
    def set_message_ttl(self, topic: str, ttl: str | int) -> int:
        seconds = parse_seconds(ttl, "message TTL")
        self._set(topic, message_ttl_seconds=seconds)
        return seconds

    def get_message_ttl(self, topic: str, applied: bool = False) -> int | None:
        v = self._view(topic, ("message_ttl_seconds",), applied)
        return None if v is None else int(v["message_ttl_seconds"])

    def remove_message_ttl(self, topic: str) -> None:
        self._remove(topic, "message_ttl_seconds")

    # ------------------------------------------------------------------ delayed delivery
    def set_delayed_delivery(
        self,
        topic: str,
        enabled: bool,
        tick_time: str | int | None = None,
        max_delay: str | int | None = None,
    ) -> None:
        """On or off, the tick and (PIP-315) the longest delay a producer may ask for."""
        self._set(topic, **delayed_delivery_values(enabled, tick_time, max_delay))

    def get_delayed_delivery(self, topic: str, applied: bool = False) -> dict[str, Any] | None:
        """Pulsar's ``DelayedDeliveryPolicies``: ``active``, ``tickTime``,
        ``maxDeliveryDelayInMillis``."""
        v = self._view(topic, _DELAYED, applied)
        if v is None:
            return None
        return {
            "active": v["delayed_delivery_enabled"],
            "tickTime": v["delayed_delivery_tick_ms"],
            "maxDeliveryDelayInMillis": v["delayed_delivery_max_delay_ms"],
        }

    def remove_delayed_delivery(self, topic: str) -> None:
        self._remove(topic, *_DELAYED)

    # ------------------------------------------------------------------ max message size
    def set_max_message_size(self, topic: str, size: str | int) -> int:
        value = message_size(size)
        self._set(topic, max_message_size=value)
        return value

    def get_max_message_size(self, topic: str, applied: bool = False) -> int | None:
        v = self._view(topic, ("max_message_size",), applied)
        return None if v is None else int(v["max_message_size"])

    def remove_max_message_size(self, topic: str) -> None:
        self._remove(topic, "max_message_size")
