"""The Spark source: ``spark.read`` / ``spark.readStream`` ``.format("filepulsar")``.

Offsets are readable JSON: for each partition's managed ledger
``"<topic>-partition-<i>": [ledgerId, entryId, n, incarnation]`` meaning every message up to
message ``n`` (counted from 1) of that entry is included; ``n = -1`` means the whole entry.
Message-level offsets let ``maxMessagesPerTrigger`` hold exactly even inside batch entries.
``incarnation`` (absent for topics created before it existed, and in older checkpoints) is the
topic's creation id: a topic deleted and created again is recognised, reported as data loss
and read from its start.

With a ``subscription`` the query is a consumer of that subscription (a durable cursor unless
``subscriptionMode=NonDurable``): a new query starts at the cursor, ``commit(end)`` moves it (so
retention can reclaim what every subscription consumed), and several queries on one
subscription share it per its type. Exclusive refuses a second query; Failover gives each
partition to one active query; Shared and Key_Shared queries claim entries in
``latestOffset`` and their offsets list the claimed entries (``{"claims": {...}}``, an entry
split by ``maxMessagesPerTrigger`` with the batch indexes taken:
:mod:`filepulsar.connector.source.claims`), so a replay reads exactly the same messages. Without a
subscription nothing is stored (no orphan subscriptions): the offsets in Spark's checkpoint are the
only state.

Typed values (``valueFormat`` struct or flatten): the columns come from the topics' latest
schema version when the DataFrame or query is loaded (:mod:`filepulsar.connector.values.types`); the
readers pass that version to the tasks in
:attr:`~filepulsar.connector.source.partition.FilePulsarPartition.value`, and each task decodes
every message with the version that wrote it, resolved to that one.
``readCompacted``: each task reads the partition's compacted view for the part of its range
before the view's horizon, then the topic (offsets stay the topic's message ids).

What runs where: the reader objects live on the driver (offsets, planning, commits); ``read``
runs on executors with only the picklable
:class:`~filepulsar.connector.source.partition.FilePulsarPartition` it is given. Per trigger the
driver reads each partition's manifest once and counts messages from fragment metadata
(:class:`~filepulsar.connector.source.meter.MessageMeter`); it reads entries only to cut
``maxMessagesPerTrigger`` exactly inside a fragment of several batch entries. The backlog left
after each batch is reported in the progress's ``latestOffset``
(:meth:`~filepulsar.connector.source.stream.FilePulsarStreamReader.reportLatestOffset`,
:func:`backlog_of`), never in the checkpointed offsets.

This module holds the batch reader (:class:`FilePulsarBatchReader`) and :func:`backlog_of`;
the rest of the source, one concept to a module:

* :mod:`filepulsar.connector.source.options` -- the options, parsed once (:class:`SourceOptions`);
* :mod:`filepulsar.connector.source.offsets` -- the offsets' form and arithmetic, options resolved
  to them;
* :mod:`filepulsar.connector.source.plan` -- the partitions a query reads, split into tasks;
* :mod:`filepulsar.connector.source.meter` -- counting messages and bytes for admission control;
* :mod:`filepulsar.connector.source.claims` -- Shared/Key_Shared claims counted in messages;
* :mod:`filepulsar.connector.source.consumers` -- a stream's partitions and subscription consumers;
* :mod:`filepulsar.connector.source.stream` -- the stream reader (:class:`FilePulsarStreamReader`);
* :mod:`filepulsar.connector.source.partition` -- one task (:class:`FilePulsarPartition`), shared
  checks;
* :mod:`filepulsar.connector.source.read` and :mod:`filepulsar.connector.source.columns` -- the
  executor's read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from filepulsar.connector.source.offsets import (
    check_offset_keys,
    check_start_not_after_end,
    partition_spec,
    resolve_offset,
)
from filepulsar.connector.source.options import SourceOptions, time_for
from filepulsar.connector.source.partition import FilePulsarPartition
from filepulsar.connector.source.plan import plan_partitions, resolve_partitions
from filepulsar.connector.source.read import read_partition
from filepulsar.connector.source.stream import FilePulsarStreamReader
from filepulsar.storage import ManagedLedger, TopicNotFound, jsontext
from filepulsar.storage.read_range import data_loss

# Re-exported (``__all__`` below): SourceOptions and FilePulsarStreamReader moved out of this
# module but tests and callers import them from here; backlog_of is public (docs/spark-source.md).
__all__ = ["FilePulsarBatchReader", "FilePulsarStreamReader", "SourceOptions", "backlog_of"]


# --------------------------------------------------------------------------- progress


def backlog_of(progress: Any, source: int | None = None) -> dict[str, Any] | None:
    """The backlog a filepulsar stream reported in a query's progress.

    PySpark gives Python sources no metrics hook, so the source reports its backlog in the
    ``latestOffset`` JSON of the progress (``query.lastProgress["sources"][i]``): messages
    left after the batch that progress is about, per partition and in total.

    Parameters
    ----------
    progress
        ``query.lastProgress`` or an element of ``query.recentProgress`` (the progress object
        or its dict/JSON form).
    source
        Index of the source in the progress; None: the first filepulsar source.

    Returns
    -------
    dict or None
        ``{"messages": total, "partitions": {partition: messages}}`` (for a Shared/Key_Shared
        subscription: the subscription's backlog per partition), or None if the progress
        holds no filepulsar backlog (no progress yet, or another source).
    """
    if progress is None:
        return None
    if isinstance(progress, str):
        progress = jsontext.loads(progress)
    sources = progress["sources"]
    picked = range(len(sources)) if source is None else [source]
    for i in picked:
        latest = sources[i]["latestOffset"]
        if isinstance(latest, str):
            try:
                latest = jsontext.loads(latest)
            except ValueError:
                continue  # another source's offset format
        if isinstance(latest, dict) and isinstance(latest.get("backlog"), dict):
            return dict(latest["backlog"])
    return None


# --------------------------------------------------------------------------- batch reads


class FilePulsarBatchReader(DataSourceReader):
    """``spark.read.format("filepulsar")``: messages between startingOffsets and
    endingOffsets (default: everything in the topics when the job runs).

    Spark plans a Python source's partitions once per DataFrame and reuses them for every
    action, so "earliest" and "latest" are resolved by the tasks, when each action runs (as
    Spark's Kafka source does): a DataFrame re-run reads what the topics hold then. The set
    of partitions read and the split into tasks are fixed when the DataFrame is first
    planned: topics or partitions created after that need a new ``spark.read ... load()``.
    """

    def __init__(self, options: Any, schema: StructType) -> None:
        """Called by Spark on the driver (in a planning Python worker) once per DataFrame
        read; the object is then pickled to executors for :meth:`read`."""
        self.opts = SourceOptions.parse(options, streaming=False).for_schema(schema)

    def partitions(self) -> list[FilePulsarPartition]:
        """Called once on the driver when the DataFrame is planned; the tasks are reused by
        every action on it. Returns picklable tasks ("latest" resolved when each runs)."""
        store = self.opts.store()
        tps = resolve_partitions(store, self.opts)
        check_offset_keys(self.opts, tps)
        start, end = {}, {}
        manifests = {}
        end_latest, loss_ok = set(), set()
        for t in tps:
            key = str(t)
            ml = ManagedLedger(store, t)
            try:
                m = ml.state()
            except TopicNotFound:  # deleted between listing and reading
                data_loss(
                    f"{t} was deleted while this query was planned", self.opts.fail_on_data_loss
                )
                continue
            manifests[key] = m
            s_spec = partition_spec(self.opts.starting_offsets, key, is_start=True)
            e_spec = partition_spec(self.opts.ending_offsets, key, is_start=False)
            timed = time_for(self.opts.starting_time, key) is not None
            if s_spec == "latest" and not timed:
                continue  # (latest, ...]: empty whenever the job runs
            if not timed and self.opts.ending_time is None:
                check_start_not_after_end(key, s_spec, e_spec)
            start[key] = resolve_offset(
                self.opts.starting_offsets, key, m, ml, self.opts, is_start=True
            )
            end[key] = resolve_offset(
                self.opts.ending_offsets, key, m, ml, self.opts, is_start=False
            )
            if e_spec == "latest" and self.opts.ending_time is None:
                end_latest.add(key)
            if s_spec == "earliest" or timed:
                loss_ok.add(key)
        return plan_partitions(
            store,
            self.opts,
            start,
            end,
            manifests,
            end_latest=frozenset(end_latest),
            loss_ok=frozenset(loss_ok),
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Called on an executor once per task attempt with one of :meth:`partitions`'
        tasks; reads only that task (a retry reads the same)."""
        return read_partition(partition)  # type: ignore[arg-type]
