"""``make demo``: the main job, on an embedded default (local Spark, a local data directory).

1. A Python service publishes orders (keyed JSON) to ``orders`` (4 partitions) with the client.
2. A Spark streaming query reads them through the durable subscription ``enrich``
   (``format("filepulsar")``), adds the amount with tax, and writes exactly-once to
   ``orders-enriched`` (also ``format("filepulsar")``), keyed by customer.
3. A client consumer reads the enriched topic; the topic stats show the subscription's cursor
   at the end (backlog 0), so retention may reclaim what was consumed.

Usage: ``python -m filepulsar.jobs.demo [--root DIR] [--messages N]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from typing import Any

from filepulsar.connector import Client, CompressionType, ConsumerType, InitialPosition
from filepulsar.connector.admin import Admin
from filepulsar.storage import create_topic


def _spark() -> Any:
    from filepulsar.jobs.spark import local_spark

    return local_spark("filepulsar-demo")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="data/demo", help="storage root (default: data/demo)")
    ap.add_argument("--messages", type=int, default=20_000, help="orders to publish")
    args = ap.parse_args(argv)
    root = os.path.abspath(args.root)
    shutil.rmtree(root, ignore_errors=True)
    client = Client(root)
    create_topic(client.store, "orders", partitions=4)

    t0 = time.perf_counter()
    producer = client.create_producer(
        "orders",
        producer_name="shop",
        compression_type=CompressionType.LZ4,
        batching_enabled=True,
    )
    for i in range(args.messages):
        order = {"order": i, "customer": f"c{i % 97}", "amount": round(10 + (i % 50) * 1.5, 2)}
        producer.send_async(json.dumps(order).encode(), None, partition_key=order["customer"])
    producer.flush()
    print(f"published {args.messages} orders in {time.perf_counter() - t0:.2f} s")

    from pyspark.sql import functions as F

    spark = _spark()
    t0 = time.perf_counter()
    orders = (
        spark.readStream.format("filepulsar")
        .option("topic", "orders")
        .option("subscription", "enrich")
        .option("subscriptionInitialPosition", "Earliest")
        .load(root)
    )
    amount = F.get_json_object(F.col("value").cast("string"), "$.amount").cast("double")
    enriched = orders.select(
        F.to_json(
            F.struct(
                F.get_json_object(F.col("value").cast("string"), "$.order").alias("order"),
                F.col("key").alias("customer"),
                F.round(amount * 1.2, 2).alias("amountWithTax"),
                F.col("messageId").alias("source"),
            )
        ).alias("value"),
        F.col("key"),
        F.create_map(F.lit("stage"), F.lit("enriched")).alias("properties"),
    )
    query = (
        enriched.writeStream.format("filepulsar")
        .option("topic", "orders-enriched")
        .option("checkpointLocation", os.path.join(root, "_checkpoints", "enrich"))
        .trigger(availableNow=True)
        .start(root)
    )
    query.awaitTermination()
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    print(f"spark enriched {rows} orders in {time.perf_counter() - t0:.2f} s")

    consumer = client.subscribe(
        "orders-enriched",
        "audit",
        consumer_type=ConsumerType.Exclusive,
        initial_position=InitialPosition.Earliest,
    )
    received = 0
    sample = None
    while True:
        batch = consumer.batch_receive()
        if not batch:
            break
        received += len(batch)
        sample = sample or batch[0]
        consumer.acknowledge_cumulative(batch[-1])
    consumer.close()
    example = sample.data().decode() if sample else None
    print(f"consumer read {received} enriched orders; e.g. {example}")
    stats = Admin(store=client.store).topics().get_stats("orders")
    backlog = sum(s["msgBacklog"] for s in stats["subscriptions"].values())
    print(f"subscription 'enrich' backlog after the run: {backlog} messages")
    client.close()
    spark.stop()
    ok = received == args.messages and backlog == 0
    print("demo OK" if ok else "demo FAILED: counts differ")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
