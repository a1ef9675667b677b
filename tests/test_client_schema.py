"""Value schemas as pulsar-client's ``pulsar.schema`` (issue 13).

The first part restates pulsar-client-python's own ``tests/schema_test.py`` in our words: the
same checks, with a storage root under ``tmp_path`` in place of the broker's service URL and
our namespace policies in place of the broker's HTTP admin calls. The second part covers what
the registry adds: Pulsar's eight compatibility strategies, ``is_allow_auto_update_schema``,
``schema_validation_enforced``, partitioned topics sharing one registry, producers in two
processes registering at once, corrupt schema files and bad arguments.

Upstream's ProtobufNativeSchemaTest is in tests/test_client_schema_protobuf.py. Ported
although upstream never runs them (no ``test_`` prefix, or nested in another test):
custom_schema_test, custom_schema_produce_and_consume_test and
test_complex_with_required_fields.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from enum import Enum
from pathlib import Path
from typing import Any

import fastavro
import pytest
from fastavro.schema import load_schema

from filepulsar.connector.admin import Admin
from filepulsar.connector.client import Client, InitialPosition, MessageId
from filepulsar.schema import (
    Array,
    AvroSchema,
    Boolean,
    Bytes,
    BytesSchema,
    CustomEnum,
    Double,
    Float,
    Integer,
    JsonSchema,
    Long,
    Map,
    Null,
    Record,
    String,
    StringSchema,
)
from filepulsar.storage import set_namespace_policies
from filepulsar.storage.errors import CorruptDataError, IncompatibleSchema, InvalidConfiguration
from filepulsar.storage.names import TopicName
from filepulsar.storage.schemas import SchemaRegistry
from filepulsar.storage.topics import create_topic

pytestmark = pytest.mark.unit

#: Receive timeout: only a broken consumer waits this long.
WAIT_MS = 30_000


@pytest.fixture
def client(tmp_path: Path) -> Any:
    c = Client(str(tmp_path))
    yield c
    c.close()


def set_strategy(c: Client, strategy: str, **more: Any) -> None:
    """The namespace's schema policies (pulsar-admin ``namespaces
    set-schema-compatibility-strategy`` and friends)."""
    set_namespace_policies(
        c.store, "public", "default", schema_compatibility_strategy=strategy, **more
    )


def registry(c: Client, topic: str) -> SchemaRegistry:
    return SchemaRegistry(c.store, TopicName.parse(topic))


# =============================================================== records and their Avro shape
class Color(Enum):
    red = 1
    green = 2
    blue = 3


def test_every_field_type_maps_to_its_avro_type() -> None:
    """upstream test_simple: each field kind, nullable by default, a plain Enum attribute and
    a CustomEnum of the same enum (the second use refers to the first by name)."""

    class Example(Record):
        _sorted_fields = True
        a = String()
        b = Integer()
        c = Array(String())
        d = Color
        e = Boolean()
        f = Float()
        g = Double()
        h = Bytes()
        i = Map(String())
        j = CustomEnum(Color)

    fastavro.parse_schema(Example.schema())
    assert Example.schema() == {
        "name": "Example",
        "type": "record",
        "fields": [
            {"name": "a", "type": ["null", "string"]},
            {"name": "b", "type": ["null", "int"]},
            {"name": "c", "type": ["null", {"type": "array", "items": "string"}]},
            {
                "name": "d",
                "type": [
                    "null",
                    {"type": "enum", "name": "Color", "symbols": ["red", "green", "blue"]},
                ],
            },
            {"name": "e", "type": ["null", "boolean"]},
            {"name": "f", "type": ["null", "float"]},
            {"name": "g", "type": ["null", "double"]},
            {"name": "h", "type": ["null", "bytes"]},
            {"name": "i", "type": ["null", {"type": "map", "values": "string"}]},
            {"name": "j", "type": ["null", "Color"]},
        ],
    }


@pytest.mark.parametrize(
    ("field", "given", "stored"),
    [
        (Integer(), 20, 20),
        (Double(), 20, 20.0),
        (Double(), 20.0, 20.0),
        (Bytes(), "Test text1", b"Test text1"),
        (String(), b"Test text1", "Test text1"),
    ],
)
def test_fields_promote_values(field: Any, given: Any, stored: Any) -> None:
    """upstream test_type_promotion: int to double, str to bytes and bytes to str."""
    assert field.validate_type("test_field", given) == stored


def test_nested_record_given_as_class_or_instance() -> None:
    """upstream test_complex: a sub-record declared by class and by instance; its second use
    refers to the first definition by name."""

    class Sub(Record):
        _sorted_fields = True
        x = Integer()
        y = Long()
        z = String()
        color = CustomEnum(Color)

    class Example(Record):
        _sorted_fields = True
        a = String()
        sub = Sub
        sub2 = Sub()

    fastavro.parse_schema(Example.schema())
    assert Example.schema() == {
        "name": "Example",
        "type": "record",
        "fields": [
            {"name": "a", "type": ["null", "string"]},
            {
                "name": "sub",
                "type": [
                    "null",
                    {
                        "name": "Sub",
                        "type": "record",
                        "fields": [
                            {
                                "name": "color",
                                "type": [
                                    "null",
                                    {
                                        "type": "enum",
                                        "name": "Color",
                                        "symbols": ["red", "green", "blue"],
                                    },
                                ],
                            },
                            {"name": "x", "type": ["null", "int"]},
                            {"name": "y", "type": ["null", "long"]},
                            {"name": "z", "type": ["null", "string"]},
                        ],
                    },
                ],
            },
            {"name": "sub2", "type": ["null", "Sub"]},
        ],
    }


def test_required_fields_are_not_nullable() -> None:
    """upstream test_complex_with_required_fields (nested in test_complex there, so never
    run): ``required`` drops the ``null`` branch, also for a sub-record."""

    class Sub(Record):
        x = Integer(required=True)
        y = Long(required=True)
        z = String()

    class Example(Record):
        a = String(required=True)
        sub = Sub(required=True)

    assert Example.schema() == {
        "name": "Example",
        "type": "record",
        "fields": [
            {"name": "a", "type": "string"},
            {
                "name": "sub",
                "type": {
                    "name": "Sub",
                    "type": "record",
                    "fields": [
                        {"name": "x", "type": "int"},
                        {"name": "y", "type": "long"},
                        {"name": "z", "type": ["null", "string"]},
                    ],
                },
            },
        ],
    }


def test_class_attribute_that_is_not_an_enum_is_no_field() -> None:
    """upstream test_invalid_enum: a plain class with int attributes is not a field."""

    class NotAnEnum:
        red = 1

    class Example(Record):
        a = Integer()
        b = NotAnEnum

    assert Example.schema() == {
        "name": "Example",
        "type": "record",
        "fields": [{"name": "a", "type": ["null", "int"]}],
    }


def test_record_holds_declared_fields_only() -> None:
    """upstream test_initialization: keyword values, assignment, and no undeclared field
    (neither set later nor given to the constructor)."""

    class Example(Record):
        a = Integer()
        b = Integer()

    r = Example(a=1, b=2)
    assert (r.a, r.b) == (1, 2)
    r.b = 5
    assert r.b == 5
    with pytest.raises(AttributeError):
        r.c = 3
    with pytest.raises((AttributeError, TypeError)):
        Record(a=1, c=8)


def test_fields_check_value_types() -> None:
    """upstream test_field_type_check: every field kind refuses values of another type with
    TypeError, and accepts int for float/double and name/value/member for an enum."""

    class Plain(Record):
        a = Integer()
        b = String(required=False)

    with pytest.raises(TypeError):
        Plain(a=1, b=2)

    class Flag(Record):
        a = Boolean()

    Flag(a=False)
    with pytest.raises(TypeError):
        Flag(a=1)

    class F(Record):
        a = Float()

    F(a=1.0)
    F(a=1)

    class N(Record):
        a = Null()

    N(a=None)
    with pytest.raises(TypeError):
        N(a=1)

    class L(Record):
        a = Long()

    L(a=1234)
    with pytest.raises(TypeError):
        L(a=1.12)

    class S(Record):
        a = String()

    S(a="hello")
    with pytest.raises(TypeError):
        S(a=1.12)

    class B(Record):
        a = Bytes()

    B(a=b"hello")
    with pytest.raises(TypeError):
        B(a=1.12)

    class D(Record):
        a = Double()

    D(a=1.0)
    D(a=1)

    class OtherEnum(Enum):
        red = 1
        green = 2
        blue = 3

    class E(Record):
        a = Color

    assert E(a=Color.red).a is Color.red
    assert E(a="red").a is Color.red
    assert E(a=1).a is Color.red
    for bad in ("redx", OtherEnum.red, 5):
        with pytest.raises(TypeError):
            E(a=bad)

    class Arr(Record):
        a = Array(String())

    Arr(a=["a", "b", "c"])
    for bad in (1, [1, 2, 3], ["1", "2", 3]):
        with pytest.raises(TypeError):
            Arr(a=bad)

    class M(Record):
        a = Map(Integer())

    M(a={"a": 1, "b": 2})
    for bad in (1, {"a": "1", "b": 2}, {1: 1, "b": 2}):
        with pytest.raises(TypeError):
            M(a=bad)

    class Sub1(Record):
        s = Integer()

    class Sub2(Record):
        s = String()

    class Outer(Record):
        a = Sub1

    Outer(a=Sub1(s=1))
    for bad in (1, Sub2(s="hello")):
        with pytest.raises(TypeError):
            Outer(a=bad)


def test_default_of_the_wrong_type_fails_the_declaration() -> None:
    """upstream test_field_type_check_defaults."""
    with pytest.raises(TypeError):

        class Example(Record):
            a = Integer(default="xyz")


def test_json_schema_encodes_a_json_object() -> None:
    """upstream test_serialize_json."""

    class Example(Record):
        a = Integer()
        b = Integer()

    assert Example.schema() == {
        "name": "Example",
        "type": "record",
        "fields": [
            {"name": "a", "type": ["null", "int"]},
            {"name": "b", "type": ["null", "int"]},
        ],
    }
    s = JsonSchema(Example)
    r = Example(a=1, b=2)
    data = s.encode(r)
    assert json.loads(data) == {"a": 1, "b": 2}
    back = s.decode(data)
    assert type(back).__name__ == "Example"
    assert back == r


def test_avro_schema_round_trips_a_record() -> None:
    """upstream test_serialize_avro."""

    class Example(Record):
        a = Integer()
        b = Integer()

    s = AvroSchema(Example)
    r = Example(a=1, b=2)
    back = s.decode(s.encode(r))
    assert type(back).__name__ == "Example"
    assert back == r


def test_fields_keep_declaration_order_unless_sorted() -> None:
    """upstream test_non_sorted_fields and test_sorted_fields."""

    class T1(Record):
        a = Integer()
        b = Integer()
        c = Double()
        d = String()

    class T2(Record):
        b = Integer()
        a = Integer()
        d = String()
        c = Double()

    assert T1.schema()["fields"] != T2.schema()["fields"]

    class S1(Record):
        _sorted_fields = True
        a = Integer()
        b = Integer()

    class S2(Record):
        _sorted_fields = True
        b = Integer()
        a = Integer()

    assert S1.schema()["fields"] == S2.schema()["fields"]


class _Tone(Enum):
    LOW = 1
    HIGH = 2


class _Inner(Record):
    x = Integer()


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 35])
@pytest.mark.parametrize("mix", ["plain", "converting", "mixed"])
def test_records_of_any_size_encode_and_decode_field_by_field(n: int, mix: str) -> None:
    """Records of 1 to 35 fields (the dumper joins displays of 1-4, 8 and 16 fields, filling
    a short one with a plain field named twice), each field converted or not: JSON keeps the
    declaration order, and both schemas give back the record."""
    kinds = {
        "plain": [(Long(), 7), (String(), "s"), (Double(), 0.5)],
        "converting": [(CustomEnum(_Tone), _Tone.HIGH), (Bytes(), b"bytes"), (_Inner(), None)],
    }
    pool = kinds["plain"] + kinds["converting"] if mix == "mixed" else kinds[mix]
    fields, values = {}, {}
    for i in range(n):
        field, value = pool[(i * 5) % len(pool)]
        name = f"f{(i * 7) % n:02d}_{i}"  # declaration order is not sorted order
        fields[name] = (
            type(field)(field.enum_type) if isinstance(field, CustomEnum) else type(field)()
        )
        values[name] = _Inner(x=i) if isinstance(field, _Inner) else value
    Wide = type(Record)(f"Wide{n}{mix}", (Record,), dict(fields))
    r = Wide(**values)
    expected = {
        k: v.value if isinstance(v, Enum) else {"x": v.x} if isinstance(v, _Inner) else v
        for k, v in values.items()
    }
    text = JsonSchema(Wide).encode(r)
    as_json = json.loads(text)
    assert list(as_json) == list(values)  # declaration order
    for k, v in expected.items():
        assert as_json[k] == v or isinstance(v, bytes), (k, as_json[k], v)
    assert JsonSchema(Wide).decode(text) == r
    assert AvroSchema(Wide).decode(AvroSchema(Wide).encode(r)) == r


def test_message_carries_its_schema_version(client: Client) -> None:
    """upstream test_schema_version: the first schema of a topic is version 0, given as eight
    big-endian bytes."""

    class Example(Record):
        a = Integer()
        b = Integer()

    producer = client.create_producer("schema-version", schema=AvroSchema(Example))
    consumer = client.subscribe("schema-version", "sub-1", schema=AvroSchema(Example))
    r = Example(a=1, b=2)
    producer.send(r)
    msg = consumer.receive(WAIT_MS)
    assert msg.schema_version() is not None
    assert msg.schema_version().encode("latin-1") == b"\x00" * 8
    assert msg.int_schema_version() == 0
    assert msg.value() == r


def test_encoding_another_type_fails() -> None:
    """upstream test_serialize_wrong_types."""

    class Example(Record):
        a = Integer()
        b = Integer()

    class Foo(Record):
        x = Integer()
        y = Integer()

    s = JsonSchema(Example)
    with pytest.raises(TypeError):
        s.encode(Foo(x=1, y=2))
    with pytest.raises(TypeError):
        s.encode("hello")


def test_fields_take_their_defaults() -> None:
    """upstream test_defaults and test_none_value: declared defaults, else None (False for a
    Boolean)."""

    class WithDefaults(Record):
        a = Integer(default=5)
        b = Integer()
        c = String(default="hello")

    r = WithDefaults()
    assert (r.a, r.b, r.c) == (5, None, "hello")

    class Unset(Record):
        a = Null()
        b = Boolean()
        c = Integer()
        d = Long()
        e = Float()
        f = Double()
        g = Bytes()
        h = String()

    u = Unset()
    assert u.b is False
    assert [u.a, u.c, u.d, u.e, u.f, u.g, u.h] == [None] * 7


def test_json_topic_refuses_readers_it_cannot_serve(client: Client) -> None:
    """upstream test_json_schema: on a JSON topic, a consumer whose record changes a field's
    type, a StringSchema and an Avro consumer are refused; the JSON consumer gets the record."""

    class Example(Record):
        a = Integer()
        b = Integer()

    class BadExample(Record):
        a = String()
        b = Integer()

    producer = client.create_producer("json-topic", schema=JsonSchema(Example))
    with pytest.raises(IncompatibleSchema):
        client.subscribe("json-topic", "sub-1", schema=JsonSchema(BadExample))
    with pytest.raises(TypeError):  # StringSchema takes no record class (as upstream)
        StringSchema(BadExample)  # type: ignore[call-arg]
    with pytest.raises(IncompatibleSchema):
        client.subscribe("json-topic", "sub-1", schema=StringSchema())
    with pytest.raises(IncompatibleSchema):
        client.subscribe("json-topic", "sub-1", schema=AvroSchema(BadExample))
    consumer = client.subscribe("json-topic", "sub-1", schema=JsonSchema(Example))
    r = Example(a=1, b=2)
    producer.send(r)
    assert consumer.receive(WAIT_MS).value() == r
    producer.close()
    consumer.close()


def test_string_topic(client: Client) -> None:
    """upstream test_string_schema: a JSON producer is refused on a STRING topic; values come
    back as str and data() as the UTF-8 bytes."""

    class Example(Record):
        a = Integer()
        b = Integer()

    producer = client.create_producer("string-topic", schema=StringSchema())
    with pytest.raises(IncompatibleSchema):
        client.create_producer("string-topic", schema=JsonSchema(Example))
    consumer = client.subscribe("string-topic", "sub-1", schema=StringSchema())
    producer.send("Hello")
    msg = consumer.receive(WAIT_MS)
    assert msg.value() == "Hello"
    assert msg.data() == b"Hello"


def test_bytes_topic(client: Client) -> None:
    """upstream test_bytes_schema: a producer that declared BytesSchema makes the topic a
    BYTES topic, so a JSON producer is refused; values are the bytes."""

    class Example(Record):
        a = Integer()
        b = Integer()

    producer = client.create_producer("bytes-topic", schema=BytesSchema())
    with pytest.raises(IncompatibleSchema):
        client.create_producer("bytes-topic", schema=JsonSchema(Example))
    consumer = client.subscribe("bytes-topic", "sub-1", schema=BytesSchema())
    producer.send(b"Hello")
    assert consumer.receive(WAIT_MS).value() == b"Hello"


def test_avro_topic_refuses_readers_it_cannot_serve(client: Client) -> None:
    """upstream test_avro_schema: on an AVRO topic a consumer whose record changes a field's
    type and a JSON consumer are refused; the Avro consumer gets the record."""

    class Example(Record):
        a = Integer()
        b = Integer()

    class BadExample(Record):
        a = String()
        b = Integer()

    producer = client.create_producer("avro-topic", schema=AvroSchema(Example))
    with pytest.raises(IncompatibleSchema):
        client.subscribe("avro-topic", "sub-1", schema=AvroSchema(BadExample))
    with pytest.raises(IncompatibleSchema):
        client.subscribe("avro-topic", "sub-2", schema=JsonSchema(Example))
    consumer = client.subscribe("avro-topic", "sub-3", schema=AvroSchema(Example))
    r = Example(a=1, b=2)
    producer.send(r)
    assert consumer.receive(WAIT_MS).value() == r
    producer.close()
    consumer.close()


class MyEnum(Enum):
    A = 1
    B = 2
    C = 3


@pytest.mark.parametrize("kind", ["json", "avro"])
def test_enum_fields_through_a_topic(client: Client, kind: str) -> None:
    """upstream test_json_enum and test_avro_enum: enum fields as plain attribute, CustomEnum
    and a required CustomEnum whose default is written into the schema."""
    default = MyEnum.A if kind == "json" else MyEnum.B

    class Example(Record):
        name = String()
        v = MyEnum
        w = CustomEnum(MyEnum)
        x = CustomEnum(MyEnum, required=True, default=default, required_default=True)

    schema = JsonSchema(Example) if kind == "json" else AvroSchema(Example)
    producer = client.create_producer(topic=f"{kind}-enum", schema=schema)
    consumer = client.subscribe(f"{kind}-enum", "test", schema=schema)
    w = MyEnum.B if kind == "json" else MyEnum.A
    producer.send(Example(name="test", v=MyEnum.C, w=w))
    value = consumer.receive(WAIT_MS).value()
    assert value.name == "test"
    assert MyEnum(value.v) is MyEnum.C
    assert MyEnum(value.w) is w
    assert MyEnum(value.x) is default
    if kind == "avro":
        assert value.v is MyEnum.C


def test_nested_maps_and_arrays_through_a_topic(client: Client) -> None:
    """upstream test_avro_map_array."""

    class MapArray(Record):
        values = Map(Array(Integer()))

    class MapMap(Record):
        values = Map(Map(Integer()))

    class ArrayMap(Record):
        values = Array(Map(Integer()))

    class ArrayArray(Record):
        values = Array(Array(Integer()))

    cases = [
        (MapArray, MapArray(values={"A": [1, 2], "B": [3]})),
        (MapMap, MapMap(values={"A": {"B": 2}})),
        (ArrayMap, ArrayMap(values=[{"A": 1}, {"B": 2}, {"C": 3}])),
        (ArrayArray, ArrayArray(values=[[1, 2, 3], [4]])),
    ]
    for i, (cls, record) in enumerate(cases):
        topic = f"map-array-{i}"
        producer = client.create_producer(topic, schema=AvroSchema(cls))
        consumer = client.subscribe(topic, "sub", schema=AvroSchema(cls))
        producer.send(record)
        msg = consumer.receive(WAIT_MS)
        assert msg.value().values == record.values
        consumer.acknowledge(msg)
        consumer.close()
        producer.close()


def test_required_default_puts_defaults_in_the_schema(client: Client) -> None:
    """upstream test_avro_required_default: ``required_default=True`` writes each field's
    default (None, or False for a required Boolean) into the schema, and that schema may
    follow the one without defaults on the same topic (default strategy)."""

    class Sub(Record):
        _sorted_fields = True
        x = Integer()
        y = Long()
        z = String()

    class Example(Record):
        a = Integer()
        b = Boolean(required=True)
        c = Long()
        d = Float()
        e = Double()
        f = String()
        g = Bytes()
        h = Array(String())
        i = Map(String())
        j = Sub()

    class ExampleRequiredDefault(Record):
        _sorted_fields = True
        a = Integer(required_default=True)
        b = Boolean(required=True, required_default=True)
        c = Long(required_default=True)
        d = Float(required_default=True)
        e = Double(required_default=True)
        f = String(required_default=True)
        g = Bytes(required_default=True)
        h = Array(String(), required_default=True)
        i = Map(String(), required_default=True)
        j = Sub(required_default=True)

    def nullable(name: str, t: Any) -> dict[str, Any]:
        return {"name": name, "type": ["null", t], "default": None}

    assert ExampleRequiredDefault.schema() == {
        "name": "ExampleRequiredDefault",
        "type": "record",
        "fields": [
            nullable("a", "int"),
            {"name": "b", "type": "boolean", "default": False},
            nullable("c", "long"),
            nullable("d", "float"),
            nullable("e", "double"),
            nullable("f", "string"),
            nullable("g", "bytes"),
            nullable("h", {"type": "array", "items": "string"}),
            nullable("i", {"type": "map", "values": "string"}),
            nullable(
                "j",
                {
                    "name": "Sub",
                    "type": "record",
                    "fields": [
                        {"name": "x", "type": ["null", "int"]},
                        {"name": "y", "type": ["null", "long"]},
                        {"name": "z", "type": ["null", "string"]},
                    ],
                },
            ),
        ],
    }
    plain = client.create_producer("default-topic", schema=AvroSchema(Example))
    with_defaults = client.create_producer(
        "default-topic", schema=AvroSchema(ExampleRequiredDefault)
    )
    plain.close()
    with_defaults.close()
    assert [s.version for s in registry(client, "default-topic").versions()] == [0, 1]


def test_unset_fields_arrive_with_their_defaults(client: Client) -> None:
    """upstream test_default_value."""

    class MyRecord(Record):
        A = Integer()
        B = String()
        C = Boolean(default=True, required=True)
        D = Double(default=6.4)

    producer = client.create_producer(topic="default-value", schema=JsonSchema(MyRecord))
    consumer = client.subscribe("default-value", "test", schema=JsonSchema(MyRecord))
    producer.send(MyRecord(A=5, B="text"))
    value = consumer.receive(WAIT_MS).value()
    assert (value.A, value.B, value.C, value.D) == (5, "text", True, 6.4)


def test_complex_record_schema_and_round_trip() -> None:
    """upstream test_serialize_schema_complex: namespaces, sorted fields, second uses of named
    types by (qualified) name, and a round trip through both encodings."""

    class NestedObj1(Record):
        _sorted_fields = True
        na1 = String()
        nb1 = Double()

    class NestedObj2(Record):
        _sorted_fields = True
        na2 = Integer()
        nb2 = Boolean()
        nc2 = NestedObj1()

    class NestedObj3(Record):
        _sorted_fields = True
        color = CustomEnum(Color)
        na3 = Integer()

    class NestedObj4(Record):
        _avro_namespace = "xxx4"
        _sorted_fields = True
        na4 = String()
        nb4 = Integer()

    class ComplexRecord(Record):
        _avro_namespace = "xxx.xxx"
        _sorted_fields = True
        a = Integer()
        b = Integer()
        color = Color
        color2 = Color
        color3 = CustomEnum(Color, required=True, default=Color.red, required_default=True)
        nested = NestedObj2()
        nested2 = NestedObj2()
        mapNested = Map(NestedObj3())
        mapNested2 = Map(NestedObj3())
        arrayNested = Array(NestedObj4())
        arrayNested2 = Array(NestedObj4())

    color_enum = {"type": "enum", "name": "Color", "symbols": ["red", "green", "blue"]}
    assert ComplexRecord.schema() == {
        "name": "ComplexRecord",
        "namespace": "xxx.xxx",
        "type": "record",
        "fields": [
            {"name": "a", "type": ["null", "int"]},
            {
                "name": "arrayNested",
                "type": [
                    "null",
                    {
                        "type": "array",
                        "items": {
                            "name": "NestedObj4",
                            "namespace": "xxx4",
                            "type": "record",
                            "fields": [
                                {"name": "na4", "type": ["null", "string"]},
                                {"name": "nb4", "type": ["null", "int"]},
                            ],
                        },
                    },
                ],
            },
            {
                "name": "arrayNested2",
                "type": ["null", {"type": "array", "items": "xxx4.NestedObj4"}],
            },
            {"name": "b", "type": ["null", "int"]},
            {"name": "color", "type": ["null", color_enum]},
            {"name": "color2", "type": ["null", "Color"]},
            {"name": "color3", "default": "red", "type": "Color"},
            {
                "name": "mapNested",
                "type": [
                    "null",
                    {
                        "type": "map",
                        "values": {
                            "name": "NestedObj3",
                            "type": "record",
                            "fields": [
                                {"name": "color", "type": ["null", "Color"]},
                                {"name": "na3", "type": ["null", "int"]},
                            ],
                        },
                    },
                ],
            },
            {"name": "mapNested2", "type": ["null", {"type": "map", "values": "NestedObj3"}]},
            {
                "name": "nested",
                "type": [
                    "null",
                    {
                        "name": "NestedObj2",
                        "type": "record",
                        "fields": [
                            {"name": "na2", "type": ["null", "int"]},
                            {"name": "nb2", "type": ["null", "boolean"]},
                            {
                                "name": "nc2",
                                "type": [
                                    "null",
                                    {
                                        "name": "NestedObj1",
                                        "type": "record",
                                        "fields": [
                                            {"name": "na1", "type": ["null", "string"]},
                                            {"name": "nb1", "type": ["null", "double"]},
                                        ],
                                    },
                                ],
                            },
                        ],
                    },
                ],
            },
            {"name": "nested2", "type": ["null", "NestedObj2"]},
        ],
    }

    for schema in (AvroSchema(ComplexRecord), JsonSchema(ComplexRecord)):
        inner = NestedObj2(na2=22, nb2=True, nc2=NestedObj1(na1="na1 value", nb1=20.5))
        r = ComplexRecord(
            a=1,
            b=2,
            color=Color.red,
            color2=Color.blue,
            nested=inner,
            nested2=inner,
            mapNested={
                "a": NestedObj3(na3=1, color=Color.green),
                "b": NestedObj3(na3=2),
                "c": NestedObj3(na3=3, color=Color.red),
            },
            mapNested2={
                "d": NestedObj3(na3=4, color=Color.red),
                "e": NestedObj3(na3=5, color=Color.blue),
                "f": NestedObj3(na3=6),
            },
            arrayNested=[
                NestedObj4(na4="value na4 1", nb4=100),
                NestedObj4(na4="value na4 2", nb4=200),
            ],
            arrayNested2=[
                NestedObj4(na4="value na4 3", nb4=300),
                NestedObj4(na4="value na4 4", nb4=400),
            ],
        )
        back = schema.decode(schema.encode(r))
        assert type(back).__name__ == "ComplexRecord"
        assert back == r
        assert r.color3 is Color.red
        assert r.mapNested["a"].color is Color.green
        assert r.mapNested["b"].color is None


def test_unset_sub_record_round_trips() -> None:
    """upstream test_sub_record_set_to_none."""

    class NestedObj1(Record):
        na1 = String()
        nb1 = Double()

    class NestedObj2(Record):
        na2 = Integer()
        nb2 = Boolean()
        nc2 = NestedObj1()

    schema = AvroSchema(NestedObj2)
    r = NestedObj2(na2=1, nb2=True)
    back = schema.decode(schema.encode(r))
    assert type(back).__name__ == "NestedObj2"
    assert back == r
    assert back.na2 == 1
    assert back.nb2 is True


@pytest.mark.parametrize("kind", ["avro", "json"])
def test_complex_record_through_a_topic(client: Client, kind: str) -> None:
    """upstream test_produce_and_consume_complex_schema_data."""

    class NestedObj1(Record):
        na1 = String()
        nb1 = Double()

    class NestedObj2(Record):
        na2 = Integer()
        nb2 = Boolean()
        nc2 = NestedObj1()

    class NestedObj3(Record):
        na3 = Integer()
        color = CustomEnum(Color, required=True, required_default=True, default=Color.blue)

    class NestedObj4(Record):
        na4 = String()
        nb4 = Integer()

    class ComplexRecord(Record):
        a = Integer()
        b = Integer()
        color = CustomEnum(Color)
        nested = NestedObj2()
        mapNested = Map(NestedObj3())
        arrayNested = Array(NestedObj4())

    schema = AvroSchema(ComplexRecord) if kind == "avro" else JsonSchema(ComplexRecord)
    topic = f"complex-{kind}"
    producer = client.create_producer(topic=topic, schema=schema)
    consumer = client.subscribe(topic, "test", schema=schema)
    r = ComplexRecord(
        a=1,
        b=2,
        nested=NestedObj2(na2=22, nb2=True, nc2=NestedObj1(na1="na1 value", nb1=20.5)),
        mapNested={
            "a": NestedObj3(na3=1, color=Color.red),
            "b": NestedObj3(na3=2, color=Color.green),
            "c": NestedObj3(na3=3),
        },
        arrayNested=[
            NestedObj4(na4="value na4 1", nb4=100),
            NestedObj4(na4="value na4 2", nb4=200),
        ],
    )
    producer.send(r)
    value = consumer.receive(WAIT_MS).value()
    assert type(value).__name__ == "ComplexRecord"
    assert value == r


#: An Avro schema given as a definition (no Record class): upstream's examples/company.avsc.
COMPANY = {
    "doc": "this is doc",
    "namespace": "example.avro",
    "type": "record",
    "name": "Company",
    "fields": [
        {"name": "name", "type": ["null", "string"]},
        {"name": "address", "type": ["null", "string"]},
        {
            "name": "employees",
            "type": [
                "null",
                {
                    "type": "array",
                    "items": {
                        "type": "record",
                        "name": "Employee",
                        "fields": [
                            {"name": "name", "type": ["null", "string"]},
                            {"name": "age", "type": ["null", "int"]},
                        ],
                    },
                },
            ],
        },
        {"name": "labels", "type": ["null", {"type": "map", "values": "string"}]},
        {
            "name": "companyType",
            "type": [
                "null",
                {
                    "type": "enum",
                    "name": "CompanyType",
                    "symbols": ["companyType1", "companyType2", "companyType3"],
                },
            ],
        },
    ],
}
COMPANY_NO_TYPE = {**COMPANY, "fields": COMPANY["fields"][:-1]}


def company(i: int, *, with_type: bool = True) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": f"company-name{i}",
        "address": f"xxx road xxx street {i}",
        "employees": [
            {"name": f"user{i}", "age": 20 + i},
            {"name": f"user{i}", "age": 30 + i},
            {"name": f"user{i}", "age": 35 + i},
        ],
        "labels": {"industry": f"software{i}", "scale": ">100", "funds": "1000000.0"},
    }
    if with_type:
        c["companyType"] = f"companyType{i % 3 + 1}"
    return c


def avsc(tmp_path: Path) -> dict[str, Any]:
    """COMPANY as fastavro loads it from an .avsc file."""
    path = tmp_path / "company.avsc"
    path.write_text(json.dumps(COMPANY))
    loaded = load_schema(str(path))
    assert isinstance(loaded, dict)
    return loaded


def test_avro_schema_from_a_definition(tmp_path: Path) -> None:
    """upstream custom_schema_test (not collected there: its name lacks the test_ prefix):
    AvroSchema(None, schema_definition=...) encodes and decodes dicts, with the definition
    given as a dict or loaded by fastavro from an .avsc file."""
    for definition in (COMPANY, avsc(tmp_path)):
        schema = AvroSchema(None, schema_definition=definition)
        value = company(0)
        assert schema.decode(schema.encode(value)) == value


def test_avro_definition_through_a_topic(client: Client, tmp_path: Path) -> None:
    """upstream custom_schema_produce_and_consume_test (not collected there either). Upstream
    expects the loaded .avsc, which has ``companyType``, to return records without it; that
    would fail had it run: here each schema returns exactly its fields."""
    cases = [
        ("custom-schema-1", COMPANY_NO_TYPE, False),
        ("custom-schema-2", avsc(tmp_path), True),
    ]
    for topic, definition, with_type in cases:
        schema = AvroSchema(None, schema_definition=definition)
        producer = client.create_producer(topic=topic, schema=schema)
        consumer = client.subscribe(topic, "test", schema=schema)
        for i in range(10):
            producer.send(company(i))  # a field the schema lacks is not written
        for i in range(10):
            msg = consumer.receive(WAIT_MS)
            assert msg.value() == company(i, with_type=with_type)
            consumer.acknowledge(msg)
        consumer.close()
        producer.close()
        # The registry holds the plain Avro schema, not fastavro's bookkeeping of a loaded one.
        (stored,) = registry(client, topic).versions()
        assert "__fastavro" not in stored.definition
        assert "__named_schemas" not in stored.definition
        fastavro.parse_schema(json.loads(stored.definition))


def test_json_omits_the_record_bookkeeping() -> None:
    """upstream test_json_schema_encode_remove_reserved_key."""

    class SchemaB(Record):
        field = String(required=True)

    class SchemaA(Record):
        field = SchemaB()

    data = JsonSchema(SchemaA).encode(SchemaA(field=SchemaB(field="something")))
    for reserved in (b"_default", b"_required", b"_required_default"):
        assert reserved not in data


def test_array_item_type_error_names_the_field() -> None:
    """upstream test_schema_array_wrong_type: the message is pulsar-client's, word for word."""

    class SomeSchema(Record):
        some_field = Array(Integer(), required=False, default=[])

    with pytest.raises(TypeError) as e:
        SomeSchema(some_field=["not", "integer"])
    assert str(e.value) == "Array field some_field items should all be of type int"


