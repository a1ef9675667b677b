"""Versioned states on a local disk as journals (storage/FORMAT.md, "Journal"): a topic of the
format before journals read and carried over, writers killed at each step of a journal commit,
segments rolling over and going away under readers, damage reported where it is."""

from __future__ import annotations

import contextlib
import fcntl
import gc
import json
import os
import shutil
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from filepulsar.storage import Producer, create_topic, paths
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.errors import (
    CommitConflict,
    CorruptDataError,
    FilePulsarError,
    TopicNotFound,
)
from filepulsar.storage.ledger import ManagedLedger, Position
from filepulsar.storage.names import TopicName
from filepulsar.storage.versioned import VersionedStore, envelope, journal, protocol, record
from filepulsar.storage.versioned.watch import CommitWaiter
from tests.test_manifest_v2 import (
    check_after_kill,
    golden_client,
    kill_at_pause,
    read_golden_scenario,
    send_after_golden_scenario,
)

GOLDEN_V2 = Path(__file__).parent / "golden" / "v2topic"
TOPIC_DIR = Path("topics/persistent/public/default")

pytestmark = pytest.mark.unit


def _read_all(root: Path, topic: str) -> list[bytes]:
    ml = ManagedLedger(open_blob_store(str(root)), TopicName.parse(topic))
    state = ml.state()
    out: list[bytes] = []
    for e in ml.read_entries(state, Position(-1, -1)):
        out.extend(e.raw.messages().column("value").to_pylist())
    return out


def _folder(root: Path, topic: str) -> Path:
    return root / TOPIC_DIR / topic / "manifest"


def _newest(root: Path, topic: str) -> dict:
    """The newest full head stored (delta records between full ones say only a change)."""
    ml = ManagedLedger(open_blob_store(str(root)), TopicName.parse(topic))
    *_, (_, raw) = (x for x in ml.manifest.stored() if not envelope.is_delta(x[1]))
    return json.loads(raw.split(b"\n")[0])


def test_v2_topic_reads_end_to_end_then_moves_to_a_journal_on_first_commit(
    tmp_path: Path,
) -> None:
    """A topic written before journals (one file per version, tests/golden/make_v2_topic.py):
    its messages, cursor, ack hole, negative ack and dedup state carry over; reading writes
    nothing; the first commit starts a journal after the newest version, and the version
    files go (a reader holding an older version finds the journal)."""
    root = tmp_path / "root"
    shutil.copytree(GOLDEN_V2, root)
    folder = _folder(root, "golden-v2")
    files = sorted(p.name for p in folder.iterdir())
    newest_file = max(int(n.split(".")[0]) for n in files)
    d = json.loads((folder / f"{newest_file:020d}.json").read_bytes().split(b"\n")[0])
    assert d["format"] == 2
    stale = ManagedLedger(open_blob_store(str(root)), TopicName.parse("golden-v2"))
    assert stale.state().version == newest_file
    client = golden_client(root, d["updated"])

    def nothing_written() -> None:
        assert sorted(p.name for p in folder.iterdir()) == files  # reading wrote nothing

    consumer = read_golden_scenario(client, "golden-v2", nothing_written)
    send_after_golden_scenario(client, "golden-v2")
    consumer.close()
    client.close()
    # The journal starts right after the newest version file; the files are gone.
    assert sorted(p.name for p in folder.iterdir()) == [paths.journal_segment(newest_file + 1)]
    state_dir = root / TOPIC_DIR / "golden-v2" / "subscriptions" / "audit" / "state"
    assert all(p.name.endswith(paths.JOURNAL_SUFFIX) for p in state_dir.iterdir())
    assert _read_all(root, "golden-v2") == [b"m%d" % i for i in range(11)]
    # A reader that cached a version file before the move finds the journal.
    assert stale.state().version > newest_file
    assert _newest(root, "golden-v2")["format"] == 2


# A writer that stops at its STOP-th journal write (record, flush, mark, segment file, ...),
# before or after it, until the test kills it. The writes are counted on the journal's own
# calls, so the pause falls exactly between the steps of a commit.
PAUSING_JOURNAL_WRITER = textwrap.dedent(
    """
    import os, sys, types
    from filepulsar.storage import Producer, open_blob_store
    from filepulsar.storage.versioned import journal

    STOP, WHEN = int(sys.argv[3]), sys.argv[4]
    calls = [0]

    def pausing(name):
        real = getattr(os, name)

        def call(*a, **k):
            n = calls[0]
            calls[0] += 1
            if n == STOP and WHEN == "before":
                print("paused", name, flush=True)
                sys.stdin.readline()
            out = real(*a, **k)
            if n == STOP and WHEN == "after":
                print("paused", name, flush=True)
                sys.stdin.readline()
            return out

        return call

    proxy = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
    for name in ("pwrite", "fdatasync", "fsync", "link", "unlink"):
        setattr(proxy, name, pausing(name))
    journal.os = proxy
    store = open_blob_store(sys.argv[1])
    p = Producer(store, "golden-v2", producer_name=sys.argv[2], batching_enabled=False)
    for i in range(8):
        p.send(b"c%d" % i)  # one commit each; ledgers of 3 entries roll over
        print("acked", i, flush=True)
    print("done", flush=True)
    """
)


