"""Topic administration: create, look up, list and delete topics, partitioned or not.

A non-partitioned topic (or a partition) exists when its manifest version 0 exists; a
partitioned topic exists when its ``partitioned.json`` exists (its partitions are created with
it). Creation uses put-if-absent, so concurrent creators agree on one outcome.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from filepulsar.storage import paths
from filepulsar.storage.blobstore import BlobNotFound, BlobStore
from filepulsar.storage.errors import (
    CorruptDataError,
    InvalidConfiguration,
    InvalidTopicName,
    ProducerBusy,
    TopicAlreadyExists,
    TopicNotFound,
)
from filepulsar.storage.manifest import ManifestStore
from filepulsar.storage.names import DOMAINS, TopicName
from filepulsar.storage.policies import effective_policies

MAX_PARTITIONS = 10000


def _topic(t: TopicName | str) -> TopicName:
    return TopicName.parse(t) if isinstance(t, str) else t


def partitions_of(store: BlobStore, topic: TopicName | str) -> int | None:
    """N for a partitioned topic, 0 for a non-partitioned one, None if it does not exist."""
    t = _topic(topic)
    try:
        raw = store.get(paths.partitioned_metadata(t))
    except BlobNotFound:
        return 0 if ManifestStore(store, t).exists() else None
    try:
        n = int(json.loads(raw)["partitions"])
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptDataError(f"partitioned metadata of {t} is unreadable") from e
    return n


def create_topic(store: BlobStore, topic: TopicName | str, partitions: int = 0) -> TopicName:
    """Create a topic; ``partitions`` > 0 makes a partitioned topic of that many partitions.

    Raises
    ------
    TopicAlreadyExists
        If the topic (partitioned or not) exists.
    InvalidTopicName
        If ``topic`` names a partition (``-partition-<i>``) directly.
    """
    t = _topic(topic)
    if (
        not isinstance(partitions, int)
        or isinstance(partitions, bool)
        or not (0 <= partitions <= MAX_PARTITIONS)
    ):
        raise InvalidConfiguration(
            f"partitions must be an integer from 0 to {MAX_PARTITIONS}, got {partitions!r}"
        )
    if t.partition_index >= 0:
        raise InvalidTopicName(
            f"{t} names a partition of {t.base}; create the partitioned topic instead"
        )
    if partitions_of(store, t) is not None:
        raise TopicAlreadyExists(f"topic {t} already exists")
    if partitions == 0:
        if not ManifestStore(store, t).create():
            raise TopicAlreadyExists(f"topic {t} already exists")
        return t
    meta = json.dumps({"partitions": partitions}).encode()
    if not store.put_if_absent(paths.partitioned_metadata(t), meta):
        raise TopicAlreadyExists(f"topic {t} already exists")
    for i in range(partitions):
        ManifestStore(store, t.partition(i)).create()
    return t


def ensure_topic(store: BlobStore, topic: TopicName | str, *, auto_create: bool = True) -> int:
    """Return the topic's partition count (0: non-partitioned), creating it if allowed.

    Auto-creation follows the namespace's policies (``allow_auto_topic_creation``,
    ``auto_topic_creation_type``, ``default_num_partitions``), as Pulsar's broker does on the
    first produce or subscribe.

    Raises
    ------
    TopicNotFound
        If the topic does not exist and may not be created.
    """
    t = _topic(topic)
    n = partitions_of(store, t)
    if n is not None:
        return n
    if t.partition_index >= 0:
        parent = partitions_of(store, t.base)
        if parent is not None and parent > t.partition_index:
            ManifestStore(store, t).create()
            return 0
        raise TopicNotFound(f"topic {t} does not exist (no partitioned topic {t.base})")
    pol = effective_policies(store, t)
    if not (auto_create and pol.allow_auto_topic_creation):
        raise TopicNotFound(f"topic {t} does not exist and auto-creation is disabled")
    want = pol.default_num_partitions if pol.auto_topic_creation_type == "partitioned" else 0
    try:
        create_topic(store, t, want)
    except TopicAlreadyExists:
        pass  # a concurrent creator won; use what it made
    n = partitions_of(store, t)
    assert n is not None
    return n


def require_topic(store: BlobStore, topic: TopicName | str) -> int:
    """The partition count of an existing topic; TopicNotFound otherwise."""
    t = _topic(topic)
    n = partitions_of(store, t)
    if n is None:
        raise TopicNotFound(f"topic {t} does not exist")
    return n


def _expand(t: TopicName, partitions: int) -> list[TopicName]:
    """The managed ledgers of ``t`` given its partition count (0: ``t`` itself)."""
    return [t.partition(i) for i in range(partitions)] if partitions else [t]


def managed_ledgers(store: BlobStore, topic: TopicName | str) -> list[TopicName]:
    """The managed ledgers of an existing topic: its partitions in order if it is partitioned,
    else the topic itself (also when ``topic`` names one partition).

    Raises
    ------
    TopicNotFound
        If the topic does not exist.
    """
    t = _topic(topic)
    return _expand(t, require_topic(store, t))


@dataclass(frozen=True)
class TopicInfo:
    name: TopicName
    partitions: int  # 0: non-partitioned

    def managed_ledgers(self) -> list[TopicName]:
        """Its partitions in order if it is partitioned, else the topic itself."""
        return _expand(self.name, self.partitions)


def list_topics(
    store: BlobStore, tenant: str = "public", namespace: str = "default", domain: str | None = None
) -> list[TopicInfo]:
    """The topics of a namespace; partitions of partitioned topics are not listed separately."""
    out = []
    for dom in (domain,) if domain else DOMAINS:
        if dom not in DOMAINS:
            raise InvalidTopicName(f"domain {dom!r} is not one of {', '.join(DOMAINS)}")
        children = store.list_dirs(paths.namespace_topics(dom, tenant, namespace))
        partitioned = set()
        infos = []
        for name in children:
            try:
                t = TopicName(dom, tenant, namespace, name)
            except InvalidTopicName:
                continue
            n = partitions_of(store, t)
            if n is None:
                continue
            if n > 0:
                partitioned.add(name)
            infos.append(TopicInfo(t, n))
        for info in infos:
            base = info.name.base
            if info.name.partition_index >= 0 and base.local_name in partitioned:
                continue
            out.append(info)
    return sorted(out, key=lambda i: str(i.name))


def list_namespaces(store: BlobStore) -> list[str]:
    """``tenant/namespace`` of every namespace with topics or policies."""
    found = set()
    for dom in DOMAINS:
        for tenant in store.list_dirs(f"topics/{dom}"):
            for ns in store.list_dirs(f"topics/{dom}/{tenant}"):
                found.add(f"{tenant}/{ns}")
    for tenant in store.list_dirs(paths.namespaces_root()):
        for ns in store.list_dirs(f"{paths.namespaces_root()}/{tenant}"):
            found.add(f"{tenant}/{ns}")
    return sorted(found)


def delete_topic(store: BlobStore, topic: TopicName | str, *, force: bool = False) -> None:
    """Delete a topic and all its data (every partition of a partitioned topic).

    Refused while a producer holds a live lease on it unless ``force``.

    Raises
    ------
    TopicNotFound, ProducerBusy
    """
    t = _topic(topic)
    parts = managed_ledgers(store, t)
    if not force:
        for p in parts:
            ms = ManifestStore(store, p)
            state = ms.latest()
            now = ms.clock()
            live = [name for name, lease in state.producers.items() if lease.expires_ms > now]
            if live:
                raise ProducerBusy(
                    f"topic {p} has connected producers {live}; close them or use force=True"
                )
    for p in parts:
        store.delete_prefix(paths.topic_dir(p))
    store.delete_prefix(paths.topic_dir(t))
