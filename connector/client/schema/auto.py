"""Pulsar's AUTO schemas for the client: :class:`AutoConsumeSchema` (decodes by the topic's stored
schema) and :class:`AutoProduceBytesSchema` (checks bytes against the topic's schema), with the
generic decoders and value checks they build from a stored schema."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable
from typing import Any

from filepulsar.connector.client.schema.codecs import (
    Schema,
    SchemaType,
    StringSchema,
)
from filepulsar.storage.errors import IncompatibleSchema, InvalidConfiguration


# ----------------------------------------------------------------------------- AUTO schemas
def _protobuf_class(definition: dict[str, Any]) -> Any:
    """The message class a ``PROTOBUF_NATIVE`` definition describes (a dynamic class built
    from its file descriptor set, as Java's generic protobuf-native schema does)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    files = descriptor_pb2.FileDescriptorSet.FromString(
        base64.b64decode(definition["fileDescriptorSet"])
    )
    pool = descriptor_pool.DescriptorPool()
    for f in files.file:
        pool.Add(f)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName(definition["rootMessageTypeName"])
    )


def _generic_decoder(stored: Any) -> Callable[[bytes], Any]:
    """A decoder of values written with the stored schema version ``stored`` into generic
    values: ``dict`` for ``AVRO`` and ``JSON`` records, ``str`` for ``STRING``, ``bytes`` for
    ``BYTES``, a (dynamic) protobuf message for ``PROTOBUF_NATIVE``. Its errors are
    :class:`IncompatibleSchema`."""
    t = stored.type
    if stored.deleted:
        raise IncompatibleSchema(
            f"schema version {stored.version} is a deletion marker, not a schema"
        )
    if t == "BYTES":
        return bytes
    if t == "STRING":
        return StringSchema().decode
    if t == "JSON":

        def decode_json(data: bytes) -> Any:
            try:
                return json.loads(data)
            except ValueError as e:
                raise IncompatibleSchema(f"value is not JSON: {e}") from e

        return decode_json
    if t == "AVRO":
        import fastavro

        parsed = fastavro.parse_schema(stored.parsed())
        reader = fastavro.schemaless_reader

        def decode_avro(data: bytes) -> Any:
            buf = io.BytesIO(data)
            try:
                out = reader(buf, parsed, None)
            except (EOFError, IndexError, ValueError, TypeError, KeyError, OverflowError) as e:
                raise IncompatibleSchema(
                    f"value is not Avro data of its schema: {type(e).__name__}: {e}"
                ) from e
            if buf.tell() != len(data):
                raise IncompatibleSchema(
                    f"value is not Avro data of its schema: {len(data) - buf.tell()} bytes "
                    "left over after the record"
                )
            return out

        return decode_avro
    if t == "PROTOBUF_NATIVE":
        from google.protobuf.message import DecodeError

        cls = _protobuf_class(stored.parsed())

        def decode_protobuf(data: bytes) -> Any:
            try:
                return cls.FromString(data)
            except DecodeError as e:
                raise IncompatibleSchema(f"value is not a {cls.DESCRIPTOR.full_name}: {e}") from e

        return decode_protobuf
    raise IncompatibleSchema(f"schema version {stored.version} has unknown type {t!r}")


class AutoConsumeSchema(Schema):
    """Pulsar's ``AUTO_CONSUME`` (Java's ``Schema.AUTO_CONSUME()``): read a topic of any
    schema, decoding each message with the schema version that wrote it.

    Give it to ``subscribe`` or ``create_reader``. It is neither registered nor checked
    against the topic's schema. ``Message.value()`` returns a generic value: a ``dict`` for
    ``AVRO`` and ``JSON`` records (Avro enums as their symbol, JSON as written), ``str`` for
    ``STRING``, ``bytes`` for ``BYTES`` and for messages written without a schema, and a
    protobuf message of a class built from the stored descriptor for ``PROTOBUF_NATIVE``.
    ``Message.int_schema_version()`` says which version wrote it. pulsar-client (Python) has
    no such schema; the dicts are what its ``AvroSchema(None, schema_definition)`` returns.
    """

    def __init__(self) -> None:
        super().__init__(None, SchemaType.AUTO_CONSUME, None, "AUTO_CONSUME")
        self._decoders: dict[tuple[str, int], Callable[[bytes], Any]] = {}

    def encode(self, obj: Any) -> bytes:
        raise TypeError("AutoConsumeSchema only decodes: give it to subscribe or create_reader")

    def decode(self, data: bytes) -> Any:
        """``data`` as it is (a value with no writer version is bytes)."""
        return data

    def decode_message(self, data: bytes, topic: str, version: int) -> Any:
        if version < 0 or self._stored_lookup is None:
            return data
        key = (topic, version)
        decoder = self._decoders.get(key)
        if decoder is None:
            decoder = self._decoders[key] = _generic_decoder(self._stored_lookup(topic, version))
        return decoder(data)

    def __str__(self) -> str:
        return "AutoConsumeSchema"