# The writer's journal calls, in order: its registration starts the journal (0 record, 1 the
# zeros after it, 2 fsync, 3 link, 4 unlink of the temporary name, 5 folder fsync, 6-18 the
# version files deleted); then each send writes its record (through a memory map: no call
# here), then fdatasync, mark (19-20, 21-22, ...).
@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("stop", [0, 1, 2, 3, 4, 5, 6, 18, 19, 20, 21, 22])
@pytest.mark.procs
def test_sigkill_at_each_journal_write_loses_no_acknowledged_message(
    tmp_path: Path, stop: int, when: str
) -> None:
    """A real writer on a topic of the format before journals is killed with SIGKILL before
    or after one of its journal writes: the segment that starts the journal (record, flush,
    link, folder flush), then each send's record, flush and mark, the zeros that preallocate
    a segment. Read back by a fresh process: the older history and every acknowledged send,
    once, in order; the topic takes writes again; the orphan sweep removes nothing needed."""
    root = tmp_path / "root"
    shutil.copytree(GOLDEN_V2, root)
    acked, _ = kill_at_pause(PAUSING_JOURNAL_WRITER, str(root), f"k{stop}{when}", str(stop), when)
    _, after = check_after_kill(root, "golden-v2", acked)
    assert _read_all(root, "golden-v2") == after


def test_segments_roll_over_and_go_under_readers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small segments: commits start new ones and delete all but the newest two; a reader
    whose position was in a deleted segment finds the newest state; a fresh reader too."""
    monkeypatch.setattr(journal, "SEGMENT_BYTES", 8 * 1024)
    store = open_blob_store(str(tmp_path))
    create_topic(store, "roll")
    lagging = ManagedLedger(store, TopicName.parse("roll"))
    lagging.state()
    with Producer(store, "roll", batching_enabled=False) as p:
        for i in range(150):
            p.send(b"r%d" % i)
    segs = sorted(p.name for p in _folder(tmp_path, "roll").iterdir())
    assert len(segs) == 2, segs  # the newest and the one before it
    assert all(os.path.getsize(_folder(tmp_path, "roll") / s) >= 8 * 1024 for s in segs)
    newest = ManagedLedger(store, TopicName.parse("roll")).state()
    assert lagging.state().version == newest.version
    assert newest.open_ledger.entries == 150 or sum(lg.entries for lg in newest.ledgers) >= 150
    assert _read_all(tmp_path, "roll") == [b"r%d" % i for i in range(150)]


def test_waiters_are_woken_by_commits_in_a_segment_a_rollover_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commits land in segments that rollovers started (small segments): a waiter on the
    folder is woken by each, not by its periodic re-check (set to a minute here). (Records
    marked through the descriptor of the new segment's temporary name were reported to
    inotify under that name, which waiters ignore: readers slept until the re-check.)"""
    monkeypatch.setattr(journal, "SEGMENT_BYTES", 8 * 1024)
    monkeypatch.setenv("FILEPULSAR_WATCH_RECHECK_MS", "60000")
    store = open_blob_store(str(tmp_path))
    create_topic(store, "wake")
    folder = paths.manifest_dir(TopicName.parse("wake"))
    with (
        Producer(store, "wake", batching_enabled=False) as p,
        CommitWaiter(store, [folder]) as waiter,
    ):
        assert waiter.watched
        for i in range(60):  # several rollovers
            p.send(b"w%d" % i)
            t0 = time.monotonic()
            waiter.wait(30)
            assert time.monotonic() - t0 < 20, f"send {i}: no wake-up"
    assert len(list(_folder(tmp_path, "wake").iterdir())) == 2


def test_a_damaged_record_is_reported_with_its_segment_and_offset(tmp_path: Path) -> None:
    """A bit flipped in a committed record (disk damage): reading the topic fails with
    CorruptDataError naming the segment file and the record's offset; nothing is skipped."""
    store = open_blob_store(str(tmp_path))
    create_topic(store, "dmg")
    with Producer(store, "dmg", batching_enabled=False) as p:
        for i in range(3):
            p.send(b"d%d" % i)
    (seg,) = _folder(tmp_path, "dmg").iterdir()
    records = list(journal.Journal(str(seg.parent), store.local_path, "dmg").records())
    victim = records[-1]
    with open(seg, "r+b") as f:
        f.seek(victim.offset + record.HEAD_SIZE + 10)
        byte = f.read(1)
        f.seek(victim.offset + record.HEAD_SIZE + 10)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(CorruptDataError, match=rf"{seg.name} at offset {victim.offset}"):
        ManagedLedger(open_blob_store(str(tmp_path)), TopicName.parse("dmg")).state()


