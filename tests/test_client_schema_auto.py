"""Schema registration by consumers and readers, AUTO_CONSUME and AUTO_PRODUCE_BYTES (issue 13).

Pulsar's broker registers the schema of a consumer (or reader) that subscribes to an idle topic
with no schema, when the namespace allows auto-update; a topic in use without a schema refuses
one (there is nothing to check it against); a consumer whose schema cannot read the topic's is
refused. ``AutoConsumeSchema`` (Java's ``Schema.AUTO_CONSUME()``) reads any topic, decoding each
message with the version that wrote it; ``AutoProduceBytesSchema`` (Java's
``Schema.AUTO_PRODUCE_BYTES()``) sends pre-encoded bytes checked against the topic's schema.
pulsar-client (Python) has neither, so these tests are our own.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

import filepulsar.schema as fschema
from filepulsar.connector.admin import Admin
from filepulsar.connector.client import Client, InitialPosition, MessageId
from filepulsar.schema import (
    AutoConsumeSchema,
    AutoProduceBytesSchema,
    AvroSchema,
    Integer,
    JsonSchema,
    ProtobufNativeSchema,
    Record,
    String,
    StringSchema,
)
from filepulsar.storage import set_namespace_policies
from filepulsar.storage.errors import IncompatibleSchema, InvalidConfiguration
from filepulsar.storage.names import TopicName
from filepulsar.storage.schemas import SchemaRegistry
from filepulsar.storage.topics import create_topic

pytestmark = pytest.mark.unit

WAIT_MS = 30_000


@pytest.fixture
def client(tmp_path: Path) -> Any:
    c = Client(str(tmp_path))
    yield c
    c.close()


def versions(c: Client, topic: str) -> list[tuple[int, str]]:
    return [(s.version, s.type) for s in SchemaRegistry(c.store, TopicName.parse(topic)).versions()]


def policies(c: Client, **kw: Any) -> None:
    set_namespace_policies(c.store, "public", "default", **kw)


def stored_values(c: Client, topic: str) -> list[bytes]:
    """Every message of ``topic``, read from the start without a schema."""
    r = c.create_reader(topic, MessageId.earliest)
    out = []
    while r.has_message_available():
        out.append(r.read_next(WAIT_MS).data())
    r.close()
    return out


class Side(Enum):
    BUY = 1
    SELL = 2


class V0(Record):
    a = Integer(required=True)


class V1(Record):
    a = Integer(required=True)
    b = String(required_default=True)


class Other(Record):
    a = String(required=True)


class Trade(Record):
    a = Integer(required=True)
    name = String()
    side = Side


# ================================================================ registration by consumers
@pytest.mark.parametrize("how", ["subscribe", "reader"])
def test_first_consumer_of_an_idle_topic_registers_its_schema(client: Client, how: str) -> None:
    """As Pulsar's broker: a consumer or reader with a schema on an idle topic with none
    registers it; a producer of another schema is then refused, one of the same schema gets
    version 0."""
    if how == "subscribe":
        client.subscribe("t", "s", schema=AvroSchema(V0)).close()
    else:
        client.create_reader("t", MessageId.earliest, schema=AvroSchema(V0)).close()
    assert versions(client, "t") == [(0, "AVRO")]
    with pytest.raises(IncompatibleSchema):
        client.create_producer("t", schema=JsonSchema(V0))
    p = client.create_producer("t", schema=AvroSchema(V0))
    p.send(V0(a=1))
    p.close()
    c = client.subscribe(
        "t", "s2", schema=AvroSchema(V0), initial_position=InitialPosition.Earliest
    )
    m = c.receive(WAIT_MS)
    assert (m.value(), m.int_schema_version()) == (V0(a=1), 0)
    c.close()


def test_consumer_registration_of_a_partitioned_topic(client: Client) -> None:
    """The partitions share the registry: the first consumer registers it once."""
    create_topic(client.store, "pt", 3)
    client.subscribe("pt", "s", schema=JsonSchema(V0)).close()
    assert versions(client, "pt") == [(0, "JSON")]


def test_idle_registration_needs_auto_update(client: Client) -> None:
    """is_allow_auto_update_schema false: a consumer with a schema on a topic with none is
    refused (as Pulsar: "schema auto updating is disabled") and nothing is registered."""
    policies(client, is_allow_auto_update_schema=False)
    with pytest.raises(IncompatibleSchema, match=r"consumer schema AVRO .*auto_update"):
        client.subscribe("t", "s", schema=AvroSchema(V0))
    with pytest.raises(IncompatibleSchema, match=r"reader schema AVRO .*auto_update"):
        client.create_reader("t", MessageId.earliest, schema=AvroSchema(V0))
    assert versions(client, "t") == []


def test_incompatible_consumer_names_topic_strategy_and_versions(client: Client) -> None:
    """A consumer whose schema cannot read the latest version is refused: the error names the
    topic, the strategy, the version it cannot read and the versions it is not among."""
    client.create_producer("t", schema=AvroSchema(V0)).close()
    client.create_producer("t", schema=AvroSchema(V1)).close()
    with pytest.raises(IncompatibleSchema) as e:
        client.subscribe("t", "s", schema=AvroSchema(Other))
    text = str(e.value)
    assert "persistent://public/default/t" in text
    assert "strategy FULL" in text
    assert "schema version 1 (AVRO" in text
    assert "versions 0..1" in text
    assert "\n" not in text
    with pytest.raises(IncompatibleSchema, match="type JSON is not AVRO"):
        client.create_reader("t", MessageId.earliest, schema=JsonSchema(V1))
    assert versions(client, "t") == [(0, "AVRO"), (1, "AVRO")]


@pytest.mark.parametrize("busy", ["data", "producer", "consumer"])
def test_topic_in_use_without_a_schema_refuses_a_schema_consumer(client: Client, busy: str) -> None:
    """As Pulsar: a topic that holds data, or has a connected producer or consumer, but no
    schema, has nothing to check a consumer's schema against: refused (not registered). Under
    ALWAYS_COMPATIBLE it is accepted without registering; AutoConsumeSchema always is."""
    held: list[Any] = []
    if busy == "data":
        p = client.create_producer("t")
        p.send(b"raw")
        p.close()
    elif busy == "producer":
        held.append(client.create_producer("t"))
    else:
        held.append(client.subscribe("t", "other"))
    with pytest.raises(IncompatibleSchema, match="no schema and is in use"):
        client.subscribe("t", "s", schema=JsonSchema(V0))
    client.subscribe("t", "s", schema=AutoConsumeSchema()).close()
    policies(client, schema_compatibility_strategy="ALWAYS_COMPATIBLE")
    client.subscribe("t", "s", schema=JsonSchema(V0)).close()
    assert versions(client, "t") == []
    for h in held:
        h.close()


# ================================================================ AUTO_CONSUME
def test_auto_consume_decodes_each_message_with_its_writer_version(client: Client) -> None:
    """Messages of two Avro versions and one written without a schema: dicts read with each
    writer's version (the second has ``b``), and the raw bytes as they are."""
    policies(client, schema_compatibility_strategy="FULL")
    c = client.subscribe("t", "s", schema=AutoConsumeSchema())
    assert versions(client, "t") == []  # AUTO_CONSUME registers nothing
    p0 = client.create_producer("t", schema=AvroSchema(V0))
    p0.send(V0(a=1))
    p1 = client.create_producer("t", schema=AvroSchema(V1))
    p1.send(V1(a=2, b="two"))
    raw = client.create_producer("t")
    raw.send(b"\x00raw")
    got = [c.receive(WAIT_MS) for _ in range(3)]
    assert [(m.value(), m.int_schema_version()) for m in got] == [
        ({"a": 1}, 0),
        ({"a": 2, "b": "two"}, 1),
        (b"\x00raw", -1),
    ]
    for x in (c, p0, p1, raw):
        x.close()


