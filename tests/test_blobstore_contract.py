"""The blob-store contract, run on the local, memory and S3 (moto) backends.

What the managed ledger's commit protocol relies on is proven here per backend: atomic,
all-or-nothing ``put_if_absent`` under thread races, listings that are never stale, and (for
local files) no torn blob after a crash at a random instant.
"""

from __future__ import annotations

import os
import pickle
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from filepulsar.storage.blobstore import BlobExists, BlobNotFound, BlobStoreError, open_blob_store
from filepulsar.storage.blobstore.fsspec import FsspecBlobStore, MemoryBlobStore, S3BlobStore
from filepulsar.storage.blobstore.local import MAP_MIN_BYTES, LocalBlobStore
from filepulsar.storage.blobstore.port import TMP_SUFFIX, BlobStore

pytestmark = pytest.mark.contract

StoreRoot = tuple[str, dict[str, Any]]
REPO = Path(__file__).resolve().parents[1]


def _open(store_root: StoreRoot) -> BlobStore:
    root, options = store_root
    return open_blob_store(root, storage_options=options)


# -- whole blobs ------------------------------------------------------------------------------


def test_put_get_overwrite(blob_store: BlobStore) -> None:
    blob_store.put("t/a.bin", b"first")
    assert blob_store.get("t/a.bin") == b"first"
    blob_store.put("t/a.bin", memoryview(b"second, longer"))
    assert blob_store.get("t/a.bin") == b"second, longer"
    blob_store.put("t/empty", b"")
    assert blob_store.get("t/empty") == b""
    assert blob_store.size("t/empty") == 0


def test_put_if_absent_creates_once(blob_store: BlobStore) -> None:
    assert blob_store.put_if_absent("m/00000000000000000001.json", b"winner") is True
    assert blob_store.put_if_absent("m/00000000000000000001.json", b"loser") is False
    assert blob_store.get("m/00000000000000000001.json") == b"winner"
    assert blob_store.list("m") == ["m/00000000000000000001.json"]


def _race(store_root: StoreRoot, keys: list[str], *, contenders: int, size: int) -> None:
    """Let ``contenders`` threads, each with its own store, put_if_absent every key at once."""
    stores = [_open(store_root) for _ in range(contenders)]
    barrier = threading.Barrier(contenders)
    winners: dict[str, list[int]] = {key: [] for key in keys}

    def payload(i: int) -> bytes:
        return bytes([i]) * size

    def contend(i: int) -> None:
        try:
            for key in keys:
                barrier.wait(timeout=60)
                if stores[i].put_if_absent(key, payload(i)):
                    winners[key].append(i)
        except BaseException:
            barrier.abort()
            raise

    with ThreadPoolExecutor(contenders) as pool:
        for future in [pool.submit(contend, i) for i in range(contenders)]:
            future.result()
    reader = _open(store_root)
    for key, won in winners.items():
        assert len(won) == 1, f"{key}: winners {won}"
        assert reader.get(key) == payload(won[0]), key


def test_put_if_absent_race_has_one_winner_per_key(store_root: StoreRoot) -> None:
    keys = [f"race/{i:020d}.json" for i in range(20)]
    _race(store_root, keys, contenders=4, size=64 * 1024)


@pytest.mark.s3
def test_s3_put_if_absent_two_writers_many_rounds(s3_root: StoreRoot) -> None:
    keys = [f"race/{i:020d}.json" for i in range(150)]
    _race(s3_root, keys, contenders=2, size=1024)


def _watch(store: BlobStore, key: str, allowed: set[bytes], final: bytes) -> Callable[[], None]:
    """Start a thread reading ``key`` until it holds ``final``; return a function that joins
    it and fails if it ever saw anything outside ``allowed`` (a missing blob is ``b"<none>"``).
    """
    started = threading.Event()
    seen: list[bytes] = []

    def read() -> None:
        started.set()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                data = store.get(key)
            except BlobNotFound:
                data = b"<none>"
            if data not in allowed:
                seen.append(data[:16] + b"... len %d" % len(data))
                return
            if data == final:
                return
        seen.append(b"<timeout>")

    thread = threading.Thread(target=read)
    thread.start()
    started.wait()

    def join() -> None:
        thread.join()
        assert not seen, f"reader saw {seen}"

    return join


def test_content_is_never_partially_visible(store_root: StoreRoot) -> None:
    writer, reader = _open(store_root), _open(store_root)
    old, new = b"a" * (6 * 2**20), b"b" * (6 * 2**20)

    join = _watch(reader, "big/blob", {b"<none>", old}, old)
    assert writer.put_if_absent("big/blob", old)
    join()

    join = _watch(reader, "big/blob", {old, new}, new)
    writer.put("big/blob", new)
    join()


