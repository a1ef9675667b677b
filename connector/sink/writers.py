"""The Spark sink: ``df.write`` / ``df.writeStream`` ``.format("filepulsar")`` into topics,
exactly-once.

Usage::

    (df.writeStream.format("filepulsar").option("topic", "orders")
       .option("checkpointLocation", "/chk/orders").start("/data/pulsar"))
    df.write.format("filepulsar").option("topic", "orders").mode("append").save("/data/pulsar")

Input columns (shared/DESIGN.md): ``value`` (binary or string) is required (or a struct, or
the record's fields as columns with ``valueFormat=flatten``: typed values, encoded with the
topic's AVRO or JSON schema -- registered from the struct if the topic has none and its
namespace policy allows -- and stamped with its schema version); optional ``key``,
``orderingKey``, ``properties`` (map<string,string>), ``eventTime``, ``deliverAt`` (timestamp
or epoch ms), ``sequenceId``, ``producerName``, ``topic`` (used when there is no ``topic``
option) and ``partition`` (with ``messageRoutingMode=CustomPartition``). Options, and what is
checked before any write, are in :mod:`filepulsar.connector.sink.options`; routing, batching,
chunking and sequence ids in :mod:`filepulsar.connector.sink.task`.

Exactly-once
------------
*Writer id.* Every commit records ``(writer id, batch id)`` in the manifest of each managed
ledger it publishes to (:func:`filepulsar.storage.staged.commit_staged`); a batch id not newer than
the recorded one is a no-op. For a streaming query the writer id is Spark's query id: PySpark 4.3
gives the Python stream writer no query id on the driver (the commit runs in a fresh Python
worker that only receives the data source, the commit messages and ``batchId``), but every
task sees it as the local property ``sql.streaming.queryId``, so tasks put it in their commit
messages and the driver takes it from there. The query id lives in the checkpoint, so it is
stable across restarts from one checkpoint and new for a new checkpoint (a fresh query must
not be mistaken for a replay), which is Delta's ``txn(appId, version)`` rule. The option
``writerId`` overrides it; if a task saw neither, a hash of ``checkpointLocation`` is used,
and with none of the three the task fails asking for ``writerId``. A batch ``save()`` draws a
fresh writer id in the writer's constructor (PySpark pickles that one writer object to the
tasks and to the commit) and commits as batch 0; an explicit ``writerId`` makes a ``save()``
idempotent: repeating it with the same id changes nothing.

*Blobs.* Each task writes one blob per topic partition it touches (another one each
:data:`filepulsar.connector.sink.task.STAGE_BYTES`), as :func:`filepulsar.storage.staged.stage`
does: durable and invisible. Blob ids are ``<writer id>.<batch id>.<spark
partition>.<attempt>.<random>.<n>``, unique per attempt, and a task that fails deletes the blobs it
staged before re-raising.

*Commit* (driver, ``commit(messages, batchId)``): blobs are grouped by managed ledger and each
ledger gets one atomic manifest commit of all its blobs, in Spark partition order, recording
``(writer id, batchId)`` and applying the topic's dedup policy. A ledger that already recorded
this batch (a replay after a crash between our commit and Spark's commit log, or a retried
commit after a partial one) returns None and its new blobs are deleted. So every input row is
published once per partition whatever Spark replays.

*Abort* (driver, ``abort(messages, batchId)``): for every managed ledger that has not recorded
this batch, the listed blobs are deleted, and so are other blobs named for this writer and
batch (staged by task attempts that failed or were lost). A ledger that already recorded the
batch is left alone: its blobs may be published.

*Stray blobs.* A task attempt that dies without running Python's error handling (executor lost,
speculative duplicate) leaves its blob behind, invisible. A batch ``save()`` clears them after
its commit (one listing of each data folder it published to); a streaming commit does so only
when one of its tasks needed a retry, to keep listings off the per-micro-batch path. Blobs
staged by a query that was killed before it committed are not found this way: the restarted
query stages the batch again under new names. They stay invisible orphans until a
storage-level sweep of unreferenced blobs reclaims them.

Topics, ordering, dedup: rows of one producer name reach a partition in Spark partition order,
then row order; with deduplication on, give each producer's rows increasing sequence ids in
that order (Pulsar's contract for a producer), or later ones are dropped as duplicates.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from filepulsar.connector.sink.options import (
    WHAT,
    SinkConfig,
    check_writer_id,
    dedup_enabled,
    input_columns,
    message_size_limit,
    parse_options,
)
from filepulsar.connector.sink.task import TaskWriter
from filepulsar.connector.values.encode import (
    SinkValueSchema,
    check_struct,
    derive_avro,
)
from filepulsar.connector.values.types import SchemaMappingError
from filepulsar.storage import paths
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.errors import FilePulsarError, InvalidConfiguration
from filepulsar.storage.ledger import ManagedLedger
from filepulsar.storage.names import TopicName
from filepulsar.storage.policies import Policies, effective_policies
from filepulsar.storage.schemas import SchemaRegistry
from filepulsar.storage.staged import (
    StagedBlob,
    commit_staged,
    discard_staged,
    last_committed_batch,
)
from filepulsar.storage.topics import ensure_topic, partitions_of

log = logging.getLogger(__name__)

#: Local properties Spark's micro-batch execution sets on every task of a streaming query.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass(frozen=True)
class SinkCommitMessage(WriterCommitMessage):
    """What a task hands the driver: the blobs it staged (picklable, small).

    ``batch_id`` is the micro-batch the task wrote for as Spark told it (-1 if unknown); the
    driver refuses to commit blobs of another batch.
    """

    writer_id: str
    batch_id: int
    partition_id: int
    attempt: int
    blobs: tuple[StagedBlob, ...]
    num_messages: int
    duplicates: int = 0  # rows left out: their sequence id was already persisted


def sink_config(
    options: Any, schema: StructType, overwrite: bool, *, streaming: bool
) -> SinkConfig:
    """Parse and check everything before any write (runs on the driver).

    Also makes sure the ``topic`` option's topic exists (auto-created per policy, as a Pulsar
    producer does when it connects) and that ``maxMessageSize`` is within its policy.

    Raises
    ------
    InvalidConfiguration
        For a bad option, input column or column type, or ``mode("overwrite")`` on a batch
        write (topics are append-only).
    TopicNotFound
        If the topic is missing and may not be created.
    """
    config = parse_options(options)
    config = dataclasses.replace(config, columns=input_columns(schema, config))
    if overwrite and not streaming:
        raise InvalidConfiguration(
            f"{WHAT}: topics are append-only; mode('overwrite') is not supported, use "
            "mode('append')"
        )
    record = _record_struct(schema, config)
    if record is not None and config.topic is None:
        raise InvalidConfiguration(
            f"{WHAT}: a typed value (valueFormat struct or flatten) is written to the topic "
            "of the 'topic' option, whose schema encodes it; set option 'topic'"
        )
    if config.topic is not None:
        store = _store(config)
        topic = TopicName.parse(config.topic)
        ensure_topic(store, topic, auto_create=config.auto_create_topic)
        policies = effective_policies(store, topic)
        message_size_limit(config, policies, topic)
        if record is not None:
            config = dataclasses.replace(
                config,
                value_schema=_value_schema(store, topic, policies, config, record),
                record_columns=tuple(record.fieldNames())
                if config.value_format == "flatten"
                else (),
            )
    return config


def _record_struct(schema: StructType, config: SinkConfig) -> StructType | None:
    """The struct a typed write encodes (None: values are bytes or text)."""
    if config.value_format == "flatten":
        taken = set(config.columns.values())
        return StructType([f for f in schema.fields if f.name not in taken])
    actual = config.columns.get("value")
    if actual is None:
        return None
    t = schema[actual].dataType
    return t if isinstance(t, StructType) else None


def _value_schema(
    store: BlobStore, topic: TopicName, policies: Policies, config: SinkConfig, record: StructType
) -> SinkValueSchema:
    """The schema a typed write encodes with, registered in the topic's registry: the
    ``valueSchema`` option's, else the topic's latest (AVRO or JSON), else one derived from
    the struct (added if the namespace policy allows, as a producer's schema is).

    Raises
    ------
    InvalidConfiguration
        If the struct does not fit the schema (naming the field and both types), or
        ``valueSchemaType`` contradicts the topic's schema.
    IncompatibleSchema
        If the schema may not be added (compatibility strategy, auto-update off).
    """
    registry = SchemaRegistry(store, topic)
    latest = registry.latest()
    if latest is not None and latest.type not in ("AVRO", "JSON"):
        raise InvalidConfiguration(
            f"{WHAT}: topic {topic.base} has a {latest.type} schema; a struct value needs an "
            "AVRO or JSON schema: write a binary or string 'value' instead"
        )
    type_ = config.value_schema_type or (latest.type if latest is not None else "AVRO")
    if config.value_schema_text is not None:
        definition: Any = json.loads(config.value_schema_text)
    elif latest is not None:
        if config.value_schema_type and config.value_schema_type != latest.type:
            raise InvalidConfiguration(
                f"{WHAT}: valueSchemaType is {config.value_schema_type} but topic {topic.base}'s "
                f"schema is {latest.type}"
            )
        definition = latest.parsed()
    else:
        try:
            definition = derive_avro(record, config.value_schema_name)
        except SchemaMappingError as e:
            raise InvalidConfiguration(f"{WHAT}: {e}") from e
    try:
        check_struct(record, definition)
    except SchemaMappingError as e:
        raise InvalidConfiguration(
            f"{WHAT}: the input does not match the schema of topic {topic.base}: {e}"
        ) from e
    text = json.dumps(definition, sort_keys=True)
    stored = registry.register(
        type_,
        text,
        type_,
        strategy=policies.schema_compatibility_strategy,
        allow_auto_update=policies.is_allow_auto_update_schema,
    )
    mode = "flatten" if config.value_format == "flatten" else "struct"
    log.info(
        "%s: writing %s values of %s with schema version %d", WHAT, type_, topic, stored.version
    )
    return SinkValueSchema(type_, text, stored.version, mode, tuple(record.fieldNames()))


def _store(config: SinkConfig) -> BlobStore:
    return open_blob_store(config.root, storage_options=dict(config.storage_options))


def _task_context() -> Any:
    from pyspark import TaskContext

    return TaskContext.get()


def write_task(
    config: SinkConfig,
    batches: Iterator[pa.RecordBatch],
    *,
    writer_id: str,
    batch_id: int,
    batch_label: str,
) -> SinkCommitMessage:
    """Write one task's rows to staged blobs (runs on an executor)."""
    tc = _task_context()
    partition_id = tc.partitionId() if tc is not None else 0
    attempt = tc.attemptNumber() if tc is not None else 0
    tw = TaskWriter(
        config,
        writer_id=writer_id,
        batch_label=batch_label,
        partition_id=partition_id,
        attempt=attempt,
    )
    blobs = tw.write_all(batches)
    return SinkCommitMessage(
        writer_id, batch_id, partition_id, attempt, tuple(blobs), tw.num_messages, tw.duplicates
    )


def _messages(messages: Sequence[WriterCommitMessage | None]) -> list[SinkCommitMessage]:
    out = []
    for m in messages:
        if m is None:
            continue
        if not isinstance(m, SinkCommitMessage):
            raise FilePulsarError(f"{WHAT}: unexpected commit message {type(m).__name__}")
        out.append(m)
    return sorted(out, key=lambda m: (m.partition_id, m.attempt))


def _by_ledger(msgs: list[SinkCommitMessage]) -> dict[str, list[StagedBlob]]:
    groups: dict[str, list[StagedBlob]] = {}
    for m in msgs:
        for sb in m.blobs:
            groups.setdefault(sb.topic, []).append(sb)
    return groups


class _PolicyCache:
    def __init__(self, store: BlobStore) -> None:
        self.store = store
        self._cache: dict[TopicName, Policies] = {}

    def get(self, topic: TopicName) -> Policies:
        base = topic.base
        pol = self._cache.get(base)
        if pol is None:
            pol = self._cache[base] = effective_policies(self.store, topic)
        return pol


def _writer_ids(msgs: list[SinkCommitMessage], writer_id: str | None) -> set[str]:
    ids = {m.writer_id for m in msgs}
    if writer_id is not None:
        ids.add(writer_id)
    return ids


def commit_batch(
    config: SinkConfig,
    messages: Sequence[WriterCommitMessage | None],
    *,
    batch_id: int,
    writer_id: str | None = None,
    sweep: bool = False,
) -> None:
    """Publish the blobs of one batch: one atomic manifest commit per managed ledger.

    Runs on the driver. ``writer_id``, when given, must match the tasks' (they carry it).
    Every ledger is published first; only then are blobs deleted that will never be published
    (a ledger that had already recorded the batch, and -- with ``sweep`` (batch writes: once
    per ``save()``) or when a task needed a retry -- blobs that failed attempts staged for this
    writer and batch). That clean-up is best effort: a failure there is logged, never turned
    into a failed commit (what it misses is an invisible orphan, see ``sweep_orphans``).

    Raises
    ------
    FilePulsarError
        If the tasks disagree on the writer id or wrote for another batch.
    """
    msgs = _messages(messages)
    if not msgs:
        return
    ids = _writer_ids(msgs, writer_id)
    if len(ids) != 1:
        raise FilePulsarError(
            f"{WHAT}: the tasks of batch {batch_id} report writer ids {sorted(ids)}; refusing "
            "to commit"
        )
    wid = ids.pop()
    stray = sorted({m.batch_id for m in msgs if m.batch_id not in (-1, batch_id)})
    if stray:
        raise FilePulsarError(
            f"{WHAT}: commit of batch {batch_id} got blobs staged for batch(es) {stray}"
        )
    store = _store(config)
    policies = _PolicyCache(store)
    duplicates = sum(m.duplicates for m in msgs)
    replayed: list[tuple[ManagedLedger, list[StagedBlob]]] = []
    published: list[tuple[ManagedLedger, list[StagedBlob]]] = []
    for topic, blobs in sorted(_by_ledger(msgs).items()):
        ml = ManagedLedger(store, TopicName.parse(topic))
        pol = policies.get(ml.topic)
        positions = commit_staged(
            ml,
            blobs,
            policies=pol,
            dedup=dedup_enabled(pol, ml.topic),
            writer_id=wid,
            batch_id=batch_id,
        )
        if positions is None:
            replayed.append((ml, blobs))
        else:
            published.append((ml, blobs))
            duplicates += sum(1 for per_blob in positions for p in per_blob if p is None)
    log.info(
        "%s: batch %d of writer %s: %d messages, %d ledgers published, %d already had the "
        "batch, %d duplicates dropped",
        WHAT,
        batch_id,
        wid,
        sum(m.num_messages for m in msgs),
        len(published),
        len(replayed),
        duplicates,
    )
    retried = sweep or any(m.attempt > 0 for m in msgs)
    try:
        for ml, blobs in replayed:
            discard_staged(ml, blobs)
        if retried:
            for ml, blobs in published:
                _sweep(store, ml.topic, {wid}, batch_id, keep={sb.blob for sb in blobs})
    except (FilePulsarError, OSError) as e:
        log.warning(
            "%s: batch %d is committed; deleting its unpublished blobs failed (they stay as "
            "invisible orphans for sweep_orphans): %s",
            WHAT,
            batch_id,
            e,
        )


def abort_batch(
    config: SinkConfig,
    messages: Sequence[WriterCommitMessage | None],
    *,
    batch_id: int,
    writer_id: str | None = None,
) -> None:
    """Delete what an aborted batch staged; nothing of it becomes visible (driver).

    Managed ledgers that already recorded ``batch_id`` for the writer are left alone (a commit
    that failed half-way, or an earlier run, published there).
    """
    msgs = _messages(messages)
    ids = _writer_ids(msgs, writer_id)
    if not ids:
        return
    store = _store(config)
    groups = _by_ledger(msgs)
    topics = {TopicName.parse(t) for t in groups}
    if config.topic is not None:
        t = TopicName.parse(config.topic)
        n = partitions_of(store, t)
        if n:
            topics.update(t.partition(i) for i in range(n))
        elif n == 0:
            topics.add(t)
    for topic in sorted(topics, key=str):
        ml = ManagedLedger(store, topic)
        if any(last_committed_batch(ml, wid) >= batch_id for wid in ids):
            log.warning(
                "%s: abort of batch %d leaves %s alone: it already recorded the batch",
                WHAT,
                batch_id,
                topic,
            )
            continue
        discard_staged(ml, groups.get(str(topic), []))
        _sweep(store, topic, ids, batch_id, keep=set())
    log.info("%s: batch %d of writer(s) %s aborted", WHAT, batch_id, sorted(ids))


def _sweep(
    store: BlobStore, topic: TopicName, writer_ids: set[str], batch_id: int, *, keep: set[str]
) -> None:
    """Delete the blobs of ``topic`` named for these writers and batch, except ``keep``.

    Only safe where no blob of that (writer, batch) is published other than those in ``keep``:
    a ledger this commit just published to, or one that never recorded the batch.
    """
    prefixes = tuple(paths.staged_blob_prefix(wid, batch_id) for wid in writer_ids)
    deleted = 0
    for key in store.list(paths.data_dir(topic)):
        blob = paths.blob_id_of(key)
        if blob is not None and blob.startswith(prefixes) and blob not in keep:
            store.delete(key)
            deleted += 1
    if deleted:
        log.info("%s: deleted %d stray blob(s) of batch %d in %s", WHAT, deleted, batch_id, topic)


def stream_writer_id(config: SinkConfig, task_context: Any) -> str:
    """The writer id of a streaming task: ``writerId``, else Spark's query id, else a hash of
    ``checkpointLocation``.

    Raises
    ------
    InvalidConfiguration
        If none of them is available.
    """
    if config.writer_id is not None:
        return config.writer_id
    qid = task_context.getLocalProperty(QUERY_ID_PROPERTY) if task_context is not None else None
    if qid:
        return check_writer_id(qid, "Spark's streaming query id")
    if config.checkpoint_location:
        digest = hashlib.sha256(config.checkpoint_location.encode()).hexdigest()[:24]
        return f"ckpt-{digest}"
    raise InvalidConfiguration(
        f"{WHAT}: cannot tell which query this is (no streaming query id, no "
        "checkpointLocation): set option 'writerId' to a stable id for exactly-once"
    )


class FilePulsarBatchWriter(DataSourceArrowWriter):
    """``df.write.format("filepulsar")``: one ``save()`` is one exactly-once batch (id 0).

    Built on the driver by ``save()``, which validates everything here; PySpark pickles this
    object to the tasks (``write``) and back to the driver's commit (``commit``/``abort``), so
    the writer id drawn here is the same everywhere.
    """

    def __init__(self, options: Any, schema: StructType, overwrite: bool) -> None:
        self.config = sink_config(options, schema, overwrite, streaming=False)
        self.writer_id = self.config.writer_id or f"save-{uuid.uuid4().hex[:20]}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        """Stage this task's rows: called on an executor once per task attempt, on the
        writer pickled from the driver. A retried or speculative attempt stages under new
        blob ids; only the attempts whose messages reach :meth:`commit` are published.
        The returned message is pickled back to the driver."""
        return write_task(
            self.config, iterator, writer_id=self.writer_id, batch_id=0, batch_label="0"
        )

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Publish every task's blobs: called once on the driver when every task succeeded,
        with one message per task (None for a task that sent none). Idempotent per
        (writer id, batch 0): repeating a ``save()`` with the same ``writerId`` changes
        nothing."""
        commit_batch(self.config, messages, batch_id=0, writer_id=self.writer_id, sweep=True)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Delete every staged blob of this ``save()``: called once on the driver when a task
        failed for good (messages of the tasks that finished, None for the others); also
        finds the blobs of attempts that sent no message, by name."""
        abort_batch(self.config, messages, batch_id=0, writer_id=self.writer_id)


class FilePulsarStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("filepulsar")``: exactly-once per micro-batch.

    PySpark builds this writer on the driver at ``start()``, before every micro-batch and again
    in a fresh Python worker for every ``commit``/``abort``, so it holds nothing but the
    checked configuration; the writer id comes from the tasks (see the module docstring).
    """

    def __init__(self, options: Any, schema: StructType, overwrite: bool) -> None:
        # Every output mode appends the micro-batch's rows (a topic is a log), as Kafka's sink.
        self.config = sink_config(options, schema, overwrite, streaming=True)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        """Stage this task's rows of the current micro-batch: called on an executor once per
        task attempt; the query id and batch id come from the task's local properties. A
        replayed batch stages again under new blob ids; the commit drops what was already
        published. The returned message is pickled back to the driver."""
        tc = _task_context()
        writer_id = stream_writer_id(self.config, tc)
        label = tc.getLocalProperty(BATCH_ID_PROPERTY) if tc is not None else None
        batch_id = int(label) if label is not None and label.isdigit() else -1
        return write_task(
            self.config,
            iterator,
            writer_id=writer_id,
            batch_id=batch_id,
            batch_label=str(batch_id) if batch_id >= 0 else "x",
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Publish the micro-batch: called on the driver, in a fresh Python worker (this
        object rebuilt from the options; the writer id from the messages), once per batch
        before Spark writes its commit log, and again for the same ``batchId`` after a
        crash in between: a batch already published is a no-op."""
        commit_batch(self.config, messages, batch_id=batchId, writer_id=self.config.writer_id)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Delete what the micro-batch staged: called on the driver, in a fresh Python worker,
        when a task of the batch failed for good; ledgers that already recorded the batch
        are left alone."""
        abort_batch(self.config, messages, batch_id=batchId, writer_id=self.config.writer_id)
