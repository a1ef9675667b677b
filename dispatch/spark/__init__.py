"""Pulsar's dispatch semantics as Spark Structured Streaming operators.

Every function here takes a streaming DataFrame with the filepulsar source columns
(:data:`filepulsar.connector.schema.SOURCE_SCHEMA`; extra columns ride along) and returns one:

* :func:`key_shared_assign` -- the ``consumer`` of every message under a Key_Shared selector,
  stable across micro-batches and restarts; membership changes move only what Pulsar moves.
* :func:`delay_until_due` -- delayed delivery: messages whose ``deliverAt`` is past the cutoff
  are held in state and released by processing-time timers.
* :func:`dedup_by_sequence` -- broker-side deduplication by ``(producerName, sequenceId)``.
* :func:`route_retry_dlq` -- ``reconsumeLater``: failed messages as retry-letter or dead-letter
  copies, in the columns the filepulsar sink takes; :func:`route_with_retry` routes the good
  rows to an output topic and the failed ones to their letters in one projection.

A pipeline reads its source once and chains the operators on one DataFrame, ending in one
projection: a DataFrame used twice makes Spark run everything upstream of it twice
(``jobs/orders_pipeline.py`` is the shape).

Each operator lives in its own module (:mod:`filepulsar.dispatch.spark.key_shared`,
:mod:`filepulsar.dispatch.spark.delay`, :mod:`filepulsar.dispatch.spark.dedup`,
:mod:`filepulsar.dispatch.spark.retry`) over the shared Arrow-block transport of
:mod:`filepulsar.dispatch.spark.blocks` (and :mod:`filepulsar.dispatch.spark.available_now`, which
ends AvailableNow runs of ``delay_until_due``); this module re-exports them, and is the public path.

The rules are not re-implemented here: selectors, slots, sticky keys, the delay cutoff, the
backoff and the topic names come from the Spark-free modules of :mod:`dispatch`; this module
moves data to them.

Why the operators are shaped as they are
----------------------------------------
PySpark 4.3's ``transformWithStateInPandas`` worker regroups its input *row by row* in Python
(``itertuples`` and ``pd.DataFrame(rows)``), so its cost grows with rows times columns, whatever
the grouping (shared/reference/PYSPARK_NOTES.md: ~0.03 M msg/s with 10k keys). The operators
therefore never hand it messages one per row:

1. **Arrow blocks.** A stateless ``mapInArrow`` before the stateful operator cuts each Arrow
   record batch of the input into one block per state group and serialises it as an Arrow IPC
   stream (LZ4-compressed: Spark copies a block several times on its way) in a single binary
   cell. The stateful operator then sees one row per group and input
   batch (about a hundred rows per million messages), works on whole blocks with pyarrow and
   numpy, and emits blocks; a second ``mapInArrow`` turns them back into rows with the input's
   schema. No JSON per message, no Python object per message, every column kept exactly: the
   first ``mapInArrow`` names the groups of string and integer columns itself, one JSON name
   per distinct group spelt as the JVM's ``to_json`` would (other column types get theirs from
   a JVM projection, a JSON string per row, 6% of a ``dedup_by_sequence`` run's task time in a
   profile).
2. **Coarse groups.** State is kept per topic partition (Key_Shared and delays: one selector or
   one delay tracker per partition, as Pulsar keeps one dispatcher per partition) or per
   ``(topic, partition, producerName)`` (dedup: Pulsar's per-topic producer map).
3. **Chains stay in Arrow.** An operator given exactly the DataFrame another one returned
   (``key_shared_assign(delay_until_due(dedup_by_sequence(df)))``) regroups that operator's
   output blocks for its own state in Python, with the group names the JVM would make
   (:func:`~filepulsar.dispatch.spark.blocks.rekey_blocks`): rows are made once, at the end
   of the chain. Anything in between (a ``select``, a ``filter``) ends the chain, and the next
   operator cuts rows into blocks again.
4. **Only what needs state keeps state.** :func:`route_retry_dlq` needs none (Pulsar carries
   the retry count in the message's ``RECONSUMETIMES`` property) and is plain Spark SQL.

Spark's Python daemon runs a full garbage collection after every task of a reused worker; the
executor-side functions first freeze what the worker has imported
(:func:`~filepulsar.dispatch.spark.blocks.settle_worker`), which took a third of the
operators' Python time before.

Driver and executors
--------------------
The public functions run on the driver and only build plans; they validate their options there
(a bad consumer list or range fails at once, not in a task). The ``mapInArrow`` functions are
module-level and the stateful processors hold only plain option values (strings, ints, lists),
so both pickle by reference to the executors, which import this module; selectors, kernels and
state handles are rebuilt on the executor in ``init``.

Memory: a stateful operator holds one group's share of a micro-batch at once (dedup sorts it
whole); bound micro-batches with the source's ``maxMessagesPerTrigger`` for very large backlogs.

State store
-----------
``transformWithStateInPandas`` needs the RocksDB state store provider
(``spark.sql.streaming.stateStore.providerClass =
org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider``) and ``protobuf``
(``>= 6.33``) in the Python workers. State lives in the query's checkpoint, so every operator
survives restarts from the same ``checkpointLocation``; the state layouts are listed on each
function. Changing an operator's options that name state (mode, grouping columns) or the input
columns needs a new checkpoint.
"""

from __future__ import annotations

from filepulsar.dispatch.dedup import dedup_keep_mask as dedup_keep_mask
from filepulsar.dispatch.modes import KeySharedMode as KeySharedMode
from filepulsar.dispatch.spark.blocks import BLOCK_ROWS as BLOCK_ROWS
from filepulsar.dispatch.spark.blocks import NO_DATA_BATCHES_CONF as NO_DATA_BATCHES_CONF
from filepulsar.dispatch.spark.dedup import dedup_by_sequence as dedup_by_sequence
from filepulsar.dispatch.spark.delay import delay_until_due as delay_until_due
from filepulsar.dispatch.spark.key_shared import apply_consumers as apply_consumers
from filepulsar.dispatch.spark.key_shared import key_shared_assign as key_shared_assign
from filepulsar.dispatch.spark.retry import route_retry_dlq as route_retry_dlq
from filepulsar.dispatch.spark.retry import route_with_retry as route_with_retry

__all__ = [
    "BLOCK_ROWS",
    "NO_DATA_BATCHES_CONF",
    "KeySharedMode",
    "apply_consumers",
    "dedup_by_sequence",
    "dedup_keep_mask",
    "delay_until_due",
    "key_shared_assign",
    "route_retry_dlq",
    "route_with_retry",
]
