"""A flipped bit anywhere in any stored file (issue #31, "Done when" 2).

A small real root holds one of every kind of file filepulsar stores: namespace policies, a
partitioned topic's metadata, a topic written by a deduplicating producer (manifest journal,
data blobs, closed ledgers' indexes, ledger-catalog segments), a durable subscription with
acknowledgements (its state journal and creation record), a schema version, a compacted view
(its state, entries and index) and a maintenance lease. Every stored file is listed; one bit
is flipped in place at a sample of its offsets (every byte of a small file, a stride through a
big one), and everything is read back by fresh readers through the real read paths. Each flip
must either be detected -- CorruptDataError or DataLossError whose message names the file (an
entry's error names its topic, ledger and entry, and the blob) -- or read back exactly as
before. ``tests/test_journal_damage.py`` flips every bit offset of journals; this campaign
covers every other file as well, and journals at a stride.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from filepulsar.admin import Admin
from filepulsar.connector.client import Client
from filepulsar.jobs.maintain import Lease, LeaseState, Scope
from filepulsar.schema import StringSchema
from filepulsar.storage import (
    Producer,
    Reader,
    TopicName,
    catalog,
    create_topic,
    open_blob_store,
    set_namespace_policies,
    set_topic_policies,
)
from filepulsar.storage.compaction import COMPACTION_SUBSCRIPTION, compact, load_view
from filepulsar.storage.errors import CorruptDataError, DataLossError
from filepulsar.storage.ledger import ManagedLedger
from filepulsar.storage.policies import effective_policies
from filepulsar.storage.schemas import SchemaRegistry
from filepulsar.storage.subscription import SubscriptionConsumer
from filepulsar.storage.subscriptions import SubscriptionStore
from filepulsar.storage.topics import read_partitioned
from filepulsar.storage.versioned import VersionedStore
from tests.test_journal_damage import flip

pytestmark = pytest.mark.unit

TOPIC = "persistent://public/default/t"
TYPED = "persistent://public/default/typed"
PARTED = "persistent://public/default/parted"
#: Files up to this size get a flip at every byte; bigger ones at a stride giving this many.
EVERY_BYTE_UP_TO = 160
SAMPLES_PER_BIG_FILE = 64


def _build(root: Path) -> None:
    store = open_blob_store(str(root))
    set_namespace_policies(
        store, "public", "default", ledger_max_entries=3, deduplication_enabled=True
    )
    create_topic(store, TOPIC)
    set_topic_policies(store, TOPIC, retention_time_minutes=60)
    c = SubscriptionConsumer(
        store, TopicName.parse(TOPIC), "s", sub_type="Shared", initial_position="Earliest"
    )
    with Producer(store, TOPIC, producer_name="p", batching_enabled=False) as p:
        for i in range(10):
            p.send(b"v%d" % i, partition_key=f"k{i % 3}", sequence_id=i)
    got = c.fetch(10)
    c.acknowledge([(d.position, -1, 1) for d in got[:4] + got[6:7]])
    c.close()
    compact(store, TOPIC)
    create_topic(store, PARTED, partitions=2)
    with Producer(store, PARTED, producer_name="q") as p:
        p.send(b"x", partition_key="a")
    with Client(str(root)) as client:
        client.create_producer(TYPED, schema=StringSchema()).send("hello")
    lease = Lease(Admin(store=store), Scope(), "host:1:abc")
    assert lease.acquire()


#: What a stored file can change when read: its topic's reads (a topic reads only its own
#: folder, a partitioned topic also its partitions' beside it), the policies, or the lease.
PARTS = ("t", "typed", "parted", "policies", "lease")


def _snapshot(root: Path, parts: frozenset[str] = frozenset(PARTS)) -> dict[str, Any]:
    """What a fresh reader gets from the root, for each of ``parts`` (any error propagates).
    As in a fresh process: the process-wide cache of immutable catalog segments is emptied
    first (a flipped segment would otherwise be served from memory)."""
    catalog._cache.clear()
    catalog._resolved.clear()
    store = open_blob_store(str(root))
    out: dict[str, Any] = {}
    t = TopicName.parse(TOPIC)

    def read(topic: str, **kw: Any) -> list[Any]:
        r = Reader(store, topic, **kw)
        rows: list[Any] = []
        while (table := r.read_batch(100)).num_rows:
            rows += table.to_pylist()
        r.close()
        return rows

    if "t" in parts:
        out["messages"] = read(TOPIC)
        out["compacted"] = read(TOPIC, read_compacted=True)
        m = ManagedLedger(store, t).state()
        out["manifest"] = (
            m.version,
            [lg.to_json(fragments=True) for lg in m.ledgers],
            m.dedup,
            {n: p.to_json() for n, p in m.producers.items()},
            m.trimmed_last,
            m.incarnation,
        )
        view = load_view(store, t, m.incarnation)
        assert view is not None
        out["view"] = (view.horizon, [(ve.position, ve.obscured) for ve in view.index])
        # the compactor's cursor too (retention reads it)
        out["subscriptions"] = [
            SubscriptionStore(store, t, name).latest().encode()
            for name in ("s", COMPACTION_SUBSCRIPTION)
        ]
    if "typed" in parts:
        out["typed"] = read(TYPED)
        out["schemas"] = [
            (s.version, s.type, s.definition)
            for s in SchemaRegistry(store, TopicName.parse(TYPED)).versions()
        ]
    if "parted" in parts:
        out["parted"] = (read(PARTED), read_partitioned(store, PARTED))
    if "policies" in parts:
        out["policies"] = effective_policies(store, t)
    if "lease" in parts:
        lease = VersionedStore(store, Scope().lease_folder, LeaseState.decode, what="lease")
        s = lease.latest()
        out["lease"] = (s.holder, s.expires_ms, s.acquired_ms, s.version)
    return out


def _parts_of(rel: Path) -> frozenset[str]:
    top = rel.parts[0]
    if top == "maintenance":
        return frozenset({"lease"})
    if top == "topics":
        name = rel.parts[4]
        part = {"parted" if name.startswith("parted") else name}
        return frozenset(part | {"policies"} if rel.name == "policies.json" else part)
    return frozenset(PARTS)  # namespace policies: everything that reads them


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _offsets(path: Path) -> list[int]:
    """Every byte of a small file; else a stride through its written bytes (journals are
    preallocated: the zeros after their records are sampled a few times only)."""
    size = path.stat().st_size
    if size <= EVERY_BYTE_UP_TO:
        return list(range(size))
    written = len(path.read_bytes().rstrip(b"\0")) or 1
    step = written / SAMPLES_PER_BIG_FILE
    tail = {written + (size - written) * i // 4 for i in range(4)} - {size}
    return sorted({int(i * step) for i in range(SAMPLES_PER_BIG_FILE)} | tail | {size - 1})


def _named(err: BaseException, path: Path) -> bool:
    text = str(err)
    if path.name in text or path.parent.name + "/" + path.name in text:
        return True
    if path.suffix == ".entries":  # an entry's location: topic, ledger and entry
        return "ledger" in text and "entr" in text and path.stem in text
    return False


def test_every_bit_flip_in_every_stored_file_is_detected_or_harmless(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _build(root)
    before = _snapshot(root)
    files = _files(root)
    kinds = {p.suffix for p in files}
    assert {".entries", ".index", ".catalog", ".journal", ".json"} <= kinds, kinds
    assert any("maintenance" in p.parts for p in files)
    assert any("compaction" in p.parts for p in files)
    assert any("schema" in p.parts for p in files)
    assert sum(p.name == "policies.json" for p in files) == 2  # the namespace's, the topic's
    t0 = time.monotonic()
    flips = detected = harmless = 0
    wrong: list[str] = []
    for path in files:
        rel = path.relative_to(root)
        parts = _parts_of(rel)
        for off in _offsets(path):
            bit = (off * 5 + flips) % 8
            flip(path, off, bit)
            flips += 1
            try:
                after = _snapshot(root, parts)
            except (CorruptDataError, DataLossError) as e:
                if _named(e, path):
                    detected += 1
                else:
                    wrong.append(f"{rel}@{off} bit {bit}: not located: {type(e).__name__} {e}")
            except Exception as e:
                wrong.append(f"{rel}@{off} bit {bit}: {type(e).__name__} {e}")
            else:
                if after == {k: before[k] for k in after}:
                    harmless += 1
                else:
                    changed = [k for k in before if before[k] != after.get(k)]
                    wrong.append(f"{rel}@{off} bit {bit}: read back changed: {changed}")
            finally:
                flip(path, off, bit)
    took = time.monotonic() - t0
    print(
        f"{flips} flips in {len(files)} files: {detected} detected, {harmless} harmless, "
        f"{len(wrong)} wrong, {took:.1f} s"
    )
    assert _snapshot(root) == before
    assert wrong == [], f"{len(wrong)} of {flips} flips:\n" + "\n".join(wrong[:40])


def test_a_lease_stored_as_files_is_checksummed_and_old_leases_still_read(
    tmp_path: Path,
) -> None:
    """Where versions are files (object stores; here a local store without journals), a
    maintenance lease carries the manifest's checksum line: a flip anywhere in it is
    CorruptDataError naming the version, or reads the same (was: a flipped digit of its expiry
    or holder read as another lease). A lease written before the frame still reads."""
    from filepulsar.storage.blobstore.local import LocalBlobStore

    store = LocalBlobStore(str(tmp_path / "root"), journal=False)
    lease = Lease(Admin(store=store), Scope(), "host:1:abc")
    assert lease.acquire()
    folder = tmp_path / "root" / Scope().lease_folder
    (path,) = sorted(folder.glob("*.json"))[-1:]

    def read() -> Any:
        s = VersionedStore(store, Scope().lease_folder, LeaseState.decode, what="lease").latest()
        return (s.holder, s.expires_ms, s.acquired_ms, s.version, s.updated_ms, s.commit_id)

    before = read()
    wrong = []
    for off in range(path.stat().st_size):
        for bit in range(8):
            flip(path, off, bit)
            try:
                if read() != before:
                    wrong.append((off, bit))
            except CorruptDataError as e:
                if path.name not in str(e):
                    wrong.append((off, bit))
            finally:
                flip(path, off, bit)
    assert wrong == []
    old = LeaseState("old-holder", 5, 1, 0, 1, "c", "").encode().split(b"\n")[0]
    assert LeaseState.decode(old, "old").holder == "old-holder"
    assert LeaseState.decode(old + b"\n", "old").expires_ms == 5
