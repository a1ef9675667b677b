"""The client's value schemas: :class:`Schema` (with :class:`SchemaType` and :class:`SchemaInfo`)
and the schemas turning values into bytes and back: bytes, string, JSON and Avro records, and
Protobuf messages."""

from __future__ import annotations

import base64
import enum
import io
import json
from collections.abc import Callable
from typing import Any

from filepulsar.connector.client.schema.fields import type_name
from filepulsar.connector.client.schema.record import Record
from filepulsar.storage.errors import IncompatibleSchema, InvalidConfiguration


# ----------------------------------------------------------------------------- schemas
class SchemaType(enum.Enum):
    """Pulsar's schema type names (the ones filepulsar writes)."""

    BYTES = "BYTES"
    STRING = "STRING"
    JSON = "JSON"
    AVRO = "AVRO"
    PROTOBUF_NATIVE = "PROTOBUF_NATIVE"
    #: :class:`AutoConsumeSchema` (never registered).
    AUTO_CONSUME = "AUTO_CONSUME"
    #: :class:`AutoProduceBytesSchema` (registers the topic's own schema, or none).
    AUTO_PUBLISH = "AUTO_PUBLISH"


class SchemaInfo:
    """What a schema registers in a topic: its type, name and definition text."""

    def __init__(self, schema_type: SchemaType, name: str, definition: str) -> None:
        self._type = schema_type
        self._name = name
        self._definition = definition

    def schema_type(self) -> SchemaType:
        return self._type

    def name(self) -> str:
        return self._name

    def schema(self) -> str:
        return self._definition

    def __repr__(self) -> str:
        return f"SchemaInfo({self._type.name}, {self._name!r})"


class Schema:
    """Base of the schemas: ``encode(value) -> bytes`` and ``decode(bytes) -> value``."""

    def __init__(
        self, record_cls: Any, schema_type: SchemaType, definition: Any, name: str
    ) -> None:
        self._record_cls = record_cls
        text = "" if definition is None else json.dumps(definition, sort_keys=True)
        self._schema_info = SchemaInfo(schema_type, name, text)
        #: Decodes data of another (writer) schema version; set by a consumer (Avro).
        self._writer_lookup: Callable[[str, int], Any] | None = None
        #: The topic's stored schema version (a ``StoredSchema``); set by a consumer.
        self._stored_lookup: Callable[[str, int], Any] | None = None

    def schema_info(self) -> SchemaInfo:
        return self._schema_info

    def bind_versions(
        self,
        writer_lookup: Callable[[str, int], Any],
        stored_lookup: Callable[[str, int], Any],
    ) -> None:
        """Give this schema the topic's other schema versions, as a consumer or reader binding
        it for reading does (filepulsar's; pulsar-client's broker does this): ``(topic, version)``
        to the writer's definition, and to the stored version. The first binding stays."""
        if self._writer_lookup is None:
            self._writer_lookup = writer_lookup
        if self._stored_lookup is None:
            self._stored_lookup = stored_lookup

    def encode(self, obj: Any) -> bytes:
        raise NotImplementedError

    def decode(self, data: bytes) -> Any:
        raise NotImplementedError

    def decode_message(self, data: bytes, topic: str, version: int) -> Any:
        """Decode a received message's value written with schema ``version`` of ``topic``."""
        return self.decode(data)

    def _validate_object_type(self, obj: Any) -> None:
        if not isinstance(obj, self._record_cls):
            raise TypeError(
                f"Invalid record obj of type {type(obj)} - expected type is "
                f"{type_name(self._record_cls)}"
            )


class BytesSchema(Schema):
    """Values are ``bytes`` as they are (the default)."""

    def __init__(self) -> None:
        super().__init__(bytes, SchemaType.BYTES, None, "BYTES")

    def encode(self, data: Any) -> bytes:
        self._validate_object_type(data)
        return bytes(data)

    def decode(self, data: bytes) -> Any:
        return data

    def __str__(self) -> str:
        return "BytesSchema"


class StringSchema(Schema):
    """Values are ``str``, stored as UTF-8."""

    def __init__(self) -> None:
        super().__init__(str, SchemaType.STRING, None, "STRING")

    def encode(self, obj: Any) -> bytes:
        self._validate_object_type(obj)
        return str(obj).encode("utf-8")

    def decode(self, data: bytes) -> Any:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise IncompatibleSchema(f"value is not UTF-8 text: {e}") from e

    def __str__(self) -> str:
        return "StringSchema"


