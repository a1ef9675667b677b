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
``latestOffset`` and their offsets list the claimed entries (``{"claims": {...}}``), so a replay
reads exactly the same messages. Without a subscription nothing is stored (no orphan
subscriptions): the offsets in Spark's checkpoint are the only state.

Typed values (``valueFormat`` struct or flatten): the columns come from the topics' latest
schema version when the DataFrame or query is loaded (:mod:`connector.spark_schema`); the
readers pass that version to the tasks in :attr:`FilePulsarPartition.value`, and each task
decodes every message with the version that wrote it, resolved to that one.
``readCompacted``: each task reads the partition's compacted view for the part of its range
before the view's horizon, then the topic (offsets stay the topic's message ids).

What runs where: the reader objects live on the driver (offsets, planning, commits); ``read``
runs on executors with only the picklable :class:`FilePulsarPartition` it is given. Per
trigger the driver reads each partition's manifest once and counts messages from fragment
metadata (:class:`_Meter`); it reads entries only to cut ``maxMessagesPerTrigger`` exactly
inside a fragment of several batch entries. The backlog left after each batch is reported in
the progress's ``latestOffset`` (:meth:`FilePulsarStreamReader.reportLatestOffset`,
:func:`backlog_of`), never in the checkpointed offsets.
"""

from __future__ import annotations

import logging
import re
import signal
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, replace
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
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from filepulsar.connector.options import OptionReader, storage_options, storage_root
from filepulsar.connector.schema import Columns, narrow_schema, source_columns, typed_schemas
from filepulsar.connector.source_read import (
    WHOLE,
    FilePulsarPartition,
    after,
    check_trimmed,
    data_loss,
    read_partition,
    recreated_message,
)
from filepulsar.connector.spark_schema import (
    ON_CORRUPT,
    VALUE_FORMATS,
    ValueSpec,
    plan_value_spec,
)
from filepulsar.dispatch.modes import ConsumerType, InitialPosition, KeySharedMode
from filepulsar.storage import (
    ConsumerBusy,
    InvalidConfiguration,
    ManagedLedger,
    MessageId,
    SubscriptionNotFound,
    TopicName,
    TopicNotFound,
    effective_policies,
    ensure_topic,
    jsontext,
    list_topics,
    open_blob_store,
)
from filepulsar.storage.blobstore import BlobStore
from filepulsar.storage.compaction import load_view
from filepulsar.storage.ledger import Position
from filepulsar.storage.manifest import Fragment, LedgerInfo, ManifestState, ManifestStore
from filepulsar.storage.subscription import SubscriptionConsumer
from filepulsar.storage.subscriptions import SubscriptionStore, subscription_backlog
from filepulsar.storage.topics import managed_ledgers

log = logging.getLogger(__name__)

Off = list[Any]  # [ledger, entry, n] or [ledger, entry, n, incarnation]

# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, parsed once (on the driver) into typed values."""

    root: str
    storage_options: dict[str, Any]
    topics: tuple[str, ...]
    pattern: str | None
    subscription: str | None
    subscription_type: ConsumerType
    durable: bool
    initial_position: InitialPosition
    starting_offsets: Any
    ending_offsets: Any
    starting_time: int | dict[str, int] | None
    max_messages: int | None
    max_bytes: int | None
    fail_on_data_loss: bool
    property_filter: dict[str, tuple[str, ...]]
    consumer_name: str | None
    priority_level: int
    key_shared_mode: KeySharedMode
    sticky_ranges: tuple[tuple[int, int], ...] | None
    lease_ms: int
    max_entries_per_task: int
    pattern_refresh_ms: int
    busy_timeout_ms: int = 10000
    wait_for_topics: bool = False
    starting_given: bool = False
    min_messages: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    ending_time: int | None = None
    columns: tuple[str, ...] | None = None
    emit: Columns = ()  # what the reader emits: set by the readers from Spark's schema
    value_format: str = "binary"
    on_corrupt: str = "fail"
    read_compacted: bool = False
    value: ValueSpec | None = None  # a typed read's reader schema: set by the readers

    @classmethod
    def parse(cls, options: Any, *, streaming: bool | None) -> SourceOptions:
        """Parse and validate; every problem raises InvalidConfiguration naming the option and
        the allowed values. ``streaming=None`` (at ``load()``, before Spark says which kind of
        read it is) skips the checks that depend on it.

        Where a query starts, one rule: a checkpoint wins (its topics must be the query's);
        else, with a ``subscription``, an existing subscription's cursor; else the position
        ``startingOffsets``/``startingTime`` give (with a subscription: where it is created;
        ``subscriptionInitialPosition`` is the same choice, so both together are refused);
        defaults ``latest`` (streams) and ``earliest`` (batch). JSON offsets name every
        partition read; ``-2``/``-1`` mean earliest/latest per partition.
        """
        o = OptionReader(options, "filepulsar source")
        root = storage_root(o)
        so = storage_options(o)
        topic = o.string("topic")
        topics = o.string(_spelling(o, "topics", "subscribe"))
        pattern = o.string(_spelling(o, "topicsPattern", "subscribePattern"))
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
        sub_type = o.mode("subscriptionType", ConsumerType, ConsumerType.Exclusive)
        mode = o.choice("subscriptionMode", ("Durable", "NonDurable"), "Durable")
        initial_given = bool(o.string("subscriptionInitialPosition"))
        initial = o.mode("subscriptionInitialPosition", InitialPosition, InitialPosition.Latest)
        if not sub and (o.has("subscriptionType") or o.has("subscriptionMode") or initial_given):
            raise InvalidConfiguration(
                "filepulsar source: 'subscriptionType'/'subscriptionMode'/"
                "'subscriptionInitialPosition' need 'subscription'"
            )
        if streaming is False and sub:
            raise InvalidConfiguration(
                "filepulsar source: 'subscription' applies to streaming reads; batch reads "
                "use startingOffsets/endingOffsets"
            )
        starting_given = bool(o.string("startingOffsets"))
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
        starting_time = _parse_time(o, _spelling(o, "startingTime", "startingTimestamp"))
        ending_time = _parse_time(o, _spelling(o, "endingTime", "endingTimestamp"))
        if isinstance(ending_time, dict):
            raise InvalidConfiguration(
                "filepulsar source: 'endingTime' is one publish time in ms for every partition"
            )
        if ending_time is not None and streaming:
            raise InvalidConfiguration(
                "filepulsar source: 'endingTime' applies to batch reads only"
            )
        if ending_time is not None and o.string("endingOffsets"):
            raise InvalidConfiguration(
                "filepulsar source: 'endingTime' and 'endingOffsets' both say where to stop; "
                "give one of them"
            )
        if starting_time is not None and starting_given:
            raise InvalidConfiguration(
                "filepulsar source: 'startingTime' and 'startingOffsets' both say where "
                "to start; give one of them"
            )
        # One precedence rule (README, "Where a query starts"): a checkpoint wins; else an
        # existing subscription's cursor; else where startingOffsets/startingTime say (for a
        # subscription: the position it is created at). subscriptionInitialPosition is the
        # Pulsar spelling of the same choice, so giving both is ambiguous.
        if sub and initial_given and (starting_given or starting_time is not None):
            raise InvalidConfiguration(
                "filepulsar source: with a subscription, 'subscriptionInitialPosition' and "
                "'startingOffsets'/'startingTime' both say where a new subscription starts; "
                "give one of them"
            )
        if sub and starting in ("earliest", "latest") and starting_given:
            initial = InitialPosition.parse(starting)
        max_messages = o.integer(
            _spelling(o, "maxMessagesPerTrigger", "maxOffsetsPerTrigger"), None, minimum=1
        )
        max_bytes = o.integer("maxBytesPerTrigger", None, minimum=1)
        min_messages = o.integer(
            _spelling(o, "minMessagesPerTrigger", "minOffsetsPerTrigger"), None, minimum=1
        )
        delay_given = bool(o.string("maxTriggerDelay"))
        delay = _duration_ms(o, "maxTriggerDelay", 15 * 60 * 1000)
        if delay_given and min_messages is None:
            raise InvalidConfiguration(
                "filepulsar source: 'maxTriggerDelay' applies with 'minMessagesPerTrigger'"
            )
        if min_messages is not None and streaming is False:
            raise InvalidConfiguration(
                "filepulsar source: 'minMessagesPerTrigger' applies to streaming reads"
            )
        if min_messages is not None and max_messages is not None and min_messages > max_messages:
            raise InvalidConfiguration(
                f"filepulsar source: minMessagesPerTrigger ({min_messages}) is more than "
                f"maxMessagesPerTrigger ({max_messages})"
            )
        value_format = o.choice("valueFormat", VALUE_FORMATS, "binary")
        on_corrupt = o.choice("onCorruptValue", ON_CORRUPT, "fail")
        if o.string("onCorruptValue") and value_format == "binary":
            raise InvalidConfiguration(
                "filepulsar source: 'onCorruptValue' applies with valueFormat struct or flatten"
            )
        read_compacted = o.boolean("readCompacted", False)
        if read_compacted and sub and sub_type in (ConsumerType.Shared, ConsumerType.KeyShared):
            raise InvalidConfiguration(
                "filepulsar source: 'readCompacted' needs an Exclusive or Failover subscription "
                f"(as Pulsar's), not {sub_type.wire}"
            )
        cols_opt = o.string("columns")
        columns = None
        if cols_opt is not None:
            columns = tuple(c.strip() for c in cols_opt.split(",") if c.strip())
            try:
                if value_format == "binary":  # typed reads: checked with the value's columns
                    source_columns(None, columns)
            except ValueError as e:
                raise InvalidConfiguration(f"filepulsar source: {e}") from e
        fail = o.boolean("failOnDataLoss", True)
        filt = _parse_property_filter(o)
        consumer_name = o.string("consumerName")
        priority = o.integer("priorityLevel", 0, minimum=0) or 0
        ks_mode = o.mode("keySharedMode", KeySharedMode, KeySharedMode.AutoSplit)
        sticky = _parse_ranges(o.string("stickyHashRanges"))
        if ks_mode is KeySharedMode.Sticky and not sticky:
            raise InvalidConfiguration(
                "filepulsar source: keySharedMode STICKY needs 'stickyHashRanges', e.g. "
                "'0-32767,40000-40100'"
            )
        lease = o.integer("consumerLeaseMs", 30000, minimum=100) or 30000
        per_task = o.integer("maxEntriesPerPartition", 2000, minimum=1) or 2000
        busy_wait = o.integer("consumerBusyTimeoutMs", lease + 5000, minimum=0)
        refresh = o.integer("patternAutoDiscoveryPeriodMs", 5000, minimum=0)
        wait = o.boolean("waitingForNonExistedTopic", False)
        if wait and streaming is False:
            raise InvalidConfiguration(
                "filepulsar source: 'waitingForNonExistedTopic' applies to streaming reads"
            )
        if wait and pattern:
            raise InvalidConfiguration(
                "filepulsar source: 'waitingForNonExistedTopic' applies to 'topic'/'topics'; "
                "a topicsPattern query picks up topics as they are created"
            )
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
            wait_for_topics=wait,
            starting_given=starting_given or starting_time is not None,
            min_messages=min_messages,
            max_trigger_delay_ms=delay,
            ending_time=ending_time,
            columns=columns,
            value_format=value_format,
            on_corrupt=on_corrupt,
            read_compacted=read_compacted,
        )

    def store(self) -> BlobStore:
        return open_blob_store(self.root, storage_options=self.storage_options or None)

    def for_schema(self, schema: StructType | None) -> SourceOptions:
        """These options with :attr:`emit` set from the schema Spark hands the reader (the
        user's ``.schema(...)``, or the declared one).

        Raises
        ------
        InvalidConfiguration
            If the schema names a column the source does not have, or gives it another type.
        """
        if self.value_format == "binary":
            try:
                emit = source_columns(schema, self.columns)
            except ValueError as e:
                raise InvalidConfiguration(f"filepulsar source: {e}") from e
            return replace(self, emit=emit)

        def fits(spec: ValueSpec) -> bool:
            try:
                source_columns(schema, self.columns, self.typed_schema(spec))
            except (ValueError, InvalidConfiguration):
                return False
            return True

        spec = self.value_spec(expect=fits if schema is not None else None)
        try:
            emit = source_columns(schema, self.columns, self.typed_schema(spec))
        except ValueError as e:
            raise InvalidConfiguration(f"filepulsar source: {e}") from e
        return replace(self, emit=emit, value=spec)

    def value_spec(self, expect: Any = None) -> ValueSpec:
        """The reader's schema of a typed read: the latest version of the topics' schema
        (which they must share), see :func:`connector.spark_schema.plan_value_spec`."""
        store = self.store()
        if self.pattern:
            dom, tenant, ns, rx = _pattern_namespace(self.pattern)
            bases = [
                i.name for i in list_topics(store, tenant, ns, dom) if rx.fullmatch(str(i.name))
            ]
        else:
            bases = [TopicName.parse(t).base for t in self.topics]
        return plan_value_spec(store, bases, self.value_format, self.on_corrupt, expect)

    def typed_schema(self, spec: ValueSpec) -> StructType:
        """Every column of a typed read (:func:`connector.schema.typed_schemas`)."""
        try:
            return typed_schemas(spec.columns(), spec.mode == "flatten")[0]
        except ValueError as e:
            raise InvalidConfiguration(f"filepulsar source: {e}") from e

    def declared_schema(self) -> StructType:
        """The schema a ``load()`` without ``.schema(...)`` declares: the ``columns`` option's
        columns, or every column (a typed read: from the topics' latest schema version)."""
        if self.value_format == "binary":
            return narrow_schema(self.columns)
        full = self.typed_schema(self.value_spec())
        try:
            source_columns(None, self.columns, full)
        except ValueError as e:
            raise InvalidConfiguration(f"filepulsar source: {e}") from e
        return narrow_schema(self.columns, full)


