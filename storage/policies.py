"""Namespace and topic policies, stored as JSON in the tree.

A topic's effective policies are the defaults, overridden by its namespace's file, overridden by
the topic's own file (a partition reads its partitioned topic's file). Only the fields a file
names override; an unknown field or a bad value is an error that names the file and the allowed
names or values.

A policy file is framed like the manifest (a compact JSON line, then ``crc32c=<8 hex>`` over
it); files written before the framing (plain JSON) are still read, and rewritten framed by the
next ``set_*_policies``.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, fields
from typing import Any

from filepulsar.storage import jsontext, paths
from filepulsar.storage.blobstore import BlobNotFound
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.errors import CorruptDataError, InvalidConfiguration, NotAllowedError
from filepulsar.storage.names import TopicName

#: Pulsar's schema compatibility strategies (``filepulsar.storage.schemas`` applies them).
SCHEMA_STRATEGIES = (
    "ALWAYS_COMPATIBLE",
    "ALWAYS_INCOMPATIBLE",
    "BACKWARD",
    "FORWARD",
    "FULL",
    "BACKWARD_TRANSITIVE",
    "FORWARD_TRANSITIVE",
    "FULL_TRANSITIVE",
)
DEFAULT_MAX_MESSAGE_SIZE = 5 * 1024 * 1024
#: The format's bound on ``max_message_size``: a message must fit in one entry's payload
#: (``filepulsar.storage.entry.MAX_PAYLOAD_SIZE``) with room for its properties.
MAX_MESSAGE_SIZE_LIMIT = 128 * 1024 * 1024


@dataclass(frozen=True)
class Policies:
    """Effective policies of a topic. Units are in the field names.

    Retention follows Pulsar: 0/0 keeps nothing once every durable subscription consumed it;
    -1 means unlimited. ``message_ttl_seconds`` 0 disables TTL. ``delayed_delivery_max_delay_ms``
    is Pulsar's ``maxDeliveryDelayInMillis`` (PIP-315): a producer's message whose delivery
    time is further than that past its publish time is refused (0: no limit). Ledger rollover
    limits apply to the managed ledger (Pulsar's ``managedLedgerMaxEntriesPerLedger`` and friends);
    ``ledger_max_fragments`` bounds the manifest's size and is ours. The schema policies are
    Pulsar's (``schemaCompatibilityStrategy`` with the broker's default ``FULL``,
    ``isAllowAutoUpdateSchema``, ``schemaValidationEnforced``: whether a producer without a
    schema may write to a topic that has one); ``filepulsar.storage.schemas`` applies them.

    What the manifest remembers is bounded too: a producer's dedup entry is dropped once it has
    no lease and published nothing for ``dedup_producer_inactivity_minutes`` (Pulsar's
    ``brokerDeduplicationProducerInactivityTimeoutMinutes``, 6 h by default); a Spark query's
    last committed batch id is dropped once unused for ``sink_batches_max_age_minutes`` (7
    days) or beyond the ``sink_batches_max`` most recently used queries (ours: a query
    restarted after that replays its last batch as new rows). A subscription stores at most
    ``max_unacked_ranges_to_persist`` individually acknowledged ranges beyond its mark-delete
    position (Pulsar's ``managedLedgerMaxUnackedRangesToPersist``, 10,000): the acknowledgements
    in ranges beyond the cap (the farthest from the mark-delete position) are dropped and
    those messages delivered again, as Pulsar redelivers them after its cursor is recovered.
    """

    retention_time_minutes: int = 0
    retention_size_mb: int = 0
    message_ttl_seconds: int = 0
    deduplication_enabled: bool = False
    delayed_delivery_enabled: bool = True
    delayed_delivery_tick_ms: int = 1000
    delayed_delivery_max_delay_ms: int = 0
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    allow_auto_topic_creation: bool = True
    auto_topic_creation_type: str = "non-partitioned"
    default_num_partitions: int = 1
    ledger_max_entries: int = 50000
    ledger_max_size_mb: int = 1024
    ledger_max_age_minutes: int = 240
    ledger_max_fragments: int = 256
    producer_lease_ms: int = 30000
    subscription_expiration_minutes: int = 0
    schema_compatibility_strategy: str = "FULL"
    is_allow_auto_update_schema: bool = True
    schema_validation_enforced: bool = False
    dedup_producer_inactivity_minutes: int = 360
    sink_batches_max: int = 1000
    sink_batches_max_age_minutes: int = 10080
    max_unacked_ranges_to_persist: int = 10000

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type in ("bool", bool):
                if not isinstance(v, bool):
                    raise InvalidConfiguration(f"policy {f.name} must be true or false, got {v!r}")
            elif f.type in ("str", str):
                if not isinstance(v, str):
                    raise InvalidConfiguration(f"policy {f.name} must be a string, got {v!r}")
            elif not isinstance(v, int) or isinstance(v, bool):
                raise InvalidConfiguration(f"policy {f.name} must be an integer, got {v!r}")
        for name in ("retention_time_minutes", "retention_size_mb"):
            if getattr(self, name) < -1:
                raise InvalidConfiguration(
                    f"policy {name} must be >= -1, got {getattr(self, name)}"
                )
        positive = (
            "delayed_delivery_tick_ms",
            "max_message_size",
            "default_num_partitions",
            "ledger_max_entries",
            "ledger_max_size_mb",
            "ledger_max_age_minutes",
            "ledger_max_fragments",
            "producer_lease_ms",
            "dedup_producer_inactivity_minutes",
            "sink_batches_max",
            "sink_batches_max_age_minutes",
            "max_unacked_ranges_to_persist",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise InvalidConfiguration(f"policy {name} must be > 0, got {getattr(self, name)}")
        if self.max_message_size > MAX_MESSAGE_SIZE_LIMIT:
            raise InvalidConfiguration(
                f"policy max_message_size must be <= {MAX_MESSAGE_SIZE_LIMIT} (the format's "
                f"limit; larger messages need chunking), got {self.max_message_size}"
            )
        for name in (
            "message_ttl_seconds",
            "subscription_expiration_minutes",
            "delayed_delivery_max_delay_ms",
        ):
            if getattr(self, name) < 0:
                raise InvalidConfiguration(f"policy {name} must be >= 0, got {getattr(self, name)}")
        if self.auto_topic_creation_type not in ("non-partitioned", "partitioned"):
            raise InvalidConfiguration(
                "policy auto_topic_creation_type must be 'non-partitioned' or 'partitioned', "
                f"got {self.auto_topic_creation_type!r}"
            )

        if self.schema_compatibility_strategy not in SCHEMA_STRATEGIES:
            raise InvalidConfiguration(
                "policy schema_compatibility_strategy must be one of "
                f"{', '.join(SCHEMA_STRATEGIES)}, got {self.schema_compatibility_strategy!r}"
            )

    def merged(self, overrides: dict[str, Any]) -> Policies:
        """A copy with ``overrides`` applied; unknown names raise InvalidConfiguration."""
        check_policy_names(overrides)
        return dataclasses.replace(self, **overrides)


POLICY_NAMES = tuple(f.name for f in fields(Policies))


def check_policy_names(overrides: dict[str, Any]) -> None:
    unknown = sorted(set(overrides) - set(POLICY_NAMES))
    if unknown:
        raise InvalidConfiguration(
            f"unknown policy {', '.join(unknown)}: allowed are {', '.join(POLICY_NAMES)}"
        )


def _read(store: BlobStore, key: str) -> dict[str, Any]:
    """The overrides stored in ``key`` ({} if there is no file), checked: the names are known
    and the values allowed. Errors name the file."""
    try:
        raw = store.get(key)
    except BlobNotFound:
        return {}
    known = _PARSED.get(raw)
    if known is not None:
        return dict(known)
    where = f"policy file {store.url(key)}"
    if jsontext.is_framed(raw):
        data = jsontext.decode_framed(raw, where)
    else:  # written before policy files were framed
        try:
            data = jsontext.loads(raw)
        except ValueError as e:
            # Damage: a framed file whose checksum line lost a character reads as unframed
            raise CorruptDataError(f"{where} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise InvalidConfiguration(f"{where} must hold a JSON object")
    _check(data, where)
    if len(_PARSED) >= _MAX_PARSED:
        _PARSED.clear()
    _PARSED[raw] = dict(data)
    return data


_PARSED: dict[bytes, dict[str, Any]] = {}
"""Policy files this process read and found valid, by their bytes: every consumer and
producer made reads its topic's two policy files (a process subscribing 10 clients to 30
topics reads them 600 times), and parsing and checking them again costs more than the read."""
_MAX_PARSED = 256


def _check(overrides: dict[str, Any], where: str) -> None:
    try:
        Policies().merged(overrides)
    except InvalidConfiguration as e:
        raise InvalidConfiguration(f"{where}: {e}") from e


def _write(store: BlobStore, key: str, overrides: dict[str, Any], replace: bool) -> None:
    current = {} if replace else _read(store, key)
    current.update(overrides)
    _check(current, f"policies for {store.url(key)} (nothing stored)")
    store.put(key, jsontext.encode_framed(current))


def set_namespace_policies(
    store: BlobStore, tenant: str, namespace: str, replace: bool = False, **overrides: Any
) -> None:
    """Set namespace policies (merged into the stored ones unless ``replace``)."""
    _write(store, paths.namespace_policies(tenant, namespace), overrides, replace)


def set_topic_policies(
    store: BlobStore, topic: TopicName | str, replace: bool = False, **overrides: Any
) -> None:
    """Set topic-level overrides (a partition uses its partitioned topic's)."""
    t = TopicName.parse(topic) if isinstance(topic, str) else topic
    _write(store, paths.topic_policies(t.base), overrides, replace)


def _remove(store: BlobStore, key: str, names: tuple[str, ...]) -> None:
    check_policy_names(dict.fromkeys(names))
    current = _read(store, key)
    if not any(n in current for n in names):
        return
    for n in names:
        current.pop(n, None)
    store.put(key, jsontext.encode_framed(current))


def remove_namespace_policies(store: BlobStore, tenant: str, namespace: str, *names: str) -> None:
    """Drop overrides from a namespace's policies (they fall back to the defaults)."""
    _remove(store, paths.namespace_policies(tenant, namespace), names)


def remove_topic_policies(store: BlobStore, topic: TopicName | str, *names: str) -> None:
    """Drop a topic's overrides (they fall back to its namespace's)."""
    t = TopicName.parse(topic) if isinstance(topic, str) else topic
    _remove(store, paths.topic_policies(t.base), names)


def topic_overrides(store: BlobStore, topic: TopicName | str) -> dict[str, Any]:
    """The overrides stored for a topic (its partitioned topic's for a partition; {} if
    none)."""
    t = TopicName.parse(topic) if isinstance(topic, str) else topic
    return _read(store, paths.topic_policies(t.base))


def namespace_overrides(store: BlobStore, tenant: str, namespace: str) -> dict[str, Any]:
    """The overrides stored for a namespace (checked; {} if none)."""
    return _read(store, paths.namespace_policies(tenant, namespace))


def namespace_policies(store: BlobStore, tenant: str, namespace: str) -> Policies:
    return Policies().merged(_read(store, paths.namespace_policies(tenant, namespace)))


def effective_policies(store: BlobStore, topic: TopicName) -> Policies:
    """Defaults ← namespace file ← topic file."""
    ns = _read(store, paths.namespace_policies(topic.tenant, topic.namespace))
    tp = _read(store, paths.topic_policies(topic.base))
    return _with_overrides(tuple(sorted({**ns, **tp}.items())))


@functools.lru_cache(maxsize=256)
def _with_overrides(overrides: tuple[tuple[str, Any], ...]) -> Policies:
    """The defaults with ``overrides`` (checked, so their values are hashable scalars)
    applied; remembered (:class:`Policies` is frozen)."""
    return Policies().merged(dict(overrides))


def check_max_delay(limit_ms: int, deliver_at: int, now: int, where: str) -> None:
    """Refuse a delivery time more than ``limit_ms`` (the topic's
    ``delayed_delivery_max_delay_ms``; 0: no limit) past ``now``, as Pulsar's broker refuses
    such a message (PIP-315). The one rule the producer, ``send_table`` and the Spark sink
    apply; ``where`` names the topic (and, for the sink, the job).

    Raises
    ------
    NotAllowedError
        With Pulsar's wording ("Exceeds max allowed delivery delay of ... milliseconds").
    """
    delay = deliver_at - now
    if limit_ms > 0 and delay > limit_ms:
        raise NotAllowedError(
            f"Exceeds max allowed delivery delay of {limit_ms} milliseconds on {where}: "
            f"the message asks for {delay} ms; send it with a delay of at most {limit_ms} ms "
            "(policy delayed_delivery_max_delay_ms)"
        )
