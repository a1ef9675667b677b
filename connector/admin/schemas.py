"""``admin.schemas()``: a topic's value schema versions, shown, added and deleted as
pulsar-admin's ``schemas`` group does."""

from __future__ import annotations

import builtins
import json
from typing import Any

from filepulsar.connector.admin.args import as_topic
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.errors import (
    IncompatibleSchema,
    InvalidConfiguration,
)
from filepulsar.storage.policies import effective_policies
from filepulsar.storage.schemas import (
    RECORD_TYPES,
    SCHEMA_TYPES,
    SchemaRegistry,
    StoredSchema,
)
from filepulsar.storage.topics import require_topic


class Schemas:
    """``admin.schemas()``: a topic's value schema versions (pulsar-admin ``schemas``).

    A schema is shown as pulsar-admin prints it: ``{"version", "type", "schema", "timestamp"}``
    with ``schema`` the definition text (an Avro record schema for ``AVRO`` and ``JSON``).
    """

    def __init__(self, store: BlobStore) -> None:
        self.store = store

    def _registry(self, topic: str) -> SchemaRegistry:
        t = as_topic(topic)
        require_topic(self.store, t.base)
        return SchemaRegistry(self.store, t)

    @staticmethod
    def _show(s: StoredSchema) -> dict[str, Any]:
        return {
            "version": s.version,
            "type": s.type,
            "schema": s.definition,
            "timestamp": s.timestamp_ms,
        }

    def get_schema(self, topic: str, version: int | None = None) -> dict[str, Any]:
        """The newest version (or ``version``) of the topic's schema.

        Raises
        ------
        TopicNotFound
            If the topic does not exist.
        IncompatibleSchema
            If it has no schema (or no such version).
        """
        reg = self._registry(topic)
        if version is None:
            latest = reg.latest()
            if latest is None:
                raise IncompatibleSchema(f"topic {as_topic(topic)} has no schema")
            return self._show(latest)
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise InvalidConfiguration(f"schema version must be an integer >= 0, got {version!r}")
        return self._show(reg.get(version))

    def get_all_versions(self, topic: str) -> builtins.list[dict[str, Any]]:
        """Every version of the topic's schema, oldest first ([] if it has none)."""
        return [self._show(s) for s in self._registry(topic).versions()]

    def create_schema(self, topic: str, schema_type: str, definition: str = "") -> int:
        """Add a schema version as a producer would (pulsar-admin ``schemas upload``),
        checked against the topic's compatibility strategy; returns its version (the existing
        one if an equal schema is stored).

        Raises
        ------
        IncompatibleSchema
            If the strategy does not allow it.
        InvalidConfiguration
            For an unknown type or a definition that is not JSON.
        """
        if schema_type not in SCHEMA_TYPES:
            raise InvalidConfiguration(
                f"schema type {schema_type!r} is not allowed: use one of {', '.join(SCHEMA_TYPES)}"
            )
        if schema_type in RECORD_TYPES:
            try:
                parsed = json.loads(definition)
            except ValueError as e:
                raise InvalidConfiguration(f"a {schema_type} schema must be JSON: {e}") from e
            if not isinstance(parsed, dict) or parsed.get("type") != "record":
                raise InvalidConfiguration(
                    f"a {schema_type} schema must be an Avro record schema "
                    '({"type": "record", "name": ..., "fields": [...]})'
                )
        t = as_topic(topic)
        pol = effective_policies(self.store, t)
        reg = self._registry(topic)
        stored = reg.register(
            schema_type,
            definition if schema_type in RECORD_TYPES else "",
            schema_type,
            strategy=pol.schema_compatibility_strategy,
            allow_auto_update=True,
        )
        return stored.version

    def delete_schema(self, topic: str) -> int:
        """Delete the topic's schema (pulsar-admin ``schemas delete``): a deletion marker is
        added as the next version, so no version number is ever reused; returns how many
        versions were in force. Messages already written are still read through the schema
        version they were written with (those versions stay stored); the next producer with a
        schema registers it as if the topic had none."""
        return self._registry(topic).delete()
