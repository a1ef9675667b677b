"""Every storage key in one place. No other module builds a path.

Layout under the root (ids zero-padded to 20 digits so listings sort numerically)::

    namespaces/<tenant>/<namespace>/policies.json
    topics/<domain>/<tenant>/<namespace>/<topic>/
        partitioned.json                     partitioned topic: {"partitions": N}
        policies.json                        topic-level policy overrides
        manifest/<version>.json              managed-ledger state, one file per version
        manifest/<first>.journal             on a local disk: a journal segment (its versions
                                             from <first> on) instead of version files
        data/<blob>.entries                  entry data written by one producer session
        ledgers/<ledger>-<version>-<nonce>.index  fragment list of a closed ledger
        catalog/<first>-<last>-<nonce>.catalog    closed ledgers <first>..<last> (manifest 2)
        manifest/<version>.turn              commit-turn marker of a contended version
        subscriptions/<name>/state/<version>.json  a durable subscription's state
        subscriptions/<name>/subscription.json  its creation record (written after version 0)
        schema/<version>.json                schema registry (of the partitioned topic)
        compaction/state/<version>.json      the compacted view's state
        compaction/data/<blob>.entries|.index  the compacted view's entries and index
    maintenance/all/lease/<version>.json     the lease of ``filepulsar maintain`` (every
    maintenance/tenants/<tenant>/lease/       namespace, one tenant's, or one namespace's)
    maintenance/namespaces/<tenant>/<namespace>/lease/

Every versioned folder (``manifest/``, ``state/``, ``lease/``) holds version files or, on a
local disk, journal segments (:func:`journal_segment`). A file being written there, or
anywhere on a local disk, has the temporary name :func:`temp_name` until it is linked.

Keys the manifest records relative to the topic folder (ledger indexes, catalog segments)
become keys through :func:`topic_key`. Staged sink blob ids are
``<writer>.<batch>.<partition>.<attempt>.<nonce>.<n>`` (:func:`staged_blob_stem`).
"""

from __future__ import annotations

from filepulsar.storage.names import TopicName, validate_segment

MANIFEST_SUFFIX = ".json"
DATA_SUFFIX = ".entries"
INDEX_SUFFIX = ".index"
CATALOG_SUFFIX = ".catalog"
CATALOG_DIR = "catalog"
TURN_SUFFIX = ".turn"
#: A journal segment file's suffix (its name is the version of its first record).
JOURNAL_SUFFIX = ".journal"
#: Suffix of the temporary files a local store writes next to their final name
#: (:func:`temp_name`): never listed, and deleted by recovery once no writer can use them.
TMP_SUFFIX = ".tmp"
TENANT_MARKER = "tenant.json"
SCHEMA_SUFFIX = ".json"


def namespace_policies(tenant: str, namespace: str) -> str:
    validate_segment(tenant, "tenant")
    validate_segment(namespace, "namespace")
    return f"namespaces/{tenant}/{namespace}/policies.json"


def namespaces_root() -> str:
    return "namespaces"


def policy_tenant_dir(tenant: str) -> str:
    """Folder of a tenant's namespace policies (and its registration marker)."""
    validate_segment(tenant, "tenant")
    return f"{namespaces_root()}/{tenant}"


def policy_namespace_dir(tenant: str, namespace: str) -> str:
    """Folder of one namespace's policies."""
    validate_segment(namespace, "namespace")
    return f"{policy_tenant_dir(tenant)}/{namespace}"


def tenant_marker(tenant: str) -> str:
    """The file that registers a tenant created with no namespace yet."""
    return f"{policy_tenant_dir(tenant)}/{TENANT_MARKER}"


def topics_root() -> str:
    """Folder of every topic (one folder per domain below it)."""
    return "topics"


def domain_dir(domain: str) -> str:
    """Folder of every topic of one domain (``persistent``/``non-persistent``)."""
    return f"{topics_root()}/{domain}"


def tenant_dir(domain: str, tenant: str) -> str:
    """Folder of one tenant's namespaces within a domain."""
    validate_segment(tenant, "tenant")
    return f"{domain_dir(domain)}/{tenant}"


def namespace_topics(domain: str, tenant: str, namespace: str) -> str:
    """Folder holding one folder per topic of the namespace."""
    validate_segment(tenant, "tenant")
    validate_segment(namespace, "namespace")
    return f"topics/{domain}/{tenant}/{namespace}"


def topic_dir(topic: TopicName) -> str:
    return f"topics/{topic.domain}/{topic.tenant}/{topic.namespace}/{topic.local_name}"


def topic_key(topic: TopicName, relative: str) -> str:
    """The key of ``relative``, a key the manifest records relative to the topic's folder
    (a ledger index, a catalog segment)."""
    return f"{topic_dir(topic)}/{relative}"


