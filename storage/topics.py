"""Topic administration: create, look up, list and delete topics, partitioned or not.

A non-partitioned topic (or a partition) exists when its manifest version 0 exists; a
partitioned topic exists when its ``partitioned.json`` exists (its partitions are created with
it). Creation uses put-if-absent, so concurrent creators agree on one outcome.

Every creation gets an *incarnation*, a random id (in the manifest, and for a partitioned
topic also in ``partitioned.json`` and each partition's manifest): a topic deleted and created
again under the same name is recognisably another topic, so a reader's old position in it is
never taken for a position in the new one.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from filepulsar.storage import jsontext, paths
from filepulsar.storage.blobstore import BlobNotFound
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.errors import (
    AlreadyExists,
    ConsumerBusy,
    CorruptDataError,
    FilePulsarError,
    InvalidConfiguration,
    InvalidTopicName,
    NamespaceNotFound,
    NotEmpty,
    ProducerBusy,
    TenantNotFound,
    TopicAlreadyExists,
    TopicNotFound,
)
from filepulsar.storage.manifest import ManifestStore
from filepulsar.storage.names import DOMAINS, TopicName, validate_segment
from filepulsar.storage.policies import effective_policies

#: Most partitions a partitioned topic may have (Pulsar's ``maxNumPartitionsPerPartitionedTopic``
#: is unlimited by default; a bound keeps a damaged or hostile ``partitioned.json`` from making
#: every reader open millions of ledgers).
MAX_PARTITIONS = 10000


def _topic(t: TopicName | str) -> TopicName:
    return TopicName.parse(t) if isinstance(t, str) else t


@dataclass(frozen=True)
class PartitionedMetadata:
    """The content of a partitioned topic's ``partitioned.json``."""

    partitions: int
    incarnation: str  # "" in files written before incarnations existed

    def encode(self) -> bytes:
        return jsontext.encode_framed(
            {"partitions": self.partitions, "incarnation": self.incarnation}
        )

    @classmethod
    def decode(cls, raw: bytes, where: str) -> PartitionedMetadata:
        """Parse and verify; ``where`` names the file in errors. Reads both the framed form
        (JSON line + ``crc32c=`` line) and the older bare JSON object.

        Raises
        ------
        CorruptDataError
            If the checksum fails, the JSON does not parse, or the partition count is not an
            integer from 1 to :data:`MAX_PARTITIONS`.
        """
        if jsontext.is_framed(raw):
            d = jsontext.decode_framed(raw, where)
        else:  # the older form: one JSON object, no checksum
            try:
                d = jsontext.loads(raw)
            except ValueError as e:
                raise CorruptDataError(f"{where} is not valid JSON") from e
        n = d.get("partitions") if isinstance(d, dict) else None
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_PARTITIONS:
            raise CorruptDataError(
                f"{where}: 'partitions' must be an integer from 1 to {MAX_PARTITIONS}, got {n!r}"
            )
        inc = d.get("incarnation", "")
        if not isinstance(inc, str):
            raise CorruptDataError(f"{where}: 'incarnation' must be a string, got {inc!r}")
        return cls(n, inc)


def read_partitioned(store: BlobStore, topic: TopicName | str) -> PartitionedMetadata | None:
    """The ``partitioned.json`` of ``topic``, None if it has none (a non-partitioned topic or
    no topic at all).

    Raises
    ------
    CorruptDataError
        If the file is damaged (naming the file).
    """
    t = _topic(topic)
    key = paths.partitioned_metadata(t)
    try:
        raw = store.get(key)
    except BlobNotFound:
        return None
    return PartitionedMetadata.decode(raw, f"{store.root}/{key}")


