"""The ledger catalog's space (issue 31, defect 4): the bytes stored for closed ledgers grow
linearly with the ledgers, and the orphan sweep reclaims every superseded segment
(storage/catalog.py, FORMAT.md "Ledger catalog").

Before the tiers, each rollover wrote the whole last segment (up to 512 closed ledgers) again
under a new name, and the sweep kept every segment any stored manifest version named (a
journal holds thousands): 2,000 rollovers left ~124 MB of catalog for ~0.5 MB of ledgers.
"""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from filepulsar.storage import Producer, create_topic, set_topic_policies
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.catalog import (
    FANOUT,
    SEGMENT_LEDGERS,
    SegmentRef,
    StoredHead,
    retained_heads,
    segment_ledgers,
)
from filepulsar.storage.ledger import ManagedLedger, Position
from filepulsar.storage.manifest import LedgerInfo
from filepulsar.storage.names import TopicName
from filepulsar.storage.retention import sweep_orphans
from filepulsar.storage.versioned import GC_GRACE_MS, KEEP_VERSIONS
from tests.test_manifest_v2 import kill_at_pause

pytestmark = pytest.mark.unit

CATALOG = "topics/persistent/public/default/roll/catalog"
HOUR = 3600_000


def _catalog(root: Path) -> dict[str, int]:
    """The catalog's files on disk and their sizes."""
    return {p.name: p.stat().st_size for p in (root / CATALOG).iterdir()}


def _heads(root: Path) -> list[dict]:
    """Every stored manifest version (journal records), parsed, ascending. A delta record
    (FORMAT.md, "Delta records") names the catalog of the full head before it, as the
    sweep reads it."""
    ml = ManagedLedger(open_blob_store(str(root)), TopicName.parse("roll"))
    heads = [json.loads(raw.split(b"\n")[0]) for _, raw in ml.manifest.stored()]
    heads.sort(key=lambda d: d["version"])
    catalog: list = []
    for d in heads:
        if "delta" in d:
            d["catalog"] = catalog
        catalog = d["catalog"]
    return heads


def _names(heads: Sequence[dict]) -> set[str]:
    return {SegmentRef.from_json(r).name.split("/")[-1] for d in heads for r in d["catalog"]}


@pytest.mark.slow
def test_catalog_bytes_grow_linearly_and_the_sweep_reclaims_every_superseded_copy(
    tmp_path: Path,
) -> None:
    """2,000 real rollovers (a producer on a local disk, one entry per ledger, 50 B messages):
    the catalog's bytes on disk stay within a small multiple of the closed ledgers' records,
    and after the sweep only the segments named by a version a reader may still load remain.
    Fails before the tiers (~250 records' bytes per ledger; the sweep kept every copy)."""
    root = tmp_path / "root"
    store = open_blob_store(str(root))
    set_topic_policies(store, "roll", ledger_max_entries=1)
    create_topic(store, "roll")
    with Producer(store, "roll", batching_enabled=False) as p:
        for i in range(2001):
            p.send(b"%050d" % i)  # each send after the first closes the ledger before it
    ml = ManagedLedger(store, TopicName.parse("roll"))
    closed = [lg for lg in ml.state().ledgers if not lg.is_open]
    assert len(closed) >= 2000  # (closing the producer closed its ledger too)
    n = len(closed)
    record = sum(len(json.dumps(lg.to_json(), separators=(",", ":"))) for lg in closed) / n
    files = _catalog(root)
    # Each ledger is written once per tier (1, 8, 64, 512 ledgers a segment), each file framed.
    assert sum(files.values()) <= 6 * n * record, (len(files), sum(files.values()), record)

    # The real clock: every segment a version written in the last GC grace names stays.
    now = int(time.time() * 1000)
    sweep_orphans(store, "roll", min_age_ms=0, now=now)
    recent = [d for d in _heads(root) if d["updated"] >= now - GC_GRACE_MS]
    assert recent and _names(recent) <= set(_catalog(root))

    # An hour on, the grace is past: only the newest 64 versions' segments are left.
    report = sweep_orphans(store, "roll", min_age_ms=0, now=now + HOUR)
    left = _catalog(root)
    assert set(left) == _names(_heads(root)[-KEEP_VERSIONS:])
    assert report.deleted  # superseded copies were reclaimed
    assert sum(left.values()) <= 1.5 * n * record, (len(left), sum(left.values()), record)
    fresh = ManagedLedger(open_blob_store(str(root)), TopicName.parse("roll"))
    values = [
        v
        for e in fresh.read_entries(fresh.state(), Position(-1, -1))
        for v in e.raw.messages().column("value").to_pylist()
    ]
    assert values == [b"%050d" % i for i in range(2001)]