@pytest.mark.parametrize("kind", ["json", "avro", "string"])
def test_auto_consume_of_each_schema_type(client: Client, kind: str) -> None:
    """JSON and Avro records become dicts (JSON as written: the enum's value; Avro: the enum's
    symbol), STRING values str; a reader does the same."""
    schema = {"json": JsonSchema(Trade), "avro": AvroSchema(Trade), "string": StringSchema()}[kind]
    value: Any = Trade(a=7, name="x", side=Side.SELL) if kind != "string" else "héllo"
    p = client.create_producer("t", schema=schema)
    p.send(value)
    p.close()
    expected = {
        "json": {"a": 7, "name": "x", "side": 2},
        "avro": {"a": 7, "name": "x", "side": "SELL"},
        "string": "héllo",
    }[kind]
    c = client.subscribe(
        "t", "s", schema=AutoConsumeSchema(), initial_position=InitialPosition.Earliest
    )
    assert c.receive(WAIT_MS).value() == expected
    c.close()
    r = client.create_reader("t", MessageId.earliest, schema=AutoConsumeSchema())
    assert r.read_next(WAIT_MS).value() == expected
    r.close()


def _protobuf_class() -> Any:
    fdp = descriptor_pb2.FieldDescriptorProto
    fp = descriptor_pb2.FileDescriptorProto()
    fp.name, fp.package, fp.syntax = "auto.proto", "auto", "proto3"
    m = fp.message_type.add()
    m.name = "Point"
    for name, number, ftype in (("label", 1, fdp.TYPE_STRING), ("x", 2, fdp.TYPE_INT64)):
        f = m.field.add()
        f.name, f.number, f.type, f.label = name, number, ftype, fdp.LABEL_OPTIONAL
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("auto.Point"))


