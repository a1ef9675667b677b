"""The Spark source: ``spark.read`` / ``spark.readStream`` ``.format("filepulsar")``.

Offsets are readable JSON: for each partition's managed ledger
``"<topic>-partition-<i>": [ledgerId, entryId, n]`` meaning every message up to message ``n``
(counted from 1) of that entry is included; ``n = -1`` means the whole entry. Message-level
offsets let ``maxMessagesPerTrigger`` hold exactly even inside batch entries.

With a ``subscription`` the query is a consumer of that subscription (a durable cursor unless
``subscriptionMode=NonDurable``): a new query starts at the cursor, ``commit(end)`` moves it (so
retention can reclaim what every subscription consumed), and several queries on one
subscription share it per its type. Exclusive refuses a second query; Failover gives each
partition to one active query; Shared and Key_Shared queries claim entries in
``latestOffset`` and their offsets list the claimed entries (``{"claims": {...}}``), so a replay
reads exactly the same messages. Without a subscription nothing is stored (no orphan
subscriptions): the offsets in Spark's checkpoint are the only state.

What runs where: the reader objects live on the driver (offsets, planning, commits); ``read``
runs on executors with only the picklable :class:`FilePulsarPartition` it is given.
"""

from __future__ import annotations

import logging
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from filepulsar.connector.options import OptionReader, storage_options, storage_root
from filepulsar.connector.source_read import WHOLE, FilePulsarPartition, after, read_partition
from filepulsar.storage import (
    ConsumerBusy,
    InvalidConfiguration,
    ManagedLedger,
    MessageId,
    SubscriptionNotFound,
    TopicName,
    list_topics,
    open_blob_store,
)
from filepulsar.storage.blobstore import BlobStore
from filepulsar.storage.ledger import Position
from filepulsar.storage.manifest import ManifestState
from filepulsar.storage.subscription import (
    SubscriptionConsumer,
    SubscriptionStore,
    subscription_backlog,
)
from filepulsar.storage.topics import managed_ledgers

log = logging.getLogger(__name__)

SUB_TYPES = ("Exclusive", "Failover", "Shared", "Key_Shared")
Off = list[int]  # [ledger, entry, n]

# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, parsed once (on the driver) into typed values."""

    root: str
    storage_options: dict[str, Any]
    topics: tuple[str, ...]
    pattern: str | None
    subscription: str | None
    subscription_type: str
    durable: bool
    initial_position: str
    starting_offsets: Any
    ending_offsets: Any
    starting_time: int | None
    max_messages: int | None
    max_bytes: int | None
    fail_on_data_loss: bool
    property_filter: dict[str, tuple[str, ...]]
    consumer_name: str | None
    priority_level: int
    key_shared_mode: str
    sticky_ranges: tuple[tuple[int, int], ...] | None
    lease_ms: int
    max_entries_per_task: int
    pattern_refresh_ms: int
    busy_timeout_ms: int = 10000

    @classmethod
    def parse(cls, options: Any, *, streaming: bool | None) -> SourceOptions:
        """Parse and validate; every problem raises InvalidConfiguration naming the option and
        the allowed values. ``streaming=None`` (at ``load()``, before Spark says which kind of
        read it is) skips the checks that depend on it."""
        o = OptionReader(options, "filepulsar source")
        root = storage_root(o)
        so = storage_options(o)
        topic = o.string("topic")
        topics = o.string("topics")
        pattern = o.string("topicsPattern")
        given = [
            n for n, v in (("topic", topic), ("topics", topics), ("topicsPattern", pattern)) if v
        ]
        if len(given) != 1:
            raise InvalidConfiguration(
                "filepulsar source: set exactly one of 'topic', 'topics' (comma list) or "
                f"'topicsPattern' (regex); got {given or 'none'}"
            )
        names: tuple[str, ...] = ()
        if topic:
            names = (str(TopicName.parse(topic.strip())),)
        elif topics:
            parts = [t.strip() for t in topics.split(",") if t.strip()]
            if not parts:
                raise InvalidConfiguration("filepulsar source: option 'topics' is empty")
            names = tuple(str(TopicName.parse(t)) for t in parts)
        if pattern:
            _pattern_namespace(pattern)
        sub = o.string("subscription")
        sub_type = o.choice("subscriptionType", SUB_TYPES, "Exclusive")
        mode = o.choice("subscriptionMode", ("Durable", "NonDurable"), "Durable")
        initial = o.choice("subscriptionInitialPosition", ("Latest", "Earliest"), "Latest")
        if not sub and (o.has("subscriptionType") or o.has("subscriptionMode")):
            raise InvalidConfiguration(
                "filepulsar source: 'subscriptionType'/'subscriptionMode' need 'subscription'"
            )
        if streaming is False and sub:
            raise InvalidConfiguration(
                "filepulsar source: 'subscription' applies to streaming reads; batch reads "
                "use startingOffsets/endingOffsets"
            )
        starting = _parse_offsets_option(
            o, "startingOffsets", "earliest" if streaming is False else "latest"
        )
        ending = _parse_offsets_option(o, "endingOffsets", "latest")
        if streaming and o.has("endingOffsets") and o.string("endingOffsets"):
            raise InvalidConfiguration(
                "filepulsar source: 'endingOffsets' applies to batch reads only"
            )
        if ending == "earliest":
            raise InvalidConfiguration(
                "filepulsar source: endingOffsets 'earliest' is not allowed; use 'latest' or JSON"
            )
        starting_time = o.integer("startingTime", None, minimum=0)
        if starting_time is not None and isinstance(starting, dict):
            raise InvalidConfiguration(
                "filepulsar source: 'startingTime' and JSON 'startingOffsets' both say where "
                "to start; give one of them"
            )
        max_messages = o.integer("maxMessagesPerTrigger", None, minimum=1)
        max_bytes = o.integer("maxBytesPerTrigger", None, minimum=1)
        fail = o.boolean("failOnDataLoss", True)
        filt = _parse_property_filter(o)
        consumer_name = o.string("consumerName")
        priority = o.integer("priorityLevel", 0, minimum=0) or 0
        ks_mode = o.choice("keySharedMode", ("AUTO_SPLIT", "STICKY"), "AUTO_SPLIT")
        sticky = _parse_ranges(o.string("stickyHashRanges"))
        if ks_mode == "STICKY" and not sticky:
            raise InvalidConfiguration(
                "filepulsar source: keySharedMode STICKY needs 'stickyHashRanges', e.g. "
                "'0-32767,40000-40100'"
            )
        lease = o.integer("consumerLeaseMs", 30000, minimum=100) or 30000
        per_task = o.integer("maxEntriesPerPartition", 2000, minimum=1) or 2000
        busy_wait = o.integer("consumerBusyTimeoutMs", lease + 5000, minimum=0)
        refresh = o.integer("patternAutoDiscoveryPeriodMs", 5000, minimum=0)
        o.check_unknown()
        return cls(
            root=root,
            storage_options=so,
            topics=names,
            pattern=pattern,
            subscription=sub,
            subscription_type=sub_type,
            durable=mode == "Durable",
            initial_position=initial,
            starting_offsets=starting,
            ending_offsets=ending,
            starting_time=starting_time,
            max_messages=max_messages,
            max_bytes=max_bytes,
            fail_on_data_loss=fail,
            property_filter=filt,
            consumer_name=consumer_name,
            priority_level=priority,
            key_shared_mode=ks_mode,
            sticky_ranges=sticky,
            lease_ms=lease,
            max_entries_per_task=per_task,
            pattern_refresh_ms=refresh if refresh is not None else 5000,
            busy_timeout_ms=busy_wait if busy_wait is not None else 10000,
        )

    def store(self) -> BlobStore:
        return open_blob_store(self.root, storage_options=self.storage_options or None)