def topic_relative(topic: TopicName, key: str) -> str:
    """``key`` (under the topic's folder) relative to that folder, as the manifest records
    it; :func:`topic_key` turns it back.

    Raises
    ------
    ValueError
        If ``key`` is not under the topic's folder.
    """
    prefix = f"{topic_dir(topic)}/"
    if not key.startswith(prefix):
        raise ValueError(f"key {key!r} is not under {prefix!r}")
    return key[len(prefix) :]


def partitioned_metadata(topic: TopicName) -> str:
    return f"{topic_dir(topic)}/partitioned.json"


def topic_policies(topic: TopicName) -> str:
    return f"{topic_dir(topic)}/policies.json"


def schema_dir(topic: TopicName) -> str:
    """The schema versions of a topic (kept under the partitioned topic, not a partition)."""
    return f"{topic_dir(topic.base)}/schema"


def manifest_dir(topic: TopicName) -> str:
    return f"{topic_dir(topic)}/manifest"


def manifest(topic: TopicName, version: int) -> str:
    return versioned_file(manifest_dir(topic), version)


def manifest_version(key: str) -> int | None:
    """The version of a manifest key, or None if ``key`` is not a manifest file."""
    return _version_of(key, MANIFEST_SUFFIX)


def versioned_file(folder: str, version: int) -> str:
    """Version ``version`` of a versioned state (manifest, subscription, compaction state)
    kept in ``folder``; :func:`manifest` is this for a topic's manifest folder."""
    return f"{folder}/{version:020d}{MANIFEST_SUFFIX}"


def turn_file(folder: str, version: int) -> str:
    """The commit-turn marker of ``version`` in a versioned state's ``folder``."""
    return f"{folder}/{version:020d}{TURN_SUFFIX}"


def turn_version(key: str) -> int | None:
    """The version of a commit-turn key, or None if ``key`` is not one."""
    return _version_of(key, TURN_SUFFIX)


def journal_segment(first: int) -> str:
    """The name (in a versioned state's folder) of the journal segment whose first record is
    version ``first``."""
    return f"{first:020d}{JOURNAL_SUFFIX}"


def journal_first(name: str) -> int | None:
    """The first version of a journal segment's name (or key), or None if it is not one."""
    return _version_of(name, JOURNAL_SUFFIX)


def temp_name(name: str, nonce: str) -> str:
    """``.<name>.<nonce>.tmp``: the hidden name a file is written under before it is linked
    as ``name`` in the same folder."""
    return f".{name}.{nonce}{TMP_SUFFIX}"


def journal_segment_temp(first: int, nonce: str) -> str:
    """The temporary name of :func:`journal_segment` ``first`` while it is written."""
    return temp_name(journal_segment(first), nonce)


def _version_of(key: str, suffix: str) -> int | None:
    name = key.rsplit("/", 1)[-1]
    if not name.endswith(suffix):
        return None
    stem = name[: -len(suffix)]
    return int(stem) if stem.isdigit() and len(stem) == 20 else None


def schema_version_of(key: str) -> int | None:
    """The version number of a stored schema's key (``<n>.json`` in :func:`schema_dir`)."""
    name = key.rsplit("/", 1)[-1]
    if not name.endswith(SCHEMA_SUFFIX):
        return None
    stem = name[: -len(SCHEMA_SUFFIX)]
    return int(stem) if stem.isdigit() else None


def data_dir(topic: TopicName) -> str:
    return f"{topic_dir(topic)}/data"


def data_blob(topic: TopicName, blob_id: str) -> str:
    validate_segment(blob_id, "blob id")
    return f"{data_dir(topic)}/{blob_id}{DATA_SUFFIX}"


def session_blob_id(session: str, seq: int) -> str:
    """``<session>-<seq:06d>``: the id of a producer session's ``seq``-th data blob."""
    return f"{session}-{seq:06d}"


def blob_id_of(key: str) -> str | None:
    name = key.rsplit("/", 1)[-1]
    return name[: -len(DATA_SUFFIX)] if name.endswith(DATA_SUFFIX) else None


def ledger_index(topic: TopicName, ledger_id: int, version: int, nonce: str) -> str:
    """Key of a closed ledger's index, written by the commit attempt that makes ``version``.

    ``nonce`` (lowercase hex, random per attempt) makes the name unique, so a writer that
    loses the commit race never overwrites the index the winner's manifest names.
    """
    if not nonce or not all(c in "0123456789abcdef" for c in nonce):
        raise ValueError(f"index nonce must be lowercase hex, got {nonce!r}")
    return f"{topic_dir(topic)}/ledgers/{ledger_id:020d}-{version:020d}-{nonce}{INDEX_SUFFIX}"


