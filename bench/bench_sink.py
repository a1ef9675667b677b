"""Spark sink benchmark (issue 5): ``df.write.format("filepulsar")`` against Spark's Parquet
sink on the same cached DataFrame, in the same run.

Run: ``python -m bench.bench_sink`` (or ``make bench``). The DataFrame holds 1M rows of one
100-byte binary ``value`` (local[2], two partitions), cached and materialised before timing;
one write of each sink warms the JVM and the Python workers first (PYSPARK_NOTES gotcha 8).
The two sinks then run interleaved, ``REPEAT`` pairs; the ratio is the median of the pairs'
ratios (the two runs of a pair share the machine's load of the moment: other processes on a
shared two-core machine swing single runs by 2x), the throughputs are the best runs. The
streaming figure runs a Parquet file source through ``writeStream.format("filepulsar")`` with
``Trigger.AvailableNow`` (query start included).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from typing import Any

N = 1_000_000
REPEAT = 7


def _session() -> Any:
    from filepulsar.jobs.spark import local_spark

    return local_spark("filepulsar-bench-sink", driver_memory="3g")


def _frame(spark: Any) -> Any:
    """1M rows of a 100-byte pseudo-random binary value (64 + 32 hash bytes + 4 id bytes)."""
    from pyspark.sql import functions as F

    sid = F.col("id").cast("string")
    value = F.concat(
        F.unhex(F.sha2(sid, 512)),
        F.unhex(F.sha2(sid, 256)),
        F.unhex(F.lpad(F.hex(F.col("id")), 8, "0")),
    )
    df = spark.range(0, N, numPartitions=2).select(value.alias("value")).cache()
    df.count()
    return df


def run() -> list[dict[str, Any]]:
    spark = _session()
    base = tempfile.mkdtemp(prefix="fp-bench-sink-")
    try:
        df = _frame(spark)
        root = os.path.join(base, "pulsar")
        counter = [0]

        def filepulsar() -> float:
            counter[0] += 1
            t0 = time.perf_counter()
            (
                df.write.format("filepulsar")
                .option("topic", f"bench-{counter[0]}")
                .mode("append")
                .save(root)
            )
            return time.perf_counter() - t0

        def parquet() -> float:
            counter[0] += 1
            path = os.path.join(base, f"parquet-{counter[0]}")
            t0 = time.perf_counter()
            df.write.mode("overwrite").parquet(path)
            dt = time.perf_counter() - t0
            shutil.rmtree(path, ignore_errors=True)
            return dt

        filepulsar()
        parquet()
        fp_times, pq_times = [], []
        for _ in range(REPEAT):
            fp_times.append(filepulsar())
            pq_times.append(parquet())
        ratio = statistics.median(p / f for p, f in zip(pq_times, fp_times))
        fp = min(fp_times)
        pq = min(pq_times)
        stream = _stream(spark, df, base)
        return [
            {
                "name": f"Spark sink filepulsar, batch write, 1M x 100 B (best of {REPEAT})",
                "value": N / fp / 1e6,
                "unit": "M msg/s",
            },
            {
                "name": f"Spark Parquet sink, same DataFrame (peer, best of {REPEAT})",
                "value": N / pq / 1e6,
                "unit": "M msg/s",
            },
            {
                "name": f"filepulsar / Parquet sink throughput (median of {REPEAT} pairs)",
                "value": ratio,
                "unit": "ratio",
                "goal": ">= 1.0",
            },
            {
                "name": "Spark sink filepulsar, streaming availableNow from Parquet, 1M x 100 B",
                "value": N / stream / 1e6,
                "unit": "M msg/s",
            },
        ]
    finally:
        spark.stop()
        shutil.rmtree(base, ignore_errors=True)


def _stream(spark: Any, df: Any, base: str) -> float:
    """Time a streaming query (Parquet source → filepulsar) over the same rows, start included."""
    src = os.path.join(base, "stream-src")
    df.write.parquet(src)
    schema = spark.read.parquet(src).schema
    times = []
    for i in range(2):
        t0 = time.perf_counter()
        q = (
            spark.readStream.schema(schema)
            .parquet(src)
            .writeStream.format("filepulsar")
            .option("topic", f"stream-{i}")
            .option("checkpointLocation", os.path.join(base, f"chk-{i}"))
            .trigger(availableNow=True)
            .start(os.path.join(base, "pulsar"))
        )
        q.awaitTermination()
        times.append(time.perf_counter() - t0)
    return times[-1]


if __name__ == "__main__":
    for row in run():
        goal = f"  (goal {row['goal']})" if "goal" in row else ""
        print(f"{row['name']:<75} {row['value']:>9.3f} {row['unit']}{goal}")
