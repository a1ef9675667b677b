"""The executor side of the sink: one Spark task's Arrow batches → staged blobs of entries.

A :class:`TaskWriter` runs inside a Spark task (a Python worker on an executor). It gathers the
record batches Spark hands ``write(iterator)``, and for each round of up to
:data:`ROUND_ROWS` rows:

1. converts the sink columns to the stored columns
   (:func:`filepulsar.storage.bulk_columns.normalize`);
2. groups rows by topic (the ``topic`` option, else the ``topic`` column), routes them to
   partitions exactly as Pulsar's client does (below), and groups them by producer name
   (an entry has one producer); every group keeps the input order of its rows;
3. cuts each group into entries with the cutter :meth:`storage.Producer.send_table` uses
   (:func:`filepulsar.storage.batcher.cut`, under the options'
   :class:`~filepulsar.storage.batcher.BatchPolicy`): batches of ``batchingMaxMessages`` messages /
   ``batchingMaxBytes`` value bytes (or one batch per ordering key, else key, with
   ``batchingType=KeyBased``), one non-batched entry per delayed row (``deliverAt``) and per row
   when batching is off, chunk entries for a message above the max message size
   (:func:`filepulsar.storage.batcher.too_big`);
4. encodes the entries (compression, checksum; :func:`filepulsar.storage.batcher.encode`) and
   appends them to the managed ledger's blob.

Encoded entries go to one staged blob per (topic partition, task), written as
:func:`filepulsar.storage.staged.stage` writes them (durable once the task ends, invisible until the
driver commits) but appended round by round, so a task holds no more than a round in memory
on local disks; a blob that reaches :data:`STAGE_BYTES` is closed and the next one begins.
What is Spark's stays here: rounds, column names, the topic and ``partition`` columns, the
``producerName`` grouping and sequence id ``-1`` when the input has none. Nothing loops per
message in Python except for chunked and delayed rows and when batching is off (one entry per
message is then the point).

Routing of a partitioned topic (shared/reference/PULSAR_RULES.md):

* a row with a ``key`` goes to ``hash(key) % n`` (``hashingScheme``); the ordering key plays no
  part;
* keyless rows, ``RoundRobinPartition``: with batching, runs of ``batchingMaxMessages`` keyless
  rows go to one partition, then the next (Pulsar switches partition per batch); without
  batching every row moves to the next partition (:func:`filepulsar.dispatch.routing.keyless_runs`);
  the start partition is drawn per task;
* keyless rows, ``SinglePartition``: one partition drawn per task;
* ``CustomPartition``: the ``partition`` column decides for every row (keyed or not), and a
  value outside ``[0, n)`` fails the task, as Pulsar fails the send.

Sequence ids and deduplication: rows with a ``sequenceId`` column keep it; entries carry the
first and highest id of their rows (key-based batches the highest in both, as Pulsar's client),
so the commit drops entries a topic with deduplication has already persisted for that
producer. Before it cuts entries, a task also leaves out the rows whose id the topic had
already persisted when the task started (the broker drops those one by one; without this a
batch straddling the persisted id, as a new query re-sending rows makes, would be dropped
whole). Without the column every message is stored with sequence id ``-1`` ("not assigned by
the producer") and entries have header ids ``-1``, which the commit never treats as
duplicates: the sink's exactly-once comes from the batch commit, not from sequence ids. Chunks
of one message share its sequence id; only the last chunk carries it in its header, the
others ``-1``, so the commit checks a chunked message once, on its last chunk, as Pulsar's
broker does.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from filepulsar.connector.sink.options import (
    STORED_NAMES,
    WHAT,
    SinkConfig,
    dedup_enabled,
    message_size_limit,
)
from filepulsar.connector.values.encode import SinkValueSchema, ValueEncoder
from filepulsar.dispatch.clock import wall_ms
from filepulsar.dispatch.modes import PartitionsRoutingMode
from filepulsar.dispatch.routing import keyless_runs, route_rows
from filepulsar.storage import batcher, bulk_columns, paths
from filepulsar.storage.batcher import NO_SEQUENCE_ID, BatchPolicy
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.commit import PendingEntry
from filepulsar.storage.entry import MESSAGE_SCHEMA
from filepulsar.storage.errors import InvalidConfiguration
from filepulsar.storage.ledger import ManagedLedger
from filepulsar.storage.names import TopicName
from filepulsar.storage.policies import check_max_delay, effective_policies
from filepulsar.storage.schemas import version_bytes
from filepulsar.storage.staged import StagedBlob, StagingBlob, discard_staged
from filepulsar.storage.topics import ensure_topic

log = logging.getLogger(__name__)

#: Rows gathered from Spark's record batches before they are routed and encoded together
#: (Spark hands batches of ``spark.sql.execution.arrow.maxRecordsPerBatch``, 10000 rows by
#: default, which are then processed one by one without a concatenating copy).
ROUND_ROWS = 8192
#: Value bytes gathered before a round is processed, whatever the row count.
ROUND_BYTES = 16 * 1024 * 1024
#: Size at which a staged blob is closed and the partition's next entries go to a new one.
STAGE_BYTES = 64 * 1024 * 1024

_PROPERTIES_TYPE = MESSAGE_SCHEMA.field("properties").type
_PRODUCER = "__producer"
_PARTITION = "__partition"


@dataclass
class _TopicState:
    """What a task knows of one topic it writes to."""

    name: TopicName
    partitions: int  # 0: non-partitioned
    targets: list[TopicName]  # the managed ledgers, indexed by partition
    policy: BatchPolicy  # the options' batch policy with the topic's max message size
    start: int  # round-robin start / the single partition of keyless rows
    dedup: bool  # the topic deduplicates by (producer name, sequence id)
    keyless: int = 0  # keyless rows routed so far (round-robin position)
    max_delay_ms: int = 0  # the topic's delayed_delivery_max_delay_ms (0: no limit)


class TaskWriter:
    """Writes one Spark task's rows to staged blobs. Runs on an executor; not picklable.

    Parameters
    ----------
    config
        The sink's checked configuration (from the driver).
    writer_id
        The exactly-once identity of the query or ``save()``; prefixes every blob id.
    batch_label
        The micro-batch id as the task knows it (``"0"`` for a batch write), for blob ids.
    partition_id, attempt
        Spark's partition id and task attempt number, for blob ids.
    store
        An open blob store (default: opened from ``config``).
    clock
        Milliseconds since the epoch, for publish times.
    """

    def __init__(
        self,
        config: SinkConfig,
        *,
        writer_id: str,
        batch_label: str,
        partition_id: int,
        attempt: int,
        store: BlobStore | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.config = config
        self.writer_id = writer_id
        self.store = store or open_blob_store(
            config.root, storage_options=dict(config.storage_options)
        )
        self.clock = clock or wall_ms
        # os.urandom: forked Python workers share the daemon's ``random`` state.
        suffix = os.urandom(4).hex()
        self.blob_prefix = paths.staged_blob_stem(
            writer_id, batch_label, partition_id, attempt, suffix
        )
        self._rng_seed = f"{writer_id}/{batch_label}/{partition_id}"
        self.default_producer = config.default_producer_name(writer_id)
        self.staged: list[StagedBlob] = []
        self.num_messages = 0
        self._topics: dict[str, _TopicState] = {}
        self._mls: dict[TopicName, ManagedLedger] = {}
        self._persisted: dict[TopicName, dict[str, int]] = {}
        #: Rows left out because the topic already persisted their sequence id.
        self.duplicates = 0
        self._open: dict[TopicName, StagingBlob] = {}
        self._blob_seq = 0
        self._chunk_seq = 0
        self._round: list[pa.RecordBatch] = []
        self._encoder: ValueEncoder | None = None
        self._round_rows = 0
        self._round_bytes = 0

    # ------------------------------------------------------------------ public
    def write_all(self, batches: Iterable[pa.RecordBatch]) -> list[StagedBlob]:
        """Write every batch, stage what is buffered and return the staged blobs.

        Called once per Spark task attempt, on the executor, by the writers' ``write``
        (:func:`filepulsar.connector.sink.writers.write_task`) with Spark's iterator, consumed once.
        Entries are deterministic for given rows except what is unique per attempt (blob ids, the
        uuids of chunked messages without sequence ids) and publish times (this writer's
        clock): a retried attempt's blobs are new, and only the attempt Spark keeps is
        committed.

        On any error the blobs this task staged are deleted before the error propagates.

        Raises
        ------
        MessageTooBig
            A value above the max message size with chunking off.
        InvalidConfiguration
            A null or negative ``sequenceId``, a null ``topic``, an out-of-range ``partition``
            (CustomPartition), or a ``maxMessageSize`` above a topic's policy.
        TopicNotFound
            A topic that does not exist and may not be auto-created.
        """
        try:
            for batch in batches:
                self.add(batch)
            return self.finish()
        except BaseException:
            self.discard()
            raise

    def add(self, batch: pa.RecordBatch) -> None:
        """Take one record batch of input rows (columns as in the DataFrame)."""
        n = batch.num_rows
        if n == 0:
            return
        self._round.append(batch)
        self._round_rows += n
        self._round_bytes += batch.nbytes
        if self._round_rows >= ROUND_ROWS or self._round_bytes >= ROUND_BYTES:
            self._process_round()

    def finish(self) -> list[StagedBlob]:
        """Process the rows still gathered, make every blob durable, return them all."""
        self._process_round()
        for target in sorted(self._open, key=str):
            # Keep the blob in _open until it is durable: if finishing fails, discard() still
            # finds it (and deletes it).
            self.staged.append(self._open[target].finish())
            del self._open[target]
        return list(self.staged)

    def discard(self) -> None:
        """Delete every blob this task staged (it failed; they will never be published)."""
        by_topic: dict[str, list[StagedBlob]] = {}
        for sb in self.staged:
            by_topic.setdefault(sb.topic, []).append(sb)
        for topic, blobs in by_topic.items():
            try:
                discard_staged(self._ml(TopicName.parse(topic)), blobs)
            except Exception:  # the original error matters more; the blobs stay invisible
                log.exception("could not delete staged blobs %s of %s", blobs, topic)
        self.staged = []
        for blob in self._open.values():
            try:
                blob.abandon()
            except Exception:
                log.exception("could not delete the blob %s being staged", blob.key)
        self._open.clear()

    # ------------------------------------------------------------------ rounds
    def _process_round(self) -> None:
        if not self._round:
            return
        table = pa.Table.from_batches(self._round)
        self._round = []
        self._round_rows = self._round_bytes = 0
        data = self._normalize(table)
        now = self.clock()
        for topic, rows in self._split_by_topic(table):
            sub = data if rows is None else data.take(pa.array(rows))
            self._write_topic(self._topic(topic), sub, now)
        self.num_messages += table.num_rows

    def _normalize(self, table: pa.Table) -> pa.Table:
        """Stored columns (storage names) plus producer and partition columns."""
        cols = self.config.columns
        stored: dict[str, Any] = {}
        vs = self.config.value_schema
        if vs is not None:
            stored["value"] = self._encode_values(table, vs)
        for name, actual in cols.items():
            if name not in STORED_NAMES or (name == "value" and vs is not None):
                continue
            col = table.column(actual)
            if name == "properties" and col.type != _PROPERTIES_TYPE:
                col = col.cast(_PROPERTIES_TYPE)
            stored[STORED_NAMES[name]] = col
        data = bulk_columns.normalize(pa.table(stored))
        n = data.num_rows
        if "sequence_id" in data.column_names:
            # A row without a producer-assigned id (null, or -1 as this source reads back rows
            # written without one) is stored as having none, so a topic read by one job can be
            # written on by the next with its columns kept.
            seq = data.column("sequence_id")
            if seq.null_count:
                seq = pc.fill_null(seq, NO_SEQUENCE_ID)
                data = data.set_column(data.column_names.index("sequence_id"), "sequence_id", seq)
            low = pc.min(seq).as_py()
            if low is not None and low < NO_SEQUENCE_ID:
                raise InvalidConfiguration(
                    f"{WHAT}: column {cols['sequenceId']!r} holds {low}; sequence ids must be "
                    f">= 0, or {NO_SEQUENCE_ID} / null for a row without one"
                )
        else:
            data = data.append_column("sequence_id", pa.array(np.full(n, NO_SEQUENCE_ID, np.int64)))
        if "producerName" in cols:
            names = table.column(cols["producerName"])
            empty = pc.fill_null(pc.equal(names, ""), True)
            names = pc.if_else(empty, self.default_producer, names)
            data = data.append_column(_PRODUCER, names)
        if "partition" in cols:
            data = data.append_column(_PARTITION, table.column(cols["partition"]))
        return data

    def _encode_values(self, table: pa.Table, vs: SinkValueSchema) -> pa.Array:
        """The typed values of ``table``'s rows encoded with the topic's schema (a null
        struct stays a null value: a tombstone)."""
        if self._encoder is None:
            self._encoder = vs.encoder()
        if vs.mode == "flatten":
            rows = table.select(list(self.config.record_columns)).to_pylist()
        else:
            rows = table.column(self.config.columns["value"]).to_pylist()
        return pa.array(self._encoder.encode(rows), pa.binary())

    def _split_by_topic(self, table: pa.Table) -> list[tuple[str, np.ndarray | None]]:
        if self.config.topic is not None:
            return [(self.config.topic, None)]
        col = table.column(self.config.columns["topic"])
        if col.null_count:
            raise InvalidConfiguration(
                f"{WHAT}: column {self.config.columns['topic']!r} is null in {col.null_count} "
                "row(s) and no 'topic' option is set"
            )
        enc = pc.dictionary_encode(col).combine_chunks()
        # Spellings of one topic ("orders", "persistent://public/default/orders") are one
        # group, so its rows keep their order.
        canonical = [str(TopicName.parse(t)) for t in enc.dictionary.to_pylist()]
        names = sorted(set(canonical), key=canonical.index)
        if len(names) == 1:
            return [(names[0], None)]
        remap = np.array([names.index(c) for c in canonical], np.int64)
        codes = remap[enc.indices.to_numpy(zero_copy_only=False)]
        order = np.argsort(codes, kind="stable")
        counts = np.bincount(codes, minlength=len(names))
        bounds = np.cumsum(counts)
        return [(name, order[bounds[i] - counts[i] : bounds[i]]) for i, name in enumerate(names)]

    def _topic(self, name: str) -> _TopicState:
        state = self._topics.get(name)
        if state is not None:
            return state
        t = TopicName.parse(name)
        n = ensure_topic(self.store, t, auto_create=self.config.auto_create_topic)
        policies = effective_policies(self.store, t)
        policy = self.config.batch_policy(message_size_limit(self.config, policies, t))
        targets = [t.partition(i) for i in range(n)] if n else [t]
        start = random.Random(f"{self._rng_seed}/{t}").randrange(n) if n else 0
        dedup = dedup_enabled(policies, t)
        state = _TopicState(
            t, n, targets, policy, start, dedup, max_delay_ms=policies.delayed_delivery_max_delay_ms
        )
        self._topics[name] = state
        return state

    # ------------------------------------------------------------------ routing
    def _route(self, state: _TopicState, data: pa.Table) -> np.ndarray | None:
        """Partition of every row (None for a non-partitioned topic)."""
        n = state.partitions
        if n == 0:
            return None
        rows = data.num_rows
        if self.config.routing_mode is PartitionsRoutingMode.CustomPartition:
            col = data.column(_PARTITION)
            name = self.config.columns["partition"]
            if col.null_count:
                raise InvalidConfiguration(
                    f"{WHAT}: column {name!r} is null in {col.null_count} row(s); "
                    "CustomPartition needs a partition for every row"
                )
            parts = col.to_numpy().astype(np.int64)
            bad = (parts < 0) | (parts >= n)
            if bad.any():
                raise InvalidConfiguration(
                    f"{WHAT}: Illegal partition index chosen by the message routing policy: "
                    f"column {name!r} holds {int(parts[bad][0])}, topic {state.name} has "
                    f"{n} partitions (0..{n - 1})"
                )
            return parts
        keys = data.column("key").combine_chunks() if "key" in data.column_names else None
        step = self.config.batching_max_messages if self.config.batching_enabled else 1
        single = self.config.routing_mode is PartitionsRoutingMode.UseSinglePartition

        def keyless(count: int) -> np.ndarray:
            if single:
                return np.full(count, state.start, np.int64)
            parts = keyless_runs(count, n, start=state.start, offset=state.keyless, step=step)
            state.keyless += count
            return parts

        return route_rows(keys, rows, n, self.config.hashing_scheme, keyless)

    # ------------------------------------------------------------------ entries
    def _write_topic(self, state: _TopicState, data: pa.Table, now: int) -> None:
        self._check_delay(state, data, now)
        oversized = self._oversized(state, data)
        parts = self._route(state, data)
        producers: list[str] = [self.default_producer]
        codes = None
        if _PRODUCER in data.column_names:
            enc = pc.dictionary_encode(data.column(_PRODUCER)).combine_chunks()
            producers = enc.dictionary.to_pylist()
            if len(producers) > 1:
                codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        keep = [c for c in data.column_names if c not in (_PRODUCER, _PARTITION)]
        data = data.select(keep)
        if parts is None and codes is None:
            target = state.targets[0]
            self._write_group(state, target, producers[0], data, oversized, now)
            return
        group = (parts if parts is not None else 0) * len(producers) + (
            codes if codes is not None else 0
        )
        group = np.broadcast_to(group, (data.num_rows,))
        order = np.argsort(group, kind="stable")
        ordered = group[order]
        bounds = [0, *(np.flatnonzero(np.diff(ordered)) + 1).tolist(), len(order)]
        single = len(bounds) == 2
        for lo, hi in itertools.pairwise(bounds):
            g = int(ordered[lo])
            rows = order[lo:hi]
            sub = data if single else data.take(pa.array(rows))
            big = oversized if oversized is None or single else oversized[rows]
            target = state.targets[g // len(producers)]
            self._write_group(state, target, producers[g % len(producers)], sub, big, now)

    def _check_delay(self, state: _TopicState, data: pa.Table, now: int) -> None:
        """Refuse rows whose ``deliverAt`` is further past ``now`` than the topic's
        ``delayed_delivery_max_delay_ms`` (:func:`filepulsar.storage.policies.check_max_delay`): the
        task fails and the batch commits nothing."""
        if not state.max_delay_ms or "deliver_at" not in data.column_names:
            return
        latest = pc.max(data.column("deliver_at")).as_py()
        if latest:
            check_max_delay(state.max_delay_ms, latest, now, f"{WHAT}: topic {state.name}")

    def _oversized(self, state: _TopicState, data: pa.Table) -> np.ndarray | None:
        """Rows to split into chunks (None if none); raises if chunking is off."""
        return batcher.check_size(
            data.select([c for c in data.column_names if c not in (_PRODUCER, _PARTITION)]),
            state.policy,
            where=f"{WHAT}: topic {state.name}",
            hint=" (option maxMessageSize / the topic's max_message_size policy); set "
            "chunkingEnabled=true to split large values into chunks, or write smaller values",
        )

    def _write_group(
        self,
        state: _TopicState,
        target: TopicName,
        producer: str,
        data: pa.Table,
        oversized: np.ndarray | None,
        now: int,
    ) -> None:
        """Cut the rows of one (partition, producer) into entries; append them encoded."""
        cfg = self.config
        explicit = "sequenceId" in cfg.columns
        if explicit and state.dedup:
            data, oversized = self._drop_persisted(target, producer, data, oversized)
        if data.num_rows == 0:
            return
        uuid = self._chunk_uuid(producer, explicit)
        vs = cfg.value_schema
        for lo, hi in _id_runs(data.column("sequence_id")) if explicit else [(0, data.num_rows)]:
            part = data if hi - lo == data.num_rows else data.slice(lo, hi - lo)
            big = None if oversized is None else oversized[lo:hi]
            specs = batcher.cut(part, state.policy, big=big, chunk_uuid=uuid)
            for group in batcher.encode(
                specs,
                producer_name=producer,
                publish_time=now,
                codec=state.policy.codec,
                schema_version=version_bytes(vs.version) if vs is not None else b"",
            ):
                self._stage(target, group)

    def _chunk_uuid(self, producer: str, explicit: bool) -> Callable[[int], str]:
        """The uuid of a chunked message: ``<producer>-<sequence id>`` as Pulsar's, or one
        unique per task for a row without a sequence id."""

        def uuid(seq: int) -> str:
            if explicit and seq >= 0:
                return f"{producer}-{seq}"
            self._chunk_seq += 1
            return f"{producer}-{self.blob_prefix}-{self._chunk_seq}"

        return uuid

    def _drop_persisted(
        self,
        target: TopicName,
        producer: str,
        data: pa.Table,
        oversized: np.ndarray | None,
    ) -> tuple[pa.Table, np.ndarray | None]:
        """Leave out rows whose sequence id the topic already persisted for ``producer``.

        The broker drops such messages one by one; dropping them here keeps a batch that
        straddles the persisted id (rows re-sent by a new query) from being dropped whole by
        the commit's entry-level check, which stays the authority for concurrent writers.
        """
        persisted = self._persisted.get(target)
        if persisted is None:
            persisted = self._persisted[target] = dict(self._ml(target).state().dedup)
        highest = persisted.get(producer)
        if highest is None:
            return data, oversized
        seq = data.column("sequence_id")
        keep = pc.or_(pc.greater(seq, highest), pc.less(seq, 0))  # rows without an id pass
        kept = pc.sum(keep).as_py() or 0
        if kept == data.num_rows:
            return data, oversized
        self.duplicates += data.num_rows - kept
        mask = keep.to_numpy(zero_copy_only=False) if oversized is not None else None
        data = data.filter(keep)
        return data, None if oversized is None or mask is None else oversized[mask]

    def _stage(self, target: TopicName, pending: list[PendingEntry]) -> None:
        """Append encoded entries to the partition's open staged blob (a new one when full)."""
        blob = self._open.get(target)
        if blob is None:
            blob = self._open[target] = StagingBlob(
                self._ml(target), f"{self.blob_prefix}.{self._blob_seq}"
            )
            self._blob_seq += 1
        blob.write(pending)
        if blob.size >= STAGE_BYTES:
            self.staged.append(blob.finish())
            del self._open[target]

    # ------------------------------------------------------------------ staging
    def _ml(self, topic: TopicName) -> ManagedLedger:
        ml = self._mls.get(topic)
        if ml is None:
            ml = self._mls[topic] = ManagedLedger(self.store, topic)
        return ml


def _id_runs(seq: pa.ChunkedArray) -> list[tuple[int, int]]:
    """The row ranges ``[lo, hi)`` of one producer's rows that alternate between having a
    sequence id (>= 0) and having none (:data:`NO_SEQUENCE_ID`): each is cut into entries of
    its own, since an entry's deduplication reads its first and highest ids, and an entry
    mixing both would be taken whole as having none (or its rows without one as duplicates)."""
    has = np.asarray(pc.greater_equal(seq, 0).to_numpy(zero_copy_only=False), dtype=bool)
    if has.all() or not has.any():
        return [(0, len(has))]
    edges = np.flatnonzero(has[1:] != has[:-1]) + 1
    bounds = [0, *edges.tolist(), len(has)]
    return list(itertools.pairwise(bounds))