def test_a_closed_journal_read_again_raises_its_descriptors_error_and_touches_no_reused_one(
    tmp_path: Path,
) -> None:
    """A journal closed while something still reads it (a daemon thread at the
    interpreter's exit, whose finalizers closed it): the read raises the OSError of a closed
    descriptor, which readers handle as a storage error (before, a ValueError from the
    journal's own bookkeeping, which the push dispatcher logged as a defect), and neither the
    read nor a second close reaches a file that reuses the descriptor's number."""
    store = open_blob_store(str(tmp_path))
    create_topic(store, "shut")
    with Producer(store, "shut", batching_enabled=False) as p:
        p.send(b"x")
    j = journal.Journal(str(_folder(tmp_path, "shut")), store.local_path, "shut")
    rec, pos = j.read_from(None)
    assert rec is not None and pos is not None
    (seg,) = j._segs_open
    number = seg.fd
    j.close()
    other = os.open(tmp_path / "other", os.O_RDWR | os.O_CREAT)
    os.dup2(other, number)  # the number reused for another file
    try:
        with pytest.raises(OSError):
            j.read_from(None)
        j.close()
        seg.close()
        assert os.fstat(number).st_ino == os.fstat(other).st_ino  # still open, untouched
        assert os.path.getsize(tmp_path / "other") == 0
    finally:
        for fd in {number, other}:  # (the same number when os.open reused it already)
            os.close(fd)


def _items_store(root: Path, folder: str) -> tuple[VersionedStore[_Items], str]:
    """A versioned state in ``folder`` under ``root``, created, with one commit ("a");
    and the folder's OS path."""
    store = open_blob_store(str(root))
    vs = VersionedStore(store, folder, _Items.decode, what=folder)
    assert vs.create(_Items([]))
    vs.commit(lambda s: s.items.append("a"))
    path = store.local_path(folder)
    assert path is not None
    return vs, path


def test_a_commit_to_a_folder_deleted_before_its_mark_fails(tmp_path: Path) -> None:
    """The folder deleted while a commit is between its flush and its mark (the topic
    deleted): the commit fails, nothing claims success; a commit after it fails too."""
    vs, folder = _items_store(tmp_path, "things")
    with pytest.raises(TopicNotFound):
        vs.commit(lambda s: s.items.append("b"), before_link=lambda: shutil.rmtree(folder))
    with pytest.raises(TopicNotFound):
        vs.commit(lambda s: s.items.append("c"))


def test_a_holder_that_never_releases_the_lock_fails_commits_after_their_timeout(
    tmp_path: Path,
) -> None:
    """The folder's lock held and never released (a writer stopped by a debugger; here the
    test holds it): a commit waits for it up to its timeout, then fails with CommitConflict
    saying so; nothing is written and no descriptor is left. Released, commits go on."""
    vs, folder = _items_store(tmp_path, "held")
    fds = _open_fds()
    with (
        _lock_held(folder),
        pytest.raises(CommitConflict, match="held the folder's lock for 300 ms"),
    ):
        vs.commit(lambda s: s.items.append("b"), timeout_ms=300)
    assert protocol._waiters.wait_idle(10)  # abandoned waits take the lock, then close
    assert _open_fds() == fds
    vs.commit(lambda s: s.items.append("c"))
    fresh = VersionedStore(open_blob_store(str(tmp_path)), "held", _Items.decode, what="held")
    assert fresh.latest().items == ["a", "c"]


def test_the_lock_follows_a_folder_deleted_and_created_again(tmp_path: Path) -> None:
    """A journal keeps its folder open for the lock between commits. The folder deleted and
    created again (a topic deleted and re-created), the next commit locks the new folder:
    while another holder has it, the commit waits and fails after its timeout (it does not
    lock the deleted one and go on); released, the commit lands in the new folder."""
    vs, folder = _items_store(tmp_path, "again")  # committed once: the folder kept open
    vs.store.delete_prefix("again")  # as deleting a topic deletes its folders
    other = VersionedStore(open_blob_store(str(tmp_path)), "again", _Items.decode, what="again")
    assert other.create(_Items(["new"]))
    with _lock_held(folder), pytest.raises(CommitConflict, match="held the folder's lock"):
        vs.commit(lambda s: s.items.append("b"), timeout_ms=300)
    vs.commit(lambda s: s.items.append("c"))
    fresh = VersionedStore(open_blob_store(str(tmp_path)), "again", _Items.decode, what="again")
    assert fresh.latest().items == ["new", "c"]