def _spelling(o: OptionReader, name: str, *aliases: str) -> str:
    """The spelling of an option the user gave: ``name`` or one of its ``aliases`` (Kafka's
    names for the same thing); ``name`` when none is given.

    Raises
    ------
    InvalidConfiguration
        If two spellings of the option are given.
    """
    given = [n for n in (name, *aliases) if o.has(n) and o.string(n) is not None]
    if len(given) > 1:
        raise InvalidConfiguration(
            f"filepulsar source: {' and '.join(repr(g) for g in given)} are one option "
            f"({name}); give it once"
        )
    return given[0] if given else name


_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_ms(o: OptionReader, name: str, default: int) -> int:
    """A duration: milliseconds, or a number with a unit (``500ms``, ``30s``, ``15m``, ``1h``)
    as Spark's Kafka source takes ``maxTriggerDelay``."""
    v = o.string(name)
    if v is None:
        return default
    m = re.match(r"^\s*(\d+)\s*(ms|s|m|min|h|d)?\s*$", v.lower())
    if not m:
        raise InvalidConfiguration(
            f"filepulsar source: option '{name}' must be a duration such as 500ms, 30s, 15m "
            f"or 1h (a bare number is milliseconds), got {v!r}"
        )
    return int(m.group(1)) * _UNITS_MS[m.group(2) or "ms"]


