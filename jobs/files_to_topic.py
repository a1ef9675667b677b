"""Files -> topic (exactly-once), for spark-submit or ``python -m``.

Streams the files arriving in a folder (JSON lines, CSV, Parquet or text) into a filepulsar
topic. Each row becomes one message: ``--value-column`` (default: the whole row as JSON),
``--key-column`` as the key, ``--event-time-column`` as the event time; with
``--property-columns a,b`` those columns become properties. The filepulsar sink writes every
micro-batch exactly once (it commits the batch's entries with the batch id). Example::

    spark-submit --master spark://host:7077 jobs/files_to_topic.py \\
        --url s3://bucket/pulsar --storage-options '{"endpoint_url": "..."}' \\
        --path hdfs:///landing/orders --format json --schema 'order long, customer string' \\
        --key-column customer --topic orders --checkpoint hdfs:///chk/orders-in

File formats need a schema for streaming (``--schema``, Spark DDL), except ``text``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

FORMATS = ("json", "csv", "parquet", "text")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    doc = __doc__ or ""
    ap = argparse.ArgumentParser(
        prog="files_to_topic.py",
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--url", required=True, help="storage root of the topics (path, s3://...)")
    ap.add_argument("--storage-options", help="fsspec options as JSON (e.g. an S3 endpoint)")
    ap.add_argument("--path", required=True, help="input folder (a Hadoop path)")
    ap.add_argument("--format", default="json", choices=FORMATS, help="input file format")
    ap.add_argument("--schema", help="input schema in Spark DDL (needed except for text)")
    ap.add_argument("--topic", required=True, help="topic to write")
    ap.add_argument("--checkpoint", required=True, help="checkpoint folder (a Hadoop path)")
    ap.add_argument("--value-column", help="column to send as the value (default: row as JSON)")
    ap.add_argument("--key-column", help="column to send as the key")
    ap.add_argument("--event-time-column", help="timestamp column to send as the event time")
    ap.add_argument("--property-columns", help="comma-separated columns to send as properties")
    ap.add_argument("--max-files-per-trigger", type=int, default=100)
    ap.add_argument("--trigger", default="availableNow", help="availableNow or e.g. 30s")
    ap.add_argument("--timeout", type=float, help="with an interval trigger: stop after seconds")
    args = ap.parse_args(argv)
    if args.format != "text" and not args.schema:
        ap.error(f"--format {args.format} needs --schema (Spark DDL, e.g. 'id long, name string')")
    if args.trigger != "availableNow" and not args.trigger.rstrip("smh").isdigit():
        ap.error(f"--trigger must be availableNow or an interval like 30s, got {args.trigger!r}")
    return args


def build(spark: Any, args: argparse.Namespace) -> Any:
    from pyspark.sql import functions as F

    reader = spark.readStream.format(args.format).option(
        "maxFilesPerTrigger", args.max_files_per_trigger
    )
    if args.schema:
        reader = reader.schema(args.schema)
    if args.format == "csv":
        reader = reader.option("header", "true")
    df = reader.load(args.path)
    for c in (args.value_column, args.key_column, args.event_time_column):
        if c and c not in df.columns:
            raise SystemExit(f"error: column {c!r} is not in the input ({', '.join(df.columns)})")
    props = [p for p in (args.property_columns or "").split(",") if p]
    missing = [p for p in props if p not in df.columns]
    if missing:
        raise SystemExit(f"error: property columns {missing} are not in the input")
    if args.value_column:
        value = F.col(args.value_column).cast("string")
    elif args.format == "text":
        value = F.col("value")
    else:
        value = F.to_json(F.struct(*[F.col(c) for c in df.columns]))
    cols = [value.alias("value")]
    if args.key_column:
        cols.append(F.col(args.key_column).cast("string").alias("key"))
    if args.event_time_column:
        cols.append(F.col(args.event_time_column).cast("timestamp").alias("eventTime"))
    if props:
        pairs = [x for p in props for x in (F.lit(p), F.col(p).cast("string"))]
        cols.append(F.create_map(*pairs).alias("properties"))
    return df.select(*cols)


def start(spark: Any, args: argparse.Namespace) -> Any:
    from filepulsar.jobs.spark import prepare_session, trigger_kwargs

    prepare_session(spark)
    writer = (
        build(spark, args)
        .writeStream.format("filepulsar")
        .option("topic", args.topic)
        .option("checkpointLocation", args.checkpoint)
    )
    if args.storage_options:
        writer = writer.option("storageOptions", args.storage_options)
    return writer.trigger(**trigger_kwargs(args.trigger)).start(args.url)


def main(argv: list[str] | None = None) -> int:
    from filepulsar.jobs.spark import run_query

    _, rows, seconds = run_query("filepulsar-files-to-topic", start, parse_args(argv))
    print(json.dumps({"messages": rows, "seconds": seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
