"""ProtobufNativeSchema (issue 13): pulsar-client-python's ProtobufNativeSchemaTest restated in
our words, plus produce/consume through a topic and the registry's root-message check.

The message classes are built at run time from a FileDescriptorProto (no protoc needed), as
upstream's test does.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from filepulsar.connector.client import Client, IncompatibleSchema, InitialPosition
from filepulsar.schema import ProtobufNativeSchema, SchemaType

pytestmark = pytest.mark.unit

FDP = descriptor_pb2.FieldDescriptorProto


def _field(msg: Any, name: str, number: int, ftype: int, type_name: str = "") -> None:
    f = msg.field.add()
    f.name, f.number, f.type = name, number, ftype
    f.label = FDP.LABEL_OPTIONAL
    if type_name:
        f.type_name = type_name


def _classes(package: str, file_name: str) -> tuple[Any, Any, Any]:
    fp = descriptor_pb2.FileDescriptorProto()
    fp.name, fp.package, fp.syntax = file_name, package, "proto3"
    m = fp.message_type.add()
    m.name = "TestMessage"
    _field(m, "name", 1, FDP.TYPE_STRING)
    _field(m, "value", 2, FDP.TYPE_INT32)
    n = fp.message_type.add()
    n.name = "TestMessageWithNested"
    _field(n, "str_field", 1, FDP.TYPE_STRING)
    _field(n, "int_field", 2, FDP.TYPE_INT32)
    _field(n, "double_field", 3, FDP.TYPE_DOUBLE)
    _field(n, "nested", 4, FDP.TYPE_MESSAGE, f".{package}.TestInner")
    i = fp.message_type.add()
    i.name = "TestInner"
    _field(i, "inner_str", 1, FDP.TYPE_STRING)
    _field(i, "inner_int", 2, FDP.TYPE_INT64)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fp)
    return tuple(  # type: ignore[return-value]
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{n}"))
        for n in ("TestMessage", "TestMessageWithNested", "TestInner")
    )


PbMessage, PbNested, PbInner = _classes("test", "test_schema.proto")


def test_schema_type_and_name() -> None:
    info = ProtobufNativeSchema(PbMessage).schema_info()
    assert info.schema_type() == SchemaType.PROTOBUF_NATIVE
    assert info.name() == "PROTOBUF_NATIVE"


def test_definition_holds_the_three_keys_naming_the_root() -> None:
    d = json.loads(ProtobufNativeSchema(PbMessage).schema_info().schema())
    assert d["rootMessageTypeName"] == "test.TestMessage"
    assert d["rootFileDescriptorName"] == "test_schema.proto"
    fds = descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(d["fileDescriptorSet"]))
    assert "test_schema.proto" in [f.name for f in fds.file]


def test_round_trip_is_protobuf_binary() -> None:
    schema = ProtobufNativeSchema(PbMessage)
    original = PbMessage(name="pulsar", value=100)
    data = schema.encode(original)
    assert PbMessage.FromString(data) == original
    back = schema.decode(data)
    assert (back.name, back.value) == ("pulsar", 100)


def test_round_trip_of_a_nested_message() -> None:
    schema = ProtobufNativeSchema(PbNested)
    original = PbNested(
        str_field="test",
        int_field=7,
        double_field=3.14,
        nested=PbInner(inner_str="inner", inner_int=999),
    )
    back = schema.decode(schema.encode(original))
    assert (back.str_field, back.int_field) == ("test", 7)
    assert back.double_field == pytest.approx(3.14)
    assert (back.nested.inner_str, back.nested.inner_int) == ("inner", 999)


def test_wrong_types_raise_type_error() -> None:
    with pytest.raises(TypeError):
        ProtobufNativeSchema(PbMessage).encode("not a protobuf message")
    with pytest.raises(TypeError):
        ProtobufNativeSchema(str)


def test_produce_and_consume_through_a_topic(tmp_path: Path) -> None:
    client = Client(str(tmp_path / "root"))
    try:
        schema = ProtobufNativeSchema(PbMessage)
        producer = client.create_producer("pb", schema=schema)
        consumer = client.subscribe(
            "pb", "s", schema=schema, initial_position=InitialPosition.Earliest
        )
        producer.send(PbMessage(name="field", value=42))
        m = consumer.receive(5000)
        value = m.value()
        assert isinstance(value, PbMessage)
        assert (value.name, value.value) == ("field", 42)
        assert m.int_schema_version() == 0
        # Another root message type is not the same schema: refused under FULL (default).
        with pytest.raises(IncompatibleSchema, match="root message type"):
            client.create_producer("pb", schema=ProtobufNativeSchema(PbNested))
        with pytest.raises(IncompatibleSchema, match="root message type"):
            client.subscribe("pb", "t", schema=ProtobufNativeSchema(PbInner))
        # The same root type from another build of the file is accepted.
        Other, _, _ = _classes("test", "test_schema.proto")
        client.create_producer("pb", schema=ProtobufNativeSchema(Other)).send(
            Other(name="again", value=1)
        )
        assert consumer.receive(5000).value().name == "again"
    finally:
        client.close()