# -- reads ------------------------------------------------------------------------------------


def test_get_range(blob_store: BlobStore) -> None:
    data = bytes(range(256)) * 4
    blob_store.put("r/blob", data)
    assert blob_store.get_range("r/blob", 0, 10) == data[:10]
    assert blob_store.get_range("r/blob", 100, 356) == data[100:356]
    assert blob_store.get_range("r/blob", 1000, 1024) == data[1000:]
    assert blob_store.get_range("r/blob", 7, 7) == b""
    for start, end in [(1000, 1025), (1024, 1030), (2000, 2010)]:
        with pytest.raises(BlobStoreError, match=rf"r/blob.*\[{start}, {end}\)"):
            blob_store.get_range("r/blob", start, end)
    with pytest.raises(ValueError):
        blob_store.get_range("r/blob", 5, 4)
    with pytest.raises(ValueError):
        blob_store.get_range("r/blob", -1, 4)
    with pytest.raises(BlobNotFound):
        blob_store.get_range("r/missing", 0, 1)


def test_get_range_view_reads_as_get_range(blob_store: BlobStore) -> None:
    """The view of committed bytes (a memory map on local stores, past MAP_MIN_BYTES) holds
    the same bytes and fails the same ways as :meth:`get_range`."""
    data = os.urandom(MAP_MIN_BYTES * 2 + 4097)
    blob_store.put("r/big", data)
    for start, end in [(0, 10), (0, len(data)), (4097, 4097 + MAP_MIN_BYTES), (5, len(data))]:
        view = blob_store.get_range_view("r/big", start, end)
        assert bytes(view) == data[start:end] == blob_store.get_range("r/big", start, end)
    for start, end in [(0, len(data) + 1), (MAP_MIN_BYTES, len(data) + MAP_MIN_BYTES)]:
        with pytest.raises(BlobStoreError, match=rf"r/big.*\[{start}, {end}\)"):
            blob_store.get_range_view("r/big", start, end)
    with pytest.raises(BlobNotFound):
        blob_store.get_range_view("r/missing", 0, MAP_MIN_BYTES)
    with pytest.raises(ValueError):
        blob_store.get_range_view("r/big", MAP_MIN_BYTES * 2, 0)


def test_local_view_stays_readable_after_the_blob_is_deleted(tmp_path: Path) -> None:
    """Retention and compaction delete whole data blobs while readers may hold mapped views:
    a mapped view of a deleted file keeps its bytes (unlink never shortens a mapping), and
    views a reader keeps (messages it holds) do not use up file descriptors."""
    store = LocalBlobStore(str(tmp_path))
    data = os.urandom(MAP_MIN_BYTES * 3)
    store.put("r/big", data)
    fds = len(os.listdir("/proc/self/fd"))
    views = [store.get_range_view("r/big", 100, len(data)) for _ in range(64)]
    assert all(isinstance(v, memoryview) and not isinstance(v.obj, bytes) for v in views)
    assert len(os.listdir("/proc/self/fd")) == fds  # live views hold no file descriptors
    store.delete("r/big")
    assert not store.exists("r/big")
    assert all(bytes(v) == data[100:] for v in views)


def test_missing_key(blob_store: BlobStore) -> None:
    blob_store.put("dir/file", b"x")
    for key in ("nothing/here", "dir"):
        assert blob_store.exists(key) is False
        for read in (blob_store.get, blob_store.size, blob_store.mtime_ms):
            with pytest.raises(BlobNotFound, match=key):
                read(key)
    blob_store.delete("nothing/here")


def test_size_and_mtime(blob_store: BlobStore) -> None:
    before_ms = time.time_ns() // 1_000_000
    blob_store.put("s/blob", b"12345")
    after_ms = time.time_ns() // 1_000_000
    assert blob_store.size("s/blob") == 5
    # S3 keeps whole seconds.
    assert before_ms - 1000 <= blob_store.mtime_ms("s/blob") <= after_ms + 1000


# -- listing ----------------------------------------------------------------------------------