def test_evolved_schema_is_read_through_the_old_one(client: Client) -> None:
    """upstream test_schema_evolve: under FORWARD, a second producer whose record makes a
    field required adds version 1; a consumer and a reader holding the first schema read the
    interleaved messages of both."""

    class User1(Record):
        name = String()
        age = Integer()

    class User2(Record):
        _sorted_fields = True
        name = String()
        age = Integer(required=True)

    set_strategy(client, "FORWARD")
    topic = "schema-evolve"
    producer1 = client.create_producer(topic, schema=AvroSchema(User1))
    consumer = client.subscribe(topic, "sub", schema=AvroSchema(User1))
    reader = client.create_reader(topic, MessageId.earliest, schema=AvroSchema(User1))
    producer2 = client.create_producer(topic, schema=AvroSchema(User2))
    n = 20
    for i in range(n // 2):
        producer1.send(User1(age=i + 100, name=f"User1 {i}"))
        producer2.send(User2(age=i + 200, name=f"User2 {i}"))

    def check(msgs: list[Any]) -> None:
        for i, msg in enumerate(msgs):
            value, k = msg.value(), math.floor(i / 2)
            if i % 2 == 0:
                assert (value.age, value.name) == (k + 100, f"User1 {k}")
            else:
                assert (value.age, value.name) == (k + 200, f"User2 {k}")

    got_c, got_r = [], []
    for _ in range(n):
        got_c.append(consumer.receive(WAIT_MS))
        got_r.append(reader.read_next(WAIT_MS))
    check(got_c)
    check(got_r)
    assert [m.int_schema_version() for m in got_c[:2]] == [0, 1]


class ExampleRecord(Record):
    str_field = String()
    int_field = Integer()
    float_field = Float()
    bytes_field = Bytes()


@pytest.mark.parametrize("kind", ["avro", "json"])
def test_promoted_values_through_a_topic(client: Client, kind: str) -> None:
    """upstream test_schema_type_promotion: bytes given to a String field, int to Float and str
    to Bytes arrive as the field's type."""
    schema = AvroSchema(ExampleRecord) if kind == "avro" else JsonSchema(ExampleRecord)
    topic = f"type-promotion-{kind}"
    consumer = client.subscribe(topic=topic, subscription_name=f"my-sub-{kind}", schema=schema)
    producer = client.create_producer(topic=topic, schema=schema)
    sent = ExampleRecord(str_field=b"test", int_field=1, float_field=3, bytes_field="str")
    producer.send(sent)
    msg = consumer.receive(WAIT_MS)
    got = msg.value()
    assert got.str_field == sent.str_field == "test"
    assert got.int_field == sent.int_field
    assert got.float_field == sent.float_field
    assert got.bytes_field == sent.bytes_field == b"str"
    consumer.acknowledge(msg)


@pytest.mark.parametrize("mode", ["batched", "chunked", "send_async"])
def test_schema_values_in_batches_and_chunks(client: Client, mode: str) -> None:
    """Every write path stamps the schema version: batched entries, chunked messages and
    send_async; a multi-topic consumer decodes messages of both topics."""

    class Blob(Record):
        n = Integer(required=True)
        text = String()

    opts: dict[str, Any] = {
        "batched": {"batching_enabled": True},
        "chunked": {"chunking_enabled": True},
        "send_async": {},
    }[mode]
    size = 3 * 1024 * 1024 if mode == "chunked" else 10
    schema = AvroSchema(Blob)
    producers = [client.create_producer(t, schema=schema, **opts) for t in ("x1", "x2")]
    consumer = client.subscribe(
        ["x1", "x2"], "s", schema=schema, initial_position=InitialPosition.Earliest
    )
    n = 3 if mode == "chunked" else 50
    for p in producers:
        for i in range(n):
            if mode == "chunked":
                p.send(Blob(n=i, text="v" * size))
            else:
                p.send_async(Blob(n=i, text="v" * size), None)
        p.flush()
    got = [consumer.receive(WAIT_MS) for _ in range(2 * n)]
    assert sorted((m.topic_name()[-2:], m.value().n) for m in got) == sorted(
        (t, i) for t in ("x1", "x2") for i in range(n)
    )
    assert {m.int_schema_version() for m in got} == {0}
    assert all(len(m.value().text) == size for m in got)


# ================================================================ the registry: strategies
# Schemas for the strategy checks. Each "step" is a change from one version to the next.
class V0(Record):
    """The first version: a required int with no default."""

    a = Integer(required=True)


class AddOptional(Record):
    """V0 plus a nullable field with a default: readable both ways."""

    a = Integer(required=True)
    b = String(required_default=True)


class AddRequired(Record):
    """V0 plus a required field with no default: old readers ignore it (FORWARD), new readers
    cannot fill it from old data (not BACKWARD)."""

    a = Integer(required=True)
    b = String(required=True)


class DropRequired(Record):
    """V0 without ``a`` (another field, with a default, instead): new readers ignore ``a``
    (BACKWARD), old readers cannot fill ``a`` from new data (not FORWARD)."""

    z = String(required_default=True)


class ADefaulted(Record):
    """``a`` with a default 0: readable both ways from V0."""

    a = Integer(required=True, default=0, required_default=True)


class ZOnlyDefaulted(Record):
    """From ADefaulted: ``a`` dropped (ADefaulted readers use its default), ``z`` added with a
    default. Readable both ways from ADefaulted, not readable by V0 (no ``a``)."""

    z = String(required_default=True)


class ADropped(Record):
    """``a`` dropped, ``b`` added with a default: backward from V0 (``a`` ignored)."""

    b = String(required_default=True)


class AAsString(Record):
    """``a`` back as a string with a default: reads ADropped data (default), cannot read V0
    data (int is no string)."""

    b = String(required_default=True)
    a = String(required=True, default="", required_default=True)


def produce_chain(c: Client, topic: str, chain: list[type[Record]]) -> None:
    for cls in chain:
        c.create_producer(topic, schema=AvroSchema(cls)).close()


# strategy -> (accepted chain, refused chain): each chain is registered in order, the last
# step of the refused chain is the one refused.
STRATEGY_CASES: dict[str, tuple[list[type[Record]], list[type[Record]]]] = {
    "BACKWARD": ([V0, DropRequired], [V0, AddRequired]),
    "FORWARD": ([V0, AddRequired], [V0, DropRequired]),
    "FULL": ([V0, AddOptional], [V0, AddRequired]),
    # Transitive: accepted, a schema compatible with every version; refused, a last step
    # compatible with the latest version only (test_transitive_differs_from_the_plain_form).
    "BACKWARD_TRANSITIVE": ([V0, ADropped, ADropped], [V0, ADropped, AAsString]),
    "FORWARD_TRANSITIVE": ([V0, ADefaulted, ADefaulted], [V0, ADefaulted, ZOnlyDefaulted]),
    "FULL_TRANSITIVE": ([V0, AddOptional, AddOptional], [V0, ADefaulted, ZOnlyDefaulted]),
}


@pytest.mark.parametrize("strategy", sorted(STRATEGY_CASES))
def test_strategy_accepts_and_refuses(client: Client, strategy: str) -> None:
    """Each checking strategy with a change it accepts and one it refuses; a refused schema
    adds no version."""
    set_strategy(client, strategy)
    ok, bad = STRATEGY_CASES[strategy]
    produce_chain(client, "ok", ok)
    assert len(registry(client, "ok").versions()) == len(set(ok))
    produce_chain(client, "bad", bad[:-1])
    with pytest.raises(IncompatibleSchema, match=strategy):
        client.create_producer("bad", schema=AvroSchema(bad[-1]))
    assert len(registry(client, "bad").versions()) == len(bad) - 1


@pytest.mark.parametrize(
    ("plain", "chain"),
    [
        ("BACKWARD", [V0, ADropped, AAsString]),
        ("FORWARD", [V0, ADefaulted, ZOnlyDefaulted]),
        ("FULL", [V0, ADefaulted, ZOnlyDefaulted]),
    ],
)
def test_transitive_differs_from_the_plain_form(client: Client, plain: str, chain: Any) -> None:
    """The last step is compatible with the previous version but not with the first: the plain
    strategy (latest only) accepts it, the transitive one (every version) refuses it."""
    set_strategy(client, plain)
    produce_chain(client, "plain", chain)
    assert len(registry(client, "plain").versions()) == 3
    set_strategy(client, f"{plain}_TRANSITIVE")
    produce_chain(client, "transitive", chain[:-1])
    with pytest.raises(IncompatibleSchema, match="version 0"):
        client.create_producer("transitive", schema=AvroSchema(chain[-1]))


def test_always_compatible_accepts_anything_but_not_past_auto_update(client: Client) -> None:
    """ALWAYS_COMPATIBLE: even another schema type is added (positive); it does not override
    is_allow_auto_update_schema=false (negative)."""
    set_strategy(client, "ALWAYS_COMPATIBLE")
    client.create_producer("t", schema=AvroSchema(V0)).close()
    client.create_producer("t", schema=AvroSchema(AddRequired)).close()
    client.create_producer("t", schema=StringSchema()).close()
    assert [s.type for s in registry(client, "t").versions()] == ["AVRO", "AVRO", "STRING"]
    set_strategy(client, "ALWAYS_COMPATIBLE", is_allow_auto_update_schema=False)
    with pytest.raises(IncompatibleSchema, match="is_allow_auto_update_schema"):
        client.create_producer("t", schema=JsonSchema(V0))
    assert len(registry(client, "t").versions()) == 3


def test_always_incompatible_keeps_the_first_schema(client: Client) -> None:
    """ALWAYS_INCOMPATIBLE: the registered schema is used again (positive); no other one, even
    a fully compatible one, is added (negative)."""
    set_strategy(client, "ALWAYS_INCOMPATIBLE")
    p1 = client.create_producer("t", schema=AvroSchema(V0))
    p2 = client.create_producer("t", schema=AvroSchema(V0))
    p1.send(V0(a=1))
    p2.send(V0(a=2))
    with pytest.raises(IncompatibleSchema, match="ALWAYS_INCOMPATIBLE"):
        client.create_producer("t", schema=AvroSchema(AddOptional))
    assert len(registry(client, "t").versions()) == 1


def test_consumer_check_follows_the_strategy(client: Client) -> None:
    """A consumer's schema must read what the strategy lets producers write: under FULL the
    latest version, under FULL_TRANSITIVE every version."""
    set_strategy(client, "FULL")
    produce_chain(client, "t", [V0, ADefaulted, ZOnlyDefaulted])
    # ADefaulted reads the latest (ZOnlyDefaulted) and V0: accepted either way.
    client.subscribe("t", "a", schema=AvroSchema(ADefaulted)).close()
    # V0 cannot read ZOnlyDefaulted data (no ``a``): refused.
    with pytest.raises(IncompatibleSchema):
        client.subscribe("t", "b", schema=AvroSchema(AddRequired))
    set_strategy(client, "FULL_TRANSITIVE")

    class NeedsZ(Record):
        z = String(required_default=True)
        a = String(required=True, default="", required_default=True)

    # Reads the latest (no ``a``: its default) but not version 0 (``a`` an int, not a string).
    with pytest.raises(IncompatibleSchema, match="version 0"):
        client.subscribe("t", "c", schema=AvroSchema(NeedsZ))
    set_strategy(client, "FULL")
    client.subscribe("t", "c", schema=AvroSchema(NeedsZ)).close()


# ======================================================== auto update, validation, partitions
def test_auto_update_off_refuses_new_schemas(client: Client) -> None:
    """is_allow_auto_update_schema=false (as Pulsar): a producer whose schema is stored goes
    on; one with a new schema, even a compatible one, is refused and nothing is written; on a
    topic with no schema yet, too, until the schema is uploaded with the admin API."""
    client.create_producer("t", schema=AvroSchema(V0)).close()
    set_strategy(client, "FULL", is_allow_auto_update_schema=False)
    p = client.create_producer("t", schema=AvroSchema(V0))
    p.send(V0(a=1))
    with pytest.raises(IncompatibleSchema, match="is_allow_auto_update_schema is false"):
        client.create_producer("t", schema=AvroSchema(AddOptional))
    assert len(registry(client, "t").versions()) == 1

    create_topic(client.store, "fresh")
    with pytest.raises(IncompatibleSchema, match="is_allow_auto_update_schema is false"):
        client.create_producer("fresh", schema=AvroSchema(V0))
    assert registry(client, "fresh").versions() == []
    with Admin(store=client.store) as admin:
        v = admin.schemas().create_schema("fresh", "AVRO", AvroSchema(V0).schema_info().schema())
    assert v == 0
    p = client.create_producer("fresh", schema=AvroSchema(V0))
    assert p.send(V0(a=1)) is not None


def test_schema_validation_enforced(client: Client) -> None:
    """schema_validation_enforced: off (the default), a producer without a schema may write to
    a topic with one; on, it is refused with a one-line error; a topic with no schema still
    takes it."""

    class Example(Record):
        a = Integer()

    client.create_producer("t", schema=JsonSchema(Example)).close()
    plain = client.create_producer("t")
    plain.send(b"raw")
    plain.close()
    set_strategy(client, "FULL", schema_validation_enforced=True)
    with pytest.raises(IncompatibleSchema, match="schema_validation_enforced") as e:
        client.create_producer("t")
    assert "\n" not in str(e.value)
    client.create_producer("other").close()
    # The raw message is there, unstamped; the consumer decodes only what was stamped.
    consumer = client.subscribe(
        "t", "s", schema=JsonSchema(Example), initial_position=InitialPosition.Earliest
    )
    msg = consumer.receive(WAIT_MS)
    assert (msg.data(), msg.int_schema_version(), msg.schema_version()) == (b"raw", -1, "")


@pytest.mark.parametrize(
    ("schema", "raw"),
    [
        (AvroSchema(V0), b"\xff\xff"),  # a varint cut short
        (AvroSchema(V0), b""),
        (StringSchema(), b"\xff\xfe"),
        (JsonSchema(V0), b"[1]"),
        (JsonSchema(V0), b'{"a": "not an int"}'),
    ],
    ids=["avro-garbage", "avro-empty", "string-not-utf8", "json-list", "json-wrong-type"],
)
def test_value_that_does_not_decode_is_reported_with_its_message(
    client: Client, schema: Any, raw: bytes
) -> None:
    """Bytes written without the schema (allowed while schema_validation_enforced is off) do
    not decode: value() raises IncompatibleSchema naming the message and topic, on one line;
    data() still returns the bytes."""
    client.create_producer("t", schema=schema).close()
    plain = client.create_producer("t")
    mid = plain.send(raw)
    consumer = client.subscribe("t", "s", schema=schema, initial_position=InitialPosition.Earliest)
    msg = consumer.receive(WAIT_MS)
    with pytest.raises(IncompatibleSchema, match="does not decode") as e:
        msg.value()
    assert str(mid) in str(e.value)
    assert "persistent://public/default/t" in str(e.value)
    assert "\n" not in str(e.value)
    assert msg.data() == raw


def test_partitions_share_one_registry(client: Client, tmp_path: Path) -> None:
    """A partitioned topic has one schema history: every partition's messages carry the same
    version, a producer on one partition is checked against it, and the versions live under
    the partitioned topic only."""

    class Example(Record):
        a = Integer()

    class Other(Record):
        a = String()

    create_topic(client.store, "pt", partitions=3)
    producer = client.create_producer("pt", schema=AvroSchema(Example))
    consumer = client.subscribe(
        "pt", "s", schema=AvroSchema(Example), initial_position=InitialPosition.Earliest
    )
    for i in range(12):
        producer.send(Example(a=i), partition_key=f"k{i}")
    got = [consumer.receive(WAIT_MS) for _ in range(12)]
    assert sorted(m.value().a for m in got) == list(range(12))
    assert len({m.topic_name() for m in got}) > 1
    assert {m.int_schema_version() for m in got} == {0}
    with pytest.raises(IncompatibleSchema):
        client.create_producer("pt-partition-1", schema=AvroSchema(Other))
    same = client.create_producer("pt-partition-2", schema=AvroSchema(Example))
    same.send(Example(a=99))
    schema_files = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("schema/*.json"))
    assert len(schema_files) == 1
    assert "partition" not in str(schema_files[0])