def _parse_time(o: OptionReader, name: str) -> int | dict[str, int] | None:
    """A publish time in ms since the epoch, or (startingTime) JSON of partition -> time."""
    v = o.string(name)
    if v is None:
        return None
    if v.strip().startswith("{"):
        d = o.json_value(name)
        if not isinstance(d, dict) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in d.values()
        ):
            raise InvalidConfiguration(
                f"filepulsar source: option '{name}' JSON must map partitions to publish "
                'times in ms, e.g. {"persistent://public/default/t-partition-0": 1700000000000}'
            )
        out = {}
        for k, t in d.items():
            try:
                out[str(TopicName.parse(k))] = t
            except ValueError as e:
                raise InvalidConfiguration(f"filepulsar source: option '{name}': {k}: {e}") from e
        return out
    t = o.integer(name, None, minimum=0)
    return t


def _time_for(spec: int | dict[str, int] | None, topic: str) -> int | None:
    """The time ``spec`` gives partition ``topic`` (None: no time given)."""
    if isinstance(spec, dict):
        return spec.get(topic)
    return spec


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


#: Kafka's per-partition sentinels in JSON offsets.
_SENTINELS = {"-2": "earliest", "-1": "latest", "earliest": "earliest", "latest": "latest"}


def _parse_offsets_option(o: OptionReader, name: str, default: str) -> Any:
    """'earliest', 'latest', or {partition: message id | "earliest" | "latest" | -2 | -1}."""
    v = o.string(name)
    if v is None:
        return default
    low = v.strip().lower()
    if low in ("earliest", "latest"):
        return low
    try:
        d = jsontext.loads(v)
    except ValueError as e:
        raise InvalidConfiguration(
            f"filepulsar source: option '{name}' must be 'earliest', 'latest' or JSON like "
            '{"persistent://public/default/t-partition-0": "12:3:0"} (-2/-1 for '
            "earliest/latest per partition)"
        ) from e
    if not isinstance(d, dict):
        raise InvalidConfiguration(f"filepulsar source: option '{name}' JSON must be an object")
    out = {}
    for k, mid in d.items():
        try:
            t = str(TopicName.parse(k))
            word = _SENTINELS.get(str(mid).strip().lower()) if not isinstance(mid, bool) else None
            out[t] = word if word is not None else str(MessageId.parse(str(mid)))
        except ValueError as e:
            raise InvalidConfiguration(
                f"filepulsar source: option '{name}': {k}: {e} (give a message id "
                "'ledger:entry[:partition[:batch]]', -2/'earliest' or -1/'latest')"
            ) from e
        if name == "endingOffsets" and out[t] == "earliest":
            raise InvalidConfiguration(
                f"filepulsar source: endingOffsets for {t} is earliest (-2), which is not "
                "allowed; use -1/'latest' or a message id"
            )
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


def _missing_topic(store: BlobStore, name: str) -> TopicNotFound:
    return TopicNotFound(
        f"filepulsar source: topic {name} does not exist under root {store.root}; create it "
        "(filepulsar topics create), allow auto-creation in the namespace's policies "
        "(allow_auto_topic_creation) for a stream, or set waitingForNonExistedTopic=true on a "
        "stream to start before it exists"
    )


def resolve_partitions(
    store: BlobStore, opts: SourceOptions, *, create: bool = False, wait: bool = False
) -> list[TopicName]:
    """The managed ledgers (partitions, or non-partitioned topics) the options name, sorted.

    A named topic that does not exist is created when ``create`` and the namespace's
    auto-creation policy allow it (as a Pulsar consumer subscribing does), left out when
    ``wait`` (it joins when it appears), and an error otherwise.

    Raises
    ------
    TopicNotFound
        For a named topic that does not exist (naming the root).
    """
    if opts.pattern:
        dom, tenant, ns, rx = _pattern_namespace(opts.pattern)
        infos = [i for i in list_topics(store, tenant, ns, dom) if rx.fullmatch(str(i.name))]
        out = [p for i in infos for p in i.managed_ledgers()]
        return sorted(out, key=str)
    out = []
    for name in opts.topics:
        try:
            out += managed_ledgers(store, name)
            continue
        except TopicNotFound:
            pass
        if create and effective_policies(store, TopicName.parse(name)).allow_auto_topic_creation:
            ensure_topic(store, name)
            log.info("filepulsar source: created topic %s (namespace auto-creation)", name)
            out += managed_ledgers(store, name)
        elif not wait:
            raise _missing_topic(store, name)
    return sorted(out, key=str)


# --------------------------------------------------------------------------- offsets


def _off(ledger: int, entry: int, n: int, incarnation: str) -> Off:
    """An offset; the topic's incarnation rides along when it has one."""
    return [ledger, entry, n, incarnation] if incarnation else [ledger, entry, n]


def _inc(off: Off) -> str:
    """The incarnation an offset was taken in ("" unknown: offsets written before them)."""
    return str(off[3]) if len(off) > 3 else ""


