"""Reading typed values in Spark: :class:`ValueDecoder` decodes each message's value with the
schema version that wrote it into the read's Spark form (Avro through fastavro with schema
resolution, JSON, strings), and :func:`decode_columns` turns a group of messages' values into
Arrow columns at once."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import operator
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from filepulsar.connector.values.types import (
    PRIMITIVES,
    SchemaMappingError,
    ValueSpec,
    define_name,
    strip_raw_logical,
)
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.errors import CorruptDataError, IncompatibleSchema
from filepulsar.storage.names import TopicName
from filepulsar.storage.schemas import SchemaRegistry


# ----------------------------------------------------------------------------- decoding
class _Bad(ValueError):
    """A JSON value that does not fit the reader's schema (path and what was wrong)."""


def _json_conv(schema: Any, names: dict[str, Any], ns: str, path: str) -> Callable[[Any], Any]:
    """A function turning a decoded JSON value into the Python value Arrow takes for the
    reader's Avro type ``schema`` (projecting records as Avro resolution does)."""
    where = path or "value"
    if isinstance(schema, str) and schema not in PRIMITIVES and schema != "null":
        full = schema if "." in schema or not ns else f"{ns}.{schema}"
        target = names.get(full, names.get(schema))
        if target is None:
            raise SchemaMappingError(f"{where}: unknown Avro type {schema!r}")
        return lambda v: _json_conv(target, names, ns, path)(v)
    if isinstance(schema, list):
        nullable = "null" in schema
        branches = [_json_conv(b, names, ns, path) for b in schema if b != "null"]

        def union(v: Any) -> Any:
            if v is None:
                if nullable:
                    return None
                raise _Bad(f"{where}: null where the schema has no null")
            last: Exception | None = None
            for b in branches:
                try:
                    return b(v)
                except _Bad as e:
                    last = e
            raise _Bad(str(last) if last else f"{where}: no union branch takes {v!r}")

        return union
    if isinstance(schema, dict) and isinstance(schema.get("type"), dict | list):
        return _json_conv(schema["type"], names, ns, path)
    t = schema.get("type") if isinstance(schema, dict) else schema
    logical = schema.get("logicalType") if isinstance(schema, dict) else None

    def need(v: Any, ok: bool, what: str) -> None:
        if not ok:
            raise _Bad(f"{where}: {what} expected, got {type(v).__name__} {v!r:.40}")

    if t == "null":
        return lambda v: need(v, v is None, "null")
    if logical == "date" and t == "int":

        def date(v: Any) -> Any:
            need(v, isinstance(v, int) and not isinstance(v, bool), "days since 1970 (int)")
            return dt.date(1970, 1, 1) + dt.timedelta(days=v)

        return date
    if (
        logical
        in (
            "timestamp-millis",
            "timestamp-micros",
            "local-timestamp-millis",
            "local-timestamp-micros",
        )
        and t == "long"
    ):
        per_s = 1000 if logical.endswith("millis") else 1_000_000
        tz = dt.UTC if logical.startswith("timestamp") else None

        def ts(v: Any) -> Any:
            need(v, isinstance(v, int) and not isinstance(v, bool), "a timestamp (long)")
            epoch = dt.datetime(1970, 1, 1, tzinfo=tz)
            return epoch + dt.timedelta(microseconds=v * (1_000_000 // per_s))

        return ts
    if logical == "decimal" and t in ("bytes", "fixed"):
        scale = int(schema.get("scale", 0))

        def dec(v: Any) -> Any:
            need(v, isinstance(v, int | float | str) and not isinstance(v, bool), "a decimal")
            try:
                return decimal.Decimal(str(v)).quantize(decimal.Decimal(1).scaleb(-scale))
            except decimal.InvalidOperation as e:
                raise _Bad(f"{where}: {v!r} is not a decimal") from e

        return dec
    if t == "boolean":

        def boolean(v: Any) -> Any:
            need(v, isinstance(v, bool), "boolean")
            return v

        return boolean
    if t in ("int", "long"):

        def integer(v: Any) -> Any:
            need(v, isinstance(v, int) and not isinstance(v, bool), t)
            return v

        return integer
    if t in ("float", "double"):

        def real(v: Any) -> Any:
            need(v, isinstance(v, int | float) and not isinstance(v, bool), t)
            return float(v)

        return real
    if t == "string":

        def string(v: Any) -> Any:
            need(v, isinstance(v, str), "string")
            return v

        return string
    if t in ("bytes", "fixed"):
        if t == "fixed":
            define_name(schema, names, ns)

        def raw(v: Any) -> Any:
            # pulsar-client's JsonSchema writes bytes as their text
            need(v, isinstance(v, str), "bytes (as text)")
            return v.encode("utf-8")

        return raw
    if t == "enum":
        define_name(schema, names, ns)

        def sym(v: Any) -> Any:
            # pulsar-client's JsonSchema writes an enum's Python value (a name or a number)
            need(v, isinstance(v, str | int) and not isinstance(v, bool), "an enum symbol")
            return str(v)

        return sym
    if t == "array":
        item = _json_conv(schema.get("items"), names, ns, f"{path}[]")

        def array(v: Any) -> Any:
            need(v, isinstance(v, list), "array")
            return [item(x) for x in v]

        return array
    if t == "map":
        val = _json_conv(schema.get("values"), names, ns, f"{path}{{}}")

        def mapping(v: Any) -> Any:
            need(v, isinstance(v, dict), "map (object)")
            return {str(k): val(x) for k, x in v.items()}

        return mapping
    if t in ("record", "error"):
        full, space = define_name(schema, names, ns)
        plan = []
        for f in schema.get("fields", []):
            name = str(f["name"])
            sub = f"{path}.{name}" if path else name
            has_default = "default" in f
            default = f.get("default")
            plan.append((name, _json_conv(f["type"], names, space, sub), has_default, default))

        def record(v: Any) -> Any:
            need(v, isinstance(v, dict), f"record {full} (object)")
            out = {}
            for name, conv, has_default, default in plan:
                if name in v:
                    out[name] = conv(v[name])
                elif has_default and default is not None:
                    out[name] = conv(default)
                else:
                    out[name] = None
            return out

        return record
    raise SchemaMappingError(f"{where}: Avro type {t!r} has no Spark column type")


def _rename_top(writer: Any, reader: Any) -> Any:
    """The writer's schema with its top-level record named as the reader's (pulsar-client reads
    a renamed record class field by field)."""
    if isinstance(writer, dict) and isinstance(reader, dict) and "name" in reader:
        w = dict(writer)
        w["name"] = reader["name"]
        if "namespace" in reader:
            w["namespace"] = reader["namespace"]
        else:
            w.pop("namespace", None)
        return w
    return writer


class ValueDecoder:
    """Decodes the values of a group of messages into Arrow arrays of the reader's types
    (executor side; one per task).

    Parameters
    ----------
    spec
        The reader's schema and mode.
    store
        Where the topics' schema registries are (writer versions are fetched once each).
    """

    def __init__(self, spec: ValueSpec, store: BlobStore) -> None:
        import fastavro

        self.spec = spec
        self.store = store
        self._fastavro = fastavro
        _, self.arrow_type = spec.value_type()
        self._reader_def = strip_raw_logical(spec.parsed())
        self._reader = None
        if spec.type == "AVRO":
            self._reader = fastavro.parse_schema(json.loads(json.dumps(self._reader_def)))
        self._json = _json_conv(self._reader_def, {}, "", "") if spec.type == "JSON" else None
        self._writers: dict[tuple[str, int], Any] = {}
        self._registries: dict[str, SchemaRegistry] = {}

    def _writer(self, topic: TopicName, version: int) -> tuple[Any, Any]:
        """(writer, reader) for fastavro: the parsed Avro schema of ``version`` of ``topic``
        and the reader's schema, or (the reader's, None) when the message carries no version
        or its version is the reader's own schema (no resolution needed: faster)."""
        if version < 0:
            return self._reader, None
        key = (str(topic.base), version)
        hit = self._writers.get(key)
        if hit is None:
            reg = self._registries.get(key[0])
            if reg is None:
                reg = self._registries[key[0]] = SchemaRegistry(self.store, topic.base)
            stored = reg.get(version)
            if stored.type != "AVRO":
                raise IncompatibleSchema(
                    f"schema version {version} of {topic.base} is {stored.type}, not AVRO"
                )
            if stored.same_as(self.spec.type, self.spec.definition):
                hit = (self._reader, None)
            else:
                w = _rename_top(strip_raw_logical(stored.parsed()), self._reader_def)
                hit = (self._fastavro.parse_schema(w), self._reader)
            self._writers[key] = hit
        return hit

    def decode(self, table: pa.Table, topic: TopicName) -> pa.Array:
        """One Arrow array of decoded values for the rows of ``table`` (a storage
        READ_SCHEMA table with ``value``, ``schema_version``, ``ledger_id``, ``entry_id`` and
        ``batch_index``); a null value (tombstone) decodes to null.

        Raises
        ------
        CorruptDataError
            For a value that does not decode (``onCorruptValue=fail``), naming the topic,
            ledger, entry and batch index.
        """
        col = table.column("value")
        values = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
        if self.spec.type == "BYTES":
            return values
        if self.spec.type == "STRING":
            try:
                return values.cast(pa.string())  # checks UTF-8
            except pa.ArrowInvalid:
                return self._decode_rows(values, table, topic, self._utf8)
        return self._decode_rows(values, table, topic, None)

    @staticmethod
    def _utf8(data: bytes, version: int, topic: TopicName) -> Any:
        return data.decode("utf-8")

    def _decode_rows(
        self,
        values: pa.Array,
        table: pa.Table,
        topic: TopicName,
        one: Callable[[bytes, int, TopicName], Any] | None,
    ) -> pa.Array:
        # null: written without a schema (decoded with the reader's own)
        versions = table.column("schema_version").fill_null(-1).to_numpy()
        payloads = values.to_pylist()
        out: list[Any] = [None] * len(payloads)
        decode = one or self._one
        for i, data in enumerate(payloads):
            if data is None:
                continue
            try:
                out[i] = decode(data, int(versions[i]), topic)
            except (_Bad, IncompatibleSchema, UnicodeDecodeError) as e:
                self._corrupt(table, topic, i, e)
        try:
            return to_arrow(out, self.arrow_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
            # A decoded value Arrow cannot hold (an int above the field's range, say): find it.
            for i, v in enumerate(out):
                try:
                    pa.array([v], type=self.arrow_type)
                except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e2:
                    self._corrupt(table, topic, i, e2)
                    out[i] = None
            if self.spec.on_corrupt == "fail":
                raise CorruptDataError(f"{topic}: decoded values do not fit: {e}") from e
            return to_arrow(out, self.arrow_type)

    def _one(self, data: bytes, version: int, topic: TopicName) -> Any:
        if self._json is not None:
            try:
                d = json.loads(data)
            except ValueError as e:
                raise _Bad(f"value is not JSON: {e}") from e
            return self._json(d)
        from fastavro.read import SchemaResolutionError

        buf = io.BytesIO(data)
        try:
            v = self._fastavro.schemaless_reader(buf, *self._writer(topic, version))
        except SchemaResolutionError as e:
            raise IncompatibleSchema(f"schema version {version} does not resolve: {e}") from e
        except (EOFError, IndexError, ValueError, TypeError, KeyError, OverflowError) as e:
            raise _Bad(f"not Avro data of schema version {version}: {type(e).__name__}: {e}") from e
        if buf.tell() != len(data):
            raise _Bad(
                f"{len(data) - buf.tell()} bytes left after the Avro value of schema version "
                f"{version}"
            )
        return v

    def _corrupt(self, table: pa.Table, topic: TopicName, i: int, e: Exception) -> None:
        ledger = int(table.column("ledger_id")[i].as_py())
        entry = int(table.column("entry_id")[i].as_py())
        bidx = int(table.column("batch_index")[i].as_py())
        where = f"{topic}, ledger {ledger}, entry {entry}" + (
            f", batch index {bidx}" if bidx >= 0 else ""
        )
        if self.spec.on_corrupt == "null":
            return
        raise CorruptDataError(
            f"value of the message at {where} does not decode with the topic's "
            f"{self.spec.type} schema: {e}; set onCorruptValue=null to read it as null",
            topic=str(topic),
            ledger_id=ledger,
            entry_id=entry,
        ) from e


def to_arrow(values: list[Any], t: pa.DataType) -> pa.Array:
    """``values`` (Python values, None for null) as an Arrow array of type ``t``; a struct is
    built field by field (an order of magnitude faster than Arrow converting dicts)."""
    if not pa.types.is_struct(t):
        return pa.array(values, type=t)
    nulls = [v is None for v in values]
    has_null = any(nulls)
    children = []
    for f in t:
        name = f.name
        if has_null:
            col = [None if v is None else v.get(name) for v in values]
        else:
            try:
                col = list(map(operator.itemgetter(name), values))
            except KeyError:
                col = [v.get(name) for v in values]
        children.append(to_arrow(col, f.type))
    mask = pa.array(nulls, pa.bool_()) if has_null else None
    return pa.StructArray.from_arrays(children, fields=list(t), mask=mask)


def decode_columns(decoder: ValueDecoder, table: pa.Table, topic: TopicName) -> dict[str, pa.Array]:
    """The value columns (:meth:`ValueSpec.columns`) of ``table``'s rows."""
    arr = decoder.decode(table, topic)
    cols = decoder.spec.columns()
    if len(cols) == 1 and cols[0][0] == "value":
        return {"value": arr}
    # Flatten: a null struct (tombstone, nulled value) gives null fields.
    assert isinstance(arr, pa.StructArray)
    out = {}
    valid = arr.is_valid()
    for i, (name, _, _) in enumerate(cols):
        child = arr.field(i)
        if arr.null_count:
            child = pa.compute.if_else(valid, child, pa.scalar(None, child.type))
        out[name] = child
    return out