def test_deleted_schema_never_reuses_a_version(client: Client) -> None:
    """After the admin deletes a topic's schema, the next schema gets a new version number
    (Pulsar's deletion is a version of its own): a message written before the deletion still
    decodes through the schema it was written with, not through a later one that took its
    number. Nothing from before the deletion counts for compatibility."""

    class Old(Record):
        a = Long()

    class New(Record):
        a = String()

    old = client.create_producer("t", schema=AvroSchema(Old))
    old.send(Old(a=98))
    old.close()
    with Admin(store=client.store) as admin:
        assert admin.schemas().delete_schema("t") == 1
        assert admin.schemas().get_all_versions("t") == []
        assert admin.schemas().delete_schema("t") == 0
    new = client.create_producer("t", schema=AvroSchema(New))  # a was a long: not checked
    new.send(New(a="x"))
    consumer = client.subscribe(
        "t", "s", schema=AvroSchema(New), initial_position=InitialPosition.Earliest
    )
    first, second = consumer.receive(WAIT_MS), consumer.receive(WAIT_MS)
    assert second.value() == New(a="x")
    assert first.int_schema_version() < second.int_schema_version()
    # The old message is read through Old (its writer): a long cannot become a string.
    with pytest.raises(IncompatibleSchema, match="does not decode"):
        first.value()
    assert AvroSchema(Old).decode(first.data()) == Old(a=98)
    assert [s.version for s in registry(client, "t").versions()] == [second.int_schema_version()]