class AutoProduceBytesSchema(Schema):
    """Pulsar's ``AUTO_PRODUCE_BYTES`` (Java's ``Schema.AUTO_PRODUCE_BYTES()``): send values
    already encoded as bytes to a topic with a schema, checked against that schema first.

    Give it to ``create_producer``: the producer takes the topic's latest schema version and
    stamps it on every message; ``send(b)`` decodes ``b`` with that schema and refuses bytes
    that do not decode (:class:`IncompatibleSchema`, nothing stored). Avro data must be one
    whole record of the schema; JSON must be an object whose fields have the record's types
    (enums by symbol or value, bytes as text) with every non-nullable field without a default
    present; ``STRING`` must be UTF-8; protobuf must parse as the root message. On a topic
    with no schema the bytes are sent as they are, unstamped. With ``schema`` given (Java's
    ``AUTO_PRODUCE_BYTES(schema)``), that schema is registered as a producer's would be and
    the bytes are checked by decoding with it. pulsar-client (Python) has no such schema.
    """

    def __init__(self, schema: Schema | None = None) -> None:
        if schema is not None and (
            not isinstance(schema, Schema)
            or isinstance(schema, AutoConsumeSchema | AutoProduceBytesSchema)
        ):
            raise InvalidConfiguration(
                "AutoProduceBytesSchema takes None or the schema to check the bytes with "
                f"(StringSchema(), JsonSchema(RecordClass), AvroSchema(...)), got {schema!r}"
            )
        super().__init__(bytes, SchemaType.AUTO_PUBLISH, None, "AUTO_PRODUCE_BYTES")
        self._given = schema
        self._check: Callable[[bytes], Any] | None = None
        self._against = ""

    def _bound(self, check: Callable[[bytes], Any] | None, against: str) -> AutoProduceBytesSchema:
        """A copy checking the bytes with ``check`` (one per producer: the topic's schema)."""
        out = AutoProduceBytesSchema(self._given)
        out._check = check
        out._against = against
        return out

    def encode(self, data: Any) -> bytes:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(
                f"AutoProduceBytesSchema sends bytes already encoded, got {type(data).__name__}"
            )
        raw = bytes(data)
        check = self._check
        if check is not None:
            try:
                check(raw)
            except IncompatibleSchema as e:
                raise IncompatibleSchema(
                    f"bytes refused by AutoProduceBytesSchema: they are not a value of "
                    f"{self._against}: {e}"
                ) from e
        return raw

    def decode(self, data: bytes) -> Any:
        return data

    def __str__(self) -> str:
        return "AutoProduceBytesSchema" + (f"({self._given})" if self._given else "")


_JSON_KINDS: dict[str, tuple[type, ...]] = {
    "null": (type(None),),
    "boolean": (bool,),
    "int": (int,),
    "long": (int,),
    "float": (int, float),
    "double": (int, float),
    "string": (str,),
    "bytes": (str,),
}


def _json_problem(value: Any, t: Any, names: dict[str, Any], path: str) -> str:
    """Why a decoded JSON value does not fit Avro type ``t`` as filepulsar's and Pulsar's JSON
    schemas write it ("" if it does)."""
    where = path or "the value"
    if isinstance(t, list):
        if any(not _json_problem(value, b, names, path) for b in t):
            return ""
        return f"{where} is {json.dumps(value)[:40]}, which fits no branch of {t}"
    if isinstance(t, str):
        if t in _JSON_KINDS:
            ok = isinstance(value, _JSON_KINDS[t]) and not (
                isinstance(value, bool) and t != "boolean"
            )
            return "" if ok else f"{where} is {json.dumps(value)[:40]}, not {t}"
        named = names.get(t) or names.get(t.rsplit(".", 1)[-1])
        if named is None:
            return f"{where}: unknown Avro type {t!r}"
        t = named
    kind = t.get("type")
    if isinstance(kind, dict | list) or kind in _JSON_KINDS:
        return _json_problem(value, kind, names, path)
    if kind in ("record", "error"):
        names.setdefault(t.get("name", ""), t)
        if not isinstance(value, dict):
            return f"{where} is {json.dumps(value)[:40]}, not a {t.get('name')} object"
        for f in t.get("fields", []):
            sub = f"{path}.{f['name']}" if path else f["name"]
            if f["name"] in value:
                problem = _json_problem(value[f["name"]], f["type"], names, sub)
                if problem:
                    return problem
            elif "default" not in f and _json_problem(None, f["type"], names, sub):
                return f"field {sub} is missing (it is not nullable and has no default)"
        return ""
    if kind == "enum":
        names.setdefault(t.get("name", ""), t)
        ok = isinstance(value, str | int) and not isinstance(value, bool)
        return "" if ok else f"{where} is {json.dumps(value)[:40]}, not a {t.get('name')} symbol"
    if kind == "fixed":
        names.setdefault(t.get("name", ""), t)
        return "" if isinstance(value, str) else f"{where} is not text (fixed {t.get('name')})"
    if kind == "array":
        if not isinstance(value, list):
            return f"{where} is {json.dumps(value)[:40]}, not an array"
        for i, x in enumerate(value):
            problem = _json_problem(x, t["items"], names, f"{path}[{i}]")
            if problem:
                return problem
        return ""
    if kind == "map":
        if not isinstance(value, dict):
            return f"{where} is {json.dumps(value)[:40]}, not an object (map)"
        for k, x in value.items():
            problem = _json_problem(x, t["values"], names, f"{path}[{k!r}]")
            if problem:
                return problem
        return ""
    return f"{where}: unknown Avro type {kind!r}"


def bytes_check(stored: Any) -> Callable[[bytes], Any] | None:
    """How :class:`AutoProduceBytesSchema` checks bytes against stored version ``stored``
    (None: anything goes, a ``BYTES`` schema)."""
    if stored.type == "BYTES":
        return None
    decode = _generic_decoder(stored)
    if stored.type != "JSON":
        return decode
    definition = stored.parsed()

    def check_json(data: bytes) -> None:
        problem = _json_problem(decode(data), definition, {}, "")
        if problem:
            raise IncompatibleSchema(problem)

    return check_json
