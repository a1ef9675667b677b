"""The local SparkSession the jobs, benchmarks and tests use (one recipe, sized for a small
machine): ``local[2]``, two shuffle partitions, no UI or progress bar, quiet logs, checkpoint
files written without a child process per path (:data:`FILESYSTEM_CHECKPOINT_FILE_MANAGER`),
and Python workers running this interpreter (Spark would otherwise run ``python3`` from PATH)."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

#: The state store the stateful operators of :mod:`filepulsar.dispatch.spark` need.
ROCKSDB_STATE_STORE = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

#: RocksDB changelog checkpointing: a state store commit writes the batch's changes instead of
#: a snapshot of the whole store (snapshots are made in the background every few batches).
#: Spark supports switching it on for an existing checkpoint.
ROCKSDB_CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"

#: The session setting that picks how Spark writes a query's checkpoint files.
CHECKPOINT_FILE_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"

#: Spark's checkpoint file manager over Hadoop's ``FileSystem`` API, for local checkpoints.
#: Spark's default (``FileContext``) renames each checkpoint file through Hadoop's
#: ``AbstractFileSystem``, which on the local filesystem, without Hadoop's native library
#: (PySpark ships none), starts a ``readlink`` process for each path it looks at: 8 per file a
#: micro-batch writes (the offset and commit logs, each state store partition's changelog and
#: their ``.crc`` files), three quarters of the JVM's child processes in a stateful query. This
#: one writes the same files (a temporary file renamed into place, as atomic on a local disk)
#: without them; the ``chmod`` per created file that Hadoop's local filesystem runs stays.
FILESYSTEM_CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def local_spark(app_name: str, *, driver_memory: str = "2g", **conf: str) -> Any:
    """Get or create the local session; ``conf`` adds (or overrides) Spark settings.

    A session that already runs in this process is returned as it is (Spark applies static
    settings only when the JVM starts); runtime settings in ``conf`` are applied to it.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    settings = {
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": driver_memory,
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_STATE_STORE,
        ROCKSDB_CHANGELOG: "true",
        CHECKPOINT_FILE_MANAGER: FILESYSTEM_CHECKPOINT_FILE_MANAGER,
        **conf,
    }
    builder = SparkSession.builder.master("local[2]").appName(app_name)
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    for k, v in conf.items():
        if k.startswith("spark.sql."):
            spark.conf.set(k, v)
    spark.sparkContext.setLogLevel("ERROR")
    register_data_source(spark)
    return spark


def register_data_source(spark: Any) -> None:
    """Register the ``filepulsar`` data source unless the session already knows it from an
    installed package.

    Spark finds ``pyspark_filepulsar`` by listing a driver-side worker's import path, which an
    editable install or a notebook kernel started elsewhere does not show: then it is
    registered here. Where Spark found it in an installed package, registering again would
    only log that it "replaced a statically registered data source" on every run, so it is
    left as it is. With ``--py-files`` (a zip also on the driver's ``PYTHONPATH``, as
    docs/deployment.md says) Spark finds it in the zip, but its own registration does not
    ship the zip to the executors' Python workers (``No module named 'filepulsar'`` in every
    read task); registering here does, so a session with py-files always registers.
    """
    from py4j.protocol import Py4JError

    from filepulsar.connector.datasource import FilePulsarDataSource

    try:
        manager = spark._jsparkSession.sessionState().dataSourceManager()
        known = bool(manager.dataSourceExists(FilePulsarDataSource.name()))
        shipped = bool(spark.sparkContext._python_includes)  # --py-files .zip/.egg/.jar
    except (AttributeError, Py4JError):  # Spark Connect: no JVM handle to ask
        known = shipped = False
    if shipped or not known:
        spark.dataSource.register(FilePulsarDataSource)


def prepare_session(spark: Any) -> None:
    """Make any session (spark-submit's, a notebook's) ready for the jobs: the data source
    registered explicitly (``--py-files`` deployments, where Spark's discovery of
    ``pyspark_filepulsar`` does not see the package) and the RocksDB state store the dispatch
    operators need (a runtime setting, applied before a query starts), with changelog
    checkpointing (:data:`ROCKSDB_CHANGELOG`) unless the session chose otherwise. A session
    with a ``local`` master (its checkpoints on this machine's disk) writes checkpoint files
    with :data:`FILESYSTEM_CHECKPOINT_FILE_MANAGER` unless it chose a manager; a cluster's
    keeps Spark's default (on HDFS no process is started, and its rename is atomic)."""
    register_data_source(spark)
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB_STATE_STORE)
    if spark.conf.get(ROCKSDB_CHANGELOG, None) is None:
        spark.conf.set(ROCKSDB_CHANGELOG, "true")
    local = str(spark.conf.get("spark.master", "")).startswith("local")  # Spark Connect too
    if local and spark.conf.get(CHECKPOINT_FILE_MANAGER, None) is None:
        spark.conf.set(CHECKPOINT_FILE_MANAGER, FILESYSTEM_CHECKPOINT_FILE_MANAGER)


