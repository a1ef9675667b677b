"""Topic -> Parquet files (exactly-once), for spark-submit or ``python -m``.

Streams a topic through a durable subscription into Parquet files with Spark's file sink
(its ``_spark_metadata`` log makes the output exactly-once: readers of the folder see each
message once, also after task failures and restarts). Columns: the message columns of the
filepulsar source (``value`` as binary, or as text with ``--value-as-string``), partitioned by
publish date with ``--partition-by-date``. Example::

    spark-submit --master spark://host:7077 jobs/topic_to_files.py \\
        --url s3://bucket/pulsar --storage-options '{"endpoint_url": "..."}' \\
        --topic orders --path hdfs:///lake/orders --checkpoint hdfs:///chk/orders-lake

With ``--trigger availableNow`` (the default) it copies what is there and stops; with an
interval (``--trigger 30s``) it runs until stopped or ``--timeout``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    doc = __doc__ or ""
    ap = argparse.ArgumentParser(
        prog="topic_to_files.py",
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--url", required=True, help="storage root of the topics (path, s3://...)")
    ap.add_argument("--storage-options", help="fsspec options as JSON (e.g. an S3 endpoint)")
    ap.add_argument("--topic", required=True, help="topic to copy (or a comma-separated list)")
    ap.add_argument("--subscription", default="to-files", help="durable subscription")
    ap.add_argument("--path", required=True, help="output folder (a Hadoop path)")
    ap.add_argument("--checkpoint", required=True, help="checkpoint folder (a Hadoop path)")
    ap.add_argument("--value-as-string", action="store_true", help="write value as UTF-8 text")
    ap.add_argument(
        "--partition-by-date", action="store_true", help="folders by publish date (date=...)"
    )
    ap.add_argument("--max-messages-per-trigger", type=int, default=100_000)
    ap.add_argument("--trigger", default="availableNow", help="availableNow or e.g. 30s")
    ap.add_argument("--timeout", type=float, help="with an interval trigger: stop after seconds")
    args = ap.parse_args(argv)
    if args.trigger != "availableNow" and not args.trigger.rstrip("smh").isdigit():
        ap.error(f"--trigger must be availableNow or an interval like 30s, got {args.trigger!r}")
    if args.max_messages_per_trigger < 1:
        ap.error("--max-messages-per-trigger must be >= 1")
    return args


def start(spark: Any, args: argparse.Namespace) -> Any:
    from pyspark.sql import functions as F

    from filepulsar.jobs.spark import prepare_session, trigger_kwargs

    prepare_session(spark)
    reader = (
        spark.readStream.format("filepulsar")
        .option("topics", args.topic)
        .option("subscription", args.subscription)
        .option("subscriptionInitialPosition", "Earliest")
        .option("maxMessagesPerTrigger", args.max_messages_per_trigger)
    )
    if args.storage_options:
        reader = reader.option("storageOptions", args.storage_options)
    df = reader.load(args.url)
    if args.value_as_string:
        df = df.withColumn("value", F.col("value").cast("string"))
    if args.partition_by_date:
        df = df.withColumn("date", F.to_date("publishTime"))
    writer = df.writeStream.format("parquet").option("checkpointLocation", args.checkpoint)
    if args.partition_by_date:
        writer = writer.partitionBy("date")
    return writer.trigger(**trigger_kwargs(args.trigger)).start(args.path)


def main(argv: list[str] | None = None) -> int:
    from filepulsar.jobs.spark import run_query

    _, rows, seconds = run_query("filepulsar-topic-to-files", start, parse_args(argv))
    print(json.dumps({"messages": rows, "seconds": seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
