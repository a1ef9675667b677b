"""A topic's schema registry: the versioned schemas its producers declared.

Pulsar keeps one schema history per topic (a partitioned topic's partitions share it). Here it
lives in ``<topic>/schema/<version>.json`` under the partitioned (base) topic, one immutable,
framed file per version (``jsontext.encode_framed``), written with put-if-absent: two producers
registering different schemas at once get consecutive versions or one of them is re-checked
against the other's. A message written with a schema carries its version in the entry header
(``schema_version``, 8 bytes big-endian, as Pulsar's message metadata); a consumer decodes it
with the writer's schema fetched from here. Deleting the schema adds a deletion marker as the
next version (as Pulsar does): the versions before it stop counting for compatibility but stay
stored for the messages they wrote, and version numbers are never reused.

Compatibility follows Pulsar's strategies (the namespace/topic policy
``schema_compatibility_strategy``, default ``FULL``, Pulsar's broker default):

- ``ALWAYS_COMPATIBLE``: any new schema is accepted; ``ALWAYS_INCOMPATIBLE``: none is.
- ``BACKWARD``: the new schema can read data written with the latest one; ``FORWARD``: the
  latest can read data written with the new one; ``FULL``: both. The ``*_TRANSITIVE`` forms
  check every stored version, not only the latest.
- Schemas of different types (``AVRO`` vs ``JSON`` vs ``STRING`` ...) are incompatible unless
  the strategy is ``ALWAYS_COMPATIBLE``. ``PROTOBUF_NATIVE`` schemas are compatible when their
  root message type is the same. ``AVRO`` and ``JSON`` definitions are Avro record
  schemas and are compared by Avro's schema-resolution rules (:func:`can_read`).

A new schema is added only while ``is_allow_auto_update_schema`` is true (Pulsar's default);
otherwise a producer with an unknown schema gets :class:`IncompatibleSchema`, also on a topic
with no schema yet (as in Pulsar: the admin API's ``create_schema`` adds one then). The first
consumer or reader of an idle topic with no schema registers its schema the same way
(:meth:`SchemaRegistry.register` with ``role``; the client decides idleness); later ones are
checked with :meth:`SchemaRegistry.check_reader`.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

from filepulsar.dispatch.clock import wall_ms
from filepulsar.storage import jsontext, paths
from filepulsar.storage.blobstore import BlobNotFound
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.errors import CorruptDataError, IncompatibleSchema, InvalidConfiguration
from filepulsar.storage.names import TopicName
from filepulsar.storage.policies import SCHEMA_STRATEGIES

#: Schema types with an Avro record definition (compared field by field).
RECORD_TYPES = ("AVRO", "JSON")
#: Types a schema may have (Pulsar's ``SchemaType`` names that filepulsar's client can write).
SCHEMA_TYPES = ("BYTES", "STRING", "JSON", "AVRO", "PROTOBUF_NATIVE")
STRATEGIES = SCHEMA_STRATEGIES


def version_bytes(version: int) -> bytes:
    """A schema version as stored in an entry header (8 bytes, big-endian; Pulsar's form)."""
    return version.to_bytes(8, "big", signed=True)


def version_of(raw: bytes) -> int:
    """The schema version an entry header holds (-1 if it holds none)."""
    if not raw:
        return -1
    return int.from_bytes(raw, "big", signed=True)


@dataclass(frozen=True, slots=True)
class StoredSchema:
    """One version of a topic's schema. ``definition`` is the schema text (JSON for ``AVRO``
    and ``JSON``; empty for ``STRING`` and ``BYTES``). A ``deleted`` version is the marker
    a schema deletion leaves (Pulsar's deleted schema): the versions before it no longer
    count for producers and consumers, but stay readable for the messages they wrote, and
    version numbers go on after it."""

    version: int
    type: str
    definition: str
    name: str
    timestamp_ms: int
    deleted: bool = False

    def parsed(self) -> Any:
        return json.loads(self.definition) if self.definition else None

    def same_as(self, type_: str, definition: str) -> bool:
        if type_ != self.type:
            return False
        if not definition and not self.definition:
            return True
        try:
            return bool(json.loads(definition) == self.parsed())
        except ValueError:
            return definition == self.definition

    def encode(self) -> bytes:
        out: dict[str, Any] = {
            "version": self.version,
            "type": self.type,
            "definition": self.definition,
            "name": self.name,
            "timestamp": self.timestamp_ms,
        }
        if self.deleted:
            out["deleted"] = True
        return jsontext.encode_framed(out)

    @classmethod
    def decode(cls, raw: bytes, where: str) -> StoredSchema:
        d = jsontext.decode_framed(raw, where)
        try:
            s = cls(
                int(d["version"]),
                str(d["type"]),
                str(d["definition"]),
                str(d.get("name", "")),
                int(d.get("timestamp", 0)),
                d.get("deleted", False),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptDataError(f"{where}: not a schema version: {e}") from e
        if not isinstance(s.deleted, bool):
            raise CorruptDataError(f"{where}: 'deleted' is not true or false: {s.deleted!r}")
        if s.type not in SCHEMA_TYPES and not s.deleted:
            raise CorruptDataError(f"{where}: unknown schema type {s.type!r}")
        return s


class SchemaRegistry:
    """The schema versions of one topic (a partition uses its partitioned topic's).

    Versions are immutable once written, so they are cached by version; :meth:`versions`
    lists the folder only to find new ones. Thread-safe.
    """

    def __init__(self, store: BlobStore, topic: TopicName) -> None:
        self.store = store
        self.topic = topic.base
        self.folder = paths.schema_dir(self.topic)
        self._cache: dict[int, StoredSchema] = {}
        self._lock = threading.Lock()

    def _key(self, version: int) -> str:
        return paths.versioned_file(self.folder, version)

    def stored(self) -> list[StoredSchema]:
        """Every stored version, deletion markers included, oldest first."""
        found = []
        for key in self.store.list(self.folder):
            v = paths.schema_version_of(key)
            if v is not None:
                found.append(v)
        return [self.get(v) for v in sorted(found)]

    def versions(self) -> list[StoredSchema]:
        """The versions in force, oldest first: those after the last deletion."""
        return _in_force(self.stored())

    def get(self, version: int) -> StoredSchema:
        """Version ``version``.

        Raises
        ------
        IncompatibleSchema
            If the topic has no such version stored.
        """
        with self._lock:
            hit = self._cache.get(version)
        if hit is not None:
            return hit
        key = self._key(version)
        try:
            raw = self.store.get(key)
        except BlobNotFound as e:
            raise IncompatibleSchema(
                f"topic {self.topic} has no schema version {version} ({self.store.url(key)})"
            ) from e
        s = StoredSchema.decode(raw, self.store.url(key))
        if s.version != version:
            raise CorruptDataError(
                f"{self.store.url(key)}: holds schema version {s.version}, not {version}"
            )
        with self._lock:
            self._cache[version] = s
        return s

    def latest(self) -> StoredSchema | None:
        vs = self.versions()
        return vs[-1] if vs else None

    def find(self, type_: str, definition: str) -> StoredSchema | None:
        """The stored version equal to this schema, if any."""
        for s in self.versions():
            if s.same_as(type_, definition):
                return s
        return None

    def register(
        self,
        type_: str,
        definition: str,
        name: str,
        *,
        strategy: str,
        allow_auto_update: bool,
        clock: Any = None,
        role: str = "producer",
    ) -> StoredSchema:
        """The version of this schema, added if new and compatible (a producer's schema, or
        the schema of the first consumer or reader of an idle topic: ``role`` names which in
        errors).

        Raises
        ------
        IncompatibleSchema
            If the schema is new and incompatible with the stored ones under ``strategy``, or
            new while auto-update is off. Nothing is written then.
        """
        check_strategy(strategy)
        while True:
            stored = self.stored()
            existing = _in_force(stored)
            for s in existing:
                if s.same_as(type_, definition):
                    return s
            if not allow_auto_update:
                # As Pulsar: also on a topic with no schema yet (upload one with the admin API).
                raise IncompatibleSchema(
                    f"{role} schema {type_} {name!r} is not among the schemas of topic "
                    f"{self.topic} and is_allow_auto_update_schema is false (add it with "
                    "Admin.schemas().create_schema or turn the policy on)"
                )
            check_compatible(type_, definition, existing, strategy, str(self.topic))
            version = stored[-1].version + 1 if stored else 0
            now = wall_ms() if clock is None else clock()
            s = StoredSchema(version, type_, definition, name, now)
            if self.store.put_if_absent(self._key(version), s.encode()):
                with self._lock:
                    self._cache[version] = s
                return s
            # Another producer added a version meanwhile: check against it too.

    def check_reader(
        self, type_: str, definition: str, *, strategy: str, role: str = "consumer"
    ) -> None:
        """Check a consumer's or reader's schema against the stored ones (nothing stored:
        anything goes). The consumer must be able to read what the strategy lets producers
        write: the latest version, or every version for the transitive strategies.

        Raises
        ------
        IncompatibleSchema
            If it cannot: naming the topic, the strategy, the topic's version it cannot read
            and the version the consumer's schema is in the topic (or that it is in none).
        """
        check_strategy(strategy)
        existing = self.versions()
        if not existing or any(s.same_as(type_, definition) for s in existing):
            return
        if strategy == "ALWAYS_COMPATIBLE":
            return
        against = existing if strategy.endswith("_TRANSITIVE") else existing[-1:]
        ours = (
            f"{role} schema {type_} (in none of topic {self.topic}'s schema versions "
            f"{existing[0].version}..{existing[-1].version})"
        )
        for s in against:
            if s.type != type_:
                problem = f"type {type_} is not {s.type}"
            elif type_ in RECORD_TYPES:
                problem = can_read(json.loads(definition), s.parsed())
            elif type_ == "PROTOBUF_NATIVE":
                problem = _same_root_message(definition, s)
            else:
                problem = ""
            if problem:
                raise IncompatibleSchema(
                    f"{ours} is incompatible with schema version {s.version} ({s.type} "
                    f"{s.name!r}) of topic {self.topic} under strategy {strategy}: it cannot "
                    f"read that version's data: {problem}"
                )

    def delete(self, clock: Any = None) -> int:
        """Delete the schema (pulsar-admin's ``schemas delete``): add a deletion marker as the
        next version, as Pulsar does; how many versions were in force. The versions before
        the marker stay stored, so messages they wrote still decode through their writer's
        schema, and a schema registered later gets a new version number, never a reused one.
        """
        while True:
            stored = self.stored()
            live = _in_force(stored)
            if not live:
                return 0
            now = wall_ms() if clock is None else clock()
            marker = StoredSchema(stored[-1].version + 1, "", "", "", now, deleted=True)
            if self.store.put_if_absent(self._key(marker.version), marker.encode()):
                with self._lock:
                    self._cache[marker.version] = marker
                return len(live)
            # Another registration or deletion took the number: look again.


def _in_force(stored: list[StoredSchema]) -> list[StoredSchema]:
    """The versions after the last deletion marker."""
    for i in range(len(stored) - 1, -1, -1):
        if stored[i].deleted:
            return stored[i + 1 :]
    return stored


def check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise InvalidConfiguration(
            f"schema compatibility strategy {strategy!r} is not allowed: use one of "
            + ", ".join(STRATEGIES)
        )


def check_compatible(
    type_: str, definition: str, existing: list[StoredSchema], strategy: str, topic: str
) -> None:
    """Whether a new schema may follow ``existing`` under ``strategy`` (raises if not)."""
    if not existing or strategy == "ALWAYS_COMPATIBLE":
        return
    if strategy == "ALWAYS_INCOMPATIBLE":
        raise IncompatibleSchema(
            f"topic {topic} has a schema and its strategy is ALWAYS_INCOMPATIBLE: "
            "no other schema may be added"
        )
    against = existing if strategy.endswith("_TRANSITIVE") else existing[-1:]
    base = strategy.removesuffix("_TRANSITIVE")
    new = json.loads(definition) if type_ in RECORD_TYPES else None
    for s in against:
        if s.type != type_:
            raise IncompatibleSchema(
                f"schema of type {type_} is incompatible with topic {topic}'s schema version "
                f"{s.version} of type {s.type} (strategy {strategy})"
            )
        if type_ == "PROTOBUF_NATIVE":
            problem = _same_root_message(definition, s)
            if problem:
                raise IncompatibleSchema(
                    f"schema incompatible with topic {topic} ({strategy}): {problem}"
                )
            continue
        if type_ not in RECORD_TYPES:
            continue
        old = s.parsed()
        checks = []
        if base in ("BACKWARD", "FULL"):
            checks.append(("the new schema cannot read data of", can_read(new, old)))
        if base in ("FORWARD", "FULL"):
            checks.append(("data of the new schema cannot be read by", can_read(old, new)))
        for what, problem in checks:
            if problem:
                raise IncompatibleSchema(
                    f"schema incompatible with topic {topic} ({strategy}): {what} schema "
                    f"version {s.version}: {problem}"
                )


def _same_root_message(definition: str, stored: StoredSchema) -> str:
    """Protobuf-native schemas are compatible when they describe the same root message type
    (Pulsar's ProtobufNativeSchemaCompatibilityCheck; protobuf's own wire rules then let old
    and new fields coexist). Why not ("" if they are)."""
    try:
        new = json.loads(definition).get("rootMessageTypeName")
        old = (stored.parsed() or {}).get("rootMessageTypeName")
    except (ValueError, AttributeError):
        return "a protobuf-native definition is not a JSON object"
    if new != old:
        return f"root message type {new!r} differs from {old!r} of schema version {stored.version}"
    return ""


# ---------------------------------------------------------------------- Avro resolution
_PROMOTIONS = {
    "int": {"int", "long", "float", "double"},
    "long": {"long", "float", "double"},
    "float": {"float", "double"},
    "string": {"string", "bytes"},
    "bytes": {"bytes", "string"},
}
_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


def can_read(reader: Any, writer: Any) -> str:
    """Why data written with Avro schema ``writer`` cannot be read with ``reader`` ("" if it
    can), by the Avro specification's schema-resolution rules: records match fields by name
    (a reader field missing in the writer needs a default), numeric types promote
    (int -> long -> float -> double), string and bytes interchange, every writer union branch
    must be readable, a reader union must hold a branch for the writer's type, and enum
    symbols written must be known to the reader (or it has a default)."""
    return _can_read(reader, writer, {}, {}, "")


def _named(schema: Any, names: dict[str, Any], ns: str) -> Any:
    """Resolve a reference to a named type and register named definitions."""
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return schema
        full = schema if "." in schema or not ns else f"{ns}.{schema}"
        return names.get(full, names.get(schema, schema))
    if isinstance(schema, dict) and schema.get("type") in ("record", "enum", "fixed", "error"):
        name = schema.get("name", "")
        space = schema.get("namespace", ns)
        full = name if "." in name or not space else f"{space}.{name}"
        names.setdefault(full, schema)
        names.setdefault(name, schema)
    return schema


def _kind(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        t = schema.get("type")
        if isinstance(t, dict | list):
            return _kind(t)
        return "record" if t == "error" else str(t)
    return str(schema)


def _short(schema: Any) -> str:
    if isinstance(schema, dict):
        return str(schema.get("name") or schema.get("type"))
    if isinstance(schema, list):
        return "[" + ", ".join(_short(s) for s in schema) + "]"
    return str(schema)


def _can_read(
    reader: Any, writer: Any, rnames: dict[str, Any], wnames: dict[str, Any], path: str
) -> str:
    reader = _named(reader, rnames, "")
    writer = _named(writer, wnames, "")
    if isinstance(reader, dict) and isinstance(reader.get("type"), dict | list):
        reader = reader["type"]
    if isinstance(writer, dict) and isinstance(writer.get("type"), dict | list):
        writer = writer["type"]
    rk, wk = _kind(reader), _kind(writer)
    where = path or "the top level"
    if wk == "union":
        for branch in writer:
            problem = _can_read(reader, branch, rnames, wnames, path)
            if problem:
                return problem
        return ""
    if rk == "union":
        for branch in reader:
            if not _can_read(branch, writer, rnames, wnames, path):
                return ""
        return f"{where}: no branch of {_short(reader)} reads {_short(writer)}"
    if wk in _PROMOTIONS and rk in _PROMOTIONS[wk]:
        return ""
    if rk != wk:
        return f"{where}: {_short(writer)} cannot be read as {_short(reader)}"
    if rk in _PRIMITIVES:
        return ""
    if rk == "record":
        # Pulsar's Python client renames the writer's record to the reader's at the top
        # level; nested records must match by name, as Avro requires.
        rname, wname = reader.get("name", ""), writer.get("name", "")
        if path and rname.split(".")[-1] != wname.split(".")[-1]:
            return f"{where}: record {writer.get('name')} is not {reader.get('name')}"
        wfields = {f["name"]: f for f in writer.get("fields", [])}
        for f in reader.get("fields", []):
            wf = wfields.get(f["name"])
            sub = f"{path}.{f['name']}" if path else f["name"]
            if wf is None:
                if "default" not in f:
                    return f"field {sub} is missing in the writer's schema and has no default"
                continue
            problem = _can_read(f["type"], wf["type"], rnames, wnames, sub)
            if problem:
                return problem
        return ""
    if rk == "enum":
        missing = set(writer.get("symbols", [])) - set(reader.get("symbols", []))
        if missing and "default" not in reader:
            return f"{where}: enum symbols {sorted(missing)} are unknown to the reader"
        return ""
    if rk == "array":
        return _can_read(reader["items"], writer["items"], rnames, wnames, f"{path}[]")
    if rk == "map":
        return _can_read(reader["values"], writer["values"], rnames, wnames, f"{path}{{}}")
    if rk == "fixed":
        if reader.get("size") != writer.get("size"):
            return f"{where}: fixed sizes differ ({writer.get('size')} vs {reader.get('size')})"
        return ""
    return f"{where}: unknown Avro type {rk!r}"