def test_list_is_recursive_sorted_and_exact(blob_store: BlobStore) -> None:
    keys = ["a/b/2", "a/b/1", "a/b/c/d/3", "a/bc/4", "a/x", "z"]
    for key in keys:
        blob_store.put(key, key.encode())
    assert blob_store.list("a/b") == ["a/b/1", "a/b/2", "a/b/c/d/3"]
    assert blob_store.list("a") == ["a/b/1", "a/b/2", "a/b/c/d/3", "a/bc/4", "a/x"]
    assert blob_store.list("") == sorted(keys)
    assert blob_store.list("a/b/1") == []
    assert blob_store.list("missing") == []
    assert blob_store.list_dirs("") == ["a"]
    assert blob_store.list_dirs("a") == ["b", "bc"]
    assert blob_store.list_dirs("a/b") == ["c"]
    assert blob_store.list_dirs("a/b/1") == []
    assert blob_store.list_dirs("missing") == []


def test_listing_and_exists_are_never_stale(store_root: StoreRoot) -> None:
    writer, reader = _open(store_root), _open(store_root)
    assert reader.list("t") == [] and reader.list_dirs("t") == []
    assert not reader.exists("t/p/1")
    writer.put("t/p/1", b"1")
    assert reader.list("t") == ["t/p/1"] and reader.list_dirs("t") == ["p"]
    assert reader.exists("t/p/1")
    assert writer.put_if_absent("t/p/2", b"2")
    assert reader.list("t") == ["t/p/1", "t/p/2"]
    writer.delete("t/p/1")
    assert reader.list("t") == ["t/p/2"]
    assert not reader.exists("t/p/1")
    assert reader.put_if_absent("t/p/1", b"again")


# -- deletion ---------------------------------------------------------------------------------


def test_delete_and_delete_prefix(blob_store: BlobStore) -> None:
    for key in ["l/1/a", "l/1/b/c", "l/10/a", "l/2"]:
        blob_store.put(key, b"x")
    blob_store.delete("l/2")
    blob_store.delete("l/2")
    assert not blob_store.exists("l/2")
    blob_store.delete_prefix("l/1")
    assert blob_store.list("l") == ["l/10/a"]
    blob_store.delete_prefix("l/1")
    blob_store.delete_prefix("never/was")
    with pytest.raises(ValueError):
        blob_store.delete_prefix("")
    assert blob_store.list("") == ["l/10/a"]


# -- keys -------------------------------------------------------------------------------------

BAD_KEYS = [
    "",
    "/abs",
    "a/../b",
    "..",
    "./a",
    "a//b",
    "a/",
    "a\\b",
    "a/\x00b",
    "a\nb",
    "d/.name.0123abcd.tmp",
]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_bad_keys_are_rejected(blob_store: BlobStore, key: str) -> None:
    calls: list[Callable[[], object]] = [
        lambda: blob_store.put(key, b"x"),
        lambda: blob_store.put_if_absent(key, b"x"),
        lambda: blob_store.get(key),
        lambda: blob_store.get_range(key, 0, 1),
        lambda: blob_store.exists(key),
        lambda: blob_store.size(key),
        lambda: blob_store.delete(key),
        lambda: blob_store.delete_prefix(key),
        lambda: blob_store.local_path(key),
    ]
    if key:
        calls += [lambda: blob_store.list(key), lambda: blob_store.list_dirs(key)]
    for call in calls:
        with pytest.raises(ValueError):
            call()
    assert blob_store.list("") == []


# -- appends ----------------------------------------------------------------------------------


def test_append(blob_store: BlobStore) -> None:
    if not blob_store.supports_append:
        pytest.skip(f"{type(blob_store).__name__} has no appends (it writes whole blobs)")
    with blob_store.open_append("ledgers/00000000000000000007.ledger") as appender:
        assert appender.write(b"hello") == 0
        assert appender.write(memoryview(b", world")) == 5
        assert appender.offset == 12
        appender.sync()
        assert blob_store.get("ledgers/00000000000000000007.ledger") == b"hello, world"
    with pytest.raises(BlobStoreError, match="closed"):
        appender.write(b"more")
    with pytest.raises(BlobExists, match=r"00000000000000000007\.ledger"):
        blob_store.open_append("ledgers/00000000000000000007.ledger")
    path = blob_store.local_path("ledgers/00000000000000000007.ledger")
    assert path is not None and os.path.isabs(path)
    assert Path(path).read_bytes() == b"hello, world"


def test_append_unsupported(blob_store: BlobStore) -> None:
    if blob_store.supports_append:
        pytest.skip("this backend appends")
    with pytest.raises(NotImplementedError, match="cannot append"):
        blob_store.open_append("ledgers/1")
    assert blob_store.local_path("ledgers/1") is None


# -- opening ----------------------------------------------------------------------------------


