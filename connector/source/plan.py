"""Planning the Spark source's tasks on the driver.

Owns which managed ledgers a query reads (:func:`resolve_partitions`: named topics, created
when auto-creation allows, or a pattern's matches) and the split of each partition's range
(start, end] into :class:`~filepulsar.connector.source.partition.FilePulsarPartition` tasks of
bounded entry count (:func:`plan_partitions`), reporting what retention or a deleted topic lost
on the way.
"""

from __future__ import annotations

import logging
from typing import Any

from filepulsar.connector.source.offsets import START, PartitionOffset, recreated_between
from filepulsar.connector.source.options import SourceOptions, parse_topic_pattern
from filepulsar.connector.source.partition import FilePulsarPartition
from filepulsar.storage import (
    ManagedLedger,
    TopicName,
    TopicNotFound,
    effective_policies,
    ensure_topic,
    paths,
)
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.compaction import load_view
from filepulsar.storage.manifest import ManifestState
from filepulsar.storage.read_range import (
    WHOLE,
    after,
    check_trimmed,
    data_loss,
    recreated_message,
)
from filepulsar.storage.topics import managed_ledgers, match_topics

log = logging.getLogger(__name__)


def _missing_topic(store: BlobStore, name: str) -> TopicNotFound:
    return TopicNotFound(
        f"filepulsar source: topic {name} does not exist under root {store.root}; create it "
        "(filepulsar topics create), allow auto-creation in the namespace's policies "
        "(allow_auto_topic_creation) for a stream, or set waitingForNonExistedTopic=true on a "
        "stream to start before it exists"
    )


def _empty_root(store: BlobStore, name: str) -> TopicNotFound:
    return TopicNotFound(
        f"filepulsar source: root {store.root} holds no topics and no namespace policies, so "
        f"topic {name} is not created there (a stream never creates a root's first topic: on "
        "a mistyped root it would wait for ever); check the root, create the topic "
        "(filepulsar topics create), or set waitingForNonExistedTopic=true to wait for it"
    )


def holds_nothing(store: BlobStore) -> bool:
    """Whether the root holds no topic and no namespace policies: a new or mistyped root."""
    return not store.list_dirs(paths.topics_root()) and not store.list_dirs(paths.namespaces_root())


def resolve_partitions(
    store: BlobStore, opts: SourceOptions, *, create: bool = False, wait: bool = False
) -> list[TopicName]:
    """The managed ledgers (partitions, or non-partitioned topics) the options name, sorted.

    A named topic that does not exist is created when ``create`` and the namespace's
    auto-creation policy allow it (as a Pulsar consumer subscribing does) -- unless the root
    holds nothing yet (:func:`holds_nothing`: a reader never creates a root's first topic, so
    a mistyped root is an error, not a new empty store) --, left out when ``wait`` (it joins
    when it appears), and an error otherwise.

    Raises
    ------
    TopicNotFound
        For a named topic that does not exist (naming the root).
    """
    if opts.pattern:
        infos = match_topics(store, parse_topic_pattern(opts.pattern))
        out = [p for i in infos for p in i.managed_ledgers()]
        return sorted(out, key=str)
    out = []
    empty: bool | None = None  # the root holds nothing (checked once, when it matters)
    for name in opts.topics:
        try:
            out += managed_ledgers(store, name)
            continue
        except TopicNotFound:
            pass
        if create and empty is None:
            empty = holds_nothing(store)
        if (
            create
            and not empty
            and effective_policies(store, TopicName.parse(name)).allow_auto_topic_creation
        ):
            ensure_topic(store, name)
            log.info("filepulsar source: created topic %s (namespace auto-creation)", name)
            out += managed_ledgers(store, name)
        elif not wait:
            raise _empty_root(store, name) if empty else _missing_topic(store, name)
    return sorted(out, key=str)


def plan_partitions(
    store: BlobStore,
    opts: SourceOptions,
    start: dict[str, PartitionOffset],
    end: dict[str, PartitionOffset],
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
        if recreated_between(s, e):
            s = START.at(e.incarnation)  # a topic created again is read from its start
        tail = topic in end_latest
        if not tail and (s == e or e.position < s.position):
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
                    f"{s.ledger_id}:{s.entry_id} were lost",
                    opts.fail_on_data_loss,
                )
                continue
        if e.incarnation and m.incarnation and m.incarnation != e.incarnation:
            data_loss(
                recreated_message(topic, e.incarnation, m.incarnation), opts.fail_on_data_loss
            )
            continue
        ok = topic in loss_ok
        horizon = None
        if opts.read_compacted:
            view = load_view(store, t, m.incarnation)
            if view is not None and s.position < view.horizon:
                horizon = view.horizon  # the view stands for what retention deleted before it
        if (
            not ok
            and check_trimmed(
                topic, m, s.task if horizon is None else (*horizon, WHOLE), opts.fail_on_data_loss
            )
            and horizon is None
        ):
            # Reported here, once: the tasks start after what retention deleted (a task
            # reports only what retention deletes after this plan).
            s = PartitionOffset(*m.trimmed_last, WHOLE, s.incarnation)
        first = after(m, ml, s.task)
        if first is None or first > e.position:
            if tail or horizon is not None:
                parts.append(_part(opts, topic, s, e, filt, m, end_latest=tail, loss_ok=ok))
            continue
        # Count entries in (start, end] by ledger and cut into chunks.
        chunk_start = s
        count = 0
        for lg in m.ledgers_from(first.ledger_id):
            if not lg.entries or lg.ledger_id > e.ledger_id:
                continue
            lo = first.entry_id if lg.ledger_id == first.ledger_id else 0
            hi = min(lg.entries - 1, e.entry_id) if lg.ledger_id == e.ledger_id else lg.entries - 1
            eid = lo
            while eid <= hi:
                take = min(hi - eid + 1, opts.max_entries_per_task - count)
                eid += take
                count += take
                if count >= opts.max_entries_per_task:
                    cut = PartitionOffset(lg.ledger_id, eid - 1)
                    if cut.position >= e.position:
                        break
                    parts.append(_part(opts, topic, chunk_start, cut, filt, m, loss_ok=ok))
                    chunk_start, count = cut, 0
        parts.append(_part(opts, topic, chunk_start, e, filt, m, end_latest=tail, loss_ok=ok))
    return parts


def _part(
    opts: SourceOptions,
    topic: str,
    s: PartitionOffset,
    e: PartitionOffset,
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
        start=s.task,
        end=e.task,
        fail_on_data_loss=opts.fail_on_data_loss,
        property_filter=filt,
        incarnation=m.incarnation,
        end_latest=end_latest,
        loss_ok=loss_ok,
        columns=opts.emit,
        value=opts.value,
        read_compacted=opts.read_compacted,
    )
