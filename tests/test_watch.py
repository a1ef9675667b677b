"""Wake-ups when a commit lands (issue 14): inotify on a local disk, polling elsewhere.

The waits here are made unable to end by polling (re-check and poll intervals of 10 minutes),
so a test that passes shows the wake-up itself; a broken wake-up fails on the test's own
timeout, never by a sleep. Commits come from another process where the issue asks for it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from filepulsar.connector.client import Client
from filepulsar.storage import paths
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.names import TopicName
from filepulsar.storage.producer import Producer
from filepulsar.storage.versioned.watch import CommitWaiter

pytestmark = pytest.mark.procs

_SEND = (
    "import sys\n"
    "from filepulsar.connector.client import Client\n"
    "c = Client(sys.argv[1])\n"
    "p = c.create_producer(sys.argv[2])\n"
    "p.send(sys.argv[3].encode())\n"
    "c.close()\n"
)


def _send_from_another_process(root: str, topic: str, payload: str) -> None:
    subprocess.run([sys.executable, "-P", "-c", _SEND, root, topic, payload], check=True)


@pytest.fixture
def no_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waits that only a wake-up can end within a test's lifetime."""
    monkeypatch.setenv("FILEPULSAR_WATCH_RECHECK_MS", "600000")
    monkeypatch.setenv("FILEPULSAR_POLL_INTERVAL_MS", "600000")
    monkeypatch.delenv("FILEPULSAR_WATCH", raising=False)


def _manifest_dir(topic: str) -> str:
    return paths.manifest_dir(TopicName.parse(topic))


def _watched_manifest(tmp_path: Path) -> tuple[str, Any, CommitWaiter]:
    """Topic ``t``'s manifest folder (an OS path), a writer of commits to it, and a waiter
    on it."""
    from filepulsar.storage.manifest import ManifestState
    from filepulsar.storage.versioned import VersionedStore

    root = str(tmp_path / "root")
    store = open_blob_store(root)
    Producer(store, "t").close()
    folder = _manifest_dir("t")
    path = store.local_path(folder)
    assert path is not None
    writer = VersionedStore(open_blob_store(root), folder, ManifestState.decode, what="m")
    return path, writer, CommitWaiter(store, [folder])


def test_waiter_is_woken_by_a_commit_from_another_process(tmp_path: Path, no_polling: None):
    root = str(tmp_path / "root")
    store = open_blob_store(root)
    Producer(store, "t").close()  # the topic (and its manifest folder) exists
    waiter = CommitWaiter(store, [_manifest_dir("t")])
    assert waiter.watched
    done = threading.Event()

    woken: list[bool] = []

    def wait() -> None:
        woken.append(waiter.wait(timeout=None))  # a polling wait would last 10 minutes
        done.set()

    th = threading.Thread(target=wait, daemon=True)
    th.start()
    _send_from_another_process(root, "t", "hello")
    assert done.wait(60), "the waiter was not woken by the commit"
    assert woken == [True], "the wait ended without seeing the folder change"
    waiter.close()


def test_a_commit_between_look_and_wait_is_not_lost(tmp_path: Path, no_polling: None):
    root = str(tmp_path / "root")
    store = open_blob_store(root)
    p = Producer(store, "t")
    waiter = CommitWaiter(store, [_manifest_dir("t")])
    p.send(b"lands before the wait")  # after the look, before the wait
    p.close()
    # The commit happened since the waiter was made: the wait reports it at once, long
    # before its 10-minute timeout (a lost wake-up would end the wait by time, returning False).
    started = time.monotonic()
    assert waiter.wait(timeout=600) is True
    assert time.monotonic() - started < 60
    # A second wait has nothing new: it lasts its whole (short) timeout and says so.
    started = time.monotonic()
    assert waiter.wait(timeout=0.05) is False
    assert time.monotonic() - started >= 0.05
    waiter.close()


