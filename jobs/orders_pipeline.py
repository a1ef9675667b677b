"""Orders pipeline (topic -> topic with Pulsar's dispatch rules), for spark-submit or in-process.

Reads the input topic and its retry-letter topic through one durable subscription, then, as a
Pulsar broker and a Key_Shared consumer group would:

1. drops duplicates by ``(producerName, sequenceId)`` (broker deduplication),
2. holds messages with a ``deliverAt`` until they are due (delayed delivery),
3. assigns every message to one of ``--consumers`` by its key (Key_Shared),
4. validates each order (JSON with a non-negative ``amount``); a failed one goes to the retry
   topic with a delay, and after ``--max-redeliver`` retries to the dead-letter topic,
5. writes the good ones, with the consumer that handled them, to the output topic,

all in one streaming query writing exactly-once into filepulsar topics. Example::

    spark-submit --master spark://host:7077 jobs/orders_pipeline.py \\
        --url s3://bucket/pulsar --storage-options '{"endpoint_url": "..."}' \\
        --input orders --output orders-processed --checkpoint hdfs:///chk/orders \\
        --consumers c1,c2,c3 --trigger 10s

Topics: the retry topic is ``<input>-<subscription>-RETRY`` and the dead-letter topic
``<input>-<subscription>-DLQ`` (Pulsar's default names); the output and letter topics are
created when missing. Each output message carries the properties of its input plus
``consumer`` (the Key_Shared consumer) and ``sourceMessageId``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from filepulsar.dispatch.redelivery import dead_letter_topic, retry_letter_topic
from filepulsar.storage.names import TopicName

DEFAULT_SUBSCRIPTION = "orders-pipeline"
#: Messages a micro-batch reads at most. Each batch of the pipeline pays a fixed cost (planning
#: its three stateful operators, their state commits, the source's cursor and Spark's logs):
#: 250k against 100k spent 0.78x the CPU an order (816k orders, docs/dispatch-operators.md).
MAX_MESSAGES_PER_TRIGGER = 250_000


def parser() -> argparse.ArgumentParser:
    doc = __doc__ or ""
    ap = argparse.ArgumentParser(
        prog="orders_pipeline.py",
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--url", required=True, help="storage root of the topics (path, s3://...)")
    ap.add_argument("--storage-options", help="fsspec options as JSON (e.g. an S3 endpoint)")
    ap.add_argument("--input", default="orders", help="input topic (default: orders)")
    ap.add_argument("--output", default="orders-processed", help="output topic")
    ap.add_argument("--subscription", default=DEFAULT_SUBSCRIPTION, help="durable subscription")
    ap.add_argument("--checkpoint", required=True, help="checkpoint folder (a Hadoop path)")
    ap.add_argument(
        "--consumers", default="c1,c2,c3", help="Key_Shared consumer names, comma separated"
    )
    ap.add_argument("--retry-delay-ms", type=int, default=1000, help="delay of a retry")
    ap.add_argument(
        "--max-redeliver", type=int, default=2, help="retries before the dead-letter topic"
    )
    ap.add_argument(
        "--max-messages-per-trigger",
        type=int,
        default=MAX_MESSAGES_PER_TRIGGER,
        help="micro-batch bound",
    )
    ap.add_argument(
        "--trigger",
        default="availableNow",
        help="availableNow (read what is there, then stop; the default) or an interval such "
        "as 5s (run until stopped or --timeout)",
    )
    ap.add_argument("--timeout", type=float, help="with an interval trigger: stop after seconds")
    return ap


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = parser()
    args = ap.parse_args(argv)
    args.consumer_list = [c.strip() for c in args.consumers.split(",") if c.strip()]
    if not args.consumer_list:
        ap.error("--consumers needs at least one name")
    if args.retry_delay_ms < 0 or args.max_redeliver < 0 or args.max_messages_per_trigger < 1:
        ap.error("--retry-delay-ms and --max-redeliver must be >= 0, --max-messages... >= 1")
    if args.trigger != "availableNow" and not args.trigger.rstrip("smh").isdigit():
        ap.error(f"--trigger must be availableNow or an interval like 5s, got {args.trigger!r}")
    return args


def letter_topics(input_topic: str, subscription: str) -> tuple[str, str]:
    """The retry-letter and dead-letter topics of ``input_topic`` (Pulsar's default names)."""
    topic = str(TopicName.parse(input_topic))
    return retry_letter_topic(topic, subscription), dead_letter_topic(topic, subscription)


def build(spark: Any, args: argparse.Namespace) -> Any:
    """The streaming DataFrame the sink writes: good orders to ``--output``, failed ones to
    the retry or dead-letter topic (a ``topic`` column per row)."""
    from pyspark.sql import functions as F

    from filepulsar.dispatch.spark import (
        dedup_by_sequence,
        delay_until_due,
        key_shared_assign,
        route_with_retry,
    )

    retry, _ = letter_topics(args.input, args.subscription)
    reader = (
        spark.readStream.format("filepulsar")
        .option("topics", f"{TopicName.parse(args.input)},{retry}")
        .option("subscription", args.subscription)
        .option("subscriptionInitialPosition", "Earliest")
        .option("maxMessagesPerTrigger", args.max_messages_per_trigger)
    )
    if args.storage_options:
        reader = reader.option("storageOptions", args.storage_options)
    # One branch: the source is read once and every operator runs once per micro-batch. The
    # retry topic's rows pass dedup untouched (the sink wrote them without sequence ids).
    assigned = key_shared_assign(
        delay_until_due(dedup_by_sequence(reader.load(args.url))), args.consumer_list
    )
    amount = F.get_json_object(F.col("value").cast("string"), "$.amount").cast("double")
    checked = assigned.withColumn("failed", F.coalesce(amount < 0, F.lit(True)))
    props = F.coalesce(F.col("properties"), F.create_map().cast("map<string,string>"))
    handled = F.map_concat(
        F.map_filter(props, lambda k, _: ~k.isin("consumer", "sourceMessageId")),
        F.create_map(
            F.lit("consumer"), F.col("consumer"), F.lit("sourceMessageId"), F.col("messageId")
        ),
    )
    return route_with_retry(
        checked,
        output_topic=str(TopicName.parse(args.output)),
        output_properties=handled,
        subscription=args.subscription,
        delay_ms=args.retry_delay_ms,
        max_reconsume_times=args.max_redeliver,
    )


def prepare_topics(args: argparse.Namespace) -> None:
    """Create the output, retry and dead-letter topics when missing (the source reads the
    retry topic from the start, so it must exist)."""
    from filepulsar.connector.admin import Admin
    from filepulsar.storage import jsontext
    from filepulsar.storage.errors import AlreadyExists, TopicAlreadyExists

    opts = jsontext.loads(args.storage_options) if args.storage_options else None
    topics = Admin(args.url, storage_options=opts).topics()
    for name in (args.output, *letter_topics(args.input, args.subscription)):
        try:
            topics.create_non_partitioned_topic(name)
        except (AlreadyExists, TopicAlreadyExists):
            pass


def start(spark: Any, args: argparse.Namespace) -> Any:
    """Start the query (topics prepared, data source registered); returns it."""
    from filepulsar.jobs.spark import prepare_session, trigger_kwargs

    prepare_session(spark)
    prepare_topics(args)
    writer = (
        build(spark, args)
        .writeStream.format("filepulsar")
        .option("checkpointLocation", args.checkpoint)
        .queryName("orders-pipeline")
    )
    if args.storage_options:
        writer = writer.option("storageOptions", args.storage_options)
    if args.trigger == "availableNow":
        from filepulsar.dispatch.spark import NO_DATA_BATCHES_CONF

        # The run ends with no empty batch at its end, under Spark Connect too (where
        # delay_until_due's listener cannot end it).
        spark.conf.set(NO_DATA_BATCHES_CONF, "false")
    return writer.trigger(**trigger_kwargs(args.trigger)).start(args.url)


def main(argv: list[str] | None = None) -> int:
    from filepulsar.jobs.spark import run_query

    query_id, rows, seconds = run_query("filepulsar-orders-pipeline", start, parse_args(argv))
    print(json.dumps({"inputRows": rows, "seconds": seconds, "query": query_id}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