MERGING_WRITER = textwrap.dedent(
    """
    import sys
    from filepulsar.storage import Producer, create_topic, set_topic_policies
    from filepulsar.storage.blobstore.local import LocalBlobStore

    STOP, WHEN = int(sys.argv[2]), sys.argv[3]

    class Pausing(LocalBlobStore):
        # At catalog segment write STOP it reports and blocks until the test kills the
        # process: before the write starts or after it returned.
        segments = 0

        def put_if_absent(self, key, data):
            if "/catalog/" not in key:
                return super().put_if_absent(key, data)
            n = Pausing.segments
            Pausing.segments += 1
            if n == STOP and WHEN == "before":
                print("paused", key, flush=True)
                sys.stdin.readline()
            out = super().put_if_absent(key, data)
            if n == STOP and WHEN == "after":
                print("paused", key, flush=True)
                sys.stdin.readline()
            return out

    store = Pausing(sys.argv[1])
    set_topic_policies(store, "roll", ledger_max_entries=1)
    create_topic(store, "roll")
    p = Producer(store, "roll", batching_enabled=False)
    for i in range(100):
        p.send(b"c%d" % i)  # one commit each; from the second on, each closes a ledger
        print("acked", i, flush=True)
    print("done", flush=True)
    """
)


def _values(root: Path) -> list[bytes]:
    ml = ManagedLedger(open_blob_store(str(root)), TopicName.parse("roll"))
    return [
        v
        for e in ml.read_entries(ml.state(), Position(-1, -1))
        for v in e.raw.messages().column("value").to_pylist()
    ]


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("stop", [7, 63])
@pytest.mark.procs
def test_sigkill_at_a_rollover_that_merges_segments_loses_no_acknowledged_message(
    tmp_path: Path, stop: int, when: str
) -> None:
    """A real writer is killed with SIGKILL before or after writing the segment of the
    rollover that merges 8 segments into one (the 8th: 8 ledgers, the 64th: 64), that is
    before its head names it. Read back by a fresh store: every acknowledged send, once, in
    order; the sweep (even an hour on) leaves a readable topic that takes writes again."""
    root = tmp_path / "root"
    acked, paused = kill_at_pause(MERGING_WRITER, str(root), str(stop), when)
    assert acked == stop  # send k fills ledger k and closes it
    assert f"/{0:020d}-{stop:020d}-" in paused  # the merged segment: ledgers 0..stop
    values = _values(root)
    assert values == [b"c%d" % i for i in range(len(values))]  # once, in order
    assert len(values) >= acked
    store = open_blob_store(str(root))
    sweep_orphans(store, "roll", min_age_ms=0)
    with Producer(store, "roll", batching_enabled=False) as p:
        for i in range(len(values), len(values) + 9):
            p.send(b"c%d" % i)  # 9 rollovers more: the merge again, and past it
    after = _values(root)
    assert after == [b"c%d" % i for i in range(len(values) + 9)]
    sweep_orphans(store, "roll", min_age_ms=0, now=int(time.time() * 1000) + HOUR)
    assert _values(root) == after