def test_consumer_blocked_in_receive_is_woken_by_a_send_from_another_process(
    tmp_path: Path, no_polling: None
):
    root = str(tmp_path / "root")
    client = Client(root)
    consumer = client.subscribe("t", "s")
    got: list[bytes] = []

    def receive() -> None:
        got.append(consumer.receive(120_000).data())

    th = threading.Thread(target=receive, daemon=True)
    th.start()
    _send_from_another_process(root, "t", "woken")
    th.join(120)
    assert got == [b"woken"]
    client.close()


def test_reader_blocked_in_read_next_is_woken_by_a_send_from_another_process(
    tmp_path: Path, no_polling: None
):
    from filepulsar.connector.client import MessageId

    root = str(tmp_path / "root")
    client = Client(root)
    reader = client.create_reader("t", MessageId.earliest)
    got: list[bytes] = []

    def read() -> None:
        got.append(reader.read_next(120_000).data())

    th = threading.Thread(target=read, daemon=True)
    th.start()
    _send_from_another_process(root, "t", "read")
    th.join(120)
    assert got == [b"read"]
    client.close()


def test_threads_waiting_on_different_folders_wake_on_their_own_commits(
    tmp_path: Path, no_polling: None
):
    """Waiting threads read the process's one inotify descriptor themselves (no watcher
    thread between): whoever wakes counts every folder's events, so each thread returns on a
    commit to its own folder, not on another's; a closed waiter's thread returns at once."""
    root = str(tmp_path / "root")
    store = open_blob_store(root)
    for t in ("a", "b", "c"):
        Producer(store, t).close()
    woke = {t: threading.Event() for t in ("a", "b", "c")}
    waiters = {t: CommitWaiter(store, [_manifest_dir(t)]) for t in ("a", "b", "c")}

    def wait(t: str) -> None:
        waiters[t].wait(timeout=None)  # a polling wait would last 10 minutes
        woke[t].set()

    threads = {t: threading.Thread(target=wait, args=(t,), daemon=True) for t in woke}
    for th in threads.values():
        th.start()
    _send_from_another_process(root, "a", "to a")
    assert woke["a"].wait(60)
    assert not woke["b"].is_set() and not woke["c"].is_set()
    _send_from_another_process(root, "b", "to b")
    assert woke["b"].wait(60)
    assert not woke["c"].is_set()
    waiters["c"].close()
    assert woke["c"].wait(60)
    for t, th in threads.items():
        th.join(60)
        waiters[t].close()
    assert not any(th.is_alive() for th in threads.values())


def test_a_waiter_is_woken_when_another_thread_reads_its_event(tmp_path: Path, no_polling: None):
    """The process's waiters share one inotify descriptor, and whoever reads an event counts
    it for everyone: a thread that reads the event another thread waits for (here the look
    before a read, right after a commit) must wake that thread, which would otherwise sleep
    on a descriptor with nothing left in it. Twenty commits, each read away at once."""
    from filepulsar.storage.versioned.watch import folder_stamp

    path, writer, waiter = _watched_manifest(tmp_path)
    for _ in range(20):
        woke = threading.Event()

        def wait(woke: threading.Event = woke) -> None:
            waiter.wait(timeout=None)  # a polling wait would last 10 minutes
            woke.set()

        th = threading.Thread(target=wait, daemon=True)
        th.start()
        while waiter not in waiter._ino.waiting:  # type: ignore[union-attr]
            th.join(0.001)  # until the thread is about to poll (its look found nothing)
        writer.commit(lambda s: None)
        assert folder_stamp(path) is not None  # reads the commit's event in this thread
        assert woke.wait(60)
        th.join(60)
    waiter.close()