def _pattern_namespace(pattern: str) -> tuple[str, str, str, re.Pattern[str]]:
    """(domain, tenant, namespace, compiled regex on the full name) of a topics pattern."""
    full = pattern if "://" in pattern else f"persistent://public/default/{pattern}"
    m = re.match(r"^(persistent|non-persistent)://([^/]+)/([^/]+)/(.+)$", full)
    if not m:
        raise InvalidConfiguration(
            f"filepulsar source: topicsPattern {pattern!r} must look like "
            "'persistent://tenant/namespace/<regex>' (or a bare regex in public/default)"
        )
    try:
        rx = re.compile(full)
    except re.error as e:
        raise InvalidConfiguration(f"filepulsar source: topicsPattern is not a regex: {e}") from e
    return m.group(1), m.group(2), m.group(3), rx


def _parse_offsets_option(o: OptionReader, name: str, default: str) -> Any:
    v = o.string(name)
    if v is None:
        return default
    low = v.strip().lower()
    if low in ("earliest", "latest"):
        return low
    try:
        import json

        d = json.loads(v)
    except ValueError as e:
        raise InvalidConfiguration(
            f"filepulsar source: option '{name}' must be 'earliest', 'latest' or JSON like "
            '{"persistent://public/default/t-partition-0": "12:3:0"}'
        ) from e
    if not isinstance(d, dict):
        raise InvalidConfiguration(f"filepulsar source: option '{name}' JSON must be an object")
    out = {}
    for k, mid in d.items():
        try:
            t = str(TopicName.parse(k))
            out[t] = mid if mid in ("earliest", "latest") else str(MessageId.parse(str(mid)))
        except ValueError as e:
            raise InvalidConfiguration(f"filepulsar source: option '{name}': {e}") from e
    return out


def _parse_property_filter(o: OptionReader) -> dict[str, tuple[str, ...]]:
    v = o.json_value("propertyFilter")
    if v is None:
        return {}
    if not isinstance(v, dict) or not all(
        isinstance(k, str)
        and (isinstance(x, str) or (isinstance(x, list) and all(isinstance(i, str) for i in x)))
        for k, x in v.items()
    ):
        raise InvalidConfiguration(
            "filepulsar source: 'propertyFilter' must be a JSON object of property name to a "
            'value or a list of values, e.g. {"tag": ["a", "b"]}'
        )
    return {k: (x,) if isinstance(x, str) else tuple(x) for k, x in v.items()}


def _parse_ranges(v: str | None) -> tuple[tuple[int, int], ...] | None:
    if not v:
        return None
    out = []
    for part in v.split(","):
        m = re.match(r"^\s*(\d+)\s*-\s*(\d+)\s*$", part)
        if not m:
            raise InvalidConfiguration(
                f"filepulsar source: stickyHashRanges item {part!r} must be 'start-end'"
            )
        out.append((int(m.group(1)), int(m.group(2))))
    return tuple(out)


# --------------------------------------------------------------------------- topics


def resolve_partitions(store: BlobStore, opts: SourceOptions) -> list[TopicName]:
    """The managed ledgers (partitions, or non-partitioned topics) the options name, sorted.

    Raises
    ------
    TopicNotFound
        For a named topic that does not exist.
    """
    if opts.pattern:
        dom, tenant, ns, rx = _pattern_namespace(opts.pattern)
        infos = [i for i in list_topics(store, tenant, ns, dom) if rx.fullmatch(str(i.name))]
        out = [p for i in infos for p in i.managed_ledgers()]
    else:
        out = [p for name in opts.topics for p in managed_ledgers(store, name)]
    return sorted(out, key=str)


# --------------------------------------------------------------------------- offsets


def _end_of(m: ManifestState) -> Off:
    lid, eid = m.last_position()
    return [lid, eid, WHOLE]