def test_open_blob_store_roots(tmp_path: Path) -> None:
    local = open_blob_store(str(tmp_path / "x"))
    assert isinstance(local, LocalBlobStore)
    assert local.root == f"file://{tmp_path / 'x'}"
    assert open_blob_store(f"file://{tmp_path}/x/").root == local.root
    memory = open_blob_store("memory://ns/")
    assert isinstance(memory, MemoryBlobStore) and memory.root == "memory://ns"
    with pytest.raises(ValueError, match="needs a name"):
        open_blob_store("memory://")
    with pytest.raises(ValueError, match="do not apply"):
        open_blob_store(str(tmp_path), storage_options={"anon": True})


def test_store_survives_pickling(blob_store: BlobStore) -> None:
    blob_store.put("p/1", b"x")
    copy = pickle.loads(pickle.dumps(blob_store))
    assert copy.root == blob_store.root
    assert copy.get("p/1") == b"x"
    assert copy.put_if_absent("p/1", b"y") is False


def test_memory_names_are_separate_namespaces() -> None:
    one, other, same = (open_blob_store(f"memory://{n}") for n in ("ns-one", "ns-two", "ns-one"))
    try:
        one.put("k", b"1")
        assert not other.exists("k") and other.list("") == []
        assert same.get("k") == b"1"
    finally:
        one.delete("k")


@pytest.mark.s3
def test_s3_root(s3_root: StoreRoot) -> None:
    store = _open(s3_root)
    assert isinstance(store, S3BlobStore) and store.root == s3_root[0]
    with pytest.raises(ValueError, match="needs a bucket"):
        open_blob_store("s3://", storage_options=s3_root[1])


def test_unproven_backend_refuses_put_if_absent() -> None:
    pytest.importorskip("aiohttp")
    store = open_blob_store("http://127.0.0.1:9/topics")
    assert type(store) is FsspecBlobStore
    with pytest.raises(BlobStoreError, match="not proven atomic"):
        store.put_if_absent("m/1", b"x")


# -- S3 specifics -----------------------------------------------------------------------------


@pytest.mark.s3
def test_s3_get_range_is_a_ranged_get(s3_root: StoreRoot, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _open(s3_root)
    store.put("r/blob", bytes(1000))
    fs = store._fs  # type: ignore[attr-defined]
    calls: list[tuple[str, Any]] = []
    call_s3 = fs._call_s3

    async def spy(method: str, *args: Any, **kwargs: Any) -> Any:
        calls.append((method, kwargs.get("Range")))
        return await call_s3(method, *args, **kwargs)

    monkeypatch.setattr(fs, "_call_s3", spy)
    assert store.get_range("r/blob", 10, 20) == bytes(10)
    assert calls == [("get_object", "bytes=10-19")]


@pytest.mark.s3
def test_s3_sees_other_clients_writes_at_once(s3_root: StoreRoot) -> None:
    import boto3

    root, options = s3_root
    bucket, prefix = root.removeprefix("s3://").split("/", 1)
    other = boto3.client("s3", endpoint_url=options["endpoint_url"], region_name="us-east-1")
    store = _open(s3_root)
    other.put_object(Bucket=bucket, Key=f"{prefix}/t/p/1", Body=b"1")
    assert store.list_dirs("t") == ["p"] and store.list("t/p") == ["t/p/1"]
    assert store.list_dirs("t/p") == []
    other.put_object(Bucket=bucket, Key=f"{prefix}/t/p/2", Body=b"2")
    other.put_object(Bucket=bucket, Key=f"{prefix}/t/q/3", Body=b"3")
    assert store.exists("t/p/2") and store.size("t/p/2") == 1
    assert store.list_dirs("t") == ["p", "q"] and store.list("t/p") == ["t/p/1", "t/p/2"]
    other.delete_object(Bucket=bucket, Key=f"{prefix}/t/p/1")
    assert not store.exists("t/p/1")
    assert store.put_if_absent("t/p/1", b"again")


def test_s3_unreachable_endpoint_is_an_error_not_absence() -> None:
    pytest.importorskip("s3fs")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    options = {
        "endpoint_url": f"http://127.0.0.1:{port}",
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"region_name": "us-east-1"},
        "config_kwargs": {"retries": {"max_attempts": 1}},
    }
    store = open_blob_store("s3://nowhere/root", storage_options=options)
    store._fs.retries = 1  # type: ignore[attr-defined]
    for call in (
        lambda: store.exists("k"),
        lambda: store.put_if_absent("k", b"x"),
        lambda: store.list(""),
    ):
        with pytest.raises(BlobStoreError, match="s3://nowhere/root") as raised:
            call()
        assert not isinstance(raised.value, BlobNotFound)