def test_a_wakeup_sleeps_on_through_other_folders_events(tmp_path: Path, no_polling: None):
    """A commit in a folder that is not the waiting thread's (another waiter of the process)
    wakes its poll: the thread reads the event (so it is counted for that waiter) and sleeps
    on until its own flag is set, rather than returning early for a round of nothing."""
    from filepulsar.storage.versioned.watch import Wakeup, folder_stamp

    path, writer, other = _watched_manifest(tmp_path)  # another user's waiter
    wake = Wakeup()
    result: list[bool] = []
    th = threading.Thread(target=lambda: result.append(wake.wait(600)), daemon=True)
    th.start()
    try:
        while not wake._sleeping:
            th.join(0.001)  # until the thread sleeps
        before = folder_stamp(path, drain=False)
        writer.commit(lambda s: None)
        deadline = time.monotonic() + 60
        while folder_stamp(path, drain=False) == before:
            assert time.monotonic() < deadline, "the sleeping thread never read the event"
            th.join(0.001)  # until the sleeping thread read the event
        th.join(0.5)
        assert th.is_alive() and not result  # still asleep: not its folder
        wake.set()
        th.join(60)
        assert result == [True]
    finally:
        wake.set()
        other.close()


def test_a_thread_reading_its_own_events_wakes_on_a_commit_with_no_watcher_thread(
    tmp_path: Path, no_polling: None
):
    """The push dispatcher's wait (a :class:`Wakeup` over callbacks added with
    ``thread=False``): no watcher thread is started for such callbacks, a commit wakes the
    waiting thread itself (which runs the callback), a commit whose event another thread
    reads wakes it through the callback, and a ``set`` from another thread wakes it too."""
    from filepulsar.storage.versioned.watch import Wakeup, folder_stamp

    path, writer, waiter = _watched_manifest(tmp_path)
    wake = Wakeup()
    touched: list[int] = []

    def callback() -> None:
        touched.append(1)
        wake.set()

    waiter.add_callback(callback, thread=False)
    ino = waiter._ino
    assert ino is not None and callback not in ino.threaded
    assert ino._thread is None or not ino.threaded  # (nobody polls for this callback)
    try:
        for read_elsewhere in (False, True, False):
            wake.clear()
            woke = threading.Event()

            def wait(woke: threading.Event = woke) -> None:
                assert wake.wait(600)  # a polling wait would last 10 minutes
                woke.set()

            th = threading.Thread(target=wait, daemon=True)
            th.start()
            while not wake._sleeping:
                th.join(0.001)  # until the thread sleeps
            writer.commit(lambda s: None)
            if read_elsewhere:
                assert folder_stamp(path) is not None  # reads the event in this thread
            assert woke.wait(60)
            th.join(60)
        assert len(touched) == 3
        wake.clear()
        th = threading.Thread(target=lambda: wake.wait(600), daemon=True)
        th.start()
        while not wake._sleeping:
            th.join(0.001)
        wake.set()
        th.join(60)
        assert not th.is_alive()
    finally:
        waiter.remove_callback(callback)
        waiter.close()


def test_a_stamp_taken_without_reading_counts_the_events_read_before_it(
    tmp_path: Path, no_polling: None
):
    """``folder_stamp(drain=False)`` reads no event: a commit not read yet leaves it as it
    was; once :func:`drain_events` read it (running the folder's callbacks), it changes."""
    from filepulsar.storage.versioned.watch import drain_events, folder_stamp

    path, writer, waiter = _watched_manifest(tmp_path)
    touched: list[int] = []

    def callback() -> None:
        touched.append(1)

    waiter.add_callback(callback, thread=False)
    try:
        before = folder_stamp(path, drain=False)
        assert before is not None
        writer.commit(lambda s: None)
        assert folder_stamp(path, drain=False) == before and not touched
        drain_events()
        assert folder_stamp(path, drain=False) != before and touched
    finally:
        waiter.remove_callback(callback)
        waiter.close()


