"""Writing typed values from Spark: :func:`derive_avro` (the Avro record schema of a Spark
struct), :func:`check_struct` (a struct checked against a topic's schema), :class:`ValueEncoder`
(a struct row to Avro binary or a JSON object) and :class:`SinkValueSchema` (what a sink writes
its values with)."""

from __future__ import annotations

import datetime as dt
import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from filepulsar.connector.values.types import (
    PRIMITIVES,
    SchemaMappingError,
    define_name,
)
from filepulsar.storage.errors import InvalidConfiguration


# ----------------------------------------------------------------------------- Spark -> Avro
def derive_avro(struct: StructType, name: str, path: str = "") -> dict[str, Any]:
    """The Avro record schema of rows of ``struct`` (a nullable field is ``["null", T]`` with
    default null; a nested struct is a record named after its field).

    Raises
    ------
    SchemaMappingError
        Naming the field whose Spark type has no Avro form here.
    """
    fields = []
    for f in struct.fields:
        sub = f"{path}.{f.name}" if path else f.name
        t = _avro_of(f.dataType, f.name, sub)
        if f.nullable:
            fields.append({"name": f.name, "type": ["null", t], "default": None})
        else:
            fields.append({"name": f.name, "type": t})
    return {"type": "record", "name": name, "fields": fields}


def _avro_of(t: DataType, name: str, path: str) -> Any:
    if isinstance(t, BooleanType):
        return "boolean"
    if isinstance(t, ByteType | ShortType | IntegerType):
        return "int"
    if isinstance(t, LongType):
        return "long"
    if isinstance(t, FloatType):
        return "float"
    if isinstance(t, DoubleType):
        return "double"
    if isinstance(t, StringType):
        return "string"
    if isinstance(t, BinaryType):
        return "bytes"
    if isinstance(t, DateType):
        return {"type": "int", "logicalType": "date"}
    if isinstance(t, TimestampType):
        return {"type": "long", "logicalType": "timestamp-micros"}
    if isinstance(t, TimestampNTZType):
        return {"type": "long", "logicalType": "local-timestamp-micros"}
    if isinstance(t, DecimalType):
        return {
            "type": "bytes",
            "logicalType": "decimal",
            "precision": t.precision,
            "scale": t.scale,
        }
    if isinstance(t, ArrayType):
        item = _avro_of(t.elementType, name, f"{path}[]")
        return {"type": "array", "items": ["null", item] if t.containsNull else item}
    if isinstance(t, MapType):
        if not isinstance(t.keyType, StringType):
            raise SchemaMappingError(
                f"field {path}: map keys are {t.keyType.simpleString()}; Avro maps have string keys"
            )
        val = _avro_of(t.valueType, name, f"{path}{{}}")
        return {"type": "map", "values": ["null", val] if t.valueContainsNull else val}
    if isinstance(t, StructType):
        rec = derive_avro(t, name, path)
        rec["namespace"] = (
            "spark." + ".".join(path.replace("[]", "").replace("{}", "").split(".")[:-1])
            if "." in path
            else "spark"
        )
        return rec
    raise SchemaMappingError(
        f"field {path}: Spark type {t.simpleString()} has no Avro form here (boolean, integer "
        "types, float, double, string, binary, date, timestamp, decimal, array, map, struct)"
    )


def _types_of(schema: Any) -> list[Any]:
    return list(schema) if isinstance(schema, list) else [schema]


def check_struct(struct: StructType, definition: Any, path: str = "") -> None:
    """Check that rows of ``struct`` can be written with the Avro record schema
    ``definition``: every struct field is a field of the record with a type the record's
    type takes, and every record field the struct lacks is nullable or has a default.

    Raises
    ------
    SchemaMappingError
        Naming the field, the struct's type and the schema's type.
    """
    _check(struct, definition, path, {}, "")


def _deref(schema: Any, names: dict[str, Any], ns: str) -> Any:
    if isinstance(schema, str) and schema not in PRIMITIVES and schema != "null":
        full = schema if "." in schema or not ns else f"{ns}.{schema}"
        return names.get(full, names.get(schema, schema))
    if isinstance(schema, dict):
        if isinstance(schema.get("type"), dict | list):
            return _deref(schema["type"], names, ns)
        if schema.get("type") in ("record", "enum", "fixed", "error"):
            define_name(schema, names, ns)
    return schema