# ============================================================== two processes at once
WORKER = textwrap.dedent(
    """
    import json, sys
    from filepulsar.connector.client import Client
    from filepulsar.schema import AvroSchema, Integer, Long, Record, String

    root, which, topics = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])

    if which == "b":
        class Reading(Record):
            a = Integer()
            b = String(required_default=True)
    else:
        class Reading(Record):
            a = Integer()
            c = Long(required_default=True)

    client = Client(root)
    schema = AvroSchema(Reading)
    for topic in topics:
        print("ready", flush=True)
        assert sys.stdin.readline().strip() == "go"
        producer = client.create_producer(topic, schema=schema)
        mid = producer.send(Reading(a=1))
        producer.close()
        print(json.dumps({"topic": topic, "id": str(mid)}), flush=True)
    client.close()
    """
)


@pytest.mark.procs
def test_two_processes_register_different_schemas_at_once(client: Client, tmp_path: Path) -> None:
    """Two processes create producers with different, compatible schemas on the same new
    topic at the same moment (a pipe barrier), for several topics: every topic ends with both
    versions, each message carries the version of its own schema, none is lost."""
    topics = [f"race-{i}" for i in range(6)]
    root = Client(str(tmp_path / "root"))
    for topic in topics:  # so both processes start the race from the same point
        create_topic(root.store, topic)
    root.close()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    procs = {
        which: subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / "root"), which, json.dumps(topics)],
            cwd=tmp_path,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        for which in ("b", "c")
    }
    results: dict[str, list[str]] = {"b": [], "c": []}
    try:
        for _ in topics:
            for p in procs.values():
                assert p.stdout is not None
                assert p.stdout.readline().strip() == "ready"
            for p in procs.values():
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            for which, p in procs.items():
                assert p.stdout is not None
                results[which].append(p.stdout.readline())
        for p in procs.values():
            assert p.wait(timeout=120) == 0
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    other = Client(str(tmp_path / "root"))
    try:
        for topic in topics:
            versions = registry(other, topic).versions()
            assert [s.version for s in versions] == [0, 1]
            fields = {
                s.version: {f["name"] for f in json.loads(s.definition)["fields"]} for s in versions
            }
            assert sorted(map(sorted, fields.values())) == [["a", "b"], ["a", "c"]]
            consumer = other.subscribe(topic, "check", initial_position=InitialPosition.Earliest)
            msgs = [consumer.receive(WAIT_MS) for _ in range(2)]
            consumer.close()
            by_field = {}
            for m in msgs:
                by_field["b" if "b" in fields[m.int_schema_version()] else "c"] = m
            assert set(by_field) == {"b", "c"}
    finally:
        other.close()