def test_a_look_that_leaves_the_events_to_its_caller_finds_what_they_counted(
    tmp_path: Path, no_polling: None
):
    """A look with ``drain=False`` (the push dispatcher's, which reads the process's queued
    events at the start of each round) tells whether anything landed from the events read
    before it: a commit not read yet is found by the first look after a read of the events
    (:func:`drain_events`, or any look that reads them); a look that reads them finds it at
    once. Both read the state a fresh reader reads."""
    from filepulsar.storage.manifest import ManifestState
    from filepulsar.storage.versioned import VersionedStore
    from filepulsar.storage.versioned.watch import drain_events

    _, writer, waiter = _watched_manifest(tmp_path)
    try:
        reader = VersionedStore(
            open_blob_store(str(tmp_path / "root")), writer.folder, ManifestState.decode, what="m"
        )
        first = reader.latest(drain=False).version
        for _ in range(3):
            writer.commit(lambda s: None)
            drain_events()
            assert reader.latest(drain=False).version == writer.latest().version > first
            first = writer.latest().version
        writer.commit(lambda s: None)
        assert reader.latest().version == writer.latest().version > first  # (reads them)
        assert reader.latest(drain=False).version == writer.latest().version
    finally:
        waiter.close()


def test_a_watched_folder_is_read_only_when_a_commit_landed(
    tmp_path: Path, no_polling: None, monkeypatch: pytest.MonkeyPatch
):
    """While this process watches a journal's folder, a look at its newest state reads the
    journal only if a commit landed since the last read (inotify's count for the folder is a
    cache validator): a commit from another process, or from another store object here, is
    seen by the very next look, without waiting; looks with nothing new read nothing."""
    from filepulsar.storage.versioned import VersionedStore
    from filepulsar.storage.versioned import journal as journal_mod

    root = str(tmp_path / "root")
    store = open_blob_store(root)
    Producer(store, "t").close()
    folder = _manifest_dir("t")
    reads = []  # one item per read of the journal: a look's usual read or the general one

    def counted(real: Any) -> Any:
        def read(self: Any, *a: Any, **k: Any) -> Any:
            reads.append(1)
            return real(self, *a, **k)

        return read

    for name in ("read_from", "read_new"):
        monkeypatch.setattr(journal_mod.Journal, name, counted(getattr(journal_mod.Journal, name)))
    from filepulsar.storage.manifest import ManifestState

    def open_store() -> VersionedStore[Any]:
        return VersionedStore(open_blob_store(root), folder, ManifestState.decode, what="m")

    vs = open_store()
    unwatched = []
    for _ in range(3):
        before = len(reads)
        unwatched.append(vs.latest().version)
        assert len(reads) > before  # not watched: every look reads
    assert len(set(unwatched)) == 1
    waiter = CommitWaiter(store, [folder])
    reads.clear()
    first = vs.latest().version
    assert reads  # the first look while watched reads
    before = len(reads)
    assert [vs.latest().version for _ in range(5)] == [first] * 5
    assert len(reads) == before  # then nothing landed: nothing read
    _send_from_another_process(root, "t", "elsewhere")
    after = vs.latest().version
    assert after > first  # seen at once, no wait
    other = open_store()
    other.commit(lambda s: None)  # a commit from another store object in this process
    assert vs.latest().version == other.latest().version > after
    waiter.close()


def test_a_deleted_and_recreated_topic_is_watched_again(tmp_path: Path, no_polling: None):
    root = str(tmp_path / "root")
    store = open_blob_store(root)
    Producer(store, "t").close()
    waiter = CommitWaiter(store, [_manifest_dir("t")])
    assert waiter.watched
    store.delete_prefix(paths.topic_dir(TopicName.parse("t")))
    waiter.wait(timeout=60)  # the folder's removal wakes it
    assert not waiter.watched  # gone: waits poll until the folder is back
    Producer(store, "t").close()
    waiter.wait(timeout=0)  # looks again: the new folder is watched
    assert waiter.watched
    _send_from_another_process(root, "t", "again")
    waiter.wait(timeout=60)
    waiter.close()


