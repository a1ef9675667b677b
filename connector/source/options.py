"""The Spark source's options, parsed once on the driver into :class:`SourceOptions`.

Owns every reading option: its spellings (Kafka's aliases), its parsing and validation (each
problem is an :class:`InvalidConfiguration` naming the option and what is allowed), and the
option-level rules between them (where a query starts, what applies to batch or streaming
reads). The schema a read declares (:meth:`SourceOptions.declared_schema`) is derived here too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql.types import StructType

from filepulsar.connector.options import OptionReader, storage_options, storage_root
from filepulsar.connector.schema import Columns, narrow_schema, source_columns, typed_schemas
from filepulsar.connector.values.types import ON_CORRUPT, VALUE_FORMATS, ValueSpec, plan_value_spec
from filepulsar.dispatch.modes import ConsumerType, InitialPosition, KeySharedMode
from filepulsar.storage import (
    InvalidConfiguration,
    MessageId,
    TopicName,
    jsontext,
    open_blob_store,
)
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.topics import TopicPattern, match_topics


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
            parse_topic_pattern(pattern)
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
        # One precedence rule (docs/spark-source.md, "Where a query starts"): a checkpoint
        # wins; else an existing subscription's cursor; else where startingOffsets/startingTime
        # say (for a subscription: the position it is created at). subscriptionInitialPosition
        # is the Pulsar spelling of the same choice, so giving both is ambiguous.
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
        (which they must share), see :func:`filepulsar.connector.values.types.plan_value_spec`."""
        store = self.store()
        if self.pattern:
            bases = [i.name for i in match_topics(store, parse_topic_pattern(self.pattern))]
        else:
            bases = [TopicName.parse(t).base for t in self.topics]
        return plan_value_spec(store, bases, self.value_format, self.on_corrupt, expect)

    def typed_schema(self, spec: ValueSpec) -> StructType:
        """Every column of a typed read (:func:`filepulsar.connector.schema.typed_schemas`)."""
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


def time_for(spec: int | dict[str, int] | None, topic: str) -> int | None:
    """The time ``spec`` gives partition ``topic`` (None: no time given)."""
    if isinstance(spec, dict):
        return spec.get(topic)
    return spec


def parse_topic_pattern(pattern: str) -> TopicPattern:
    """The ``topicsPattern`` option parsed (:class:`filepulsar.storage.topics.TopicPattern`: the
    rule pattern consumers use too)."""
    try:
        return TopicPattern.parse(pattern)
    except InvalidConfiguration as e:
        raise InvalidConfiguration(f"filepulsar source: option 'topicsPattern': {e}") from e


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
