"""``admin.topics()``: topics and partitioned topics, their stats, subscriptions and cursor
operations (reset, skip, clear backlog, expire), compaction, termination and reading messages,
as pulsar-admin's ``topics`` group."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from filepulsar.connector.admin.args import as_topic, parse_seconds
from filepulsar.connector.admin.stats import (
    backlog_of,
    earliest_time,
    last_publish_time,
    publish_rates,
)
from filepulsar.dispatch.clock import wall_ms
from filepulsar.dispatch.modes import InitialPosition
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.compaction import CompactionReport, compact
from filepulsar.storage.compaction import describe as describe_compaction
from filepulsar.storage.errors import (
    AlreadyExists,
    ConsumerBusy,
    InvalidConfiguration,
    NotAllowedError,
    SubscriptionNotFound,
    TopicNotFound,
)
from filepulsar.storage.ledger import EARLIEST, ManagedLedger, Position
from filepulsar.storage.messageid import MessageId
from filepulsar.storage.names import TopicName, validate_segment
from filepulsar.storage.reader import READ_SCHEMA, Reader
from filepulsar.storage.retention import last_published_before
from filepulsar.storage.subscriptions import (
    SubscriptionStore,
    acknowledge_up_to,
    delete_subscription,
    ensure_subscription,
    list_subscriptions,
    reset_subscription,
    skip_entries,
    subscription_backlog,
)
from filepulsar.storage.topics import (
    create_topic,
    delete_topic,
    list_topics,
    managed_ledgers,
    require_topic,
    split_namespace,
    update_partitioned_topic,
)


class Topics:
    """``admin.topics()``: topics, their stats, messages and subscriptions."""

    def __init__(self, store: BlobStore, *, clock: Callable[[], int] = wall_ms) -> None:
        self.store = store
        self.clock = clock  # ms since the epoch: the cutoff of expire_messages

    # ------------------------------------------------------------------ topics
    def create_non_partitioned_topic(self, topic: str) -> str:
        return str(create_topic(self.store, topic, 0))

    def create_partitioned_topic(self, topic: str, num_partitions: int) -> str:
        if not isinstance(num_partitions, int) or num_partitions < 1:
            raise InvalidConfiguration(
                f"a partitioned topic needs at least 1 partition, got {num_partitions!r}"
            )
        return str(create_topic(self.store, topic, num_partitions))

    def update_partitioned_topic(self, topic: str, num_partitions: int) -> tuple[int, int]:
        """Add partitions (the count only grows); returns (old, new)."""
        return update_partitioned_topic(self.store, topic, num_partitions)

    def get_partitioned_topic_metadata(self, topic: str) -> dict[str, int]:
        return {"partitions": require_topic(self.store, topic)}

    def list(self, namespace: str = "public/default") -> builtins.list[str]:
        """The topics of a namespace (a partitioned topic once, not each partition)."""
        tenant, ns = split_namespace(namespace)
        return [str(i.name) for i in list_topics(self.store, tenant, ns)]

    def list_with_partitions(
        self, namespace: str = "public/default"
    ) -> builtins.list[tuple[str, int]]:
        tenant, ns = split_namespace(namespace)
        return [(str(i.name), i.partitions) for i in list_topics(self.store, tenant, ns)]

    def delete(self, topic: str, *, force: bool = False) -> None:
        """Delete a non-partitioned topic (or one partition) and its data; refused while
        producers or consumers are connected, unless ``force``.

        Raises
        ------
        TopicNotFound
            If there is no such topic.
        NotAllowedError
            For a partitioned topic, as Pulsar's broker refuses ``topics delete`` on one
            (HTTP 409, "please call delete-partitioned-topic"): delete it with
            :meth:`delete_partitioned_topic`. Nothing is deleted.
        ProducerBusy, ConsumerBusy
            While clients are connected and not ``force``.
        """
        t = as_topic(topic)
        parts = require_topic(self.store, t)
        if parts:
            raise NotAllowedError(
                f"{t} is a partitioned topic ({parts} partitions), please call "
                "delete-partitioned-topic (topics delete-partitioned-topic on the command "
                "line, delete_partitioned_topic in Python)"
            )
        delete_topic(self.store, t, force=force)

    def delete_partitioned_topic(self, topic: str, *, force: bool = False) -> None:
        """Delete a partitioned topic, every partition and its data (pulsar-admin
        ``topics delete-partitioned-topic``); refused while clients are connected unless
        ``force``.

        Raises
        ------
        TopicNotFound
            If there is no such partitioned topic (a non-partitioned one is deleted with
            :meth:`delete`, as in Pulsar).
        """
        t = as_topic(topic)
        if not require_topic(self.store, t):
            raise TopicNotFound(
                f"partitioned topic {t} does not exist: it is a non-partitioned topic "
                "(delete it with topics delete)"
            )
        delete_topic(self.store, t, force=force)

    # ------------------------------------------------------------------ stats
    def _ledger_stats(self, t: TopicName) -> dict[str, Any]:
        ml = ManagedLedger(self.store, t)
        m = ml.state()
        now = ml.clock()
        subs: dict[str, Any] = {}
        for name in list_subscriptions(self.store, t):
            try:
                s = SubscriptionStore(self.store, t, name).latest()
            except SubscriptionNotFound:
                continue
            size, earliest = backlog_of(ml, m, s.mark_delete)
            subs[name] = {
                "type": s.sub_type.wire,
                "msgBacklog": subscription_backlog(ml, m, s),
                "backlogSize": size,
                "earliestMsgPublishTimeInBacklog": earliest,
                "markDeletePosition": "{}:{}".format(*s.mark_delete),
                "consumers": [
                    {"consumerName": c.name, "priorityLevel": c.priority}
                    for c in s.live_consumers(now)
                ],
                "lastActiveTimestamp": s.last_active_ms,
            }
        rate, throughput = publish_rates(ml, m, now)
        backlogs = [x["backlogSize"] for x in subs.values()]
        return {
            "msgRateIn": rate,
            "msgThroughputIn": throughput,
            "msgInCounter": m.total_messages,
            "storageSize": sum(lg.size for lg in m.ledgers),
            "backlogSize": max(backlogs, default=0),
            "earliestMsgPublishTimeInBacklogs": earliest_time(
                x["earliestMsgPublishTimeInBacklog"] for x in subs.values()
            ),
            "lastPublishTimeStamp": last_publish_time(m),
            "topicCreationTimeStamp": m.created_ms,
            "ledgers": len(m.ledgers),
            "lastMessageId": "{}:{}".format(*m.last_position()),
            "publishers": [
                {"producerName": name, "accessMode": lease.access_mode.wire}
                for name, lease in m.producers.items()
                if lease.expires_ms > now
            ],
            "subscriptions": subs,
        }

    def get_stats(self, topic: str) -> dict[str, Any]:
        """Pulsar's topic stats: ``msgRateIn`` and ``msgThroughputIn`` (over the last
        minute, from publish times), ``msgInCounter``, ``storageSize``, ``backlogSize`` (the
        largest subscription's, in stored bytes), ``earliestMsgPublishTimeInBacklogs``,
        ``lastPublishTimeStamp`` and ``topicCreationTimeStamp`` (PIP-431; the latter None
        for a topic created before filepulsar recorded it), ``publishers``,
        ``subscriptions`` (each with ``type``, ``msgBacklog``, ``backlogSize``,
        ``earliestMsgPublishTimeInBacklog``, ``consumers``). No dispatch rates
        (``msgRateOut``): no broker counts what it delivers (docs/peers.md). For a
        partitioned topic, the totals over its partitions (see
        :meth:`get_partitioned_stats`)."""
        t = as_topic(topic)
        if require_topic(self.store, t):
            return self.get_partitioned_stats(topic, per_partition=False)
        return {"topic": str(t), **self._ledger_stats(t)}

    def get_partitioned_stats(self, topic: str, per_partition: bool = True) -> dict[str, Any]:
        """Totals over the partitions (subscriptions' backlogs and consumers summed), with
        each partition's stats under ``partitions`` when ``per_partition``. A non-partitioned
        topic counts as one partition. ``topicCreationTimeStamp`` is the earliest partition's
        (None if any partition's is unknown)."""
        t = as_topic(topic)
        parts = {str(p): self._ledger_stats(p) for p in managed_ledgers(self.store, t)}
        out: dict[str, Any] = {
            "topic": str(t),
            "metadata": {"partitions": require_topic(self.store, t)},
            "msgRateIn": round(sum(p["msgRateIn"] for p in parts.values()), 3),
            "msgThroughputIn": round(sum(p["msgThroughputIn"] for p in parts.values()), 3),
            "msgInCounter": sum(p["msgInCounter"] for p in parts.values()),
            "storageSize": sum(p["storageSize"] for p in parts.values()),
            "backlogSize": sum(p["backlogSize"] for p in parts.values()),
            "earliestMsgPublishTimeInBacklogs": earliest_time(
                p["earliestMsgPublishTimeInBacklogs"] for p in parts.values()
            ),
            "lastPublishTimeStamp": max(
                (p["lastPublishTimeStamp"] for p in parts.values()), default=0
            ),
            "topicCreationTimeStamp": _earliest_known(
                [p["topicCreationTimeStamp"] for p in parts.values()]
            ),
            "publishers": [pub for p in parts.values() for pub in p["publishers"]],
            "subscriptions": {},
        }
        for p in parts.values():
            for name, s in p["subscriptions"].items():
                agg = out["subscriptions"].setdefault(
                    name,
                    {
                        "type": s["type"],
                        "msgBacklog": 0,
                        "backlogSize": 0,
                        "earliestMsgPublishTimeInBacklog": 0,
                        "consumers": [],
                    },
                )
                agg["msgBacklog"] += s["msgBacklog"]
                agg["backlogSize"] += s["backlogSize"]
                agg["earliestMsgPublishTimeInBacklog"] = earliest_time(
                    (agg["earliestMsgPublishTimeInBacklog"], s["earliestMsgPublishTimeInBacklog"])
                )
                agg["consumers"].extend(s["consumers"])
        if per_partition:
            out["partitions"] = parts
        return out

    def get_internal_stats(self, topic: str) -> dict[str, Any]:
        """Pulsar's internal (managed ledger) stats: ledgers and cursors. For a partitioned
        topic, one such dict per partition under ``partitions``."""
        t = as_topic(topic)
        if require_topic(self.store, t):
            return {
                "metadata": {"partitions": require_topic(self.store, t)},
                "partitions": {str(p): self._internal(p) for p in managed_ledgers(self.store, t)},
            }
        return self._internal(t)

    def _internal(self, t: TopicName) -> dict[str, Any]:
        ml = ManagedLedger(self.store, t)
        m = ml.state()
        cursors: dict[str, Any] = {}
        for name in list_subscriptions(self.store, t):
            try:
                s = SubscriptionStore(self.store, t, name).latest()
            except SubscriptionNotFound:
                continue
            cursors[name] = {
                "markDeletePosition": "{}:{}".format(*s.mark_delete),
                "readPosition": "{}:{}".format(*s.dispatched),
                "individuallyDeletedMessages": [f"[{r[0]}:{r[1]}..{r[2]}:{r[3]}]" for r in s.acked],
                "pendingEntries": len(s.pending),
                "version": s.version,
            }
        opened = m.open_ledger
        return {
            "entriesAddedCounter": sum(lg.entries for lg in m.ledgers),
            "numberOfEntries": sum(lg.entries for lg in m.ledgers),
            "totalSize": sum(lg.size for lg in m.ledgers),
            "currentLedgerEntries": opened.entries if opened else 0,
            "currentLedgerSize": opened.size if opened else 0,
            "lastConfirmedEntry": "{}:{}".format(*m.last_position()),
            "trimmedMessages": m.trimmed_messages,
            "manifestVersion": m.version,
            "ledgers": [
                {
                    "ledgerId": lg.ledger_id,
                    "entries": lg.entries,
                    "messages": lg.messages,
                    "size": lg.size,
                    "closed": lg.closed_ms is not None,
                }
                for lg in m.ledgers
            ],
            "cursors": cursors,
        }

    # ------------------------------------------------------------------ messages
    def _rows(self, reader: Reader, n: int) -> Iterator[dict[str, Any]]:
        got = 0
        while got < n:
            # one entry more: the first read re-reads the start entry and filters it out
            table = reader.read_batch(min(100, n - got) + 1, timeout_ms=0)
            if not table.num_rows:
                return
            for row in table.slice(0, n - got).to_pylist():
                yield _message_dict(row)
                got += 1

    def read_table(
        self, topic: str, *, max_messages: int | None = None, columns: str = "spark"
    ) -> pa.Table:
        """Every message of a topic (each partition in order, partitions one after the other)
        as one Arrow table, acknowledging nothing. ``.to_pandas()`` gives a DataFrame. For
        notebooks and checks; a large topic is better read with Spark.

        ``columns="spark"`` (the default): the Spark source's columns, names and types
        (``value``, ``key``, ``orderingKey``, ``topic``, ``partition``, ``messageId``,
        ``ledgerId``, ``entryId``, ``batchIndex``, ``publishTime`` and ``eventTime`` as UTC
        timestamps, ``properties``, ``producerName``, ``sequenceId``, ``deliverAt``,
        ``redeliveryCount`` always 0), so a table and a DataFrame of the same topic compare
        as they are. ``columns="storage"``: the storage reader's columns (snake_case,
        times as epoch ms: ``publish_time``, ``event_time``, ``deliver_at``...).

        Raises
        ------
        TopicNotFound
            If the topic does not exist.
        InvalidConfiguration
            If ``max_messages`` is negative or ``columns`` is neither.
        """
        if max_messages is not None and max_messages < 0:
            raise InvalidConfiguration(f"max_messages must be >= 0, got {max_messages}")
        if columns not in ("spark", "storage"):
            raise InvalidConfiguration(
                f"read_table columns must be 'spark' or 'storage', got {columns!r}"
            )
        spark = columns == "spark"
        if spark:
            from filepulsar.connector.schema import SOURCE_ARROW_SCHEMA
            from filepulsar.connector.source.columns import to_spark
        parts: builtins.list[pa.Table] = []
        got = 0
        for p in managed_ledgers(self.store, as_topic(topic)):
            r = Reader(self.store, p)
            try:
                while max_messages is None or got < max_messages:
                    table = r.read_batch(1000, timeout_ms=0)
                    if not table.num_rows:
                        break
                    if max_messages is not None:
                        table = table.slice(0, max_messages - got)
                    got += table.num_rows
                    if spark:
                        table = pa.Table.from_batches([to_spark(table, str(p), None)])
                    parts.append(table)
            finally:
                r.close()
        if parts:
            return pa.concat_tables(parts)
        return SOURCE_ARROW_SCHEMA.empty_table() if spark else READ_SCHEMA.empty_table()

    def peek_messages(
        self, topic: str, sub_name: str | None = None, n: int = 1
    ) -> builtins.list[dict[str, Any]]:
        """The next ``n`` messages after the subscription's cursor (without a subscription:
        from the start of the topic), per partition in order; nothing is acknowledged."""
        if n < 1:
            raise InvalidConfiguration(f"the number of messages to peek must be >= 1, got {n}")
        t = as_topic(topic)
        out: builtins.list[dict[str, Any]] = []
        for p in managed_ledgers(self.store, t):
            if len(out) >= n:
                break
            start = MessageId.earliest
            if sub_name is not None:
                try:
                    md = SubscriptionStore(self.store, p, sub_name).latest().mark_delete
                except SubscriptionNotFound as e:
                    raise SubscriptionNotFound(
                        f"subscription {sub_name!r} does not exist on {p}"
                    ) from e
                if md[0] >= 0:
                    start = MessageId(max(p.partition_index, -1), md[0], md[1])
            r = Reader(self.store, p, start, start_message_id_inclusive=False)
            out.extend(self._rows(r, n - len(out)))
        return out

    def examine_message(
        self,
        topic: str,
        initial_position: InitialPosition | str = "latest",
        message_position: int = 1,
    ) -> dict[str, Any]:
        """The message at ``message_position`` (1 = the first) counted from the ``earliest``
        or ``latest`` end of a non-partitioned topic or one partition (Pulsar's rule);
        ``initial_position`` is an :class:`~filepulsar.dispatch.modes.InitialPosition` or its name
        in any case.

        Raises
        ------
        InvalidConfiguration
            For a bad position, or a partitioned topic (name one partition).
        TopicNotFound
            If the topic does not exist or holds fewer messages.
        """
        t = as_topic(topic)
        if require_topic(self.store, t):
            raise InvalidConfiguration(
                f"{t} is partitioned; examine a partition ({t.partition(0)} ...)"
            )
        from_start = InitialPosition.parse(initial_position) is InitialPosition.Earliest
        if not isinstance(message_position, int) or message_position < 1:
            raise InvalidConfiguration(
                f"message position must be an integer >= 1, got {message_position!r}"
            )
        ml = ManagedLedger(self.store, t)
        total = ml.state().total_messages
        index = message_position - 1 if from_start else total - message_position
        if not 0 <= index < total:
            raise TopicNotFound(
                f"{t} has {total} messages; there is no message at position "
                f"{message_position} from the {initial_position} end"
            )
        r = Reader(self.store, t, MessageId.earliest, start_message_id_inclusive=True)
        seen = 0
        while True:
            table = r.read_batch(1000, timeout_ms=0)
            if not table.num_rows:
                raise TopicNotFound(f"{t}: message {message_position} is gone (retention)")
            if seen + table.num_rows > index:
                return _message_dict(table.slice(index - seen, 1).to_pylist()[0])
            seen += table.num_rows

    # ------------------------------------------------------------------ subscriptions
    def get_subscriptions(self, topic: str) -> builtins.list[str]:
        """Subscription names over every partition."""
        names: set[str] = set()
        for p in managed_ledgers(self.store, topic):
            names.update(list_subscriptions(self.store, p))
        return sorted(names)

    # ------------------------------------------------------------------ compaction
    def trigger_compaction(self, topic: str) -> builtins.list[CompactionReport]:
        """Compact the topic (every partition) up to its last message now (pulsar-admin
        ``topics compact``; here the run happens in this call, so it has finished when this
        returns). Returns one report per partition; see ``filepulsar.storage.compaction``."""
        return [compact(self.store, p) for p in managed_ledgers(self.store, topic)]

    compact = trigger_compaction

    def compaction_status(self, topic: str) -> dict[str, Any]:
        """pulsar-admin ``topics compaction-status``: ``status`` is ``SUCCESS`` once every
        partition has a compacted view (``NOT_RUN`` otherwise), with each partition's
        horizon and size under ``partitions``."""
        parts = {
            str(p): describe_compaction(self.store, p) for p in managed_ledgers(self.store, topic)
        }
        done = all(v["status"] == "SUCCESS" for v in parts.values())
        return {"status": "SUCCESS" if done and parts else "NOT_RUN", "partitions": parts}

    def _parts_with(self, topic: str, sub: str) -> builtins.list[TopicName]:
        validate_segment(sub, "subscription name")
        parts = managed_ledgers(self.store, topic)
        # (a subscription whose state was lost counts: deleting it is the way out)
        have = [p for p in parts if SubscriptionStore(self.store, p, sub).known()]
        if not have:
            raise SubscriptionNotFound(f"subscription {sub!r} does not exist on {as_topic(topic)}")
        return have

    def create_subscription(
        self, topic: str, subscription_name: str, message_id: MessageId | str = "latest"
    ) -> None:
        """Create a durable subscription with no consumer, its cursor at ``message_id``
        (``latest``, ``earliest`` or an id), on every partition.

        Raises
        ------
        AlreadyExists
            If the subscription exists (on any partition).
        """
        mid = _message_id(message_id)
        parts = managed_ledgers(self.store, topic)
        for p in parts:
            if SubscriptionStore(self.store, p, subscription_name).exists():
                raise AlreadyExists(f"subscription {subscription_name!r} already exists on {p}")
        where = "Earliest" if mid == MessageId.earliest else "Latest"
        for p in parts:
            ensure_subscription(self.store, p, subscription_name, initial_position=where)
        if mid not in (MessageId.earliest, MessageId.latest):
            self.reset_cursor(topic, subscription_name, message_id=mid)

    def delete_subscription(self, topic: str, sub_name: str, *, force: bool = False) -> None:
        """Delete a subscription on every partition (pulsar-admin ``unsubscribe``); refused
        while consumers are connected unless ``force`` (they then lose it)."""
        parts = self._parts_with(topic, sub_name)
        if not force:
            for p in parts:
                st = SubscriptionStore(self.store, p, sub_name)
                if not st.exists():
                    continue  # its state was lost: nobody can be connected to it
                live = st.latest().live_consumers(st.clock())
                if live:
                    raise ConsumerBusy(
                        f"subscription {sub_name!r} on {p} has connected consumers "
                        f"({', '.join(c.name for c in live)}); close them or use force"
                    )
        for p in parts:
            delete_subscription(self.store, p, sub_name)

    unsubscribe = delete_subscription

    def reset_cursor(
        self,
        topic: str,
        sub_name: str,
        *,
        message_id: MessageId | str | None = None,
        timestamp: int | None = None,
    ) -> dict[str, str]:
        """Move the subscription's cursor so the next message delivered is ``message_id``
        (its partition only, for a partitioned topic; ``earliest`` and ``latest`` apply to
        every partition) or the first one published at or after
        ``timestamp`` (epoch ms, on every partition). Returns each partition's new
        mark-delete position."""
        if (message_id is None) == (timestamp is None):
            raise InvalidConfiguration("reset_cursor needs exactly one of message_id, timestamp")
        parts = self._parts_with(topic, sub_name)
        out: dict[str, str] = {}
        if message_id is not None:
            mid = _message_id(message_id)
            target = parts
            ends = (MessageId.earliest, MessageId.latest)
            if mid not in ends and (len(parts) > 1 or parts[0].partition_index >= 0):
                target = [p for p in parts if p.partition_index == mid.partition]
                if not target:
                    raise InvalidConfiguration(
                        f"message id {mid} names partition {mid.partition}; {as_topic(topic)} "
                        "has no such partition with this subscription"
                    )
            for p in target:
                pos = None if mid == MessageId.latest else Position(mid.ledger_id, mid.entry_id)
                if mid == MessageId.earliest:
                    pos = Position(-1, -1)
                md = reset_subscription(self.store, p, sub_name, pos)
                out[str(p)] = "{}:{}".format(*md)
            return out
        assert timestamp is not None
        for p in parts:
            ml = ManagedLedger(self.store, p)
            last = last_published_before(ml, ml.state(), int(timestamp))
            nxt = EARLIEST if last is None else ml.next_position(ml.state(), last)
            md = reset_subscription(self.store, p, sub_name, nxt)
            out[str(p)] = "{}:{}".format(*md)
        return out

    def skip_messages(self, topic: str, sub_name: str, n: int) -> int:
        """Skip the next ``n`` messages (entries, as Pulsar's broker counts them) of a
        non-partitioned topic or of one partition; returns how many were skipped.

        Raises
        ------
        NotAllowedError
            For a partitioned topic, as Pulsar's broker refuses it (HTTP 405): which ``n``
            of its partitions' messages would be "the next" is not defined. Name a partition
            (``<topic>-partition-<i>``).
        """
        t = as_topic(topic)
        parts = require_topic(self.store, t)
        if parts:
            raise NotAllowedError(
                f"skip messages on a partitioned topic is not allowed ({t} has {parts} "
                f"partitions): skip on one partition, {t}-partition-0 to "
                f"{t}-partition-{parts - 1}"
            )
        return sum(
            skip_entries(self.store, p, sub_name, n) for p in self._parts_with(topic, sub_name)
        )

    def skip_all_messages(self, topic: str, sub_name: str) -> None:
        """Clear the subscription's backlog (pulsar-admin ``clear-backlog``)."""
        for p in self._parts_with(topic, sub_name):
            reset_subscription(self.store, p, sub_name, None)

    clear_backlog = skip_all_messages

    def expire_messages(self, topic: str, sub_name: str, expire_time_in_seconds: int) -> int:
        """Acknowledge the messages published more than ``expire_time_in_seconds`` ago
        (as message TTL would). Returns on how many partitions the cursor moved."""
        secs = parse_seconds(expire_time_in_seconds, "expire time")
        cutoff = self.clock() - secs * 1000
        moved = 0
        for p in self._parts_with(topic, sub_name):
            ml = ManagedLedger(self.store, p)
            last = last_published_before(ml, ml.state(), cutoff)
            if last is not None and acknowledge_up_to(self.store, p, sub_name, last):
                moved += 1
        return moved


def _message_id(value: MessageId | str) -> MessageId:
    if isinstance(value, MessageId):
        return value
    try:
        return MessageId.parse(str(value))
    except ValueError as e:
        raise InvalidConfiguration(
            f"message id {value!r} is malformed: give ledger:entry:partition[:batch], "
            "earliest or latest"
        ) from e


def _message_dict(row: dict[str, Any]) -> dict[str, Any]:
    mid = MessageId(row["partition"], row["ledger_id"], row["entry_id"], row["batch_index"])
    value = row["value"]
    return {
        "messageId": str(mid),
        "key": row["key"],
        "value": value,
        "properties": dict(row["properties"] or []),
        "publishTime": row["publish_time"],
        "eventTime": row.get("event_time"),
        "producerName": row["producer_name"],
        "sequenceId": row.get("sequence_id"),
    }


def _earliest_known(times: list[int | None]) -> int | None:
    """The earliest of ``times``; None if there are none or any is unknown (a partition
    created before creation times were recorded may be the oldest)."""
    if not times or any(t is None for t in times):
        return None
    return min(t for t in times if t is not None)