def _check_record_cls(record_cls: Any, what: str) -> None:
    if not (isinstance(record_cls, type) and issubclass(record_cls, Record)):
        raise InvalidConfiguration(f"{what} needs a Record subclass, got {record_cls!r}")


class JsonSchema(Schema):
    """Values are instances of a :class:`Record` class, stored as JSON objects (enums by value,
    bytes as text). The registered definition is the class's Avro record schema."""

    def __init__(self, record_cls: type[Record]) -> None:
        _check_record_cls(record_cls, "JsonSchema")
        super().__init__(record_cls, SchemaType.JSON, record_cls.schema(), "JSON")
        self._build = record_cls._builder()
        self._dump = record_cls._dumper(avro=False)
        self._dumps = json.JSONEncoder(separators=(",", ":")).encode

    def encode(self, obj: Any) -> bytes:
        self._validate_object_type(obj)
        if type(obj) is not self._record_cls:
            self._validate_object_type(obj)
        return self._dumps(self._dump(obj)).encode("utf-8")

    def decode(self, data: bytes) -> Any:
        try:
            d = json.loads(data)
        except ValueError as e:
            raise IncompatibleSchema(f"value is not JSON: {e}") from e
        if not isinstance(d, dict):
            raise IncompatibleSchema(f"JSON value is a {type(d).__name__}, not an object")
        try:
            return self._build(d)
        except TypeError as e:  # a field of another type than the record declares
            raise IncompatibleSchema(f"JSON value does not match the record: {e}") from e

    def __str__(self) -> str:
        return f"JsonSchema({self._record_cls.__name__})"


def _without_fastavro_keys(definition: Any) -> Any:
    """``definition`` without the ``__fastavro_parsed`` / ``__named_schemas`` ... keys."""
    if isinstance(definition, dict):
        return {
            k: _without_fastavro_keys(v)
            for k, v in definition.items()
            if not (isinstance(k, str) and k.startswith("__"))
        }
    if isinstance(definition, list):
        return [_without_fastavro_keys(x) for x in definition]
    return definition


