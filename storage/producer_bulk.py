"""The producer's bulk API: ``send_table`` and the routing, batching policy and id table it
uses.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from filepulsar.dispatch.routing import (
    MessageRouter,
    route_rows,
)
from filepulsar.storage import batcher, bulk_columns
from filepulsar.storage.codec import Codec
from filepulsar.storage.ledger import (
    Position,
)
from filepulsar.storage.names import TopicName
from filepulsar.storage.producer_messages import OutgoingMessage

if TYPE_CHECKING:
    from filepulsar.storage.producer_leases import _Partition
    from filepulsar.storage.send_queue import _Batch, _Queued

_IDS_SCHEMA = pa.schema(
    [
        pa.field("partition", pa.int32()),
        pa.field("ledger_id", pa.int64()),
        pa.field("entry_id", pa.int64()),
        pa.field("batch_index", pa.int32()),
    ]
)


class _BulkMixin:
    """``send_table`` (part of :class:`Producer`)."""

    # Set by Producer.__init__; declared here for mypy only.
    _clock: Callable[[], int]
    _closed: bool
    _custom: Callable[[Any, int], int] | None
    _error: BaseException | None
    _lock: threading.Lock
    _parts: list[_Partition]
    _router: MessageRouter | None
    _write_lock: threading.Lock
    batching: bool
    batching_type: str
    chunking: bool
    codec: Codec
    dedup: bool
    hashing_scheme: str
    max_bytes: int
    max_message_size: int
    max_messages: int
    num_partitions: int
    producer_name: str
    schema_version: bytes
    topic: TopicName

    if TYPE_CHECKING:  # methods of the other Producer parts

        def _raise_state(self) -> None: ...
        def _route_custom(self, msg: OutgoingMessage) -> int: ...
        def _seal(
            self,
            part: _Partition,
            b: _Batch,
            bkey: Any,
            *,
            batched: bool = True,
            deliver_at: int = 0,
        ) -> None: ...
        def _seal_keys(self, part: _Partition) -> None: ...
        def _check_delay(self, deliver_at: int) -> None: ...
        def _write(self, part: _Partition, queued: list[_Queued]) -> None: ...

    # ------------------------------------------------------------------ bulk API
    def send_table(self, data: pa.Table | pa.RecordBatch | Sequence[Any]) -> pa.Table:
        """Publish many messages at once and wait until they are stored.

        ``data``: a table with ``value`` and any of ``key``, ``ordering_key``, ``properties``,
        ``event_time``, ``sequence_id``, ``deliver_at`` (:func:`storage.bulk_columns.normalize`),
        or a list of bytes. Rows are routed (``dispatch.routing``: keyed rows by hash, keyless
        rows round robin one partition per batch, or per row with batching off) and cut into
        entries by :func:`storage.batcher.cut` under the producer's batch policy, the cutter
        the Spark sink uses too: batches by the batching limits (per ordering key, else key,
        with ``KeyBased`` batching), delayed rows alone, chunks for messages above the max
        message size when chunking is on; all without a per-message Python loop. Returns a
        table of ``partition``, ``ledger_id``, ``entry_id``, ``batch_index`` aligned with the
        input rows (``-1`` ids for dropped duplicates; a chunked message has its last chunk's
        id).

        Raises
        ------
        InvalidConfiguration
            For a missing or mistyped column, or a custom router's bad answer (nothing is
            written).
        MessageTooBig
            If a message is above the max message size (its value after compression plus its
            key, ordering key and properties, :func:`storage.batcher.too_big`) and chunking is
            off (nothing is written).
        NotAllowedError
            If a ``deliver_at`` is further past now than the topic's
            ``delayed_delivery_max_delay_ms`` (nothing is written).
        """
        table = bulk_columns.normalize(data)
        n_rows = table.num_rows
        if n_rows == 0:
            return _IDS_SCHEMA.empty_table()
        policy = self._batch_policy()
        big = batcher.check_size(
            table,
            policy,
            where=f"send_table to {self.topic}",
            hint="; enable chunking (chunking_enabled=True, batching off) or send smaller "
            "messages; nothing was sent",
        )
        if "deliver_at" in table.column_names:
            latest = pc.max(table.column("deliver_at")).as_py()
            if latest:
                self._check_delay(int(latest))  # nothing is written if one asks too long a delay
        plan: list[tuple[_Partition, pa.Table, Any, np.ndarray | None]] = []
        if self.num_partitions <= 1:
            plan.append((self._parts[0], table, None, big))
        else:
            parts = self._bulk_partitions(table)
            order = np.argsort(parts, kind="stable")
            for p in range(self.num_partitions):
                rows = order[parts[order] == p]
                if len(rows):
                    sub_big = big[rows] if big is not None else None
                    plan.append((self._parts[p], table.take(pa.array(rows)), rows, sub_big))
        explicit_seq = "sequence_id" in table.column_names
        name = self.producer_name
        results: list[tuple[Any, bool, int, Position | None]] = []
        with self._write_lock:
            with self._lock:
                if self._closed or self._error is not None:
                    self._raise_state()
                now = self._clock()
                work = []
                for part, sub, rows, sub_big in plan:
                    if part.batch:
                        self._seal(part, part.batch, None)
                    if part.key_batches:
                        self._seal_keys(part)
                    taken, part.queue = part.queue, []
                    seq_base: int | None = None
                    if not explicit_seq:
                        seq_base = part.next_seq
                        part.next_seq += sub.num_rows
                    work.append((part, sub, rows, sub_big, taken, seq_base))
            for part, sub, part_rows, sub_big, taken, base in work:
                if taken:  # earlier messages of this producer go first
                    self._write(part, taken)
                if self._error is not None:
                    raise self._error
                specs = batcher.cut(
                    sub, policy, big=sub_big, seq_base=base, chunk_uuid=lambda s: f"{name}-{s}"
                )
                groups = batcher.encode(
                    specs,
                    producer_name=name,
                    publish_time=now,
                    codec=self.codec,
                    schema_version=self.schema_version,
                )
                try:
                    positions = part.writer.append_stream(groups, dedup=self.dedup)
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
                    results.append((rows_, spec.batched, part.ml.partition, pos))
        return self._ids_table(results, n_rows)

    def _batch_policy(self) -> batcher.BatchPolicy:
        """The producer's settings that shape entries, for the bulk cutter."""
        return batcher.BatchPolicy(
            max_message_size=self.max_message_size,
            codec=self.codec,
            batching=self.batching,
            max_messages=self.max_messages,
            max_bytes=self.max_bytes,
            batching_type=self.batching_type,
            chunking=self.chunking,
        )

    @staticmethod
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

    def _bulk_partitions(self, table: pa.Table) -> np.ndarray:
        """Partition of every row (``dispatch.routing``'s rules, as ``send_async`` routes)."""
        n = self.num_partitions
        rows = table.num_rows
        keys = table.column("key") if "key" in table.column_names else None
        if self._custom is not None:
            cols = {c: table.column(c).to_pylist() for c in table.column_names}
            none = [None] * rows
            props = [dict(p) if p is not None else None for p in cols.get("properties", none)]
            out = np.empty(rows, np.int64)
            for i, (v, k, ok, evt) in enumerate(
                zip(
                    cols["value"],
                    cols.get("key", none),
                    cols.get("ordering_key", none),
                    cols.get("event_time", none),
                )
            ):
                out[i] = self._route_custom(OutgoingMessage(v, props[i], k, ok, evt))
            return out
        router = self._router
        assert router is not None
        batch = self.max_messages if self.batching else 1
        return route_rows(
            keys, rows, n, self.hashing_scheme, lambda c: router.keyless_partitions(c, batch)
        )