def _end_of(m: ManifestState) -> Off:
    lid, eid = m.last_position()
    return _off(lid, eid, WHOLE, m.incarnation)


def _before(pos: Position) -> list[int]:
    """The offset just before entry ``pos``: ``(ledger, entry - 1)``, a position that may not
    exist (entry -1, or a ledger retention deleted) but orders and advances correctly."""
    return [pos.ledger_id, pos.entry_id - 1, WHOLE]


def _offset_of_message_id(mid: MessageId) -> list[int]:
    """Offset so that reading starts AT message ``mid`` (inclusive), as Pulsar's seek."""
    pos = Position(mid.ledger_id, mid.entry_id)
    if mid.batch_index > 0:
        return [mid.ledger_id, mid.entry_id, mid.batch_index]
    return _before(pos)


def _recreated(s: Off, e: Off) -> bool:
    """``s`` and ``e`` were taken in different incarnations of the topic."""
    return bool(_inc(s)) and bool(_inc(e)) and _inc(s) != _inc(e)


# --------------------------------------------------------------------------- partitions


def _plan(
    store: BlobStore,
    opts: SourceOptions,
    start: dict[str, Off],
    end: dict[str, Off],
    manifests: dict[str, ManifestState] | None = None,
    *,
    end_latest: frozenset[str] = frozenset(),
    loss_ok: frozenset[str] = frozenset(),
    mls: dict[str, ManagedLedger] | None = None,
) -> list[FilePulsarPartition]:
    """Split every partition's range (start, end] into tasks of bounded entry count.

    A range whose end is "latest" (batch reads; topics in ``end_latest``) always gets a task
    even if empty now: it resolves its end when it runs. Retention having deleted part of the
    range is data loss unless the range began at "earliest" or a time (``loss_ok``).
    """
    parts: list[FilePulsarPartition] = []
    filt = tuple(sorted(opts.property_filter.items()))
    for topic, e in sorted(end.items()):
        s = start.get(topic)  # None: new to the offsets, at its start (nothing to read yet)
        if s is None:
            continue
        if _recreated(s, e):
            s = _off(-1, -1, WHOLE, _inc(e))  # a topic created again is read from its start
        tail = topic in end_latest
        if not tail and (s == e or (e[0], e[1]) < (s[0], s[1])):
            continue
        t = TopicName.parse(topic)
        ml = (mls or {}).get(topic) or ManagedLedger(store, t)
        m = (manifests or {}).get(topic)
        if m is None:
            try:
                m = ml.state()
            except TopicNotFound:
                data_loss(
                    f"{t} was deleted before this query read it; its messages after "
                    f"{s[0]}:{s[1]} were lost",
                    opts.fail_on_data_loss,
                )
                continue
        if _inc(e) and m.incarnation and m.incarnation != _inc(e):
            data_loss(recreated_message(topic, _inc(e), m.incarnation), opts.fail_on_data_loss)
            continue
        ok = topic in loss_ok
        horizon = None
        if opts.read_compacted:
            view = load_view(store, t, m.incarnation)
            if view is not None and (s[0], s[1]) < view.horizon:
                horizon = view.horizon  # the view stands for what retention deleted before it
        if not ok:
            check_trimmed(
                topic, m, s if horizon is None else [*horizon, WHOLE], opts.fail_on_data_loss
            )
        first = after(m, ml, s)
        if first is None or (first.ledger_id, first.entry_id) > (e[0], e[1]):
            if tail or horizon is not None:
                parts.append(_part(opts, topic, s, e, filt, m, end_latest=tail, loss_ok=ok))
            continue
        # Count entries in (start, end] by ledger and cut into chunks.
        chunk_start: Off = list(s)
        count = 0
        for lg in m.ledgers_from(first.ledger_id):
            if not lg.entries or lg.ledger_id > e[0]:
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
                    parts.append(_part(opts, topic, chunk_start, cut, filt, m, loss_ok=ok))
                    chunk_start, count = cut, 0
        parts.append(_part(opts, topic, chunk_start, e, filt, m, end_latest=tail, loss_ok=ok))
    return parts


def _part(
    opts: SourceOptions,
    topic: str,
    s: Off,
    e: Off,
    filt: Any,
    m: ManifestState,
    *,
    end_latest: bool = False,
    loss_ok: bool = False,
) -> FilePulsarPartition:
    return FilePulsarPartition(
        root=opts.root,
        storage_options=opts.storage_options,
        topic=topic,
        start=(s[0], s[1], s[2]),
        end=(e[0], e[1], e[2]),
        fail_on_data_loss=opts.fail_on_data_loss,
        property_filter=filt,
        incarnation=m.incarnation,
        end_latest=end_latest,
        loss_ok=loss_ok,
        columns=opts.emit,
        value=opts.value,
        read_compacted=opts.read_compacted,
    )


# --------------------------------------------------------------------------- counting

#: Per-entry message counts kept by a driver's meter (fragments of batch entries it read).
_METER_FRAGMENTS = 256


