"""The producer's bulk path: :func:`send_table`, which routes a table's rows, cuts them into
entries with :mod:`filepulsar.storage.batcher` (the cutter the Spark sink uses too) and writes each
partition's entries with one commit, and the table of message ids it returns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from filepulsar.storage import batcher, bulk_columns
from filepulsar.storage.ledger import Position
from filepulsar.storage.producer.leases import Partition
from filepulsar.storage.producer.routing import Routing
from filepulsar.storage.producer.send_queue import SendQueue

_IDS_SCHEMA = pa.schema(
    [
        pa.field("partition", pa.int32()),
        pa.field("ledger_id", pa.int64()),
        pa.field("entry_id", pa.int64()),
        pa.field("batch_index", pa.int32()),
    ]
)


def send_table(
    data: pa.Table | pa.RecordBatch | Sequence[Any],
    *,
    queue: SendQueue,
    partitions: list[Partition],
    routing: Routing,
    policy: batcher.BatchPolicy,
    clock: Callable[[], int],
    check_delay: Callable[[int], None],
) -> pa.Table:
    """Publish many messages at once and wait until they are stored
    (:meth:`filepulsar.storage.producer.Producer.send_table`, which documents the contract).

    ``queue`` is the producer's send queue: what it holds goes first, and it hands out the
    sequence ids; ``partitions`` the registered partitions (their writers); ``check_delay``
    refuses a ``deliver_at`` too far ahead.
    """
    cfg = queue.config
    table = bulk_columns.normalize(data)
    n_rows = table.num_rows
    if n_rows == 0:
        return _IDS_SCHEMA.empty_table()
    big = batcher.check_size(
        table,
        policy,
        where=f"send_table to {cfg.topic}",
        hint="; enable chunking (chunking_enabled=True, batching off) or send smaller "
        "messages; nothing was sent",
    )
    if "deliver_at" in table.column_names:
        latest = pc.max(table.column("deliver_at")).as_py()
        if latest:
            check_delay(int(latest))  # nothing is written if one asks too long a delay
    plan: list[tuple[int, pa.Table, Any, np.ndarray | None]] = []
    if routing.num_partitions <= 1:
        plan.append((0, table, None, big))
    else:
        parts = routing.rows(table, policy.max_messages if policy.batching else 1)
        order = np.argsort(parts, kind="stable")
        for p in range(routing.num_partitions):
            rows = order[parts[order] == p]
            if len(rows):
                sub_big = big[rows] if big is not None else None
                plan.append((p, table.take(pa.array(rows)), rows, sub_big))
    explicit_seq = "sequence_id" in table.column_names
    name = cfg.producer_name
    results: list[tuple[Any, bool, int, Position | None]] = []
    reserve = [(p, None if explicit_seq else sub.num_rows) for p, sub, _, _ in plan]
    with queue.writing(reserve) as bases:
        now = clock()
        for (p, sub, part_rows, sub_big), base in zip(plan, bases):
            part = partitions[p]
            specs = batcher.cut(
                sub, policy, big=sub_big, seq_base=base, chunk_uuid=lambda s: f"{name}-{s}"
            )
            groups = batcher.encode(
                specs,
                producer_name=name,
                publish_time=now,
                codec=cfg.codec,
                schema_version=queue.schema_version,
            )
            try:
                positions = part.writer.append_stream(groups, dedup=cfg.dedup)
            except BaseException:
                part.writer.close()
                raise
            for spec, pos in zip(specs, positions):
                if len(spec.rows) == 0:
                    continue  # a chunk before the last: its message has the last's id
                rows_ = spec.rows
                if part_rows is not None:
                    rows_ = (
                        part_rows[rows_.start : rows_.stop]
                        if isinstance(rows_, range)
                        else part_rows[rows_]
                    )
                results.append((rows_, spec.batched, part.index, pos))
    return _ids_table(results, n_rows)


def _ids_table(results: list[tuple[Any, bool, int, Position | None]], n_rows: int) -> pa.Table:
    # Built with Arrow's run-end decoding: its memory pool keeps pages warm, where large
    # numpy temporaries pay fresh page faults on every call.
    counts = np.array([len(r[0]) for r in results], np.int64)
    run_ends = pa.array(np.cumsum(counts), pa.int64())

    def spread(values: list[Any], typ: pa.DataType) -> pa.Array:
        ree = pa.RunEndEncodedArray.from_arrays(run_ends, pa.array(values, typ))
        return pc.run_end_decode(ree)

    ok = [r[3] is not None for r in results]
    par = spread([r[2] if r[3] else -1 for r in results], pa.int32())
    led = spread([r[3].ledger_id if r[3] else -1 for r in results], pa.int64())
    ent = spread([r[3].entry_id if r[3] else -1 for r in results], pa.int64())
    starts = spread((np.cumsum(counts) - counts).tolist(), pa.int32())
    within = pc.subtract(pa.array(np.arange(n_rows, dtype=np.int32)), starts)
    batched = spread([b and o for (_, b, _, _), o in zip(results, ok)], pa.bool_())
    bidx = pc.if_else(batched, within, pa.scalar(-1, pa.int32()))
    cols = [par, led, ent, bidx]
    if not all(isinstance(r[0], range) for r in results):
        order = np.concatenate([np.asarray(r[0]) for r in results])
        inverse = np.empty(n_rows, np.int64)
        inverse[order] = np.arange(n_rows)
        cols = [c.take(pa.array(inverse)) for c in cols]
    return pa.table(cols, schema=_IDS_SCHEMA)