def partitions_of(store: BlobStore, topic: TopicName | str) -> int | None:
    """N for a partitioned topic, 0 for a non-partitioned one, None if it does not exist.

    Raises
    ------
    CorruptDataError
        If ``partitioned.json`` is damaged, or missing while the topic's partitions exist (so
        that nobody creates an empty topic over them).
    """
    t = _topic(topic)
    meta = read_partitioned(store, t)
    if meta is not None:
        return meta.partitions
    if ManifestStore(store, t).exists():
        return 0
    if t.partition_index < 0 and ManifestStore(store, t.partition(0)).exists():
        raise CorruptDataError(
            f"{store.root}/{paths.partitioned_metadata(t)} is missing but partitions of {t} "
            f"exist ({t.partition(0)} ...): the partition count is lost; restore the file "
            '(e.g. {"partitions": N}) or delete the partitions\' folders'
        )
    return None


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
    incarnation = uuid.uuid4().hex
    if partitions == 0:
        if not ManifestStore(store, t).create(incarnation=incarnation):
            raise TopicAlreadyExists(f"topic {t} already exists")
        return t
    meta = PartitionedMetadata(partitions, incarnation).encode()
    if not store.put_if_absent(paths.partitioned_metadata(t), meta):
        raise TopicAlreadyExists(f"topic {t} already exists")
    for i in range(partitions):
        ManifestStore(store, t.partition(i)).create(incarnation=incarnation)
    return t


def update_partitioned_topic(
    store: BlobStore, topic: TopicName | str, partitions: int
) -> tuple[int, int]:
    """Raise a partitioned topic's partition count to ``partitions`` (Pulsar's
    ``pulsar-admin topics update-partitioned-topic -p N``: the count only grows).

    The new partitions' managed ledgers are created first, then ``partitioned.json`` is
    rewritten, so a reader that sees the new count finds every partition. Running Spark
    queries pick the new partitions up from their start; producers, consumers and readers
    opened before see the count they started with (re-open them to use the new partitions).
    Two concurrent updates may leave the smaller count (the file is replaced, not
    conditionally): run one at a time.

    Returns
    -------
    (old, new)
        The partition counts before and after.

    Raises
    ------
    TopicNotFound
        If the topic does not exist.
    InvalidConfiguration
        If the topic is not partitioned, or ``partitions`` is not larger than the current
        count or above :data:`MAX_PARTITIONS`.
    """
    t = _topic(topic)
    if t.partition_index >= 0:
        raise InvalidTopicName(f"{t} names a partition of {t.base}; update {t.base} instead")
    meta = read_partitioned(store, t)
    if meta is None:
        if partitions_of(store, t) is None:
            raise TopicNotFound(f"topic {t} does not exist")
        raise InvalidConfiguration(
            f"topic {t} is not partitioned; only a partitioned topic's partitions can be added"
        )
    if (
        not isinstance(partitions, int)
        or isinstance(partitions, bool)
        or not meta.partitions < partitions <= MAX_PARTITIONS
    ):
        raise InvalidConfiguration(
            f"topic {t} has {meta.partitions} partitions; the new count must be an integer "
            f"from {meta.partitions + 1} to {MAX_PARTITIONS} (partitions can only be added), "
            f"got {partitions!r}"
        )
    for i in range(meta.partitions, partitions):
        ManifestStore(store, t.partition(i)).create(incarnation=meta.incarnation)
    store.put(
        paths.partitioned_metadata(t),
        PartitionedMetadata(partitions, meta.incarnation).encode(),
    )
    return meta.partitions, partitions


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
        parent = read_partitioned(store, t.base)
        if parent is not None and parent.partitions > t.partition_index:
            ManifestStore(store, t).create(incarnation=parent.incarnation)
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


_LITERAL_SEGMENT = re.compile(r"[A-Za-z0-9_\-=:.%]+")


