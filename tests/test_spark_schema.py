"""Schemas and compacted reads in Spark (issue 13): ``valueFormat`` struct/flatten on the
source (values decoded into typed columns by the topic's schema), struct values on the sink
(encoded with the topic's schema), and ``readCompacted``.

Everything runs through real Spark (one session), real client producers and consumers, and a
real compaction run.
"""

from __future__ import annotations

import datetime as dt
from enum import Enum
from pathlib import Path
from typing import Any

import pytest

from filepulsar.connector.client import Client, InitialPosition
from filepulsar.schema import (
    Array,
    AvroSchema,
    Bytes,
    Double,
    Integer,
    JsonSchema,
    Long,
    Map,
    Record,
    String,
    StringSchema,
)
from filepulsar.storage import open_blob_store, set_namespace_policies
from filepulsar.storage.compaction import compact
from filepulsar.storage.names import TopicName
from filepulsar.storage.schemas import SchemaRegistry

pytestmark = pytest.mark.spark

WAIT_MS = 5000


class Color(Enum):
    red = "red"
    green = "green"


class Address(Record):
    street = String()
    zip = Integer()


class Order(Record):
    id = Long(required=True)
    item = String()
    qty = Integer()
    price = Double()
    tags = Array(String())
    attrs = Map(Long())
    color = Color
    address = Address()
    blob = Bytes()


def _orders(n: int) -> list[Order]:
    return [
        Order(
            id=i,
            item=f"item-{i}",
            qty=i * 2,
            price=i + 0.5,
            tags=[f"t{i}", "x"],
            attrs={"a": i, "b": -i},
            color=Color.green if i % 2 else Color.red,
            address=Address(street=f"street {i}", zip=1000 + i),
            blob=b"b%d" % i,
        )
        for i in range(n)
    ]


@pytest.fixture
def root(tmp_path: Path) -> str:
    return str(tmp_path / "root")


@pytest.fixture
def client(root: str) -> Any:
    c = Client(root)
    yield c
    c.close()


def _produce(client: Client, topic: str, schema: Any, values: list[Any], **kw: Any) -> None:
    p = client.create_producer(topic, schema=schema, batching_enabled=False, **kw)
    for v in values:
        p.send(v)
    p.close()


def _read(spark: Any, root: str, **opts: str) -> Any:
    r = spark.read.format("filepulsar")
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load(root)


