"""Namespace policies in the JSON shape ``pulsar-admin namespaces policies`` prints
(Pulsar's ``Policies`` class, its field names and nesting), from the overrides stored for a
namespace.

As pulsar-admin, only what was set on the namespace is shown (Pulsar leaves unset fields
out): a user who set a retention sees ``retention_policies``, one who set nothing sees
``{}``-like output with the fields Pulsar always prints. Policies Pulsar has no namespace
field for (ledger rollover, leases, the Spark sink's bookkeeping, the max message size)
appear under ``filepulsar`` with their own names. Caller: ``Namespaces.get_pulsar_policies``.
"""

from __future__ import annotations

from typing import Any

from filepulsar.storage.policies import Policies

#: Our policy name → Pulsar's top-level field, where the value maps one to one.
_SAME: dict[str, str] = {
    "message_ttl_seconds": "message_ttl_in_seconds",
    "deduplication_enabled": "deduplicationEnabled",
    "subscription_expiration_minutes": "subscription_expiration_time_minutes",
    "schema_compatibility_strategy": "schema_compatibility_strategy",
    "is_allow_auto_update_schema": "is_allow_auto_update_schema",
    "schema_validation_enforced": "schema_validation_enforced",
}

#: Our policy names grouped into one Pulsar object each (the object appears when any is set).
_GROUPS: dict[str, dict[str, str]] = {
    "retention_policies": {
        "retention_time_minutes": "retentionTimeInMinutes",
        "retention_size_mb": "retentionSizeInMB",
    },
    "delayed_delivery_policies": {
        "delayed_delivery_tick_ms": "tickTime",
        "delayed_delivery_enabled": "active",
        "delayed_delivery_max_delay_ms": "maxDeliveryDelayInMillis",
    },
    "autoTopicCreationOverride": {
        "allow_auto_topic_creation": "allowAutoTopicCreation",
        "auto_topic_creation_type": "topicType",
        "default_num_partitions": "defaultNumPartitions",
    },
}


def pulsar_policies(overrides: dict[str, Any]) -> dict[str, Any]:
    """Pulsar's ``Policies`` JSON for a namespace's stored ``overrides`` (our names)."""
    full = Policies().merged(overrides).__dict__
    out: dict[str, Any] = {
        "deleted": False,
        "encryption_required": False,
        "schema_compatibility_strategy": "UNDEFINED",
        "schema_validation_enforced": False,
    }
    for ours, theirs in _SAME.items():
        if ours in overrides:
            out[theirs] = overrides[ours]
    for obj, names in _GROUPS.items():
        if any(n in overrides for n in names):
            out[obj] = {theirs: full[ours] for ours, theirs in names.items() if ours in full}
    known = set(_SAME) | {n for names in _GROUPS.values() for n in names}
    ours_only = {k: v for k, v in sorted(overrides.items()) if k not in known}
    if ours_only:
        out["filepulsar"] = ours_only
    return dict(sorted(out.items()))
