"""Ending a ``Trigger.AvailableNow`` run of :func:`~filepulsar.dispatch.spark.delay.delay_until_due`
once its source is drained (driver side).

Spark 4.3 asks for another micro-batch after every batch of a processing-time
``transformWithState`` (its ``shouldRunAnotherBatch`` is always true for that time mode), so
with no-data micro-batches on (:data:`~filepulsar.dispatch.spark.blocks.NO_DATA_BATCHES_CONF`,
Spark's default) an AvailableNow query holding delayed messages never ends: it runs empty batches
until its held messages are due. What a Spark user expects of AvailableNow is that the run ends
when the source is drained, and what is not due yet waits in state for the next run.

1. :func:`delay_until_due` calls :func:`end_available_now_when_drained` with its session,
   which adds one :class:`StreamingQueryListener` to it (once per session).
2. The listener looks at each micro-batch's progress. An AvailableNow query runs a batch in
   which no source moved (a no-data batch) only once its sources are drained, so the first
   one is the end of the run: it has fired every timer due by then. (Not the first batch of
   a run: that may replay the last run's no-data batch, which a stop interrupted.)
3. If that query runs :func:`delay_until_due` (its plan has a processing-time
   ``transformWithState`` over this package's block columns) under ``Trigger.AvailableNow``,
   the listener stops it, from a thread of its own (``stop()`` waits for the query's thread).
   ``awaitTermination()`` then returns as at a normal end; the next run picks up from the
   checkpoint, held messages and timers included.

Seeing the trigger and the plan takes the query's JVM object (classic PySpark). Under Spark
Connect there is none: set :data:`~filepulsar.dispatch.spark.blocks.NO_DATA_BATCHES_CONF` to
``"false"`` before ``start()`` instead, and the query ends by itself.
"""

from __future__ import annotations

import logging
import re
import threading
import weakref
from typing import Any

from py4j.protocol import Py4JError
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQueryListener

log = logging.getLogger(__name__)

__all__ = ["end_available_now_when_drained"]

#: A processing-time ``transformWithState`` over the block columns: ``delay_until_due``.
_DELAY_IN_PLAN = re.compile(
    r"TransformWithStateInPySpark \S+\(pulsar_group#\d+, pulsar_block#\d+\)[^\n]*, ProcessingTime,"
)

_installed: weakref.WeakKeyDictionary[SparkSession, _EndDrainedAvailableNow] = (
    weakref.WeakKeyDictionary()
)
_install_lock = threading.Lock()


def _delay_under_available_now(query: Any) -> bool:
    """Whether ``query`` runs ``delay_until_due`` under ``Trigger.AvailableNow`` (False when
    its JVM object cannot be seen, as under Spark Connect)."""
    try:
        execution = query._jsq.streamingQuery()
        trigger = execution.trigger().getClass().getSimpleName()
        plan = execution.logicalPlan().toString()
    except (AttributeError, Py4JError):
        return False
    return trigger.startswith("AvailableNowTrigger") and bool(_DELAY_IN_PLAN.search(plan))


class _EndDrainedAvailableNow(StreamingQueryListener):
    """Stops an AvailableNow run of ``delay_until_due`` at its first no-data batch (not
    counting the run's first batch)."""

    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark
        self._stopping: set[str] = set()
        self._started: set[str] = set()  # runs that have finished a batch

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        run = str(progress.runId)
        first = run not in self._started
        self._started.add(run)
        if progress.numInputRows or any(s.startOffset != s.endOffset for s in progress.sources):
            return  # a batch that read something: AvailableNow runs no other until drained
        if first or run in self._stopping:
            # A run's first batch may replay the no-data batch a stop interrupted at the end
            # of the last run: no sign that the new data is read.
            return
        query = self._spark.streams.get(str(progress.id))
        if query is None or str(query.runId) != run or not _delay_under_available_now(query):
            return
        self._stopping.add(run)
        log.info(
            "delay_until_due: AvailableNow query %s drained its source in batch %d; ending the "
            "run (messages not due yet stay held for the next run)",
            progress.id,
            progress.batchId,
        )
        threading.Thread(target=query.stop, name=f"end-available-now-{run}", daemon=True).start()

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        self._stopping.discard(str(event.runId))
        self._started.discard(str(event.runId))


def end_available_now_when_drained(spark: SparkSession) -> None:
    """Make AvailableNow runs of ``delay_until_due`` on ``spark`` end once their source is
    drained (see the module docstring). Adds one listener per session; called again, does
    nothing."""
    with _install_lock:
        if spark in _installed:
            return
        listener = _EndDrainedAvailableNow(spark)
        spark.streams.addListener(listener)
        _installed[spark] = listener