def _stream(spark: Any, root: str, tmp_path: Path, name: str, **opts: str) -> list[Any]:
    """Every row an AvailableNow query reads (memory sink), and the query's schema."""
    r = spark.readStream.format("filepulsar")
    if "subscription" not in opts:
        r = r.option("startingOffsets", "earliest")
    for k, v in opts.items():
        r = r.option(k, v)
    df = r.load(root)
    q = (
        df.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / f"chk-{name}"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    return spark.sql(f"select * from {name}").collect()


# ---------------------------------------------------------------------- source: typed columns
def test_avro_values_read_as_typed_columns(
    spark: Any, root: str, client: Client, tmp_path: Path
) -> None:
    orders = _orders(5)
    _produce(client, "orders", AvroSchema(Order), orders)

    flat = _read(spark, root, topic="orders", valueFormat="flatten")
    assert flat.schema.simpleString().startswith(
        "struct<id:bigint,item:string,qty:int,price:double,tags:array<string>,"
        "attrs:map<string,bigint>,color:string,address:struct<street:string,zip:int>,"
        "blob:binary,key:string,"
    )
    assert "value" not in flat.columns and "messageId" in flat.columns
    rows = flat.orderBy("id").collect()
    assert [r.id for r in rows] == list(range(5))
    r3 = rows[3]
    assert (r3.item, r3.qty, r3.price, r3.tags, r3.attrs, r3.color) == (
        "item-3",
        6,
        3.5,
        ["t3", "x"],
        {"a": 3, "b": -3},
        "green",
    )
    assert (r3.address.street, r3.address.zip, bytes(r3.blob)) == ("street 3", 1003, b"b3")

    nested = _read(spark, root, topic="orders", valueFormat="struct")
    assert nested.schema["value"].dataType.simpleString().startswith("struct<id:bigint,item")
    got = nested.selectExpr("value.id", "value.address.zip").orderBy("id").collect()
    assert [(r.id, r.zip) for r in got] == [(i, 1000 + i) for i in range(5)]

    # A stream (AvailableNow into a memory sink) reads the same typed rows.
    streamed = _stream(spark, root, tmp_path, "typed_avro", topic="orders", valueFormat="flatten")
    assert sorted((r.id, r.address.street) for r in streamed) == [
        (o.id, o.address.street) for o in orders
    ]
    # A schema given to the source picks typed columns too (checked against the topic's).
    given = spark.read.format("filepulsar").schema("item string, qty int, entryId bigint")
    got = given.option("topic", "orders").option("valueFormat", "flatten").load(root)
    assert sorted((r.item, r.qty) for r in got.collect())[1] == ("item-1", 2)
    wrong = spark.read.format("filepulsar").schema("item bigint")
    with pytest.raises(Exception, match="matches no schema version"):
        wrong.option("topic", "orders").option("valueFormat", "flatten").load(root).collect()
    # Narrowing with the columns option mixes record fields and source columns.
    narrow = _read(spark, root, topic="orders", valueFormat="flatten", columns="item,ledgerId")
    assert narrow.columns == ["item", "ledgerId"]
    assert sorted(r.item for r in narrow.collect()) == [f"item-{i}" for i in range(5)]


class Reading(Record):
    sensor = String()
    value = Double()
    samples = Array(Integer())
    labels = Map(String())
    place = Address()


def test_json_values_read_as_typed_columns(spark: Any, root: str, client: Client) -> None:
    values = [
        Reading(
            sensor=f"s{i}",
            value=i / 4,
            samples=[i, i + 1],
            labels={"unit": "C"},
            place=Address(street="main", zip=i),
        )
        for i in range(4)
    ]
    values.append(Reading(sensor="empty"))  # null fields stay null
    _produce(client, "readings", JsonSchema(Reading), values)
    df = _read(spark, root, topic="readings", valueFormat="struct")
    rows = {r.v.sensor: r.v for r in df.selectExpr("value as v").collect()}
    assert rows["s2"].value == 0.5 and rows["s2"].samples == [2, 3]
    assert rows["s2"].labels == {"unit": "C"} and rows["s2"].place.zip == 2
    # pulsar-client writes an unset sub-record as the record with its defaults.
    assert rows["empty"].value is None and rows["empty"].samples is None
    assert rows["empty"].place.street is None


def test_string_schema_reads_as_a_string_column(spark: Any, root: str, client: Client) -> None:
    _produce(client, "texts", StringSchema(), ["héllo", "wörld"])
    df = _read(spark, root, topic="texts", valueFormat="struct")
    assert df.schema["value"].dataType.simpleString() == "string"
    assert sorted(r.value for r in df.collect()) == ["héllo", "wörld"]


class V1(Record):
    a = Long()
    b = String()


class V2(Record):
    a = Long()
    c = String(default="none", required_default=True)


def test_schema_evolution_resolves_every_version_to_the_latest(
    spark: Any, root: str, client: Client
) -> None:
    set_namespace_policies(
        open_blob_store(root), "public", "default", schema_compatibility_strategy="BACKWARD"
    )
    _produce(client, "evolving", AvroSchema(V1), [V1(a=1, b="old"), V1(a=2, b="old")])
    _produce(client, "evolving", AvroSchema(V2), [V2(a=3, c="new")])
    reg = SchemaRegistry(open_blob_store(root), TopicName.parse("evolving"))
    assert [s.version for s in reg.versions()] == [0, 1]
    df = _read(spark, root, topic="evolving", valueFormat="flatten", columns="a,c")
    # Written with version 0: the field added later gets its default, the removed one is gone.
    assert sorted((r.a, r.c) for r in df.collect()) == [(1, "none"), (2, "none"), (3, "new")]


def test_a_value_that_does_not_decode_fails_with_its_location(
    spark: Any, root: str, client: Client
) -> None:
    _produce(client, "damaged", AvroSchema(V1), [V1(a=1, b="ok")])
    # A producer without a schema may write to the topic (schema_validation_enforced is off,
    # Pulsar's default); its bytes are not Avro data of the schema.
    raw = client.create_producer("damaged", batching_enabled=False)
    raw.send(b"\x02\x0a")  # a = 1, b: a 5-byte string that is not there
    raw.close()
    with pytest.raises(Exception) as err:
        _read(spark, root, topic="damaged", valueFormat="flatten").collect()
    text = str(err.value)
    assert "persistent://public/default/damaged, ledger" in text and "entry 1" in text
    assert "onCorruptValue=null" in text
    rows = _read(
        spark, root, topic="damaged", valueFormat="flatten", onCorruptValue="null"
    ).collect()
    assert sorted(((r.a, r.b, r.entryId) for r in rows), key=lambda t: t[2]) == [
        (1, "ok", 0),
        (None, None, 1),
    ]


def test_typed_reads_need_one_schema(spark: Any, root: str, client: Client) -> None:
    _produce(client, "sch-a", AvroSchema(V1), [V1(a=1)])
    _produce(client, "sch-b", AvroSchema(Address), [Address(zip=1)])
    _produce(client, "sch-c", None, [b"plain"])
    with pytest.raises(Exception, match="share one schema"):
        _read(spark, root, topics="sch-a,sch-b", valueFormat="flatten")
    with pytest.raises(Exception, match="sch-c has none"):
        _read(spark, root, topic="sch-c", valueFormat="struct")
    with pytest.raises(Exception, match="share one schema"):
        _read(spark, root, topicsPattern="persistent://public/default/sch-.*", valueFormat="struct")
    # Two topics with one schema read together.
    _produce(client, "sch-d", AvroSchema(V1), [V1(a=2)])
    df = _read(spark, root, topics="sch-a,sch-d", valueFormat="flatten", columns="a,topic")
    assert sorted((r.a, r.topic) for r in df.collect()) == [
        (1, "persistent://public/default/sch-a"),
        (2, "persistent://public/default/sch-d"),
    ]


# ---------------------------------------------------------------------- sink: struct values
def _struct_df(spark: Any, n: int) -> Any:
    from pyspark.sql import functions as F

    return spark.range(n, numPartitions=2).select(
        F.struct(
            F.col("id").alias("id"),
            F.concat(F.lit("item-"), F.col("id").cast("string")).alias("item"),
            (F.col("id") * 2).cast("int").alias("qty"),
            (F.col("id") + 0.5).alias("price"),
            F.array(F.concat(F.lit("t"), F.col("id").cast("string")), F.lit("x")).alias("tags"),
            F.create_map(F.lit("a"), F.col("id"), F.lit("b"), -F.col("id")).alias("attrs"),
            F.when(F.col("id") % 2 == 1, "green").otherwise("red").alias("color"),
            F.struct(
                F.concat(F.lit("street "), F.col("id").cast("string")).alias("street"),
                (F.col("id") + 1000).cast("int").alias("zip"),
            ).alias("address"),
            F.concat(F.lit("b"), F.col("id").cast("string")).cast("binary").alias("blob"),
        ).alias("value"),
        F.concat(F.lit("k"), F.col("id").cast("string")).alias("key"),
    )


def _consume(client: Client, topic: str, schema: Any, n: int) -> list[Any]:
    c = client.subscribe(topic, "check", schema=schema, initial_position=InitialPosition.Earliest)
    out = [c.receive(WAIT_MS).value() for _ in range(n)]
    c.close()
    return out


def test_sink_writes_structs_with_the_topics_schema(spark: Any, root: str, client: Client) -> None:
    # The topic's schema comes first: a client producer registered AvroSchema(Order).
    _produce(client, "sunk", AvroSchema(Order), _orders(1))
    (
        _struct_df(spark, 6)
        .where("value.id > 0")
        .write.format("filepulsar")
        .option("topic", "sunk")
        .mode("append")
        .save(root)
    )
    got = _consume(client, "sunk", AvroSchema(Order), 6)
    assert sorted(got, key=lambda o: o.id) == _orders(6)
    reg = SchemaRegistry(open_blob_store(root), TopicName.parse("sunk"))
    assert [s.version for s in reg.versions()] == [0]  # the same schema, not a new version


def test_sink_registers_a_schema_derived_from_the_struct(
    spark: Any, root: str, client: Client
) -> None:
    from pyspark.sql import functions as F

    df = spark.range(3).select(
        F.struct(
            F.col("id").alias("a"), F.concat(F.lit("v"), F.col("id").cast("string")).alias("b")
        ).alias("value")
    )
    df.write.format("filepulsar").option("topic", "derived").mode("append").save(root)
    stored = SchemaRegistry(open_blob_store(root), TopicName.parse("derived")).latest()
    assert stored is not None and stored.type == "AVRO"
    got = _consume(client, "derived", AvroSchema(V1), 3)
    assert sorted(got, key=lambda r: r.a) == [V1(a=i, b=f"v{i}") for i in range(3)]

    # JSON, and flattened columns: every non-sink column is a field of the record.
    flat = spark.range(3).selectExpr("id as a", "concat('w', id) as b", "cast(id as string) as key")
    (
        flat.write.format("filepulsar")
        .option("topic", "derived-json")
        .option("valueFormat", "flatten")
        .option("valueSchemaType", "JSON")
        .mode("append")
        .save(root)
    )
    got = _consume(client, "derived-json", JsonSchema(V1), 3)
    assert sorted(got, key=lambda r: r.a) == [V1(a=i, b=f"w{i}") for i in range(3)]
    # ... and Spark reads them back typed.
    back = _read(spark, root, topic="derived-json", valueFormat="flatten", columns="a,b,key")
    assert sorted(tuple(r) for r in back.collect()) == [(i, f"w{i}", str(i)) for i in range(3)]


def test_sink_refuses_a_struct_that_does_not_match(spark: Any, root: str, client: Client) -> None:
    _produce(client, "strict", AvroSchema(V1), [V1(a=1, b="x")])
    bad = spark.range(2).selectExpr("named_struct('a', cast(id as string), 'b', 'x') as value")
    with pytest.raises(Exception, match=r"field a: the struct has string, the topic's schema"):
        bad.write.format("filepulsar").option("topic", "strict").mode("append").save(root)
    extra = spark.range(2).selectExpr("named_struct('a', id, 'zzz', 1) as value")
    with pytest.raises(Exception, match="field zzz: the struct has it"):
        extra.write.format("filepulsar").option("topic", "strict").mode("append").save(root)
    # A topic without a schema gets none while the namespace forbids adding schemas.
    set_namespace_policies(
        open_blob_store(root), "public", "default", is_allow_auto_update_schema=False
    )
    good = spark.range(2).selectExpr("named_struct('a', id) as value")
    with pytest.raises(Exception, match="is_allow_auto_update_schema is false"):
        good.write.format("filepulsar").option("topic", "strict-new").mode("append").save(root)
    # Nothing was written by any of them.
    c = client.create_reader("strict", start_message_id=_earliest())
    assert c.read_next(WAIT_MS).value() is not None
    assert not c.has_message_available()
    c.close()


def _earliest() -> Any:
    from filepulsar.connector.client import MessageId

    return MessageId.earliest


# ---------------------------------------------------------------------- readCompacted
def test_read_compacted_reads_the_view_then_the_tail(
    spark: Any, root: str, client: Client, tmp_path: Path
) -> None:
    p = client.create_producer("kv", batching_enabled=True, batching_max_messages=4)
    for i in range(20):
        p.send(b"v%d" % i, partition_key=f"k{i % 4}")
    p.send(None, partition_key="k0")  # a tombstone removes k0
    p.flush()
    report = compact(open_blob_store(root), "kv")
    assert report.keys == 3
    for i in range(20, 22):
        p.send(b"v%d" % i, partition_key=f"k{i % 4}")
    p.close()
    expected = [("k1", b"v17"), ("k2", b"v18"), ("k3", b"v19"), ("k0", b"v20"), ("k1", b"v21")]

    def pairs(rows: list[Any]) -> list[tuple[str, bytes]]:
        ordered = sorted(rows, key=lambda r: (r.ledgerId, r.entryId, r.batchIndex))
        return [(r.key, bytes(r.value)) for r in ordered]

    batch = _read(spark, root, topic="kv", readCompacted="true").collect()
    assert pairs(batch) == expected
    assert len(_read(spark, root, topic="kv").collect()) == 23  # the whole topic without it
    streamed = _stream(spark, root, tmp_path, "compacted", topic="kv", readCompacted="true")
    assert pairs(streamed) == expected
    # With an Exclusive subscription: the subscription's cursor starts at the earliest message,
    # before the horizon, so the view is read, then the tail; the cursor then moves past it.
    subscribed = _stream(
        spark,
        root,
        tmp_path,
        "compacted_sub",
        topic="kv",
        readCompacted="true",
        subscription="compacted-sub",
        subscriptionInitialPosition="Earliest",
    )
    assert pairs(subscribed) == expected
    with pytest.raises(Exception, match="readCompacted' needs an Exclusive or Failover"):
        _stream(
            spark,
            root,
            tmp_path,
            "compacted_shared",
            topic="kv",
            readCompacted="true",
            subscription="s",
            subscriptionType="Shared",
        )


def test_read_compacted_is_typed_too(spark: Any, root: str, client: Client) -> None:
    p = client.create_producer("kv-typed", schema=AvroSchema(V1), batching_enabled=False)
    for i in range(6):
        p.send(V1(a=i, b=f"k{i % 2}"), partition_key=f"k{i % 2}")
    p.close()
    compact(open_blob_store(root), "kv-typed")
    df = _read(spark, root, topic="kv-typed", valueFormat="flatten", readCompacted="true")
    assert sorted((r.key, r.a) for r in df.collect()) == [("k0", 4), ("k1", 5)]


def test_timestamps_and_dates_round_trip(spark: Any, root: str, client: Client) -> None:
    from pyspark.sql import functions as F

    df = spark.range(2).select(
        F.struct(
            F.col("id").alias("n"),
            F.to_date(F.lit("2024-02-29")).alias("day"),
            F.to_timestamp(F.lit("2024-02-29 10:11:12.345678")).alias("at"),
            F.lit(1.25).cast("decimal(10,3)").alias("amount"),
        ).alias("value")
    )
    df.write.format("filepulsar").option("topic", "times").mode("append").save(root)
    back = _read(spark, root, topic="times", valueFormat="flatten", columns="n,day,at,amount")
    assert back.schema.simpleString() == (
        "struct<n:bigint,day:date,at:timestamp,amount:decimal(10,3)>"
    )
    rows = sorted(back.collect())
    assert rows[1].day == dt.date(2024, 2, 29) and str(rows[1].amount) == "1.250"
    assert rows[1].at == df.collect()[1].value.at
