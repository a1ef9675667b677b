"""The commit engine's layers, each on its own (storage/versioned/).

The journal's byte format is read by :func:`record.scan` with no lock and no journal around
it; every versioned state carries the one envelope; a store let go closes its journal's files
at once (the store owns its engine: no reference cycle keeps them open until the garbage
collector runs, which once kept a deleted topic's folder alive under inotify).
"""

from __future__ import annotations

import gc
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import crc32c
import pytest

from filepulsar.dispatch.modes import ConsumerType
from filepulsar.storage import paths
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.compaction import CompactionState
from filepulsar.storage.cursor import SubscriptionState
from filepulsar.storage.maintenance import LeaseState
from filepulsar.storage.manifest import ManifestState
from filepulsar.storage.versioned import VersionedState, VersionedStore, envelope, record
from filepulsar.storage.versioned.blob import BlobEngine
from filepulsar.storage.versioned.journaled import JournalEngine
from tests.test_journal import _Items

pytestmark = pytest.mark.unit

GOLDEN = Path(__file__).parent / "golden"


class _File:
    """A segment file as :func:`record.scan` reads it, with the answers a test chooses:
    records at ``flying`` offsets are in flight; bytes that start no record are torn."""

    def __init__(self, path: Path, first: int, flying: tuple[int, ...] = ()) -> None:
        self.path = str(path)
        self.first = first
        self.fd = os.open(path, os.O_RDONLY)
        st = os.fstat(self.fd)
        self.size, self.ino = st.st_size, st.st_ino
        self.flying = flying

    def in_flight(self, offset: int) -> bool:
        return offset in self.flying

    def torn(self, where: int, version: int, why: str) -> bool:
        return True

    def close(self) -> None:
        os.close(self.fd)


def _segment(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / paths.journal_segment(7)
    path.write_bytes(data + bytes(4096))
    return path


def test_scan_reads_the_golden_segment_with_no_journal_around_it(tmp_path: Path) -> None:
    data = (GOLDEN / "journal.segment").read_bytes()
    f = _File(_segment(tmp_path, data), 7)
    try:
        out: list[record.Record] = []
        tail = record.scan(f, 0, None, out)
    finally:
        f.close()
    assert [r.version for r in out] == [7, 8] and all(r.marked for r in out)
    assert tail.last == out[-1] and tail.end == len(data) and tail.pending is None
    assert out[1].deps and record.decode_deps(out[1].deps, f.path, out[1].offset) == [
        ("topics/persistent/public/default/t/data/s-000001.entries", 120)
    ]


def test_scan_tells_a_record_in_flight_from_one_left_pending(tmp_path: Path) -> None:
    """An unmarked record after the marked ones ends a reader's scan as pending; a writer's
    scan passes it when its writer holds it (in flight), not when nobody does."""
    data = (GOLDEN / "journal.segment").read_bytes()
    unmarked = record.encode_record(9, b"nine", (), marked=False)
    path = _segment(tmp_path, data + unmarked)
    for flying, writer in (((), False), ((), True), ((len(data),), False), ((len(data),), True)):
        f = _File(path, 7, flying)
        try:
            tail = record.scan(f, 0, None, writer=writer)
        finally:
            f.close()
        assert tail.last is not None and tail.last.version == 8
        if writer and flying:
            assert [r.version for r in tail.inflight] == [9] and tail.pending is None
            assert tail.end == len(data) + len(unmarked)
        else:
            assert tail.pending is not None and tail.pending.payload == b"nine"
            assert tail.end == len(data) and not tail.inflight


@pytest.mark.parametrize(
    "state",
    [
        ManifestState(topic="persistent://public/default/t", partition=-1),
        SubscriptionState(
            topic="persistent://public/default/t", name="s", sub_type=ConsumerType.Shared
        ),
        CompactionState(topic="persistent://public/default/t"),
        LeaseState(holder="h:1:ab"),
    ],
    ids=lambda s: type(s).__name__,
)
def test_every_state_carries_the_envelope(state: VersionedState) -> None:
    """Stamped as version 0 and then as the next version, each kind's bytes are framed and
    hold the five envelope fields, which its decoder reads back."""
    envelope.stamp_first(state, 1000)
    state.commit_id = "c0"
    nxt = type(state).decode(state.encode(), "v0")
    raw = envelope.stamp_next(nxt, state, 2000, None)
    d = envelope.open_framed(raw, type(state).__name__, "v1", (d_format(raw),))
    envelope.check_stamp(d, prev_required=True)
    assert (d["version"], d["updated"], d["prevCommitId"]) == (1, 2000, "c0")
    assert len(d["commitId"]) == 32 and d["commitId"] == nxt.commit_id
    back = type(state).decode(raw, "v1")
    assert (back.version, back.updated_ms, back.commit_id, back.prev_commit_id) == (
        1,
        2000,
        nxt.commit_id,
        "c0",
    )


def d_format(raw: bytes) -> int:
    """The ``format`` a framed state says it has (read the plain way)."""
    fmt: int = json.loads(raw.split(b"\n")[0])["format"]
    return fmt


def _fds_into(folder: Path) -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder)):
            out.append(target)
    return out


@pytest.fixture
def no_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
@pytest.mark.usefixtures("no_gc")
def test_a_store_let_go_closes_its_journal_at_once(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path))
    vs = VersionedStore(store, "f/state", _Items.decode, what="f")
    assert isinstance(vs.engine, JournalEngine)
    vs.create(_Items([]))
    vs.commit(lambda s: s.items.append("a"))
    folder = tmp_path / "f" / "state"
    assert _fds_into(folder)  # the segment and the folder, kept open between commits
    del vs
    assert _fds_into(folder) == []  # (with the collector off: no cycle held them)


def test_a_store_off_a_local_disk_keeps_files() -> None:
    vs = VersionedStore(open_blob_store("memory://engine-files"), "f", _Items.decode, what="f")
    assert isinstance(vs.engine, BlobEngine)
    assert vs.create(_Items([])) and not vs.create(_Items([]))
    state, _ = vs.commit(lambda s: s.items.append("a"))
    assert [k for k, _ in vs.stored()][-1].endswith(paths.versioned_file("f", 1))
    assert state.items == ["a"] and vs.latest(strict=True).version == 1


def _framed(line: bytes) -> bytes:
    return line + b"\ncrc32c=%08x\n" % crc32c.crc32c(line)


def test_the_lease_and_compaction_bytes_are_as_before_the_envelope() -> None:
    """The two states no golden file pins, byte for byte: the lease in its own field order
    (``prevCommitId`` always written), the compaction state with sorted keys."""
    lease = LeaseState("h:1:ab", 5, 1, 2, 3, "c2", "c1")
    assert lease.encode() == _framed(
        b'{"format":1,"holder":"h:1:ab","commitId":"c2","prevCommitId":"c1","expires":5,'
        b'"acquired":1,"version":2,"updated":3}'
    )
    view = CompactionState(
        topic="t", version=4, updated_ms=9, commit_id="c4", incarnation="i", blob="b1"
    )
    assert view.encode() == _framed(
        b'{"blob":"b1","commitId":"c4","entries":0,"format":1,"horizon":[-1,-1],'
        b'"incarnation":"i","messages":0,"retired":[],"topic":"t","updated":9,"version":4}'
    )