# ============================================================== corrupt data, bad input
def test_corrupt_schema_file_is_reported_with_its_path(client: Client, tmp_path: Path) -> None:
    """A damaged schema version file is reported as CorruptDataError naming the file, to a
    new producer and to a consumer decoding a message of that version."""

    class Example(Record):
        a = Integer()

    producer = client.create_producer("t", schema=AvroSchema(Example))
    producer.send(Example(a=1))
    (path,) = list(tmp_path.rglob("schema/*.json"))
    raw = bytearray(path.read_bytes())
    raw[raw.index(b'"AVRO"') + 1] ^= 0x20  # flip one bit of the stored type
    path.write_bytes(bytes(raw))

    fresh = Client(str(tmp_path))  # nothing cached
    try:
        with pytest.raises(CorruptDataError) as e:
            fresh.create_producer("t", schema=AvroSchema(Example))
        assert path.name in str(e.value)
        assert "\n" not in str(e.value)
        with pytest.raises(CorruptDataError, match=path.name):
            fresh.subscribe("t", "s", schema=AvroSchema(Example))
        # Nothing stored is lost: the message is still there as bytes.
        consumer = fresh.subscribe("t", "raw", initial_position=InitialPosition.Earliest)
        assert AvroSchema(Example).decode(consumer.receive(WAIT_MS).data()) == Example(a=1)
    finally:
        fresh.close()