def _before(pos: Position) -> Off:
    """The offset just before entry ``pos``: ``(ledger, entry - 1)``, a position that may not
    exist (entry -1, or a ledger retention deleted) but orders and advances correctly."""
    return [pos.ledger_id, pos.entry_id - 1, WHOLE]


def _offset_of_message_id(mid: MessageId) -> Off:
    """Offset so that reading starts AT message ``mid`` (inclusive), as Pulsar's seek."""
    pos = Position(mid.ledger_id, mid.entry_id)
    if mid.batch_index > 0:
        return [mid.ledger_id, mid.entry_id, mid.batch_index]
    return _before(pos)


# --------------------------------------------------------------------------- partitions


def _plan(
    store: BlobStore,
    opts: SourceOptions,
    start: dict[str, Off],
    end: dict[str, Off],
    manifests: dict[str, ManifestState] | None = None,
) -> list[FilePulsarPartition]:
    """Split every partition's range (start, end] into tasks of bounded entry count."""
    parts: list[FilePulsarPartition] = []
    filt = tuple(sorted(opts.property_filter.items()))
    for topic, e in sorted(end.items()):
        s = start.get(topic)  # None: new to the offsets, at its start (nothing to read yet)
        if s is None or s == e or (e[0], e[1]) < (s[0], s[1]):
            continue
        t = TopicName.parse(topic)
        ml = ManagedLedger(store, t)
        m = (manifests or {}).get(topic) or ml.state()
        first = after(m, ml, s)
        if first is None:
            continue
        # Count entries in (start, end] by ledger and cut into chunks.
        chunk_start: list[int] = list(s)
        count = 0
        for lg in m.ledgers:
            if not lg.entries or lg.ledger_id < first.ledger_id or lg.ledger_id > e[0]:
                continue
            lo = first.entry_id if lg.ledger_id == first.ledger_id else 0
            hi = min(lg.entries - 1, e[1]) if lg.ledger_id == e[0] else lg.entries - 1
            eid = lo
            while eid <= hi:
                take = min(hi - eid + 1, opts.max_entries_per_task - count)
                eid += take
                count += take
                if count >= opts.max_entries_per_task:
                    cut = [lg.ledger_id, eid - 1, WHOLE]
                    if (cut[0], cut[1]) >= (e[0], e[1]):
                        break
                    parts.append(_part(opts, topic, chunk_start, cut, filt))
                    chunk_start, count = cut, 0
        parts.append(_part(opts, topic, chunk_start, e, filt))
    return parts


def _part(opts: SourceOptions, topic: str, s: Off, e: Off, filt: Any) -> FilePulsarPartition:
    return FilePulsarPartition(
        root=opts.root,
        storage_options=opts.storage_options,
        topic=topic,
        start=(s[0], s[1], s[2]),
        end=(e[0], e[1], e[2]),
        fail_on_data_loss=opts.fail_on_data_loss,
        property_filter=filt,
    )


# --------------------------------------------------------------------------- batch reads


class FilePulsarBatchReader(DataSourceReader):
    """``spark.read.format("filepulsar")``: messages between startingOffsets and
    endingOffsets (default: everything now in the topics)."""

    def __init__(self, options: Any, schema: StructType) -> None:
        self.opts = SourceOptions.parse(options, streaming=False)

    def partitions(self) -> list[FilePulsarPartition]:
        store = self.opts.store()
        tps = resolve_partitions(store, self.opts)
        check_offset_keys(self.opts, tps)
        start, end = {}, {}
        manifests = {}
        for t in tps:
            ml = ManagedLedger(store, t)
            m = ml.state()
            manifests[str(t)] = m
            start[str(t)] = _resolve(
                self.opts.starting_offsets, str(t), m, ml, self.opts, is_start=True
            )
            end[str(t)] = _resolve(
                self.opts.ending_offsets, str(t), m, ml, self.opts, is_start=False
            )
        return _plan(store, self.opts, start, end, manifests)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FilePulsarPartition)
        return read_partition(partition)