class _Meter:
    """Counts messages between offsets on the driver from the manifests' metadata: a whole
    ledger's and a whole fragment's message counts are in the manifest (closed ledgers: in
    their index, read once and cached), and a fragment whose entries each hold one message
    (``messages == count``) or that is one entry counts exactly at any entry.

    Only a cut or a start inside a fragment of several *batch* entries needs per-entry
    counts; with ``exact`` that fragment's entries are read once and their counts kept
    (a rate-limited stream then continues from a fragment it already knows), otherwise
    the fragment's messages are spread evenly over its entries (an estimate, used for the
    backlog report only).
    """

    def __init__(self) -> None:
        self._counts: OrderedDict[tuple[str, int, int, int], list[int]] = OrderedDict()
        self.entry_reads = 0  # fragments read for their per-entry counts (tests, logs)

    def _per_entry(
        self, ml: ManagedLedger, m: ManifestState, ledger_id: int, f: Fragment, exact: bool
    ) -> list[int] | None:
        if f.messages == f.count:
            return None  # one message each: callers count entries
        key = (f.blob, f.offset, f.length, ledger_id)
        hit = self._counts.get(key)
        if hit is not None:
            self._counts.move_to_end(key)
            return hit
        if not exact:
            return None
        last = f.first_entry + f.count - 1
        got = ml.read_entries(m, Position(ledger_id, f.first_entry), end=Position(ledger_id, last))
        self.entry_reads += 1
        counts = [e.raw.header.num_messages for e in got]
        self._counts[key] = counts
        while len(self._counts) > _METER_FRAGMENTS:
            self._counts.popitem(last=False)
        return counts

    def span(
        self,
        ml: ManagedLedger,
        m: ManifestState,
        ledger_id: int,
        f: Fragment,
        a: int,
        b: int,
        exact: bool,
    ) -> int:
        """Messages in entries ``a..b`` (ledger entry ids) of fragment ``f``."""
        if a == f.first_entry and b == f.first_entry + f.count - 1:
            return f.messages
        if f.messages == f.count:
            return b - a + 1
        counts = self._per_entry(ml, m, ledger_id, f, exact)
        if counts is None:
            return round(f.messages * (b - a + 1) / f.count)
        return sum(counts[a - f.first_entry : b - f.first_entry + 1])

    def spans(
        self, ml: ManagedLedger, m: ManifestState, s: Off, e: Off
    ) -> Iterator[tuple[LedgerInfo, Fragment | None, int, int]]:
        """The entries of (s, e] as (ledger, fragment, first, last): a whole ledger comes as
        one span with fragment None (its totals are in the manifest)."""
        first = after(m, ml, s)
        if first is None:
            return
        for lg in m.ledgers_from(first.ledger_id):
            if not lg.entries or lg.ledger_id > e[0]:
                continue
            lo = first.entry_id if lg.ledger_id == first.ledger_id else 0
            hi = min(lg.entries - 1, e[1]) if lg.ledger_id == e[0] else lg.entries - 1
            if lo > hi:
                continue
            if lo == 0 and hi == lg.entries - 1:
                yield lg, None, lo, hi
                continue
            for f in ml.fragments(lg):
                fa, fb = max(lo, f.first_entry), min(hi, f.first_entry + f.count - 1)
                if fa <= fb:
                    yield lg, f, fa, fb

    def entry(
        self, ml: ManagedLedger, m: ManifestState, lg: LedgerInfo, eid: int, exact: bool = True
    ) -> int:
        """Messages in entry ``eid`` of ledger ``lg``."""
        for f in ml.fragments(lg):
            if f.first_entry <= eid < f.first_entry + f.count:
                return self.span(ml, m, lg.ledger_id, f, eid, eid, exact)
        return 1

    def messages(
        self, ml: ManagedLedger, m: ManifestState, s: Off, e: Off, *, exact: bool = False
    ) -> int:
        """Messages in (s, e] (exact from metadata, see the class; else estimated)."""
        total = 0
        for lg, f, a, b in self.spans(ml, m, s, e):
            total += lg.messages if f is None else self.span(ml, m, lg.ledger_id, f, a, b, exact)
        if total and s[2] != WHOLE:
            total -= s[2]  # the start entry's messages read before
        if total and e[2] != WHOLE:
            lg_e = m.ledger(e[0])
            if lg_e is not None:
                total -= self.entry(ml, m, lg_e, e[1], exact) - e[2]
        return max(0, total)

    def cut_messages(self, ml: ManagedLedger, m: ManifestState, s: Off, e: Off, quota: int) -> Off:
        """The offset ``quota`` messages after ``s`` (at most ``e``), exact."""
        used = 0
        last: Off = list(s)
        for lg, f, a, b in self.spans(ml, m, s, e):
            touches = (s[2] != WHOLE and s[0] == lg.ledger_id) or (
                e[2] != WHOLE and e[0] == lg.ledger_id
            )
            if f is None and not touches and used + lg.messages <= quota:
                used += lg.messages  # a whole ledger: its total is in the manifest
                last = _off(lg.ledger_id, lg.entries - 1, WHOLE, m.incarnation)
                if used == quota:
                    return last
                continue
            frags = [f] if f is not None else ml.fragments(lg)
            for fr in frags:
                fa, fb = max(a, fr.first_entry), min(b, fr.first_entry + fr.count - 1)
                if fa > fb:
                    continue
                c = self.span(ml, m, lg.ledger_id, fr, fa, fb, True)
                at_start = s[2] != WHOLE and (lg.ledger_id, fa) == (s[0], s[1])
                at_end = e[2] != WHOLE and (lg.ledger_id, fb) == (e[0], e[1])
                c -= s[2] if at_start else 0
                if at_end:
                    c -= self.span(ml, m, lg.ledger_id, fr, fb, fb, True) - e[2]
                if used + c <= quota:
                    used += c
                    last = _off(lg.ledger_id, fb, e[2] if at_end else WHOLE, m.incarnation)
                    if used == quota:
                        return last
                    continue
                for eid in range(fa, fb + 1):  # the cut is in this fragment
                    n = self.span(ml, m, lg.ledger_id, fr, eid, eid, True)
                    skip = s[2] if (at_start and eid == fa) else 0
                    top = e[2] if (at_end and eid == fb) else n
                    room = quota - used
                    if top - skip >= room:
                        whole = skip + room >= n
                        return _off(
                            lg.ledger_id, eid, WHOLE if whole else skip + room, m.incarnation
                        )
                    used += top - skip
                return _off(lg.ledger_id, fb, WHOLE, m.incarnation)  # (counts disagreed)
        return e if used else last


def ml_bytes(ml: ManagedLedger, m: ManifestState, s: Off, e: Off) -> int:
    """Stored bytes of the entries in (s, e] (a part of a fragment: its share of it)."""
    total = 0
    for lg, f, a, b in _Meter().spans(ml, m, s, e):
        if f is None:
            total += lg.size
        else:
            total += f.length * (b - a + 1) // f.count
    return total