def _check(t: DataType, schema: Any, path: str, names: dict[str, Any], ns: str) -> None:
    where = path or "value"
    schema = _deref(schema, names, ns)
    branches = [_deref(b, names, ns) for b in _types_of(schema) if b != "null"]
    problems = []
    for b in branches:
        try:
            _check_one(t, b, path, names, ns)
            return
        except SchemaMappingError as e:
            problems.append(str(e))
    if len(problems) == 1:
        raise SchemaMappingError(problems[0])
    raise SchemaMappingError(
        f"field {where}: the struct has {t.simpleString()}, the topic's schema has {_show(schema)}"
    )


def _show(schema: Any) -> str:
    if isinstance(schema, dict):
        lt = schema.get("logicalType")
        base = schema.get("name") or schema.get("type")
        return f"{base} ({lt})" if lt else str(base)
    if isinstance(schema, list):
        return "[" + ", ".join(_show(s) for s in schema) + "]"
    return str(schema)


def _check_one(t: DataType, schema: Any, path: str, names: dict[str, Any], ns: str) -> None:
    where = path or "value"
    kind = schema.get("type") if isinstance(schema, dict) else schema
    logical = schema.get("logicalType") if isinstance(schema, dict) else None

    def bad() -> SchemaMappingError:
        return SchemaMappingError(
            f"field {where}: the struct has {t.simpleString()}, the topic's schema has "
            f"{_show(schema)}"
        )

    ok_prim = {
        "boolean": (BooleanType,),
        "int": (ByteType, ShortType, IntegerType),
        "long": (ByteType, ShortType, IntegerType, LongType),
        "float": (ByteType, ShortType, IntegerType, LongType, FloatType),
        "double": (ByteType, ShortType, IntegerType, LongType, FloatType, DoubleType),
        "string": (StringType,),
        "bytes": (BinaryType,),
        "fixed": (BinaryType,),
        "enum": (StringType,),
    }
    if logical == "date":
        if not isinstance(t, DateType):
            raise bad()
        return
    if logical in ("timestamp-millis", "timestamp-micros"):
        if not isinstance(t, TimestampType):
            raise bad()
        return
    if logical in ("local-timestamp-millis", "local-timestamp-micros"):
        if not isinstance(t, TimestampNTZType):
            raise bad()
        return
    if logical == "decimal":
        if not isinstance(t, DecimalType):
            raise bad()
        return
    if kind in ok_prim:
        if not isinstance(t, ok_prim[str(kind)]):
            raise bad()
        return
    if kind == "array":
        if not isinstance(t, ArrayType):
            raise bad()
        _check(t.elementType, schema["items"], f"{path}[]", names, ns)
        return
    if kind == "map":
        if not isinstance(t, MapType) or not isinstance(t.keyType, StringType):
            raise bad()
        _check(t.valueType, schema["values"], f"{path}{{}}", names, ns)
        return
    if kind in ("record", "error"):
        if not isinstance(t, StructType):
            raise bad()
        _, space = define_name(schema, names, ns)
        rfields = {f["name"]: f for f in schema.get("fields", [])}
        for f in t.fields:
            sub = f"{path}.{f.name}" if path else f.name
            rf = rfields.get(f.name)
            if rf is None:
                raise SchemaMappingError(
                    f"field {sub}: the struct has it ({f.dataType.simpleString()}), the "
                    f"topic's schema record {schema.get('name')} has no such field (its "
                    f"fields: {', '.join(rfields)})"
                )
            _check(f.dataType, rf["type"], sub, names, space)
        given = set(t.fieldNames())
        for name, rf in rfields.items():
            if name in given or "default" in rf or "null" in _types_of(rf["type"]):
                continue
            sub = f"{path}.{name}" if path else name
            raise SchemaMappingError(
                f"field {sub}: the topic's schema requires it ({_show(rf['type'])}), the "
                "struct lacks it"
            )
        return
    raise bad()


class ValueEncoder:
    """Encodes struct rows (Python dicts from Arrow) with a topic's AVRO or JSON schema
    (executor side of the sink)."""

    def __init__(self, type_: str, definition: str) -> None:
        import fastavro

        self.type = type_
        self._fastavro = fastavro
        parsed = json.loads(definition)
        self._definition = parsed
        self._parsed: Any = (
            fastavro.parse_schema(json.loads(definition)) if type_ == "AVRO" else None
        )
        self._fill = _filler(parsed, {}, "")
        self._json = _to_json(parsed, {}, "") if type_ == "JSON" else None

    def encode(self, rows: list[Any]) -> list[bytes | None]:
        """Each row's encoded value (a null row stays null: a tombstone).

        Raises
        ------
        InvalidConfiguration
            Naming the field whose value the schema does not take.
        """
        out: list[bytes | None] = []
        for row in rows:
            if row is None:
                out.append(None)
                continue
            data = self._fill(row)
            if self._json is not None:
                out.append(json.dumps(self._json(data), separators=(",", ":")).encode("utf-8"))
                continue
            buf = io.BytesIO()
            try:
                self._fastavro.schemaless_writer(buf, self._parsed, data)
            except (ValueError, TypeError, KeyError, OverflowError) as e:
                raise InvalidConfiguration(
                    f"filepulsar sink: a row's value does not fit the topic's Avro schema: {e}"
                ) from e
            out.append(buf.getvalue())
        return out