def check_offset_keys(opts: SourceOptions, partitions: list[TopicName]) -> None:
    """JSON starting/ending offsets must name partitions the query reads.

    Raises
    ------
    InvalidConfiguration
        Naming the keys that match no partition (a typo, or a partitioned topic's base name).
    """
    known = {str(t) for t in partitions}
    rx = _pattern_namespace(opts.pattern)[3] if opts.pattern else None

    def reads(key: str) -> bool:  # with a pattern, also partitions of topics not made yet
        return key in known or (
            rx is not None and bool(rx.fullmatch(str(TopicName.parse(key).base)))
        )

    for name, spec in (
        ("startingOffsets", opts.starting_offsets),
        ("endingOffsets", opts.ending_offsets),
    ):
        unknown = sorted(k for k in spec if not reads(k)) if isinstance(spec, dict) else []
        if unknown:
            sample = ", ".join(sorted(known)[:4]) + (" ..." if len(known) > 4 else "")
            raise InvalidConfiguration(
                f"filepulsar source: {name} names {unknown}, which this query does not read; "
                f"keys are partition names such as {sample}"
            )


def _resolve(
    spec: Any,
    topic: str,
    m: ManifestState,
    ml: ManagedLedger,
    opts: SourceOptions,
    *,
    is_start: bool,
) -> Off:
    if is_start and opts.starting_time is not None and spec in ("latest", "earliest"):
        pos = ml.find_by_publish_time(m, opts.starting_time)
        return _end_of(m) if pos is None else _before(pos)
    if isinstance(spec, dict):
        spec = spec.get(topic, "earliest" if is_start else "latest")
    if spec == "earliest":
        return [-1, -1, WHOLE]
    if spec == "latest":
        return _end_of(m)
    # A starting message id is included; an ending one is not (reading stops before it, as
    # Kafka's endingOffsets): both are the offset just before the message.
    return _offset_of_message_id(MessageId.parse(spec))


# --------------------------------------------------------------------------- streaming

_RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"


def _raise_exit(signum: int, frame: Any) -> None:
    # Spark may signal again while stop() runs: one exit is enough, let the cleanup finish.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def _stop_on_sigterm() -> None:
    """Let ``stop()`` run when Spark stops the query.

    Spark ends a streaming query's Python planner process (where this reader lives) with
    SIGTERM, which by default kills Python on the spot: ``stop()`` never ran, the consumers
    stayed registered until their lease lapsed, and a restarted query on an Exclusive or
    Failover subscription waited that long. Turning SIGTERM into ``SystemExit`` lets the
    runner's own ``finally: reader.stop()`` release them. Only in that process's main thread.
    """
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if getattr(spec, "name", None) != _RUNNER:
        return
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not _raise_exit:
        signal.signal(signal.SIGTERM, _raise_exit)


class FilePulsarStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("filepulsar")`` (driver side; see the module docstring)."""

    def __init__(self, options: Any, schema: StructType) -> None:
        # Spark also builds this object on executors only to call read(): the constructor
        # validates options and touches nothing; consumers register on the first driver call.
        self.opts = SourceOptions.parse(options, streaming=True)
        self.store = self.opts.store()
        self._mls: dict[str, ManagedLedger] = {}
        self._consumers: dict[str, SubscriptionConsumer] = {}
        self._partitions: list[TopicName] = []
        self._listed_at = 0.0
        self._started = False
        self._target: dict[str, Off] | None = None
        self._claim_seq = 0
        self._committed: dict[str, Any] | None = None
        # reportLatestOffset (polled with every latestOffset): subscription states, and the
        # backlog per partition memoised on (last position, subscription version).
        self._subs: dict[str, SubscriptionStore] = {}
        self._backlog: dict[str, tuple[Any, int]] = {}

    # -- topics and consumers
    def _refresh_partitions(self, *, force: bool = False, subscribe: bool = True) -> None:
        if not subscribe:
            if not self._partitions or (
                self.opts.pattern
                and time.monotonic() - self._listed_at >= self.opts.pattern_refresh_ms / 1000
            ):
                self._partitions = resolve_partitions(self.store, self.opts)
                self._listed_at = time.monotonic()
            for t in self._partitions:
                if str(t) not in self._mls:
                    self._mls[str(t)] = ManagedLedger(self.store, t)
            return
        if not self._started:
            self._started = True
            force = True
        if not force and (
            not self.opts.pattern
            or time.monotonic() - self._listed_at < self.opts.pattern_refresh_ms / 1000
        ):
            return
        self._listed_at = time.monotonic()
        tps = resolve_partitions(self.store, self.opts)
        for t in tps:
            key = str(t)
            if key not in self._mls:
                self._mls[key] = ManagedLedger(self.store, t)
                if self.opts.subscription:
                    self._consumers[key] = self._subscribe(t)
        self._partitions = tps

    def _subscribe(self, t: TopicName) -> SubscriptionConsumer:
        _stop_on_sigterm()
        start = None
        if self.opts.starting_offsets not in ("latest", "earliest") or (
            self.opts.starting_time is not None
        ):
            ml = ManagedLedger(self.store, t)
            m = ml.state()
            off = _resolve(self.opts.starting_offsets, str(t), m, ml, self.opts, is_start=True)
            nxt = after(m, ml, off)
            start = nxt
        deadline = time.monotonic() + self.opts.busy_timeout_ms / 1000
        while True:
            try:
                return SubscriptionConsumer(
                    self.store,
                    t,
                    self.opts.subscription or "",
                    sub_type=self.opts.subscription_type,
                    consumer_name=self.opts.consumer_name,
                    initial_position=self.opts.initial_position,
                    priority_level=self.opts.priority_level,
                    key_shared_mode=self.opts.key_shared_mode,
                    sticky_ranges=list(self.opts.sticky_ranges)
                    if self.opts.sticky_ranges
                    else None,
                    durable=self.opts.durable,
                    lease_ms=self.opts.lease_ms,
                    start_position=start,
                )
            except ConsumerBusy:
                # A query that just ended releases its consumer when Spark closes its Python
                # planner (shortly after termination); a live rival fails after the timeout.
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)

    @property
    def _claims_mode(self) -> bool:
        return bool(self.opts.subscription) and self.opts.subscription_type in (
            "Shared",
            "Key_Shared",
        )

    def _active(self, key: str) -> bool:
        c = self._consumers.get(key)
        if c is None:
            return True
        c.renew_if_due()
        return c.is_active()

    # -- offsets
    def initialOffset(self) -> dict[str, Any]:
        self._refresh_partitions()
        check_offset_keys(self.opts, self._partitions)
        if self._claims_mode:
            return {"claims": {}, "seq": 0}
        out: dict[str, Any] = {}
        for t in self._partitions:
            key = str(t)
            ml = self._mls[key]
            m = ml.state()
            c = self._consumers.get(key)
            if c is not None:
                md = c.state().mark_delete
                out[key] = [md[0], md[1], WHOLE]
            else:
                out[key] = _resolve(
                    self.opts.starting_offsets, key, m, ml, self.opts, is_start=True
                )
        return out

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_messages is not None:
            return ReadMaxRows(self.opts.max_messages)
        if self.opts.max_bytes is not None:
            return ReadMaxBytes(self.opts.max_bytes)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest_positions()

    def _latest_positions(self) -> dict[str, Off]:
        self._refresh_partitions()
        return {str(t): _end_of(self._mls[str(t)].state()) for t in self._partitions}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        # Spark asks for the next batch only once the previous one is in its commit log, but
        # calls commit() for a batch only while planning the next: acknowledge ``start`` here
        # so the last batch of a run (AvailableNow) reaches the cursor too. Idempotent.
        self.commit(start)
        if self._claims_mode:
            return self._claim(start, limit)
        self._refresh_partitions()
        latest = self._target or self._latest_positions()
        end: dict[str, Any] = dict(start)
        for key, lat in latest.items():
            if key not in end:
                # A partition discovered by the pattern joins the offsets at its start (the
                # subscription's cursor, else its beginning) and is read from the next batch
                # on: every batch's range is then (start, end] of its own offsets, so a
                # replay reads the same and admission control counts it like the others.
                c = self._consumers.get(key)
                end[key] = [*c.state().mark_delete, WHOLE] if c else [-1, -1, WHOLE]
                continue
            if not self._active(key):
                continue
            if (lat[0], lat[1]) > (end[key][0], end[key][1]) or (
                (lat[0], lat[1]) == (end[key][0], end[key][1]) and end[key][2] != WHOLE
            ):
                end[key] = lat
        if isinstance(limit, ReadMaxRows):
            end = self._cap(start, end, rows=limit.max_rows)
        elif isinstance(limit, ReadMaxBytes):
            end = self._cap(start, end, nbytes=limit.max_bytes)
        if self._target is not None and end == start:
            self._release()  # AvailableNow is done: let the next query have the subscription
        return end

    def _release(self) -> None:
        """Unregister this query's consumers (they are registered again if needed)."""
        self.stop()
        self._committed = None
        self._mls = {}
        self._started = False

    def _cap(
        self,
        start: dict[str, Any],
        end: dict[str, Any],
        *,
        rows: int | None = None,
        nbytes: int | None = None,
    ) -> dict[str, Any]:
        """Cut ``end`` so at most ``rows`` messages (or about ``nbytes``) are admitted,
        partitions taken round-robin by entry (fair), never less than one message."""
        budget = rows if rows is not None else nbytes
        assert budget is not None
        out = dict(end)  # partitions new to the offsets stay at their start (see above)
        out.update(start)
        cursors: dict[str, tuple[ManifestState, Position | None, Off]] = {}
        for key in sorted(start):
            if end[key] == start[key]:
                continue
            ml = self._mls[key]
            m = ml.state()
            s = start[key]
            cursors[key] = (m, after(m, ml, s), s)
        used = 0
        active = [k for k, v in cursors.items() if v[1] is not None]
        while active and used < budget:
            for key in list(active):
                m, pos, s = cursors[key]
                ml = self._mls[key]
                e = end[key]
                if pos is None or (pos.ledger_id, pos.entry_id) > (e[0], e[1]):
                    active.remove(key)
                    continue
                entry = ml.read_entries(m, pos, end=pos)[0]
                n_msgs = entry.raw.header.num_messages
                skip = (
                    s[2] if (s[2] != WHOLE and (s[0], s[1]) == (pos.ledger_id, pos.entry_id)) else 0
                )
                avail = n_msgs - skip
                if (pos.ledger_id, pos.entry_id) == (e[0], e[1]) and e[2] != WHOLE:
                    avail = e[2] - skip
                cost = avail if rows is not None else entry.raw.size
                room = budget - used
                if rows is not None and cost > room:
                    out[key] = [pos.ledger_id, pos.entry_id, skip + room]
                    used = budget
                    break
                used += cost
                out[key] = [
                    pos.ledger_id,
                    pos.entry_id,
                    WHOLE if skip + avail >= n_msgs else skip + avail,
                ]
                nxt = ml.next_position(m, pos)
                cursors[key] = (m, nxt, s)
                if used >= budget:
                    break
        return out

    def _claim(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Shared/Key_Shared: claim entries for this query; the offset lists them."""
        self._refresh_partitions()
        max_entries = 1000
        if isinstance(limit, ReadMaxRows):
            max_entries = max(1, limit.max_rows)
        claims: dict[str, list[list[int]]] = {}
        total = 0
        for key, c in sorted(self._consumers.items()):
            if total >= max_entries:
                break
            ds = c.fetch(max_entries - total)
            if ds:
                claims[key] = [
                    [d.entry.ledger_id, d.entry.entry_id, d.redelivery_count] for d in ds
                ]
                total += len(ds)
        if not claims:
            if self._target is not None:
                self._release()
            return start
        self._claim_seq = max(self._claim_seq, int(start.get("seq", 0))) + 1
        return {"claims": claims, "seq": self._claim_seq}

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """Latest positions plus ``backlogMessages`` (messages behind the subscription's
        cursor), shown in the query's progress. Never registers consumers."""
        self._refresh_partitions(subscribe=False)
        out: dict[str, Any] = {}
        backlog = 0
        for t in self._partitions:
            key = str(t)
            ml = self._mls[key]
            m = ml.state()
            out[key] = _end_of(m)
            if self.opts.subscription and self.opts.durable:
                backlog += self._backlog_of(key, ml, m)
        if self.opts.subscription:
            out["backlogMessages"] = backlog
        return out

    def _backlog_of(self, key: str, ml: ManagedLedger, m: ManifestState) -> int:
        st = self._subs.get(key)
        if st is None:
            st = SubscriptionStore(self.store, ml.topic, self.opts.subscription or "")
            if not st.exists():
                return 0
            self._subs[key] = st
        try:
            s = st.latest()
        except SubscriptionNotFound:  # unsubscribed or expired meanwhile
            del self._subs[key]
            return 0
        memo = (m.last_position(), s.version)
        hit = self._backlog.get(key)
        if hit is None or hit[0] != memo:
            hit = self._backlog[key] = (memo, subscription_backlog(ml, m, s))
        return hit[1]

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[FilePulsarPartition]:
        if "claims" in end:
            if end.get("seq") == start.get("seq"):
                return []
            filt = tuple(sorted(self.opts.property_filter.items()))
            return [
                FilePulsarPartition(
                    root=self.opts.root,
                    storage_options=self.opts.storage_options,
                    topic=key,
                    start=(-1, -1, WHOLE),
                    end=(-1, -1, WHOLE),
                    positions=tuple((p[0], p[1], p[2]) for p in ps),
                    fail_on_data_loss=self.opts.fail_on_data_loss,
                    property_filter=filt,
                )
                for key, ps in sorted(end["claims"].items())
            ]
        self._refresh_partitions()
        return _plan(self.store, self.opts, start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FilePulsarPartition)
        return read_partition(partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Move the durable cursors to ``end`` (acknowledging what this batch read)."""
        if end == self._committed:
            return  # latestOffset calls this with every poll; an idle query writes nothing
        self._refresh_partitions()
        if not self._consumers:
            return
        if "claims" in end:
            for key, ps in end["claims"].items():
                c = self._consumers.get(key)
                if c is not None:
                    c.acknowledge([(Position(p[0], p[1]), -1, 1) for p in ps])
            self._committed = end
            return
        for key, off in end.items():
            c = self._consumers.get(key)
            if c is None or not isinstance(off, list):
                continue
            if off[2] == WHOLE:
                if off[0] >= 0:
                    c.acknowledge_cumulative(Position(off[0], off[1]))
            else:
                ml = self._mls[key]
                m = ml.state()
                before = _before(Position(off[0], off[1]))
                if before[0] >= 0:
                    c.acknowledge_cumulative(Position(before[0], before[1]))
                size = ml.read_entries(m, Position(off[0], off[1]), end=Position(off[0], off[1]))[
                    0
                ].raw.header.num_messages
                c.acknowledge([(Position(off[0], off[1]), i, size) for i in range(off[2])])
        self._committed = end

    def stop(self) -> None:
        for c in self._consumers.values():
            try:
                c.close()
            except Exception as e:  # never fail a query's shutdown on a lease cleanup
                log.warning("closing consumer of %s failed: %s", c.topic, e)
        self._consumers = {}
