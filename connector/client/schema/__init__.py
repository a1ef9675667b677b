"""Schemas of message values: pulsar-client's ``pulsar.schema`` (records, fields, schemas).

A :class:`Record` subclass declares typed fields; :class:`JsonSchema` and :class:`AvroSchema`
turn its instances into bytes and back, :class:`StringSchema` and :class:`BytesSchema` do the
same for ``str`` and ``bytes``. Give a schema to ``Client.create_producer``, ``subscribe`` or
``create_reader``: the producer registers it in the topic's schema registry
(``filepulsar.storage.schemas``, checked for compatibility per the namespace's strategy) and stamps
its version on every message; a consumer's or reader's schema is checked against the topic's, or
registered on an idle topic with none (as Pulsar's broker does); ``Message.value()`` decodes
with the consumer's schema, reading Avro data through the writer's schema version so evolved
schemas resolve. :class:`AutoConsumeSchema` and :class:`AutoProduceBytesSchema` are Pulsar's
``AUTO_CONSUME`` and ``AUTO_PRODUCE_BYTES`` (not in pulsar-client's Python library).

Decoding builds records with a function made once per record class
(:func:`~filepulsar.connector.client.schema.record._make_builder`), so a message costs about
what decoding its data costs.

The declared shape is Pulsar's: ``Record.schema()`` is the Avro record schema pulsar-client
derives (a field not ``required`` is a union with ``"null"``; ``required_default=True`` writes
the field's default into the schema; ``_sorted_fields`` sorts fields by name; ``_avro_namespace``
sets the namespace). Differences from pulsar-client, on purpose: a keyword argument naming no
field raises ``TypeError`` (pulsar-client ignores it), and JSON is written compactly.

The names live by concept and are re-exported here: field types in
:mod:`~filepulsar.connector.client.schema.fields`, records and their containers in
:mod:`~filepulsar.connector.client.schema.record`, the value schemas in
:mod:`~filepulsar.connector.client.schema.codecs`, the AUTO schemas in
:mod:`~filepulsar.connector.client.schema.auto`. This module owns binding a schema to a topic
(:func:`check_schema_arg`, :func:`register_for_producer`, :func:`bind_for_reading`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Re-exported: the public schema API (this module's ``__all__``, also ``filepulsar.schema``'s);
# the binding below uses some of them too.
from filepulsar.connector.client.schema.auto import (
    AutoConsumeSchema,
    AutoProduceBytesSchema,
    bytes_check,
)
from filepulsar.connector.client.schema.codecs import (
    AvroSchema,
    BytesSchema,
    JsonSchema,
    ProtobufNativeSchema,
    Schema,
    SchemaInfo,
    SchemaType,
    StringSchema,
)
from filepulsar.connector.client.schema.fields import (
    Boolean,
    Bytes,
    CustomEnum,
    Double,
    Field,
    Float,
    Integer,
    Long,
    Null,
    String,
)
from filepulsar.connector.client.schema.record import Array, Map, Record
from filepulsar.dispatch.clock import wall_ms
from filepulsar.storage.errors import IncompatibleSchema, InvalidConfiguration

__all__ = [
    "Array",
    "AutoConsumeSchema",
    "AutoProduceBytesSchema",
    "AvroSchema",
    "Boolean",
    "Bytes",
    "BytesSchema",
    "CustomEnum",
    "Double",
    "Field",
    "Float",
    "Integer",
    "JsonSchema",
    "Long",
    "Map",
    "Null",
    "ProtobufNativeSchema",
    "Record",
    "Schema",
    "SchemaInfo",
    "SchemaType",
    "String",
    "StringSchema",
]


# ----------------------------------------------------------------------------- binding
def check_schema_arg(schema: Any, *, producer: bool) -> Schema | None:
    """``schema`` as a client call takes it: None or a :class:`Schema`.

    A producer's :class:`BytesSchema` is kept: it registers the ``BYTES`` type, so the topic
    then refuses producers of other types, as pulsar-client's own tests expect. A consumer's
    or reader's :class:`BytesSchema` is None: it reads any topic's values as bytes.

    Raises
    ------
    InvalidConfiguration
        (a ``ValueError``) If it is something else.
    """
    if schema is None:
        return None
    if not isinstance(schema, Schema):
        raise InvalidConfiguration(
            "schema must be a filepulsar.schema schema (BytesSchema(), StringSchema(), "
            f"JsonSchema(RecordClass), AvroSchema(RecordClass)), got {schema!r}"
        )
    if isinstance(schema, BytesSchema) and not producer:
        return None
    if isinstance(schema, AutoConsumeSchema) and producer:
        raise InvalidConfiguration(
            "AutoConsumeSchema is for subscribe and create_reader; a producer of encoded bytes "
            "takes AutoProduceBytesSchema()"
        )
    if isinstance(schema, AutoProduceBytesSchema) and not producer:
        raise InvalidConfiguration(
            "AutoProduceBytesSchema is for create_producer; a consumer or reader of any "
            "schema takes AutoConsumeSchema()"
        )
    return schema


def register_for_producer(
    store: Any, topic: Any, schema: Schema | None, policies: Any
) -> tuple[bytes, Schema | None]:
    """Register a producer's schema in ``topic``'s registry: the version bytes to stamp and
    the schema the producer encodes with (for :class:`AutoProduceBytesSchema`, a copy bound
    to the topic's latest schema version, or to its own ``schema`` registered as a producer's).

    A producer without a schema writes unstamped bytes; that is refused on a topic with a
    schema only when the ``schema_validation_enforced`` policy is on (as in Pulsar).

    Raises
    ------
    IncompatibleSchema
        Per ``filepulsar.storage.schemas``.
    """
    from filepulsar.storage.schemas import SchemaRegistry, version_bytes

    registry = SchemaRegistry(store, topic)
    if isinstance(schema, AutoProduceBytesSchema) and schema._given is None:
        latest = registry.latest()
        if latest is None:
            return b"", schema._bound(None, "")
        against = f"topic {topic.base}'s schema version {latest.version} ({latest.type})"
        return version_bytes(latest.version), schema._bound(bytes_check(latest), against)
    if schema is None:
        if policies.schema_validation_enforced and registry.latest() is not None:
            raise IncompatibleSchema(
                f"topic {topic.base} has a schema and schema_validation_enforced is on: a "
                "producer without a schema may not write to it"
            )
        return b"", None
    own = schema._given if isinstance(schema, AutoProduceBytesSchema) else schema
    assert own is not None
    info = own.schema_info()
    stored = registry.register(
        info.schema_type().value,
        info.schema(),
        info.name(),
        strategy=policies.schema_compatibility_strategy,
        allow_auto_update=policies.is_allow_auto_update_schema,
    )
    if isinstance(schema, AutoProduceBytesSchema):
        against = f"{own} (topic {topic.base}'s schema version {stored.version})"
        return version_bytes(stored.version), schema._bound(bytes_check(stored), against)
    return version_bytes(stored.version), schema


def _topic_in_use(store: Any, topic: Any, now: int) -> str:
    """Why ``topic`` is in use, as Pulsar's broker decides before letting a consumer register
    a schema ("" if it is idle): it holds data, or a producer or consumer is connected (a
    lease live at ``now``, ms since the epoch)."""
    from filepulsar.storage.errors import SubscriptionNotFound
    from filepulsar.storage.manifest import ManifestStore
    from filepulsar.storage.subscriptions import SubscriptionStore, list_subscriptions
    from filepulsar.storage.topics import managed_ledgers

    for t in managed_ledgers(store, topic):
        ms = ManifestStore(store, t)
        if not ms.exists():
            continue
        state = ms.latest()
        if any(lg.entries for lg in state.ledgers):
            return f"{t} holds messages"
        if any(lease.expires_ms > now for lease in state.producers.values()):
            return f"{t} has a connected producer"
        for sub in list_subscriptions(store, t):
            try:
                live = SubscriptionStore(store, t, sub).latest().live_consumers(now)
            except SubscriptionNotFound:
                continue
            if live:
                return f"subscription {sub!r} of {t} has a connected consumer"
    return ""


def bind_for_reading(
    store: Any,
    topic: Any,
    schema: Schema | None,
    policies: Any,
    *,
    role: str = "consumer",
    clock: Callable[[], int] = wall_ms,
) -> None:
    """Check a consumer's or reader's schema against ``topic``'s and let it look up writer
    versions (for Avro resolution and :class:`AutoConsumeSchema`).

    As Pulsar's broker: on a topic with no schema, the schema is registered if the topic is
    idle (no data, no connected producer or consumer) and the namespace allows auto-update;
    a topic in use without a schema refuses a consumer with one (there is nothing to check
    it against) unless the strategy is ``ALWAYS_COMPATIBLE``. :class:`AutoConsumeSchema`
    neither registers nor is checked.

    Raises
    ------
    IncompatibleSchema
        If the schema cannot read the topic's (per the compatibility strategy), or cannot be
        registered (auto-update off, or the topic in use without a schema).
    """
    if schema is None:
        return
    from filepulsar.storage.names import TopicName
    from filepulsar.storage.schemas import SchemaRegistry

    registry = SchemaRegistry(store, topic)
    if not isinstance(schema, AutoConsumeSchema):
        info = schema.schema_info()
        type_, definition = info.schema_type().value, info.schema()
        strategy = policies.schema_compatibility_strategy
        if registry.latest() is None:
            busy = _topic_in_use(store, topic, clock())
            if not busy:
                registry.register(
                    type_,
                    definition,
                    info.name(),
                    strategy=strategy,
                    allow_auto_update=policies.is_allow_auto_update_schema,
                    role=role,
                )
            elif strategy != "ALWAYS_COMPATIBLE":
                raise IncompatibleSchema(
                    f"{role} schema {type_} cannot be checked against topic {topic.base}: the "
                    f"topic has no schema and is in use ({busy}), so no schema is registered "
                    f"for it (strategy {strategy}; as Pulsar: read it without a schema, with "
                    "AutoConsumeSchema, or register one with Admin.schemas().create_schema)"
                )
        else:
            registry.check_reader(type_, definition, strategy=strategy, role=role)
    registries: dict[str, SchemaRegistry] = {str(registry.topic): registry}

    def stored_version(topic_name: str, version: int) -> Any:
        t = TopicName.parse(topic_name).base
        reg = registries.get(str(t))
        if reg is None:
            reg = registries[str(t)] = SchemaRegistry(store, t)
        return reg.get(version)

    def lookup(topic_name: str, version: int) -> Any:
        stored = stored_version(topic_name, version)
        return stored.parsed() if stored.type in ("AVRO", "JSON") else None

    schema.bind_versions(lookup, stored_version)