def _filler(schema: Any, names: dict[str, Any], ns: str) -> Callable[[Any], Any]:
    """Arrow's Python values -> what fastavro writes: maps (lists of pairs) become dicts,
    record fields the struct lacks get their default (or null)."""
    schema = _deref(schema, names, ns)
    if isinstance(schema, list):
        subs = [_filler(b, names, ns) for b in schema if b != "null"]
        sub = subs[0] if len(subs) == 1 else (lambda v: v)
        return lambda v: None if v is None else sub(v)
    kind = schema.get("type") if isinstance(schema, dict) else schema
    if kind == "map":
        val = _filler(schema["values"], names, ns)
        return lambda v: (
            None if v is None else {k: val(x) for k, x in (v.items() if isinstance(v, dict) else v)}
        )
    if kind == "array":
        item = _filler(schema["items"], names, ns)
        return lambda v: None if v is None else [item(x) for x in v]
    if kind in ("record", "error"):
        _, space = define_name(schema, names, ns)
        plan = [
            (f["name"], _filler(f["type"], names, space), f.get("default"))
            for f in schema.get("fields", [])
        ]

        def record(v: Any) -> Any:
            if v is None:
                return None
            return {n: (conv(v[n]) if n in v else default) for n, conv, default in plan}

        return record
    return lambda v: v


def _to_json(schema: Any, names: dict[str, Any], ns: str) -> Callable[[Any], Any]:
    """Avro-ready Python values -> JSON values as pulsar-client's JsonSchema writes them
    (bytes as their text, dates as days, timestamps as the schema's unit, decimals as text)."""
    schema = _deref(schema, names, ns)
    if isinstance(schema, list):
        subs = [_to_json(b, names, ns) for b in schema if b != "null"]
        sub = subs[0] if len(subs) == 1 else (lambda v: v)
        return lambda v: None if v is None else sub(v)
    kind = schema.get("type") if isinstance(schema, dict) else schema
    logical = schema.get("logicalType") if isinstance(schema, dict) else None
    if logical == "date":
        return lambda v: None if v is None else (v - dt.date(1970, 1, 1)).days
    if logical in (
        "timestamp-millis",
        "timestamp-micros",
        "local-timestamp-millis",
        "local-timestamp-micros",
    ):
        div = 1000 if logical.endswith("millis") else 1

        def ts(v: Any) -> Any:
            if v is None:
                return None
            epoch = dt.datetime(1970, 1, 1, tzinfo=v.tzinfo and dt.UTC)
            return ((v - epoch) // dt.timedelta(microseconds=1)) // div

        return ts
    if logical == "decimal":
        return lambda v: None if v is None else str(v)
    if kind in ("bytes", "fixed"):

        def text(v: Any) -> Any:
            if v is None:
                return None
            try:
                return bytes(v).decode("utf-8")
            except UnicodeDecodeError as e:
                raise InvalidConfiguration(
                    "filepulsar sink: a binary field is not UTF-8 text, which a JSON schema "
                    "value needs (pulsar-client writes bytes as text); use an AVRO schema"
                ) from e

        return text
    if kind == "map":
        val = _to_json(schema["values"], names, ns)
        return lambda v: None if v is None else {k: val(x) for k, x in v.items()}
    if kind == "array":
        item = _to_json(schema["items"], names, ns)
        return lambda v: None if v is None else [item(x) for x in v]
    if kind in ("record", "error"):
        _, space = define_name(schema, names, ns)
        plan = [(f["name"], _to_json(f["type"], names, space)) for f in schema.get("fields", [])]
        return lambda v: None if v is None else {n: conv(v.get(n)) for n, conv in plan}
    return lambda v: v


@dataclass(frozen=True)
class SinkValueSchema:
    """The schema a typed sink writes values with (picklable): its type, definition, the
    version it has in the topic, and how the input holds the record (``struct``: the ``value``
    column; ``flatten``: the listed columns)."""

    type: str
    definition: str
    version: int
    mode: str
    fields: tuple[str, ...] = field(default_factory=tuple)

    def encoder(self) -> ValueEncoder:
        return ValueEncoder(self.type, self.definition)
