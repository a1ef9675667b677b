"""Schema'd produce and consume (issue 13): records through JsonSchema and AvroSchema against
plain bytes of the same size.

Run: ``python -m bench.bench_schema`` (or ``make bench``). ``FILEPULSAR_BENCH_SCHEMA_N`` sets
the message count (default 1M); ``FILEPULSAR_BENCH_SCHEMA_CLOCK=cpu`` measures CPU seconds of
the process instead of wall time (for a machine shared with other work). Each variant
publishes N messages with ``send_async`` on a producer with batching on (pulsar-client's
throughput setting) and then drains them with one Exclusive consumer (``batch_receive``, one
cumulative ack per batch) calling ``value()`` on every message, on a local disk. The record
has four fields (a long, a string, a double, an enum); the bytes variant sends its JSON
encoding, pre-built, so the ratio is the cost of the schema: building records, encoding and
decoding them.

The ceiling rows are bare loops with no filepulsar in them: encoding a record's values with
``json`` / ``fastavro.schemaless_writer`` (a hand-written dict of its fields), and decoding
with ``json.loads`` / ``fastavro.schemaless_reader`` into a ``Trade`` built the cheapest way
(``object.__new__`` and its ``__dict__`` filled, the enum by a dict lookup). They bound what
a schema'd producer or consumer can reach on this machine; the ``/ ceiling`` rows say how
close it gets (messaging included, so below 1).
"""

from __future__ import annotations

import enum
import io
import json
import os
import shutil
import tempfile
import time
from typing import Any

from filepulsar.connector.client import Client, ConsumerType, InitialPosition
from filepulsar.connector.client.schema.codecs import AvroSchema, JsonSchema, Schema
from filepulsar.connector.client.schema.fields import Double, Long, String
from filepulsar.connector.client.schema.record import Record

N = int(os.environ.get("FILEPULSAR_BENCH_SCHEMA_N", "1000000"))
#: ``cpu``: time by the CPU seconds of this process (all its threads) instead of wall time,
#: so that other processes on a shared machine do not skew the rates and ratios.
CPU = os.environ.get("FILEPULSAR_BENCH_SCHEMA_CLOCK", "wall") == "cpu"
_clock = time.process_time if CPU else time.perf_counter
PER = "/cpu-s" if CPU else "/s"


class Side(enum.Enum):
    BUY = 1
    SELL = 2


class Trade(Record):
    id = Long(required=True)
    symbol = String(required=True)
    price = Double(required=True)
    side = Side


def _records(n: int) -> list[Trade]:
    symbols = ["AAPL", "MSFT", "NVDA", "AMZN"]
    sides = [Side.BUY, Side.SELL]
    return [
        Trade(id=i, symbol=symbols[i & 3], price=100.0 + (i % 1000) / 8, side=sides[i & 1])
        for i in range(n)
    ]


def _produce(client: Client, topic: str, values: list[Any], schema: Schema | None) -> float:
    producer = client.create_producer(
        topic, schema=schema, batching_enabled=True, block_if_queue_full=True
    )
    send = producer.send_async
    t0 = _clock()
    for v in values:
        send(v, None)
    producer.flush()
    dt = _clock() - t0
    producer.close()
    return dt


def _consume(client: Client, topic: str, n: int, schema: Schema | None) -> float:
    consumer = client.subscribe(
        topic,
        "bench",
        consumer_type=ConsumerType.Exclusive,
        initial_position=InitialPosition.Earliest,
        schema=schema,
    )
    got = 0
    t0 = _clock()
    while got < n:
        msgs = consumer.batch_receive()
        for m in msgs:
            m.value()
        got += len(msgs)
        if msgs:
            consumer.acknowledge_cumulative(msgs[-1])
    dt = _clock() - t0
    consumer.close()
    return dt


def _ceilings(records: list[Trade]) -> dict[str, tuple[float, float]]:
    """(encode, decode) records per second of the bare loops (see the module docstring)."""
    import fastavro

    parsed = fastavro.parse_schema(Trade.schema())
    by_value = {m.value: m for m in Side}
    by_name = {m.name: m for m in Side}
    new = object.__new__
    out: dict[str, tuple[float, float]] = {}

    dumps = json.JSONEncoder(separators=(",", ":")).encode
    t0 = _clock()
    encoded = [
        dumps({"id": r.id, "symbol": r.symbol, "price": r.price, "side": r.side.value}).encode()
        for r in records
    ]
    enc = _clock() - t0
    loads = json.loads
    t0 = _clock()
    for raw in encoded:
        d = loads(raw)
        d["side"] = by_value[d["side"]]
        new(Trade).__dict__.update(d)
    out["json"] = (len(records) / enc, len(records) / (_clock() - t0))

    writer, reader, buffer = fastavro.schemaless_writer, fastavro.schemaless_reader, io.BytesIO
    t0 = _clock()
    encoded = []
    for r in records:
        buf = buffer()
        writer(buf, parsed, {"id": r.id, "symbol": r.symbol, "price": r.price, "side": r.side.name})
        encoded.append(buf.getvalue())
    enc = _clock() - t0
    t0 = _clock()
    for raw in encoded:
        d = reader(buffer(raw), parsed, None)
        d["side"] = by_name[d["side"]]
        new(Trade).__dict__.update(d)
    out["avro"] = (len(records) / enc, len(records) / (_clock() - t0))
    return out


def run() -> list[dict[str, Any]]:
    root = tempfile.mkdtemp(prefix="fp-bench-schema-")
    try:
        t0 = _clock()
        records = _records(N)
        build = _clock() - t0
        json_schema = JsonSchema(Trade)
        payloads = [json_schema.encode(r) for r in records]
        client = Client(root)
        rates: dict[str, tuple[float, float]] = {}
        for name, values, schema in (
            ("bytes", payloads, None),
            ("json", records, JsonSchema(Trade)),
            ("avro", records, AvroSchema(Trade)),
        ):
            p = _produce(client, f"t-{name}", values, schema)
            c = _consume(client, f"t-{name}", N, schema)
            rates[name] = (N / p, N / c)
        client.close()
        ceilings = _ceilings(records)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows: list[dict[str, Any]] = [
        {
            "name": "schema: build Trade records (per second)",
            "value": N / build,
            "unit": "rec" + PER,
        }
    ]
    for name, (p, c) in rates.items():
        rows.append(
            {
                "name": f"schema: produce {name} (send_async, batching)",
                "value": p,
                "unit": "msg" + PER,
            }
        )
        rows.append(
            {
                "name": f"schema: consume {name} (batch_receive + value())",
                "value": c,
                "unit": "msg" + PER,
            }
        )
    for name, (e, d) in ceilings.items():
        rows.append(
            {"name": f"schema: ceiling encode {name} (bare loop)", "value": e, "unit": "rec" + PER}
        )
        rows.append(
            {"name": f"schema: ceiling decode {name} (bare loop)", "value": d, "unit": "rec" + PER}
        )
    bp, bc = rates["bytes"]
    for name in ("json", "avro"):
        p, c = rates[name]
        e, d = ceilings[name]
        rows.append({"name": f"schema: produce {name} / bytes", "value": p / bp, "unit": "x"})
        rows.append({"name": f"schema: consume {name} / bytes", "value": c / bc, "unit": "x"})
        rows.append({"name": f"schema: produce {name} / ceiling", "value": p / e, "unit": "x"})
        rows.append({"name": f"schema: consume {name} / ceiling", "value": c / d, "unit": "x"})
    return rows


if __name__ == "__main__":
    for row in run():
        print(f"{row['name']:<60} {row['value']:>12.3f} {row['unit']}")