def run_query(app_name: str, start: Callable[[Any, Any], Any], args: Any) -> tuple[str, int, float]:
    """A pipeline's ``main``: get the session, start its query with ``start(spark, args)``,
    wait up to ``args.timeout`` seconds (None: until it ends; an ``availableNow`` query ends
    by itself), stop it if still running, stop the session. Returns the query's id, the
    input rows it read and the seconds it took.

    Spark logs at WARN (``FILEPULSAR_SPARK_LOG_LEVEL`` sets another level), without its
    console progress bar (a line per task, redrawn, in the job's log otherwise). A SIGTERM to
    this process, or to the JVM that spark-submit runs it under (:func:`stop_on_jvm_sigterm`),
    stops the query as a stop asked for (the job ends normally, no error logged); a query
    that failed raises its error."""
    from pyspark.sql import SparkSession

    level = os.environ.get("FILEPULSAR_SPARK_LOG_LEVEL", "WARN")
    spark = (
        SparkSession.builder.appName(app_name)
        .config("spark.log.level", level)
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel(level)
    t0 = time.perf_counter()
    stopping = threading.Event()
    # SIGTERM (a deploy, a scheduler's stop) ends the query between micro-batches, as a stop
    # it asked for: the job exits 0 and logs no error. The handler runs in the main thread,
    # so the wait below is made of short waits. Both handlers go in before the query starts
    # (a SIGTERM as it starts is a stop too).
    previous = signal.signal(signal.SIGTERM, functools.partial(_on_sigterm, stopping))
    jvm_previous = stop_on_jvm_sigterm(spark, stopping)
    try:
        query = start(spark, args)
        deadline = None if args.timeout is None else time.monotonic() + args.timeout
        while query.isActive and not stopping.is_set():
            left = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if left <= 0:
                break
            query.awaitTermination(left)
        if query.isActive:
            stop_between_batches(query)
        elif query.exception() is not None:
            query.awaitTermination()  # raises the query's error
    finally:
        signal.signal(signal.SIGTERM, previous)
        if jvm_previous is not None:
            from py4j.protocol import Py4JError

            with contextlib.suppress(Py4JError):  # (the JVM gone: the query's error goes on)
                jvm_previous()
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    seconds = round(time.perf_counter() - t0, 2)
    query_id = str(query.id)
    spark.stop()
    return query_id, rows, seconds


def _on_sigterm(stopping: threading.Event, signum: int, _frame: Any) -> None:
    """This process's SIGTERM handler while a job runs: the first sets ``stopping`` (the
    query stops between micro-batches); a second (the stop is slow or stuck) is the default
    handling again, at once (the process ends, as a SIGTERM did before the job started)."""
    if not stopping.is_set():
        stopping.set()
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


class _JvmSigterm:
    """The JVM's SIGTERM handler (``sun.misc.SignalHandler``, implemented in Python through
    py4j's callback server): sets the job's stop event; a second SIGTERM (the stop is slow
    or stuck) puts the JVM's previous handler back and raises the signal again, so it does
    what it did before this handler (Spark's shutdown, exit 143)."""

    def __init__(self, stopping: threading.Event) -> None:
        self._stopping = stopping
        self.again: Callable[[], None] | None = None  # (set once the handler is in place)

    def handle(self, _signal: Any) -> None:
        if self._stopping.is_set() and self.again is not None:
            self.again()
        else:
            self._stopping.set()

    class Java:
        implements: ClassVar[list[str]] = ["sun.misc.SignalHandler"]


def stop_on_jvm_sigterm(spark: Any, stopping: threading.Event) -> Callable[[], None] | None:
    """Make a SIGTERM to the session's JVM set ``stopping`` instead of shutting the JVM down.

    Under spark-submit the JVM is the job's own process (the job's Python is its child), so
    that is where a deploy's or a scheduler's SIGTERM goes. The JVM's default handler runs
    Spark's shutdown at once: the SparkContext stops under the running query, which logs
    ``ERROR MicroBatchExecution ... terminated with error``, and the job exits 143 without
    its summary. With this handler the job's Python stops the query between micro-batches
    and ends normally, and the JVM with it. Returns a function that puts the JVM's previous
    handler back, or None where the JVM cannot be reached (Spark Connect) or refuses: its
    SIGTERM then stays Spark's.
    """
    from py4j.protocol import Py4JError

    try:
        from pyspark.java_gateway import ensure_callback_server_started

        gateway = spark.sparkContext._gateway
    except (ImportError, AttributeError, NotImplementedError):  # Spark Connect: no JVM here
        return None
    handler = _JvmSigterm(stopping)
    try:
        ensure_callback_server_started(gateway)
        signals = gateway.jvm.sun.misc.Signal
        term = signals("TERM")
        previous = signals.handle(term, handler)
    except Py4JError as e:
        print(f"filepulsar: a SIGTERM to the JVM stays Spark's shutdown: {e}", file=sys.stderr)
        return None

    def again() -> None:  # a second SIGTERM: the JVM's own handling of it, at once
        signals.handle(term, previous)
        getattr(signals, "raise")(term)  # (``Signal.raise``: a Python keyword)

    handler.again = again
    return lambda: signals.handle(term, previous)


#: Spark's loggers muted while a requested stop cancels a micro-batch: the aborted write and
#: task, the interrupted Python workers, the task results and blocks that arrive after the
#: stop, each from a logger of its own (the next run redoes the batch: nothing is lost).
_STOP_NOISE = "org.apache.spark"


def stop_between_batches(query: Any, wait_s: float = 60.0) -> None:
    """Stop a streaming query between micro-batches where it has any: ``query.stop()`` in
    the middle of one interrupts its tasks, and Spark logs the aborted write, the interrupted
    Python workers and the broadcasts they lost as errors, though the stop was asked for.

    Waits (up to ``wait_s``) for the batch running now to end. A query whose batches follow
    one another with no pause in between has no such moment: a processing-time trigger whose
    batches take longer than its interval, such as the empty batches Spark runs every
    trigger for a ``ProcessingTime`` stateful operator's timers (the delay operator's) on a
    loaded host. Such a query is stopped once the batch that ran at the request has ended
    (and a second more passed with no pause), in the middle of the next one, with Spark's
    cancellation errors muted (all of :data:`_STOP_NOISE`) until its tasks have ended, and one
    warning line saying so: the next run redoes that batch from the checkpoint, nothing is
    lost. (Before, the wait ran its whole 60 s and the stop then logged them: the demo's log
    check failed on CI.)"""
    deadline = time.monotonic() + wait_s
    running = _running_batch(query)
    while query.isActive and time.monotonic() < deadline:
        if not query.status.get("isTriggerActive", False):
            query.stop()
            return
        last = query.lastProgress
        if running is not None and last is not None and last["batchId"] >= running:
            # The batch that ran at the request ended, and another runs already: a pause
            # may yet come (one missed between two polls), for a second at most.
            running = None
            deadline = min(deadline, time.monotonic() + 1.0)
        time.sleep(0.05)
    if not query.isActive:
        return
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    jvm = None if sc is None else sc._jvm
    if sc is None or jvm is None:
        query.stop()
        return
    logs = jvm.org.apache.logging.log4j
    logging.getLogger("filepulsar.jobs").warning(
        "stopping query %s in the middle of a micro-batch (it runs batches back to back: "
        "no pause between them); the next run redoes it from the checkpoint, and Spark's "
        "errors about its cancelled tasks are not logged",
        query.name or query.id,
    )
    restore = _mute(logs, _STOP_NOISE)
    try:
        query.stop()
        _wait_for_no_task(sc, 15.0)
    finally:
        restore()


def _mute(logs: Any, parent: str) -> Callable[[], None]:
    """Turn off a log4j logger and every logger below it; returns what gives each its level
    back (and removes the configurations the muting created)."""
    context = logs.LogManager.getContext(False)
    config = context.getConfiguration()
    below = parent + "."
    had = {
        str(name): config.getLoggerConfig(name).getLevel()
        for name in config.getLoggers().keySet()
        if name == parent or str(name).startswith(below)
    }
    logs.core.config.Configurator.setAllLevels(parent, logs.Level.OFF)

    def restore() -> None:
        config = context.getConfiguration()
        for name in list(config.getLoggers().keySet()):
            name = str(name)
            if name in had:
                config.getLoggerConfig(name).setLevel(had[name])
            elif name == parent or name.startswith(below):
                config.removeLogger(name)
        context.updateLoggers()

    return restore


def _wait_for_no_task(sc: Any, limit_s: float) -> None:
    """Wait (up to ``limit_s``) until no stage is active and no executor runs a task, for
    half a second in a row: a cancelled stage ends at once, while its tasks go on being
    interrupted (and logging so) in the executors' threads for a while."""
    tracker = sc._jsc.sc().statusTracker()  # (the JVM's: PySpark's has no executors)
    deadline = time.monotonic() + limit_s
    quiet_since = None
    while time.monotonic() < deadline:
        busy = len(tracker.getActiveStageIds()) > 0 or any(
            info.numRunningTasks() for info in tracker.getExecutorInfos()
        )
        now = time.monotonic()
        if busy:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        elif now - quiet_since >= 0.5:
            return
        time.sleep(0.05)


def _running_batch(query: Any) -> int | None:
    """The id of the micro-batch a query runs now (the one after its last progress), None
    when it runs none or has reported none yet."""
    if not query.isActive or not query.status.get("isTriggerActive", False):
        return None
    last = query.lastProgress
    return None if last is None else int(last["batchId"]) + 1


def trigger_kwargs(trigger: str) -> dict[str, Any]:
    """``DataStreamWriter.trigger`` arguments for ``availableNow`` or an interval such as
    ``30s``, ``5m``, ``1h`` (a bare number: seconds)."""
    if trigger == "availableNow":
        return {"availableNow": True}
    unit = {"s": "seconds", "m": "minutes", "h": "hours"}.get(trigger[-1], "seconds")
    return {"processingTime": f"{int(trigger.rstrip('smh'))} {unit}"}