def cut_bytes(ml: ManagedLedger, m: ManifestState, s: Off, e: Off, quota: int) -> Off:
    """The offset about ``quota`` stored bytes after ``s`` (at least one entry, at most
    ``e``), at entry granularity from fragment sizes (no entry is read)."""
    used = 0
    for lg, f, a, b in _Meter().spans(ml, m, s, e):
        for fr in [f] if f is not None else ml.fragments(lg):
            fa, fb = max(a, fr.first_entry), min(b, fr.first_entry + fr.count - 1)
            if fa > fb:
                continue
            per = fr.length / fr.count
            size = per * (fb - fa + 1)
            if used + size <= quota:
                used += int(size)
                continue
            k = max(1, int((quota - used) // per)) if used == 0 else int((quota - used) // per)
            if k <= 0:  # the offset just before this entry (see _before)
                return _off(lg.ledger_id, fa - 1, WHOLE, m.incarnation)
            return _off(lg.ledger_id, fa + k - 1, WHOLE, m.incarnation)
    return e


def _apportion(sizes: dict[str, int], budget: int) -> dict[str, int]:
    """Split ``budget`` over partitions in proportion to their ``sizes`` (backlogs), as
    Spark's Kafka source splits maxOffsetsPerTrigger; the shares add up to
    ``min(budget, total)`` exactly (largest remainders get the leftover units), so the
    limit is never exceeded and a non-empty backlog always admits something."""
    total = sum(sizes.values())
    if total <= budget:
        return dict(sizes)
    share = {k: budget * v / total for k, v in sizes.items()}
    out = {k: int(x) for k, x in share.items()}
    left = budget - sum(out.values())
    for k in sorted(share, key=lambda k: (out[k] - share[k], k))[:left]:
        out[k] += 1
    return out


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
        self.opts = SourceOptions.parse(options, streaming=False).for_schema(schema)

    def partitions(self) -> list[FilePulsarPartition]:
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
            s_spec = _spec(self.opts.starting_offsets, key, is_start=True)
            e_spec = _spec(self.opts.ending_offsets, key, is_start=False)
            timed = _time_for(self.opts.starting_time, key) is not None
            if s_spec == "latest" and not timed:
                continue  # (latest, ...]: empty whenever the job runs
            start[key] = _resolve(self.opts.starting_offsets, key, m, ml, self.opts, is_start=True)
            end[key] = _resolve(self.opts.ending_offsets, key, m, ml, self.opts, is_start=False)
            if e_spec == "latest" and self.opts.ending_time is None:
                end_latest.add(key)
            if s_spec == "earliest" or timed:
                loss_ok.add(key)
        return _plan(
            store,
            self.opts,
            start,
            end,
            manifests,
            end_latest=frozenset(end_latest),
            loss_ok=frozenset(loss_ok),
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition)  # type: ignore[arg-type]


def check_offset_keys(
    opts: SourceOptions, partitions: list[TopicName], *, starting: bool = True
) -> None:
    """JSON starting/ending offsets must name exactly the partitions the query reads.

    As Spark's Kafka source: every partition read must be named (``-2``/``-1`` for
    earliest/latest), so none is read from a default by accident; with a pattern, partitions
    of matching topics not created yet may be named too.

    Raises
    ------
    InvalidConfiguration
        Naming the keys that match no partition (a typo, or a partitioned topic's base name)
        or the partitions left out.
    """
    known = {str(t) for t in partitions}
    rx = _pattern_namespace(opts.pattern)[3] if opts.pattern else None

    def reads(key: str) -> bool:  # with a pattern, also partitions of topics not made yet
        return key in known or (
            rx is not None and bool(rx.fullmatch(str(TopicName.parse(key).base)))
        )

    specs: list[tuple[str, Any]] = [("endingOffsets", opts.ending_offsets)]
    if starting:
        specs.insert(0, ("startingOffsets", opts.starting_offsets))
        specs.insert(1, ("startingTime", opts.starting_time))
    for name, spec in specs:
        if not isinstance(spec, dict):
            continue
        unknown = sorted(k for k in spec if not reads(k))
        if unknown:
            sample = ", ".join(sorted(known)[:4]) + (" ..." if len(known) > 4 else "")
            raise InvalidConfiguration(
                f"filepulsar source: {name} names {unknown}, which this query does not read; "
                f"keys are partition names such as {sample}"
            )
        missing = sorted(known - set(spec))
        if missing:
            more = " ..." if len(missing) > 6 else ""
            raise InvalidConfiguration(
                f"filepulsar source: {name} JSON must name every partition the query reads "
                f"(as Kafka's); missing {missing[:6]}{more}. Give -2 (earliest) or -1 "
                "(latest) for partitions that start at either end"
            )


def _spec(spec: Any, topic: str, *, is_start: bool) -> str:
    """The per-partition form of an offsets option: 'earliest', 'latest' or a message id."""
    if isinstance(spec, dict):
        return str(spec.get(topic, "earliest" if is_start else "latest"))
    return str(spec)


def _resolve(
    spec: Any,
    topic: str,
    m: ManifestState,
    ml: ManagedLedger,
    opts: SourceOptions,
    *,
    is_start: bool,
) -> Off:
    inc = m.incarnation
    at = _time_for(opts.starting_time, topic) if is_start else opts.ending_time
    if at is not None and spec in ("latest", "earliest"):
        # From the first message published at or after ``at`` (start, included), or up to
        # the last one published before it (end, as Kafka's endingTimestamp).
        pos = ml.find_by_publish_time(m, at)
        if pos is None:
            return _end_of(m)
        b = _before(pos)
        return _off(b[0], b[1], b[2], inc)
    spec = _spec(spec, topic, is_start=is_start)
    if spec == "earliest":
        return _off(-1, -1, WHOLE, inc)
    if spec == "latest":
        return _end_of(m)
    # A starting message id is included; an ending one is not (reading stops before it, as
    # Kafka's endingOffsets): both are the offset just before the message.
    o = _offset_of_message_id(MessageId.parse(spec))
    return _off(o[0], o[1], o[2], inc)


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
        self.opts = SourceOptions.parse(options, streaming=True).for_schema(schema)
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
        self._checked = False  # the checkpoint's offsets were checked against the options
        # This trigger's manifest states (read once, by latestOffset), the end it planned
        # (for the backlog report), per-entry message counts (see _Meter), minMessages timing.
        self._states: dict[str, ManifestState] = {}
        self._last_end: dict[str, Any] | None = None
        self._meter = _Meter()
        self._clock = time.monotonic
        self._last_trigger: float | None = None

    # -- topics and consumers
    def _due(self) -> bool:
        return time.monotonic() - self._listed_at >= self.opts.pattern_refresh_ms / 1000

    def _refresh_partitions(self, *, force: bool = False, subscribe: bool = True) -> None:
        """List the query's partitions again (at start, then every
        ``patternAutoDiscoveryPeriodMs``): topics the pattern finds, partitions added to a
        topic, topics deleted (left out) or deleted and created again (a fresh manifest read,
        so a cached manifest of the old topic is never read on)."""
        if not subscribe:
            if not self._partitions or self._due():
                self._partitions = resolve_partitions(self.store, self.opts, wait=True)
                self._listed_at = time.monotonic()
            for t in self._partitions:
                if str(t) not in self._mls:
                    self._mls[str(t)] = ManagedLedger(self.store, t)
            return
        first = not self._started
        if first:
            self._started = True
            force = True
        if not force and not self._due():
            return
        self._listed_at = time.monotonic()
        tps = resolve_partitions(
            self.store, self.opts, create=first, wait=self.opts.wait_for_topics or not first
        )
        kept = []
        for t in tps:
            key = str(t)
            ml = self._mls.get(key)
            recreated = False
            if ml is not None and not first:
                try:
                    fresh = ManifestStore(self.store, t).latest()
                    seen = ml.state(refresh=False)
                except TopicNotFound:
                    continue  # deleted since the listing
                if fresh.incarnation != seen.incarnation:
                    recreated = True
                    self._drop(key)
                    ml = None
            if ml is None:
                self._mls[key] = ManagedLedger(self.store, t)
                if self.opts.subscription:
                    self._consumers[key] = self._subscribe(t, from_start=recreated)
            kept.append(t)
        for key in set(self._mls) - {str(t) for t in kept}:
            self._drop(key)
        self._partitions = kept

    def _drop(self, key: str) -> None:
        """Forget a partition that was deleted (or deleted and created again)."""
        self._mls.pop(key, None)
        self._subs.pop(key, None)
        c = self._consumers.pop(key, None)
        if c is not None:
            try:
                c.close()
            except Exception as e:  # its subscription went with the topic
                log.info("closing consumer of deleted %s: %s", key, e)

    def _subscribe(self, t: TopicName, *, from_start: bool = False) -> SubscriptionConsumer:
        _stop_on_sigterm()
        start = None
        initial = InitialPosition.Earliest if from_start else self.opts.initial_position
        if (
            self.opts.starting_given
            and self.opts.durable
            and not from_start
            and SubscriptionStore(self.store, t, self.opts.subscription or "").exists()
        ):
            log.warning(
                "filepulsar source: subscription %r on %s exists, so the query starts at "
                "its cursor; startingOffsets/startingTime only position a subscription the "
                "query creates",
                self.opts.subscription,
                t,
            )
        if not from_start and (
            self.opts.starting_offsets not in ("latest", "earliest")
            or self.opts.starting_time is not None
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
                    initial_position=initial,
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
            ConsumerType.Shared,
            ConsumerType.KeyShared,
        )

    def _active(self, key: str) -> bool:
        c = self._consumers.get(key)
        if c is None:
            return True
        c.renew_if_due()
        return c.is_active()

    # -- offsets
    def initialOffset(self) -> dict[str, Any]:
        self._checked = True  # a new query: no checkpoint to check
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
                out[key] = _off(md[0], md[1], WHOLE, m.incarnation)
            else:
                out[key] = _resolve(
                    self.opts.starting_offsets, key, m, ml, self.opts, is_start=True
                )
        return out

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.min_messages is not None:
            return ReadMinRows(self.opts.min_messages)  # the max (if any) from the options
        if self.opts.max_messages is not None:
            return ReadMaxRows(self.opts.max_messages)
        if self.opts.max_bytes is not None:
            return ReadMaxBytes(self.opts.max_bytes)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest_positions()

    def _latest_positions(self) -> dict[str, Off]:
        """Every partition's last position, from its manifest read now (once per trigger:
        the states are kept in ``_states`` for the rest of the trigger -- cutting, planning,
        the backlog report)."""
        self._refresh_partitions()
        out = {}
        self._states = {}
        for t in self._partitions:
            try:
                m = self._mls[str(t)].state()
            except TopicNotFound:
                continue  # deleted since the listing: reported by latestOffset
            self._states[str(t)] = m
            out[str(t)] = _end_of(m)
        return out

    def _check_checkpoint(self, start: dict[str, Any]) -> None:
        """Offsets from a checkpoint must be for the topics this query reads (a checkpoint
        belongs to one topic set, as Kafka's).

        Raises
        ------
        InvalidConfiguration
            Naming the checkpoint's topics and the query's.
        """
        if self._checked:
            return
        self._checked = True
        if ("claims" in start) != self._claims_mode:
            raise InvalidConfiguration(
                "filepulsar source: the checkpoint was written by a query "
                + ("with" if "claims" in start else "without")
                + " a Shared/Key_Shared subscription and this query is "
                + ("not" if "claims" in start else "")
                + " one; use a new checkpointLocation"
            )
        if "claims" in start:
            return
        rx = _pattern_namespace(self.opts.pattern)[3] if self.opts.pattern else None
        named = set(self.opts.topics)

        def base(key: str) -> str:
            return str(TopicName.parse(key).base)

        def ours(key: str) -> bool:
            if rx is not None:
                return bool(rx.fullmatch(base(key)))
            return base(key) in named or key in named

        theirs = sorted({base(k) for k in start})
        foreign = [k for k in start if not ours(k)]
        missing = []
        if rx is None and not self.opts.wait_for_topics:
            missing = [n for n in sorted(named) if not any(n in (k, base(k)) for k in start)]
        if foreign or missing:
            reads = self.opts.pattern or ", ".join(sorted(named))
            raise InvalidConfiguration(
                f"filepulsar source: the checkpoint's offsets are for {theirs} but this query "
                f"reads {reads}; a checkpoint belongs to the topics it was started with: use a "
                "new checkpointLocation, or the original topic options"
            )

    def _effective_start(self, s: Off, e: Off | None) -> Off:
        """Where a batch's range for one partition begins: ``s``, or the start of a topic
        that was deleted and created again (different incarnations, or -- for offsets from
        before incarnations -- an end behind the start, which only a reset makes)."""
        if e is None:
            return s
        if _recreated(s, e) or (not _inc(s) and (e[0], e[1]) < (s[0], s[1])):
            return _off(-1, -1, WHOLE, _inc(e))
        return s

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        self._check_checkpoint(start)
        # Spark asks for the next batch only once the previous one is in its commit log, but
        # calls commit() for a batch only while planning the next: acknowledge ``start`` here
        # so the last batch of a run (AvailableNow) reaches the cursor too. Idempotent.
        self.commit(start)
        if self._claims_mode:
            return self._claim(start, limit)
        self._refresh_partitions()
        now_latest = self._latest_positions()  # the manifests, read once for this trigger
        latest = self._target or now_latest
        end: dict[str, Any] = dict(start)
        for key in list(end):
            if key not in latest:
                # Deleted: Kafka's "partitions are gone. Some data may have been missed".
                data_loss(
                    f"{key} was deleted; messages after {end[key][0]}:{end[key][1]} this "
                    "query had not read may have been lost",
                    self.opts.fail_on_data_loss,
                )
                del end[key]
        for key, lat in latest.items():
            if key not in end:
                # A partition discovered later (a topic the pattern finds, a partition added,
                # a topic that appeared) joins the offsets at its start (the subscription's
                # cursor, else its beginning) and is read from the next batch on: every
                # batch's range is then (start, end] of its own offsets, so a replay reads
                # the same and admission control counts it like the others.
                c = self._consumers.get(key)
                if c is not None:
                    md = c.state().mark_delete
                    end[key] = _off(md[0], md[1], WHOLE, _inc(lat))
                else:
                    end[key] = _off(-1, -1, WHOLE, _inc(lat))
                continue
            if not self._active(key):
                continue
            cur = end[key]
            if self._effective_start(cur, lat) is not cur:
                if _recreated(cur, lat):
                    msg = recreated_message(key, _inc(cur), _inc(lat))
                else:
                    msg = (
                        f"{key}: its last message {lat[0]}:{lat[1]} is before this query's "
                        f"offset {cur[0]}:{cur[1]}: the topic was deleted and created again, "
                        "and messages this query had not read may have been lost"
                    )
                data_loss(msg, self.opts.fail_on_data_loss)
                end[key] = lat  # read from the start of the new topic
                continue
            if (lat[0], lat[1]) > (cur[0], cur[1]) or (
                (lat[0], lat[1]) == (cur[0], cur[1]) and cur[2] != WHOLE
            ):
                end[key] = lat
        if isinstance(limit, ReadMinRows) and self._target is None and end != start:
            # Kafka's minOffsetsPerTrigger: wait for enough messages, or maxTriggerDelay
            # since the last batch (the first trigger of a query does not wait). AvailableNow
            # never waits: it reads what there is, then ends.
            now = self._clock()
            due = (
                self._last_trigger is None
                or (now - self._last_trigger) * 1000 >= self.opts.max_trigger_delay_ms
            )
            if not due and self._count(start, end) < limit.min_rows:
                self._last_end = start
                return start
            self._last_trigger = now
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        nbytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        if isinstance(limit, ReadMinRows):  # the maximum (if any) comes from the options
            rows, nbytes = self.opts.max_messages, self.opts.max_bytes
        if rows is not None:
            end = self._cap(start, end, rows=rows)
        elif nbytes is not None:
            end = self._cap(start, end, nbytes=nbytes)
        self._last_end = end
        if self._target is not None and end == start:
            self._release()  # AvailableNow is done: let the next query have the subscription
        return end

    def _release(self) -> None:
        """Unregister this query's consumers (they are registered again if needed)."""
        self.stop()
        self._committed = None
        self._mls = {}
        self._started = False

    def _ranges(
        self, start: dict[str, Any], end: dict[str, Any]
    ) -> dict[str, tuple[ManifestState, Off, Off]]:
        """Each partition's (manifest state, start, end) with something to read in between."""
        out = {}
        for key in sorted(start):
            if key not in end or end[key] == start[key] or key not in self._mls:
                continue
            m = self._states.get(key)
            if m is None:
                continue  # deleted meanwhile: planning reports it
            out[key] = (m, self._effective_start(start[key], end[key]), end[key])
        return out

    def _count(self, start: dict[str, Any], end: dict[str, Any]) -> int:
        """Messages in (start, end] over every partition, from fragment metadata."""
        return sum(
            self._meter.messages(self._mls[k], m, s, e)
            for k, (m, s, e) in self._ranges(start, end).items()
        )

    def _cap(
        self,
        start: dict[str, Any],
        end: dict[str, Any],
        *,
        rows: int | None = None,
        nbytes: int | None = None,
    ) -> dict[str, Any]:
        """Cut ``end`` so at most ``rows`` messages (or about ``nbytes``) are admitted, split
        over the partitions in proportion to each one's backlog (as Spark's Kafka source
        does), never less than one message. Counted from fragment metadata (see
        :class:`_Meter`)."""
        budget = rows if rows is not None else nbytes
        assert budget is not None
        out = dict(end)  # partitions new to the offsets stay at their start (see above)
        out.update({k: v for k, v in start.items() if k in end})
        ranges = self._ranges(start, end)
        sizes = {}
        for key, (m, s, e) in ranges.items():
            ml = self._mls[key]
            sizes[key] = (
                self._meter.messages(ml, m, s, e, exact=True)
                if rows is not None
                else ml_bytes(ml, m, s, e)
            )
        if sum(sizes.values()) <= budget:
            return end
        for key, quota in _apportion(sizes, budget).items():
            if quota <= 0:
                continue
            m, s, e = ranges[key]
            ml = self._mls[key]
            if rows is not None:
                out[key] = self._meter.cut_messages(ml, m, s, e, quota)
            else:
                out[key] = cut_bytes(ml, m, s, e, quota)
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
        """Latest positions plus ``backlog``, shown in the query's progress as the source's
        ``latestOffset`` (read it with :func:`backlog_of`). Spark calls this right after
        :meth:`latestOffset`: the backlog is what remains after the batch just planned --
        messages in (its end, latest] per partition and in total -- so the last batch of an
        AvailableNow run shows what it left (0 when nothing arrived meanwhile), not the
        batch's own size. Uses the manifests latestOffset read (it reads them when called
        alone). Never registers consumers; never part of a checkpoint."""
        self._refresh_partitions(subscribe=False)
        if not self._states:
            for t in self._partitions:
                try:
                    self._states[str(t)] = self._mls[str(t)].state()
                except TopicNotFound:
                    continue
        out: dict[str, Any] = {}
        per: dict[str, int] = {}
        for t in self._partitions:
            key = str(t)
            m = self._states.get(key)
            if m is None:
                continue
            out[key] = lat = _end_of(m)
            if self._claims_mode:
                if self.opts.durable:
                    per[key] = self._backlog_of(key, self._mls[key], m)
                continue
            done = (self._last_end or {}).get(key)
            if done is None:
                done = _off(-1, -1, WHOLE, m.incarnation)  # not read yet: all of it
            done = self._effective_start(done, lat)
            per[key] = self._meter.messages(self._mls[key], m, done, lat)
        out["backlog"] = {"messages": sum(per.values()), "partitions": per}
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
                    columns=self.opts.emit,
                    value=self.opts.value,
                )
                for key, ps in sorted(end["claims"].items())
            ]
        self._check_checkpoint(start)
        self._refresh_partitions()
        begin = {k: self._effective_start(s, end.get(k)) for k, s in start.items()}
        # The manifests latestOffset read for this trigger cover its end; a replay after a
        # restart (no latestOffset yet) reads them fresh.
        states = {
            k: m
            for k, m in self._states.items()
            if k in end and tuple(m.last_position()) >= (end[k][0], end[k][1])
        }
        return _plan(self.store, self.opts, begin, end, states, mls=self._mls)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition)  # type: ignore[arg-type]

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
            seen = self._mls[key].state(refresh=False).incarnation if key in self._mls else ""
            if _inc(off) and seen and seen != _inc(off):
                continue  # an offset in a deleted topic: nothing to acknowledge in the new one
            if off[2] == WHOLE:
                if off[0] >= 0:
                    c.acknowledge_cumulative(Position(off[0], off[1]))
            else:
                ml = self._mls[key]
                m = self._states.get(key) or ml.state()
                before = _before(Position(off[0], off[1]))
                if before[0] >= 0:
                    c.acknowledge_cumulative(Position(before[0], before[1]))
                lg = m.ledger(off[0])
                # The entry's message count: known to the meter when the cut was made here.
                size = self._meter.entry(ml, m, lg, off[1]) if lg is not None else off[2]
                c.acknowledge([(Position(off[0], off[1]), i, size) for i in range(off[2])])
        self._committed = end

    def stop(self) -> None:
        for c in self._consumers.values():
            try:
                c.close()
            except Exception as e:  # never fail a query's shutdown on a lease cleanup
                log.warning("closing consumer of %s failed: %s", c.topic, e)
        self._consumers = {}