class AvroSchema(Schema):
    """Values stored in Avro's binary encoding (fastavro).

    Give a :class:`Record` class (values are its instances), or ``None`` and an Avro
    ``schema_definition`` dict (values are dicts). A consumer decodes a message with the
    schema version it was written with, resolved to this schema (Avro schema evolution).
    """

    def __init__(self, record_cls: Any, schema_definition: dict[str, Any] | None = None) -> None:
        import fastavro

        if record_cls is None and schema_definition is None:
            raise InvalidConfiguration(
                "AvroSchema needs a Record class or a schema_definition, got neither"
            )
        if record_cls is not None:
            _check_record_cls(record_cls, "AvroSchema")
            definition = record_cls.schema()
        else:
            # A schema fastavro has parsed (``fastavro.schema.load_schema``) carries its own
            # bookkeeping keys; the registry keeps the plain Avro schema.
            definition = _without_fastavro_keys(schema_definition)
        self._fastavro = fastavro
        self._definition = definition
        try:
            self._parsed = fastavro.parse_schema(json.loads(json.dumps(definition)))
        except Exception as e:  # fastavro raises several exception types for bad schemas
            raise InvalidConfiguration(f"not a valid Avro schema: {e}") from e
        self._writers: dict[tuple[str, int], Any] = {}
        from fastavro.read import SchemaResolutionError

        self._reader = fastavro.schemaless_reader
        self._resolution_error = SchemaResolutionError
        self._build = None if record_cls is None else record_cls._builder(typed=True)
        self._dump = None if record_cls is None else record_cls._dumper(avro=True)
        self._writer = fastavro.schemaless_writer
        super().__init__(record_cls, SchemaType.AVRO, definition, "AVRO")

    def encode(self, obj: Any) -> bytes:
        if self._record_cls is not None:
            dump = self._dump
            if type(obj) is self._record_cls and dump is not None:
                data = dump(obj)
            else:
                self._validate_object_type(obj)
                data = obj._data(avro=True)
        elif isinstance(obj, dict):
            data = obj
        else:
            raise TypeError(
                f"AvroSchema without a record class encodes dicts, got {type(obj).__name__}"
            )
        buf = io.BytesIO()
        try:
            self._writer(buf, self._parsed, data)
        except (ValueError, TypeError, KeyError) as e:
            raise TypeError(f"value does not match its Avro schema: {e}") from e
        return buf.getvalue()

    def _decode_with(self, data: bytes, writer: Any, reader: Any) -> Any:
        """Decode ``data`` written with ``writer``, resolved to ``reader`` (None: the
        writer's schema is ours, nothing to resolve)."""
        try:
            d = self._reader(io.BytesIO(data), writer, reader)
        except self._resolution_error as e:
            raise IncompatibleSchema(f"the writer's schema does not resolve to ours: {e}") from e
        except (EOFError, IndexError, ValueError, TypeError, KeyError, OverflowError) as e:
            # What fastavro raises for bytes that are not this schema's encoding.
            raise IncompatibleSchema(
                f"value is not Avro data of its schema: {type(e).__name__}: {e}"
            ) from e
        build = self._build
        return d if build is None else build(d)

    def decode(self, data: bytes) -> Any:
        return self._decode_with(data, self._parsed, None)

    def decode_message(self, data: bytes, topic: str, version: int) -> Any:
        if version < 0 or self._writer_lookup is None:
            return self._decode_with(data, self._parsed, None)
        key = (topic, version)
        writer = self._writers.get(key)
        if writer is None:
            definition = self._writer_lookup(topic, version)
            if not isinstance(definition, dict):
                writer = self._parsed  # another type's version: try our own schema
            else:
                d = dict(definition)
                # As pulsar-client does: the writer's top-level record is read as ours, so
                # a renamed record class still resolves field by field.
                if isinstance(self._definition, dict) and "name" in self._definition:
                    d["name"] = self._definition["name"]
                    if "namespace" in self._definition:
                        d["namespace"] = self._definition["namespace"]
                    else:
                        d.pop("namespace", None)
                # The writer's schema is ours (the usual case): read without resolving,
                # which fastavro would otherwise find out by comparing the two schemas,
                # field by field, on every message.
                same = d == self._definition
                writer = self._parsed if same else self._fastavro.parse_schema(d)
            self._writers[key] = writer
        return self._decode_with(data, writer, None if writer is self._parsed else self._parsed)

    def __str__(self) -> str:
        name = self._record_cls.__name__ if self._record_cls is not None else "dict"
        return f"AvroSchema({name})"


class ProtobufNativeSchema(Schema):
    """Values are instances of a protobuf message class, in protobuf's own binary encoding.

    The registered definition is Pulsar's ``ProtobufNativeSchemaData`` (what the Java client
    writes): ``fileDescriptorSet`` (base64 of a ``FileDescriptorSet`` holding the message's
    file and every file it depends on, dependencies first), ``rootMessageTypeName`` and
    ``rootFileDescriptorName``.

    Raises
    ------
    TypeError
        If ``record_cls`` is not a protobuf message class.
    """

    def __init__(self, record_cls: Any) -> None:
        from google.protobuf import descriptor_pb2
        from google.protobuf.message import Message as ProtobufMessage

        if not (isinstance(record_cls, type) and issubclass(record_cls, ProtobufMessage)):
            raise TypeError(f"record_cls must be a protobuf Message subclass, got {record_cls!r}")
        descriptor: Any = getattr(record_cls, "DESCRIPTOR")  # noqa: B009 (protobuf's, untyped)
        files = descriptor_pb2.FileDescriptorSet()
        seen: set[str] = set()

        def add(fd: Any) -> None:
            if fd.name in seen:
                return
            for dep in fd.dependencies:
                add(dep)
            seen.add(fd.name)
            proto = descriptor_pb2.FileDescriptorProto()
            fd.CopyToProto(proto)
            files.file.append(proto)

        add(descriptor.file)
        definition = {
            "fileDescriptorSet": base64.b64encode(files.SerializeToString()).decode("ascii"),
            "rootMessageTypeName": descriptor.full_name,
            "rootFileDescriptorName": descriptor.file.name,
        }
        super().__init__(record_cls, SchemaType.PROTOBUF_NATIVE, definition, "PROTOBUF_NATIVE")

    def encode(self, obj: Any) -> bytes:
        self._validate_object_type(obj)
        return bytes(obj.SerializeToString())

    def decode(self, data: bytes) -> Any:
        return self._record_cls.FromString(data)

    def __str__(self) -> str:
        return f"ProtobufNativeSchema({self._record_cls.__name__})"