def test_auto_consume_of_protobuf_native(client: Client) -> None:
    """A PROTOBUF_NATIVE value comes back as a message of a class built from the stored
    descriptor (the application needs no generated class)."""
    point = _protobuf_class()
    p = client.create_producer("t", schema=ProtobufNativeSchema(point))
    p.send(point(label="p", x=3))
    p.close()
    c = client.subscribe(
        "t", "s", schema=AutoConsumeSchema(), initial_position=InitialPosition.Earliest
    )
    v = c.receive(WAIT_MS).value()
    assert (v.DESCRIPTOR.full_name, v.label, v.x) == ("auto.Point", "p", 3)
    c.close()


def test_auto_consume_reports_a_value_its_version_cannot_decode(client: Client) -> None:
    """A stamped value that is not its version's encoding: IncompatibleSchema naming the
    message (an AUTO_PRODUCE_BYTES producer with ALWAYS_COMPATIBLE would not let it through;
    a producer of raw bytes stamped by hand is the storage API's)."""
    p = client.create_producer("t", schema=JsonSchema(V0))
    p._inner.send(b"not json")
    p.close()
    c = client.subscribe(
        "t", "s", schema=AutoConsumeSchema(), initial_position=InitialPosition.Earliest
    )
    with pytest.raises(IncompatibleSchema, match=r"written with schema version 0.*not JSON"):
        c.receive(WAIT_MS).value()
    c.close()