def parse_ledger_index(key: str) -> tuple[int, int, str] | None:
    """``(ledger id, version, nonce)`` of a ledger index key, or None if ``key`` is not one.

    Names written before nonces existed (``<ledger>-<version>.index``) give nonce ``""``.
    """
    name = key.rsplit("/", 1)[-1]
    if not name.endswith(INDEX_SUFFIX):
        return None
    parts = name[: -len(INDEX_SUFFIX)].split("-")
    if len(parts) not in (2, 3) or not all(
        len(p) == 20 and p.isascii() and p.isdigit() for p in parts[:2]
    ):
        return None
    nonce = parts[2] if len(parts) == 3 else ""
    if len(parts) == 3 and not (nonce and all(c in "0123456789abcdef" for c in nonce)):
        return None
    return int(parts[0]), int(parts[1]), nonce


def catalog_dir(topic: TopicName) -> str:
    return f"{topic_dir(topic)}/{CATALOG_DIR}"


def catalog_segment_name(first: int, last: int, nonce: str) -> str:
    """Key, relative to the topic folder, of an immutable ledger-catalog segment holding
    closed ledgers ``first..last``.

    ``nonce`` (lowercase hex, random per write) makes the name unique: a writer that loses
    the manifest race never replaces a segment another manifest names.
    """
    if not nonce or not all(c in "0123456789abcdef" for c in nonce):
        raise ValueError(f"catalog nonce must be lowercase hex, got {nonce!r}")
    return f"{CATALOG_DIR}/{first:020d}-{last:020d}-{nonce}{CATALOG_SUFFIX}"


def ledgers_dir(topic: TopicName) -> str:
    return f"{topic_dir(topic)}/ledgers"


def subscriptions_dir(topic: TopicName) -> str:
    return f"{topic_dir(topic)}/subscriptions"


def subscription_dir(topic: TopicName, subscription: str) -> str:
    validate_segment(subscription, "subscription name")
    return f"{subscriptions_dir(topic)}/{subscription}"


def subscription_state_dir(topic: TopicName, subscription: str) -> str:
    """Folder of a durable subscription's versioned state files."""
    return f"{subscription_dir(topic, subscription)}/state"


def subscription_record(topic: TopicName, subscription: str) -> str:
    """A durable subscription's creation record: written once its state's version 0 is, so
    that state found missing under it is damage, not a new subscription."""
    return f"{subscription_dir(topic, subscription)}/subscription.json"


def compaction_dir(topic: TopicName) -> str:
    """Folder of a managed ledger's compacted view (state and data)."""
    return f"{topic_dir(topic)}/compaction"


def compaction_state_dir(topic: TopicName) -> str:
    """Folder of the compaction state's versions."""
    return f"{compaction_dir(topic)}/state"


def compaction_data_dir(topic: TopicName) -> str:
    return f"{compaction_dir(topic)}/data"


def compaction_blob(topic: TopicName, blob_id: str, suffix: str) -> str:
    """A compacted view's entries (``DATA_SUFFIX``) or index (``INDEX_SUFFIX``) blob."""
    validate_segment(blob_id, "blob id")
    if suffix not in (DATA_SUFFIX, INDEX_SUFFIX):
        raise ValueError(f"compaction blob suffix must be {DATA_SUFFIX} or {INDEX_SUFFIX}")
    return f"{compaction_data_dir(topic)}/{blob_id}{suffix}"


def staged_blob_prefix(writer_id: str, batch_id: int | str) -> str:
    """The start of every staged sink blob id of one writer and batch (the sink sweeps strays
    of a batch by it)."""
    return f"{writer_id}.{batch_id}."


def staged_blob_stem(
    writer_id: str, batch_label: int | str, partition_id: int, attempt: int, nonce: str
) -> str:
    """``<writer>.<batch>.<partition>.<attempt>.<nonce>``: a sink task attempt's blob ids
    start with it (followed by ``.<n>``)."""
    return f"{staged_blob_prefix(writer_id, batch_label)}{partition_id}.{attempt}.{nonce}"


def maintenance_lease_dir(tenant: str | None = None, namespace: str | None = None) -> str:
    """Folder of the ``filepulsar maintain`` lease of one scope: every namespace (no
    ``tenant``), one tenant's namespaces, or one namespace."""
    if tenant is None:
        return "maintenance/all/lease"
    validate_segment(tenant, "tenant")
    if namespace is None:
        return f"maintenance/tenants/{tenant}/lease"
    validate_segment(namespace, "namespace")
    return f"maintenance/namespaces/{tenant}/{namespace}/lease"