@pytest.mark.s3
def test_waits_poll_on_an_object_store(
    s3_root: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("FILEPULSAR_POLL_INTERVAL_MS", "20")
    root, options = s3_root
    store = open_blob_store(root, storage_options=options)
    waiter = CommitWaiter(store, [_manifest_dir("t")])
    assert not waiter.watched  # nothing to watch on S3: waits are polling pauses
    waiter.wait()  # a pause of at most the poll interval, not a wait for a wake-up
    waiter.close()
    client = Client(root, storage_options=options)
    consumer = client.subscribe("t", "s")
    client.create_producer("t").send(b"polled")
    assert consumer.receive(60_000).data() == b"polled"
    client.close()


def test_watching_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FILEPULSAR_WATCH", "0")
    store = open_blob_store(str(tmp_path / "root"))
    Producer(store, "t").close()
    waiter = CommitWaiter(store, [_manifest_dir("t")])
    assert not waiter.watched
    waiter.close()


def test_first_send_in_a_process_does_not_import_pandas(tmp_path: Path):
    # pa.array on a Python list imports pandas (0.25-1.2 s): the first send paid for it.
    code = (
        "import sys\n"
        "from filepulsar.connector.client import Client, CompressionType\n"
        "c = Client(sys.argv[1])\n"
        "p = c.create_producer('t', compression_type=CompressionType.LZ4)\n"
        "loaded = 'pandas' in sys.modules\n"
        "p.send(b'x' * 100)\n"
        "print(loaded, 'pandas' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", code, str(tmp_path / "root")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert out == ["False", "False"]


def test_arrays_built_from_buffers_equal_pyarrows():
    import numpy as np
    import pyarrow as pa

    from filepulsar.storage.entry import numpy_to_arrow, strings_to_arrow
    from filepulsar.storage.producer.messages import binary_array as _binary_array
    from filepulsar.storage.producer.messages import int64_array as _int64_array

    ints = np.array([5, -1, 0, 7], np.int64)
    mask = np.array([False, True, False, True])
    assert numpy_to_arrow(ints).equals(pa.array(ints))
    assert numpy_to_arrow(ints, mask).equals(pa.array(ints, mask=mask))
    assert numpy_to_arrow(ints.astype(np.int32)).equals(pa.array(ints.astype(np.int32)))
    bools = np.array([True, False, True] * 5)
    assert numpy_to_arrow(bools).equals(pa.array(bools))
    assert numpy_to_arrow(np.array([], np.int64)).equals(pa.array([], pa.int64()))
    assert strings_to_arrow(["a", "", "é"]).equals(pa.array(["a", "", "é"], pa.string()))
    values = [b"x", None, b"", b"yz"]
    assert _binary_array(values).equals(pa.array(values, pa.binary()))
    keys = ["k", None, "é"]
    assert _binary_array(keys, pa.string()).equals(pa.array(keys, pa.string()))
    assert _binary_array([]).equals(pa.array([], pa.binary()))
    assert _int64_array([1, None, 3]).equals(pa.array([1, None, 3], pa.int64()))


def test_asyncio_receive_and_read_next_are_woken_by_a_send_from_another_process(
    tmp_path: Path, no_polling: None
):
    import asyncio

    from filepulsar.asyncio import Client as AsyncClient
    from filepulsar.connector.client import MessageId

    root = str(tmp_path / "root")

    async def main() -> list[bytes]:
        client = AsyncClient(root)
        try:
            consumer = await client.subscribe("t", "s")
            reader = await client.create_reader("t", MessageId.earliest)
            receive = asyncio.ensure_future(consumer.receive())
            read = asyncio.ensure_future(reader.read_next())
            await asyncio.sleep(0)  # both are waiting (pacing only: a wake-up is not raced)
            await asyncio.get_running_loop().run_in_executor(
                None, _send_from_another_process, root, "t", "async"
            )
            got = await asyncio.wait_for(asyncio.gather(receive, read), 120)
            return [m.data() for m in got]
        finally:
            await client.close()

    assert asyncio.run(main()) == [b"async", b"async"]