def test_writers_in_threads_commit_every_change_once(tmp_path: Path) -> None:
    """Four threads, each with its own store object, commit 50 changes to one folder: the
    folder's lock orders them; every change is in the newest state once."""
    store = open_blob_store(str(tmp_path))
    assert VersionedStore(store, "f", _Items.decode, what="f").create(_Items([]))

    def work(t: int) -> None:
        vs = VersionedStore(open_blob_store(str(tmp_path)), "f", _Items.decode, what="f")
        for i in range(50):
            vs.commit(lambda s, i=i: s.items.append(f"{t}-{i}"))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    final = VersionedStore(store, "f", _Items.decode, what="f").latest()
    assert sorted(final.items) == sorted(f"{t}-{i}" for t in range(4) for i in range(50))
    assert final.version == 200


@contextlib.contextmanager
def _lock_held(folder: str) -> Iterator[None]:
    """The folder's lock held by another holder (as a writer stopped by a debugger would)."""
    holder = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(holder, fcntl.LOCK_UN)
        os.close(holder)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("budget", [4096, 0], ids=["kept-open", "past-the-budget"])
def test_journals_close_what_they_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budget: int
) -> None:
    """Readers and writers of many folders: a journal keeps its segment open between calls
    while the process's budget (a quarter of the open-file limit) allows, and opens it per
    call past it; dropped journals close theirs. No descriptor is left behind either way."""
    monkeypatch.setattr(journal, "_budget", [0, budget])
    store = open_blob_store(str(tmp_path))
    for i in range(20):
        create_topic(store, f"fd{i}")
    # Descriptors are counted for the whole process: the garbage of earlier tests is collected
    # first, and the collector stays off, so only this test's objects open or close any (and
    # the dropped journals close by reference counting alone).
    gc.collect()
    gc.disable()
    try:
        before = _open_fds()
        ledgers = [ManagedLedger(store, TopicName.parse(f"fd{i}")) for i in range(20)]
        for ml in ledgers:
            ml.state()
        assert _open_fds() - before == (20 if budget else 0)
        with Producer(store, "fd3", batching_enabled=False) as p:
            for i in range(5):
                p.send(b"v%d" % i)
        assert [sum(lg.entries for lg in ml.state().ledgers) for ml in ledgers[2:4]] == [0, 5]
        del ledgers, ml, p
        assert _open_fds() == before
    finally:
        gc.enable()
    assert journal._budget[0] == 0
    assert _read_all(tmp_path, "fd3") == [b"v%d" % i for i in range(5)]


class _Items:
    """A minimal versioned state (the protocol's needs: version, times, commit ids)."""

    def __init__(self, items: list[str]) -> None:
        self.items = items
        self.version = 0
        self.updated_ms = 0
        self.commit_id = ""
        self.prev_commit_id = ""

    def encode(self) -> bytes:
        return json.dumps(
            [self.items, self.version, self.updated_ms, self.commit_id, self.prev_commit_id]
        ).encode()

    @classmethod
    def decode(cls, raw: bytes, where: str) -> _Items:
        items, version, updated, cid, prev = json.loads(raw)
        s = cls(items)
        s.version, s.updated_ms, s.commit_id, s.prev_commit_id = version, updated, cid, prev
        return s


def test_a_commit_rolling_over_after_its_folder_was_recreated_writes_nothing_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder deleted and created again (a topic force-deleted and re-created by another
    process) between a commit's tail read and its write: a commit that must start a new
    segment refuses, it does not seal the deleted segment and link its record into the new
    folder (the re-created topic's newest state would be the deleted one's). (Review of
    s22-gw: begin() reused the segment the tail read checked; fails before.)"""
    monkeypatch.setattr(journal, "SEGMENT_BYTES", 8 * 1024)
    vs, folder = _items_store(tmp_path, "again")  # segment 0 zero-filled to 8 KiB by "a"

    def change(s: _Items) -> None:
        # What another process does meanwhile (no lock needed): delete the topic, re-create it.
        vs.store.delete_prefix("again")
        other = VersionedStore(open_blob_store(str(tmp_path)), "again", _Items.decode, what="x")
        assert other.create(_Items(["new"]))
        s.items.append("big" * 3000)  # does not fit: begin() seals and starts a segment

    with pytest.raises((CommitConflict, FilePulsarError, OSError)):
        vs.commit(change)
    fresh = VersionedStore(open_blob_store(str(tmp_path)), "again", _Items.decode, what="again")
    assert fresh.latest().items == ["new"], sorted(p.name for p in Path(folder).iterdir())