def _ledgers(first: int, last: int) -> list[LedgerInfo]:
    return [
        LedgerInfo(i, entries=1, messages=1, size=80, closed_ms=1, index=f"i{i}")
        for i in range(first, last + 1)
    ]


class _Writes:
    """A catalog's write as a plain function: counts the ledgers written, names segments."""

    def __init__(self) -> None:
        self.ledgers = 0
        self.segments = 0

    def __call__(self, chunk: Sequence[LedgerInfo]) -> SegmentRef:
        self.ledgers += len(chunk)
        self.segments += 1
        return SegmentRef(
            chunk[0].ledger_id, chunk[-1].ledger_id, len(chunk), f"{self.segments:016x}"
        )


def test_rollovers_write_each_ledger_once_per_tier_and_name_few_segments() -> None:
    """3,000 rollovers, one closed ledger each, as a head's encoding covers them: every
    ledger is written at most once per tier (4 times: tiers of 1, 8, 64 and 512), no rollover
    writes more than a full segment, and a head names the full segments plus at most
    FANOUT - 1 of each smaller tier (the ledgers in order, each once)."""
    assert (FANOUT, SEGMENT_LEDGERS) == (8, 512)
    ledgers = _ledgers(0, 3000)
    writes = _Writes()
    refs: list[SegmentRef] = []
    for closed in range(1, 3001):
        before = writes.ledgers
        refs, covered = segment_ledgers(ledgers, closed, refs, writes)
        assert covered == closed
        assert writes.ledgers - before <= SEGMENT_LEDGERS
        full = closed // SEGMENT_LEDGERS
        assert [r.count for r in refs[:full]] == [SEGMENT_LEDGERS] * full
        assert len(refs) - full <= 3 * (FANOUT - 1)
        assert [r.first for r in refs] == [0, *(r.last + 1 for r in refs[:-1])]
        assert refs[-1].last == closed - 1
    assert writes.ledgers <= 4 * 3000
    assert [r.count for r in refs] == [512] * 5 + [64] * 6 + [8] * 7  # 3000 = 5670 in base 8


def test_a_partial_segment_of_the_older_layout_joins_the_tiers() -> None:
    """A head written before the tiers names one partly filled last segment (here 300
    ledgers): it is carried over as it is, and merged once the segments of its tier after it
    fill a full segment."""
    ledgers = _ledgers(0, 1000)
    old = SegmentRef(0, 299, 300, "00000000000000aa")
    writes = _Writes()
    refs, _ = segment_ledgers(ledgers, 301, [old], writes)
    assert refs[0] == old and [r.count for r in refs] == [300, 1]
    for closed in range(302, 1001):
        refs, _ = segment_ledgers(ledgers, closed, refs, writes)
        # Its tier (64 to 511 ledgers) fills a full segment with 4 segments of 64 after it.
        assert (old in refs) == (closed < 300 + 4 * 64)
    # The first 512; the other 44 of those 556 went on in tier 8 (68 with three segments of 8).
    assert [r.count for r in refs] == [512, 68] + [64] * 6 + [8] * 4 + [1] * 4
    assert writes.ledgers <= 4 * 1000


def test_retained_heads_are_the_newest_64_and_those_newest_within_the_grace() -> None:
    """The versions whose segments the sweep keeps: the newest KEEP_VERSIONS, every version
    written within the GC grace, and the one before the first of those (it was the newest
    until then); none older."""
    now = 10 * HOUR
    old = [StoredHead(v, now - HOUR + v, ()) for v in range(100)]
    kept = retained_heads(list(reversed(old)), now)
    assert [h.version for h in kept] == list(range(100 - KEEP_VERSIONS, 100))
    young = [StoredHead(100 + v, now - GC_GRACE_MS // 2, ()) for v in range(100)]
    kept = retained_heads(old + young, now)
    assert [h.version for h in kept] == list(range(99, 200))  # 99 was newest until 100 came