@pytest.mark.s3
def test_s3_conditional_write_conflict_is_retried(
    s3_root: StoreRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    store = _open(s3_root)
    fs = store._fs  # type: ignore[attr-defined]
    pipe_file = fs.pipe_file
    conflicts = [2]

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if conflicts[0]:
            conflicts[0] -= 1
            error = {"Code": "ConditionalRequestConflict", "Message": "retry"}
            raise translate_boto_error(ClientError({"Error": error}, "PutObject"))
        return pipe_file(*args, **kwargs)

    monkeypatch.setattr(fs, "pipe_file", flaky)
    assert store.put_if_absent("m/1", b"x") is True
    assert conflicts == [0]
    assert store.put_if_absent("m/1", b"y") is False


# -- crash safety (local) ---------------------------------------------------------------------

_CHILD = """
import sys
from filepulsar.storage.blobstore import open_blob_store
store = open_blob_store(sys.argv[1])
payload = bytes([int(sys.argv[3])]) * int(sys.argv[4])
print("ready", flush=True)
getattr(store, sys.argv[2])("ledgers/blob", payload)
print("done", flush=True)
"""
_CRASH_SIZE = 32 * 2**20


def _run_child(root: Path, operation: str, *, kill_after: float | None) -> tuple[float, bool]:
    """Run ``operation`` (writing ``_CRASH_SIZE`` bytes of 2) in a child process, SIGKILLed
    ``kill_after`` seconds after it is ready (None: let it finish). Return the seconds from
    ready to exit and whether the operation finished.
    """
    args = [str(root), operation, "2", str(_CRASH_SIZE)]
    with subprocess.Popen(
        [sys.executable, "-c", _CHILD, *args], cwd=REPO, stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        ready = time.monotonic()
        if kill_after is not None:
            time.sleep(kill_after)  # the random instant of the crash
            child.send_signal(signal.SIGKILL)
        code = child.wait(timeout=120)
        assert code in (0, -signal.SIGKILL), f"child exited with {code}"
        return time.monotonic() - ready, child.stdout.read() == "done\n"


@pytest.mark.parametrize("operation", ["put_if_absent", "put"])
@pytest.mark.procs
def test_crash_never_leaves_a_torn_blob(tmp_path: Path, operation: str) -> None:
    old, new = bytes([1]) * _CRASH_SIZE, bytes([2]) * _CRASH_SIZE
    duration, _ = _run_child(tmp_path / "calibrate", operation, kill_after=None)
    interrupted = 0
    # The operation's length varies with the machine's load, so crash instants are drawn from
    # the shortest run seen so far, and attempts go on until several crashes landed inside it.
    for attempt in range(60):
        if interrupted >= 3 and attempt >= 10:
            break
        root = tmp_path / f"crash{attempt}"
        store = open_blob_store(str(root))
        if operation == "put":
            store.put("ledgers/blob", old)
        took, finished = _run_child(root, operation, kill_after=random.uniform(0, duration))
        interrupted += not finished
        if finished:
            duration = min(duration, took)
        if operation == "put_if_absent" and not store.exists("ledgers/blob"):
            assert store.list("") == []
            continue
        data = store.get("ledgers/blob")
        intact = data == new or (operation == "put" and data == old)
        assert intact, f"torn blob after crash {attempt}: {len(data)} bytes"
        assert store.list("") == ["ledgers/blob"]
    assert interrupted, "no crash landed inside the operation; the test proved nothing"
    leftovers = [p.name for p in tmp_path.rglob(f"*{TMP_SUFFIX}")]
    assert all(name.startswith(".blob.") for name in leftovers), leftovers


def test_a_failed_background_flush_fails_the_next_sync(tmp_path: Path) -> None:
    """Linux reports a write-back error once per file: if the background fdatasync met it, a
    later fsync may succeed, so sync() must report the flush's failure itself."""
    from filepulsar.storage.blobstore import BlobStoreError
    from filepulsar.storage.blobstore.local import LocalBlobStore

    store = LocalBlobStore(str(tmp_path))
    appender = store.open_append("data/a.entries")
    appender.write(b"x" * 100)
    fd = appender._fd
    assert fd is not None
    os.close(fd)  # the flush thread's fdatasync now fails for real (EBADF) ...
    appender.start_flush()
    assert appender._flusher is not None
    appender._flusher.join()
    reuse = os.open(str(tmp_path / "other"), os.O_CREAT | os.O_WRONLY)  # ... and fsync would not
    try:
        assert reuse == fd
        with pytest.raises(BlobStoreError, match="fsync failed"):
            appender.sync()
    finally:
        os.close(reuse)
        appender._fd = None
