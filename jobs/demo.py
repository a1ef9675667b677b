"""``make demo``: the main job on an embedded default (a local data directory).

Today it exercises the storage engine end to end: create a partitioned topic, publish keyed
messages with the producer and a bulk table, read everything back, and print what is stored.
The Spark pipeline (readStream → Key_Shared assignment → writeStream) joins it as the connector
issues land.

Usage: ``python -m jobs.demo [--root DIR] [--messages N]``
"""

from __future__ import annotations

import argparse
import shutil
import time

import pyarrow as pa

from storage import (
    ManagedLedger,
    Producer,
    Reader,
    create_topic,
    list_topics,
    open_blob_store,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="data/demo", help="storage root (default: data/demo)")
    ap.add_argument("--messages", type=int, default=100_000, help="messages to publish")
    args = ap.parse_args(argv)
    shutil.rmtree(args.root, ignore_errors=True)
    store = open_blob_store(args.root)
    topic = "persistent://public/default/orders"
    create_topic(store, topic, partitions=4)

    t0 = time.perf_counter()
    with Producer(store, topic, producer_name="demo", compression_type="LZ4") as p:
        for i in range(args.messages // 2):
            p.send_async(b'{"order": %d}' % i, partition_key=f"customer-{i % 97}")
        n_bulk = args.messages - args.messages // 2
        p.send_table(
            pa.table(
                {
                    "value": [b'{"order": %d}' % i for i in range(n_bulk)],
                    "key": [f"customer-{i % 97}" for i in range(n_bulk)],
                }
            )
        )
    t_pub = time.perf_counter() - t0

    t0 = time.perf_counter()
    reader = Reader(store, topic)
    total = 0
    per_partition: dict[int, int] = {}
    while True:
        batch = reader.read_batch(max_entries=1000, timeout_ms=0)
        if not batch.num_rows:
            break
        total += batch.num_rows
        p_idx = batch.column("partition")[0].as_py()
        per_partition[p_idx] = per_partition.get(p_idx, 0) + batch.num_rows
    t_read = time.perf_counter() - t0

    print(f"storage root: {args.root}")
    for info in list_topics(store):
        print(f"topic {info.name} partitions={info.partitions}")
    for i in range(4):
        state = ManagedLedger(store, info.name.partition(i)).state()
        print(
            f"  partition {i}: {per_partition.get(i, 0)} messages, "
            f"{len(state.ledgers)} ledger(s), manifest version {state.version}"
        )
    print(f"published {args.messages} messages in {t_pub:.2f} s; read {total} in {t_read:.2f} s")
    if total != args.messages:
        print("ERROR: read back a different number of messages")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