@dataclass(frozen=True)
class TopicPattern:
    """A topics pattern, parsed once: the one rule by which the client's pattern consumers
    and the Spark source's ``topicsPattern`` find their topics.

    ``[domain://]tenant/namespace/<regex>``: the tenant and namespace are literal (topics are
    listed in that one namespace, as Pulsar's broker lists a namespace's topics for a pattern
    consumer); the regex must match ``tenant/namespace/<local name>`` in full. A bare regex
    (no ``/``) means ``public/default/<regex>``. The domain is the pattern's own
    (``persistent`` when it names none) unless ``domains`` is given (pulsar-client's
    ``regex_subscription_mode`` picks the domains and ignores the pattern's).
    """

    domains: tuple[str, ...]
    tenant: str
    namespace: str
    regex: re.Pattern[str]

    @classmethod
    def parse(
        cls, pattern: str | re.Pattern[str], *, domains: tuple[str, ...] | None = None
    ) -> TopicPattern:
        """Parse ``pattern`` (a compiled pattern keeps its flags).

        Raises
        ------
        InvalidConfiguration
            Naming the pattern and the form allowed.
        """
        raw = pattern.pattern if isinstance(pattern, re.Pattern) else pattern
        flags = pattern.flags if isinstance(pattern, re.Pattern) else 0
        domain, body = raw.split("://", 1) if "://" in raw else ("persistent", raw)
        if "/" not in body:
            body = "public/default/(?:" + body + ")"
        parts = body.split("/", 2)
        if (
            (domains is None and domain not in DOMAINS)
            or len(parts) < 3
            or not all(_LITERAL_SEGMENT.fullmatch(seg) for seg in parts[:2])
        ):
            raise InvalidConfiguration(
                f"topic pattern {raw!r} must name its tenant and namespace literally, e.g. "
                "'persistent://public/default/orders-.*' (or be a bare regex, in public/default)"
            )
        try:
            regex = re.compile(body, flags)
        except re.error as e:
            raise InvalidConfiguration(
                f"topic pattern {raw!r} is not a regular expression: {e}"
            ) from e
        return cls(domains if domains is not None else (domain,), parts[0], parts[1], regex)

    def matches(self, name: TopicName) -> bool:
        """Whether topic ``name`` (a partition counts as its topic) is one of the pattern's."""
        base = name.base
        return (
            base.domain in self.domains
            and self.regex.fullmatch(f"{base.tenant}/{base.namespace}/{base.local_name}")
            is not None
        )


def match_topics(store: BlobStore, pattern: TopicPattern) -> list[TopicInfo]:
    """The topics that exist now and match ``pattern``, sorted by name."""
    out = [
        info
        for domain in pattern.domains
        for info in list_topics(store, pattern.tenant, pattern.namespace, domain)
        if pattern.matches(info.name)
    ]
    return sorted(out, key=lambda i: str(i.name))


def list_namespaces(store: BlobStore) -> list[str]:
    """``tenant/namespace`` of every namespace with topics or policies."""
    found = set()
    for dom in DOMAINS:
        for tenant in store.list_dirs(paths.domain_dir(dom)):
            for ns in store.list_dirs(paths.tenant_dir(dom, tenant)):
                found.add(f"{tenant}/{ns}")
    for tenant in store.list_dirs(paths.namespaces_root()):
        for ns in store.list_dirs(paths.policy_tenant_dir(tenant)):
            found.add(f"{tenant}/{ns}")
    return sorted(found)


def _tenant_marker(tenant: str) -> str:
    return paths.tenant_marker(tenant)


#: The file that registers a tenant created with no namespace yet.
TENANT_MARKER = paths.TENANT_MARKER


def list_tenants(store: BlobStore) -> list[str]:
    """Every tenant with a namespace, a topic or a registration (:func:`create_tenant`)."""
    found = {ns.split("/", 1)[0] for ns in list_namespaces(store)}
    found.update(store.list_dirs(paths.namespaces_root()))
    return sorted(found)


def create_tenant(store: BlobStore, tenant: str) -> None:
    """Register a tenant (tenants also come into being with their first namespace or topic).

    Raises
    ------
    AlreadyExists, InvalidTopicName
    """
    validate_segment(tenant, "tenant")
    if tenant in list_tenants(store) or not store.put_if_absent(
        _tenant_marker(tenant), jsontext.encode_framed({})
    ):
        raise AlreadyExists(f"tenant {tenant} already exists")