# ================================================================ AUTO_PRODUCE_BYTES
def test_auto_produce_checks_bytes_against_an_avro_topic(client: Client) -> None:
    """Bytes that are one V0 record go through, stamped with the topic's version; bytes cut
    short, empty or with bytes left over are refused with one line, and nothing is stored."""
    client.create_producer("t", schema=AvroSchema(V0)).close()
    good = AvroSchema(V0).encode(V0(a=5))
    p = client.create_producer("t", schema=AutoProduceBytesSchema())
    p.send(good)
    for bad in (b"\xff\xff", b"", good + b"x"):
        with pytest.raises(IncompatibleSchema, match="AutoProduceBytesSchema") as e:
            p.send(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(IncompatibleSchema):
        p.send_async(b"\xff\xff", None)
    p.flush()
    p.close()
    assert stored_values(client, "t") == [good]
    c = client.subscribe("t", "s", schema=AvroSchema(V0), initial_position=InitialPosition.Earliest)
    m = c.receive(WAIT_MS)
    assert (m.value(), m.int_schema_version()) == (V0(a=5), 0)
    c.close()


@pytest.mark.parametrize(
    ("raw", "ok"),
    [
        (b'{"a": 1, "name": "n", "side": 1}', True),
        (b'{"a": 1, "side": "BUY"}', True),  # enum by symbol; nullable name left out
        (b'{"a": 1, "extra": [1]}', True),  # keys naming no field are ignored, as Pulsar
        (b"[1]", False),
        (b"not json", False),
        (b'{"a": "1"}', False),
        (b'{"a": true}', False),
        (b'{"name": "n"}', False),  # required a missing
        (b'{"a": 1, "name": 3}', False),
        (b'{"a": 1, "side": [1]}', False),
    ],
)
def test_auto_produce_checks_bytes_against_a_json_topic(
    client: Client, raw: bytes, ok: bool
) -> None:
    client.create_producer("t", schema=JsonSchema(Trade)).close()
    p = client.create_producer("t", schema=AutoProduceBytesSchema())
    if ok:
        p.send(raw)
        assert stored_values(client, "t") == [raw]
    else:
        with pytest.raises(IncompatibleSchema, match=r"not a value of topic .* schema version 0"):
            p.send(raw)
        p.flush()
        assert stored_values(client, "t") == []
    p.close()


def test_auto_produce_on_string_and_schemaless_topics(client: Client) -> None:
    """A STRING topic takes UTF-8 only; a topic with no schema takes any bytes, unstamped,
    and registers nothing."""
    client.create_producer("s", schema=StringSchema()).close()
    p = client.create_producer("s", schema=AutoProduceBytesSchema())
    p.send(b"ok")
    with pytest.raises(IncompatibleSchema, match="UTF-8"):
        p.send(b"\xff\xfe")
    p.close()
    assert stored_values(client, "s") == [b"ok"]
    q = client.create_producer("free", schema=AutoProduceBytesSchema())
    q.send(b"\xff\xfe")
    q.close()
    assert versions(client, "free") == []
    r = client.create_reader("free", MessageId.earliest)
    m = r.read_next(WAIT_MS)
    assert (m.data(), m.int_schema_version()) == (b"\xff\xfe", -1)
    r.close()


def test_auto_produce_with_its_own_schema_registers_it(client: Client) -> None:
    """``AutoProduceBytesSchema(schema)`` (Java's ``AUTO_PRODUCE_BYTES(schema)``) registers
    ``schema`` as a producer would and checks the bytes with it."""
    p = client.create_producer("t", schema=AutoProduceBytesSchema(AvroSchema(V1)))
    assert versions(client, "t") == [(0, "AVRO")]
    good = AvroSchema(V1).encode(V1(a=1, b="b"))
    p.send(good)
    with pytest.raises(IncompatibleSchema):
        p.send(b"\x02")  # a=1, then no b
    p.close()
    assert stored_values(client, "t") == [good]
    with pytest.raises(IncompatibleSchema):
        client.create_producer("t", schema=AutoProduceBytesSchema(JsonSchema(V1)))


def test_auto_schemas_refuse_misuse(client: Client) -> None:
    with pytest.raises(InvalidConfiguration, match="AutoConsumeSchema is for subscribe"):
        client.create_producer("t", schema=AutoConsumeSchema())
    with pytest.raises(InvalidConfiguration, match="AutoProduceBytesSchema is for create_"):
        client.subscribe("t", "s", schema=AutoProduceBytesSchema())
    with pytest.raises(InvalidConfiguration, match="AutoProduceBytesSchema takes None"):
        AutoProduceBytesSchema("AVRO")  # type: ignore[arg-type]
    with pytest.raises(InvalidConfiguration):
        AutoProduceBytesSchema(AutoConsumeSchema())
    p = client.create_producer("t", schema=AutoProduceBytesSchema())
    with pytest.raises(TypeError, match="sends bytes already encoded"):
        p.send(V0(a=1))
    p.close()
    with pytest.raises(TypeError, match="only decodes"):
        AutoConsumeSchema().encode({"a": 1})


def test_auto_schemas_are_filepulsar_schema_names() -> None:
    assert {"AutoConsumeSchema", "AutoProduceBytesSchema"} <= set(fschema.__all__)
    assert fschema.AutoConsumeSchema().schema_info().schema_type().value == "AUTO_CONSUME"
    assert json.loads(json.dumps(str(fschema.AutoProduceBytesSchema()))) == (
        "AutoProduceBytesSchema"
    )


def test_admin_uploaded_schema_serves_auto_produce(client: Client) -> None:
    """A schema uploaded with the admin API (no producer ever declared it) is what an
    AUTO_PRODUCE_BYTES producer checks against."""
    create_topic(client.store, "t")
    with Admin(store=client.store) as admin:
        admin.schemas().create_schema("t", "JSON", JsonSchema(V0).schema_info().schema())
    p = client.create_producer("t", schema=AutoProduceBytesSchema())
    p.send(b'{"a": 3}')
    with pytest.raises(IncompatibleSchema):
        p.send(b'{"b": 3}')
    p.close()
    assert stored_values(client, "t") == [b'{"a": 3}']


# ================================================================ decoding fast paths
class Defaults(Record):
    flag = fschema.Boolean()
    n = Integer(default=5)
    s = String()
    side = Side


@pytest.mark.parametrize("kind", ["json", "avro"])
def test_decoded_nulls_take_field_defaults(client: Client, kind: str) -> None:
    """The compiled record builders keep the constructor's rules: a null (or, in JSON, a
    missing key) takes the field's default, an enum arrives by symbol or value."""
    nulls = {"flag": None, "n": None, "s": None, "side": None}
    if kind == "avro":
        writer: Any = AvroSchema(None, schema_definition=Defaults.schema())
        reader: Any = AvroSchema(Defaults)
        values = [nulls, {"flag": True, "n": 1, "s": "x", "side": "SELL"}]
    else:
        writer = AutoProduceBytesSchema()
        reader = JsonSchema(Defaults)
        client.create_producer("t", schema=reader).close()
        values = [b"{}", json.dumps(nulls).encode(), b'{"flag": true, "n": 1, "side": 2}']
    p = client.create_producer("t", schema=writer)
    for v in values:
        p.send(v)
    p.close()
    c = client.subscribe("t", "s", schema=reader, initial_position=InitialPosition.Earliest)
    got = [c.receive(WAIT_MS).value() for _ in values]
    c.close()
    expected = [Defaults(flag=False, n=5)] * (len(values) - 1) + [
        Defaults(flag=True, n=1, s="x" if kind == "avro" else None, side=Side.SELL)
    ]
    assert got == expected
    assert all(type(x) is Defaults for x in got)
    assert got[-1].side is Side.SELL


def test_json_of_wrong_types_still_refused_on_the_fast_path() -> None:
    """Data with exactly the record's keys but a value of another type leaves the fast path
    for the field's full check (which converts what the constructor converts)."""
    schema = JsonSchema(Trade)
    assert schema.decode(b'{"a": 1, "name": "n", "side": "BUY"}') == Trade(
        a=1, name="n", side=Side.BUY
    )
    with pytest.raises(IncompatibleSchema, match="field 'a'"):
        schema.decode(b'{"a": "1", "name": "n", "side": 1}')
    with pytest.raises(IncompatibleSchema, match="Invalid enum value 'HOLD'"):
        schema.decode(b'{"a": 1, "name": "n", "side": "HOLD"}')
    with pytest.raises(IncompatibleSchema, match="Invalid enum value '3'"):
        schema.decode(b'{"a": 1, "name": "n", "side": 3}')
    assert schema.decode(b'{"a": 1, "name": null, "side": null}') == Trade(a=1)