@pytest.mark.parametrize("call", ["create_producer", "subscribe", "create_reader"])
def test_schema_argument_that_is_no_schema(client: Client, call: str) -> None:
    """schema=123 (or a Record class instead of a schema) is refused with a one-line
    InvalidConfiguration naming the schemas allowed."""
    create_topic(client.store, "t")
    for bad in (123, Record, "AVRO"):
        args: tuple[Any, ...] = {
            "create_producer": ("t",),
            "subscribe": ("t", "s"),
            "create_reader": ("t", MessageId.earliest),
        }[call]
        with pytest.raises(InvalidConfiguration, match="schema must be") as e:
            getattr(client, call)(*args, schema=bad)
        assert "\n" not in str(e.value)
        assert "JsonSchema" in str(e.value)
    assert registry(client, "t").versions() == []


def test_schema_constructors_refuse_bad_arguments() -> None:
    """JsonSchema and AvroSchema need a Record class (or, for Avro, a valid definition)."""
    with pytest.raises(InvalidConfiguration, match="Record subclass"):
        JsonSchema(int)  # type: ignore[arg-type]
    with pytest.raises(InvalidConfiguration, match="neither"):
        AvroSchema(None)
    with pytest.raises(InvalidConfiguration, match="not a valid Avro schema"):
        AvroSchema(None, schema_definition={"type": "record", "name": "X", "fields": 3})