def delete_tenant(store: BlobStore, tenant: str) -> None:
    """Delete an empty tenant (its registration).

    Raises
    ------
    TenantNotFound, NotEmpty
    """
    if tenant not in list_tenants(store):
        raise TenantNotFound(f"tenant {tenant} does not exist")
    held = [ns for ns in list_namespaces(store) if ns.split("/", 1)[0] == tenant]
    if held:
        raise NotEmpty(f"tenant {tenant} still has namespaces {held}; delete them first")
    store.delete_prefix(paths.policy_tenant_dir(tenant))


def split_namespace(namespace: str) -> tuple[str, str]:
    """``"tenant/namespace"`` as its two validated segments.

    Raises
    ------
    InvalidTopicName
        If it is not two segments, or a segment is not allowed.
    """
    tenant, sep, ns = namespace.partition("/")
    if not sep or "/" in ns:
        raise InvalidTopicName(f"namespace {namespace!r} must be tenant/namespace")
    validate_segment(tenant, "tenant")
    validate_segment(ns, "namespace")
    return tenant, ns


def create_namespace(store: BlobStore, namespace: str) -> None:
    """Register ``tenant/namespace`` (writes its empty policy file; namespaces also come into
    being with their first topic).

    Raises
    ------
    AlreadyExists, InvalidTopicName
    """
    tenant, ns = split_namespace(namespace)
    if f"{tenant}/{ns}" in list_namespaces(store) or not store.put_if_absent(
        paths.namespace_policies(tenant, ns), jsontext.encode_framed({})
    ):
        raise AlreadyExists(f"namespace {tenant}/{ns} already exists")


def delete_namespace(store: BlobStore, namespace: str, *, force: bool = False) -> None:
    """Delete a namespace's policies; with ``force`` its topics too (each as
    :func:`delete_topic` with ``force``), else it must have none (Pulsar's rule).

    Raises
    ------
    NamespaceNotFound, NotEmpty, InvalidTopicName
    """
    tenant, ns = split_namespace(namespace)
    if f"{tenant}/{ns}" not in list_namespaces(store):
        raise NamespaceNotFound(f"namespace {tenant}/{ns} does not exist")
    topics = list_topics(store, tenant, ns)
    if topics and not force:
        names = ", ".join(str(t.name) for t in topics[:5])
        more = f" and {len(topics) - 5} more" if len(topics) > 5 else ""
        raise NotEmpty(
            f"namespace {tenant}/{ns} still has topics ({names}{more}); delete them or use force"
        )
    for info in topics:
        delete_topic(store, info.name, force=True)
    for dom in DOMAINS:
        store.delete_prefix(paths.namespace_topics(dom, tenant, ns))
    store.delete_prefix(paths.policy_namespace_dir(tenant, ns))


def delete_topic(store: BlobStore, topic: TopicName | str, *, force: bool = False) -> None:
    """Delete a topic and all its data (every partition of a partitioned topic).

    Refused, unless ``force``, while a producer holds a live lease on it or a consumer is
    connected to one of its subscriptions (Pulsar refuses both without ``-f``).

    Raises
    ------
    TopicNotFound, ProducerBusy, ConsumerBusy
    """
    from filepulsar.storage.subscriptions import SubscriptionStore, list_subscriptions

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
                    f"topic {p} has connected producers {live}; close them or delete with "
                    "force (force=True, or --force on the command line)"
                )
            for sub in list_subscriptions(store, p):
                try:
                    consumers = SubscriptionStore(store, p, sub).latest().live_consumers(now)
                except FilePulsarError:
                    continue  # deleted meanwhile, or unreadable: no consumer to protect
                if consumers:
                    raise ConsumerBusy(
                        f"topic {p} has consumers connected to subscription {sub!r} "
                        f"({', '.join(c.name for c in consumers)}); close them or delete "
                        "with force (force=True, or --force on the command line)"
                    )
    for p in parts:
        store.delete_prefix(paths.topic_dir(p))
    store.delete_prefix(paths.topic_dir(t))
