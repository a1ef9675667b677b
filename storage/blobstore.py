"""The blob store: whole-object storage under one root, the only module that touches fsspec.

Everything above this module speaks in relative keys such as
``persistent/public/default/orders/manifest/00000000000000000001.json``; a store maps them
under its root. Keys are ``/``-separated, relative, and may not contain empty, ``.`` or ``..``
segments, backslashes or control characters (``ValueError`` otherwise), so nothing a caller
passes can reach a path outside the root.

The commit protocol of the managed ledger rests on :meth:`BlobStore.put_if_absent`, an atomic
create whose content is all-or-nothing. How each backend provides it:

========== ====================================================================================
backend    put_if_absent
========== ====================================================================================
local      write an anonymous temporary file (``O_TMPFILE``) in the target directory, fsync
           it, ``linkat`` it to the final name (``EEXIST`` means the key existed), fsync the
           directory. Where ``O_TMPFILE`` is refused: a named temporary file, linked, then
           unlinked. A crash leaves at most a temporary file (none with ``O_TMPFILE``),
           never a torn final file. Needs a filesystem with hard links.
memory     a process-wide lock around check-and-store. ``memory://`` lives in this process
           only (fsspec's memory filesystem is process-global): for tests and notebooks.
s3         a conditional PUT with ``If-None-Match: *`` (s3fs ``pipe_file(mode="create")``);
           ``412 PreconditionFailed`` means the key existed, ``409 ConditionalRequestConflict``
           is retried.
other      refused with :class:`BlobStoreError` until atomic create is proven for that
           backend (fsspec's generic ``mode="create"`` is check-then-write, not atomic).
========== ====================================================================================
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import os
import random
import re
import shutil
import stat
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from filepulsar.dispatch.clock import SYSTEM
from filepulsar.storage.errors import (
    BlobExists,
    BlobNotFound,
    BlobStoreError,
    BlobTruncated,
    InvalidConfiguration,
)

__all__ = [
    "TMP_SUFFIX",
    "Appender",
    "BlobExists",
    "BlobNotFound",
    "BlobStore",
    "BlobStoreError",
    "BlobTruncated",
    "FsspecBlobStore",
    "LocalBlobStore",
    "MemoryBlobStore",
    "S3BlobStore",
    "open_blob_store",
]

#: Suffix of the temporary files a local store writes next to their final name. Temporary
#: files are named ``.<name>.<random hex>.tmp``, are never listed, and may be deleted by
#: recovery once no writer can still be using them.
TMP_SUFFIX = ".tmp"

_S3_PROTOCOLS = ("s3", "s3a")
_LOCAL_PROTOCOLS = ("file", "local")
_CONFLICT_RETRIES = 8
#: Local ranged reads of committed data at least this large are memory-mapped
#: (:meth:`LocalBlobStore.get_range_view`); smaller ones are cheaper to copy.
MAP_MIN_BYTES = 256 * 1024
_MEMORY_LOCK = threading.Lock()
_CONTROL_CHARS = re.compile("[\x00-\x1f\x7f]")


def _check_key(key: str, *, allow_root: bool = False) -> str:
    if not isinstance(key, str):
        raise TypeError(f"blob key must be a str, not {type(key).__name__}")
    if key == "" and allow_root:
        return key
    if key == "":
        raise ValueError("blob key must not be empty")
    if key.startswith("/"):
        raise ValueError(f"blob key {key!r} must be relative (no leading '/')")
    if "\\" in key:
        raise ValueError(f"blob key {key!r} must not contain a backslash")
    if _CONTROL_CHARS.search(key):
        raise ValueError(f"blob key {key!r} must not contain control characters")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise ValueError(f"blob key {key!r} has an empty, '.' or '..' segment")
    name = key.rsplit("/", 1)[-1]
    if name.startswith(".") and name.endswith(TMP_SUFFIX):
        raise ValueError(f"blob key {key!r} is reserved for temporary files")
    return key


def _check_prefix_to_delete(prefix: str) -> str:
    if prefix == "":
        raise ValueError("delete_prefix('') would delete the whole store; name a directory")
    return _check_key(prefix)


def _check_range(key: str, start: int, end: int) -> None:
    if start < 0 or end < start:
        raise ValueError(f"invalid byte range [{start}, {end}) for {key!r}")


def _is_tmp_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(TMP_SUFFIX)


@contextlib.contextmanager
def _translate(
    url: str,
    operation: str,
    *,
    reading: bool,
    errors: tuple[type[Exception], ...] = (OSError,),
) -> Iterator[None]:
    """Turn OS and backend errors into blob-store errors naming ``url``.

    When ``reading``, a missing file or a directory where the blob should be is
    :class:`BlobNotFound`; every other error in ``errors`` is :class:`BlobStoreError`.
    """
    missing: tuple[type[OSError], ...] = (
        (FileNotFoundError, IsADirectoryError, NotADirectoryError) if reading else ()
    )
    try:
        yield
    except missing as e:
        raise BlobNotFound(f"{operation}: no blob at {url}") from e
    except errors as e:
        raise BlobStoreError(f"{operation} failed for {url}: {e}") from e


_IOV_MAX = 1024


class Appender:
    """An exclusively created local file that grows by appends; one writer, one handle.

    Bytes written are visible to readers of the file at once but durable only after
    :meth:`sync`. After an error the file's tail is unknown: discard the appender (readers
    detect a torn tail by checksum).
    """

    def __init__(self, fd: int, url: str) -> None:
        self._fd: int | None = fd
        self._url = url
        self._failed = False
        self.offset = 0
        self._flusher: threading.Thread | None = None
        self._flush_error: OSError | None = None
        # Offset up to which a background fsync (start_sync) made the file durable, once
        # that fsync has succeeded: a sync() that finds nothing written since skips its own.
        self._bg_synced = -1

    def start_flush(self) -> None:
        """Start writing what is written so far back to disk in the background
        (``fdatasync`` in a thread), so a later :meth:`sync` has less left to do. Durability
        is still given only by :meth:`sync`, which also reports a failure of this flush (Linux
        reports a write-back error once per file: a later ``fsync`` could return success)."""
        if self._flusher is not None and self._flusher.is_alive():
            return
        fd = self._usable_fd("flush")

        def flush() -> None:
            try:
                os.fdatasync(fd)
            except OSError as e:
                self._flush_error = e

        self._flusher = threading.Thread(target=flush, daemon=True)
        self._flusher.start()

    def start_sync(self) -> None:
        """Start a full ``fsync`` of what is written so far in the background, so the caller
        can do other work (prepare the commit that will name these bytes) while the disk
        works. The bytes are durable only once :meth:`sync` has returned: it waits for this
        fsync, reports its failure, and syncs again only if more was written since."""
        if self._flusher is not None:
            self._flusher.join()
            self._flusher = None
        fd = self._usable_fd("sync")
        upto = self.offset

        def sync() -> None:
            try:
                os.fsync(fd)
            except OSError as e:
                self._flush_error = e
            else:
                self._bg_synced = upto

        self._flusher = threading.Thread(target=sync, daemon=True)
        self._flusher.start()

    def write(self, data: bytes | memoryview) -> int:
        """Append ``data`` and return the offset where it starts.

        Raises
        ------
        BlobStoreError
            The write failed or the appender is closed or failed before.
        """
        fd = self._usable_fd("write")
        start = self.offset
        view = memoryview(data).cast("B")
        try:
            while view:
                written = os.write(fd, view)
                view = view[written:]
                self.offset += written
        except OSError as e:
            self._failed = True
            raise BlobStoreError(f"append at offset {self.offset} failed for {self._url}") from e
        return start

    def write_many(self, parts: Sequence[bytes | memoryview | Any]) -> int:
        """Append the buffers of ``parts`` back to back (``writev``, no joining copy).

        Returns the offset where the first starts. Raises like :meth:`write`.
        """
        fd = self._usable_fd("write")
        start = self.offset
        views = [v for v in (memoryview(p).cast("B") for p in parts) if len(v)]
        i = 0
        try:
            while i < len(views):
                written = os.writev(fd, views[i : i + _IOV_MAX])
                self.offset += written
                while written:
                    n = len(views[i])
                    if written >= n:
                        written -= n
                        i += 1
                    else:
                        views[i] = views[i][written:]
                        written = 0
        except OSError as e:
            self._failed = True
            raise BlobStoreError(f"append at offset {self.offset} failed for {self._url}") from e
        return start

    def sync(self) -> None:
        """Make everything written so far durable (``fsync``)."""
        fd = self._usable_fd("sync")
        if self._flusher is not None:
            self._flusher.join()
            self._flusher = None
        try:
            if self._flush_error is not None:
                raise self._flush_error
            if self._bg_synced == self.offset:
                return  # a background fsync that started after the last write succeeded
            os.fsync(fd)
        except OSError as e:
            self._failed = True
            raise BlobStoreError(f"fsync failed for {self._url}: {e}") from e

    def close(self) -> None:
        """Close the file without syncing; idempotent."""
        if self._flusher is not None:
            self._flusher.join()
            self._flusher = None
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def _usable_fd(self, operation: str) -> int:
        if self._fd is None:
            raise BlobStoreError(f"{operation} on closed appender for {self._url}")
        if self._failed:
            raise BlobStoreError(f"{operation} on failed appender for {self._url}")
        return self._fd

    def __enter__(self) -> Appender:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class BlobStore(ABC):
    """Whole blobs under one root, addressed by relative keys.

    Attributes
    ----------
    root : str
        The normalised root URL (``file:///abs/path``, ``memory://name``,
        ``s3://bucket/prefix``).
    supports_append : bool
        Whether :meth:`open_append` works (local files only).

    Every method validates its key (``ValueError``) and reports backend failures as
    :class:`BlobStoreError` naming the URL, with the original error as ``__cause__``.
    """

    root: str
    supports_append: bool = False

    def url(self, key: str) -> str:
        """Return the full URL of ``key`` (for messages and logs)."""
        return f"{self.root}/{_check_key(key, allow_root=True)}".rstrip("/")

    @abstractmethod
    def put(self, key: str, data: bytes | memoryview) -> None:
        """Store ``data`` as the whole blob ``key``, replacing any previous blob.

        Readers see the old or the new content, never a mix. Durable when it returns
        (local: temporary file, fsync, ``os.replace``, fsync of the directory).
        """

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        """Create ``key`` with ``data`` unless it exists: an atomic, all-or-nothing create.

        Among any number of concurrent callers (threads, processes, machines sharing the
        backend) exactly one gets ``True``; the others get ``False`` and the content is the
        winner's. Readers never see partial content. Durable when it returns ``True``.

        Returns
        -------
        bool
            ``True`` if this call created the blob, ``False`` if the key already existed.

        Raises
        ------
        BlobStoreError
            The backend failed, or cannot create atomically. On S3 a request whose answer
            was lost and that the client retried may report ``False`` for a blob this call
            created; callers that must know put a unique writer id in ``data`` and read back.
        """

    @abstractmethod
    def get(self, key: str) -> bytes:
        """Return the whole blob.

        Raises
        ------
        BlobNotFound
            No blob at ``key``.
        """

    @abstractmethod
    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Return bytes ``[start, end)`` of the blob (a ranged read, not a full download).

        Raises
        ------
        ValueError
            ``start < 0`` or ``end < start``.
        BlobNotFound
            No blob at ``key``.
        BlobStoreError
            The blob is shorter than ``end``; the message names the key and the range.
        """

    def get_range_view(self, key: str, start: int, end: int) -> bytes | memoryview:
        """Bytes ``[start, end)`` of a blob whose bytes in that range never change once
        written, possibly without copying them (a read-only memory map of a local file).

        Only for such ranges: the committed fragments of data blobs, which are append-only
        (storage/FORMAT.md, "Reading data blobs"). Raises like :meth:`get_range`; this
        default is :meth:`get_range`.
        """
        return self.get_range(key, start, end)

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Return whether a blob (not a directory) exists at ``key``; never cached."""

    @abstractmethod
    def size(self, key: str) -> int:
        """Return the blob's size in bytes; :class:`BlobNotFound` if missing."""

    @abstractmethod
    def mtime_ms(self, key: str) -> int:
        """Return the blob's modification time in epoch milliseconds (S3: 1 s resolution).

        Raises :class:`BlobNotFound` if missing.
        """

    @abstractmethod
    def list(self, prefix: str) -> builtins.list[str]:
        """Return the keys of all blobs below the directory ``prefix``, recursively, sorted.

        ``prefix`` names a directory (``""`` for the root): ``list("a/b")`` returns
        ``a/b/x`` and ``a/b/c/y`` but not ``a/bc/z``. ``[]`` if there are none. Never served
        from a cache.
        """

    @abstractmethod
    def list_dirs(self, prefix: str) -> builtins.list[str]:
        """Return the names of the immediate child directories of ``prefix``, sorted.

        Object stores have a directory only while a blob lies below it; a local store may
        also report a directory left empty by :meth:`delete`.
        """

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete the blob ``key``; a missing key is not an error."""

    @abstractmethod
    def delete_prefix(self, prefix: str) -> None:
        """Delete every blob below the directory ``prefix``; the root itself is refused."""

    def open_append(self, key: str) -> Appender:
        """Create ``key`` exclusively and return an :class:`Appender` for it.

        Raises
        ------
        NotImplementedError
            The backend has no appends (``supports_append`` is ``False``).
        BlobExists
            The key already exists.
        """
        raise NotImplementedError(
            f"{type(self).__name__} at {self.root} cannot append; "
            "write whole blobs with put() or put_if_absent()"
        )

    def local_path(self, key: str) -> str | None:
        """Return the absolute OS path of ``key`` for a local store (to memory-map), else None."""
        _check_key(key)
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root!r})"


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Anonymous temporary files (Linux): a put-if-absent writes and fsyncs an unnamed file in
# the target folder and links it to its name; nothing to unlink after, nothing left behind
# by a crash. Turned off for the process the first time the filesystem refuses them.
_O_TMPFILE: int = getattr(os, "O_TMPFILE", 0) if os.path.isdir("/proc/self/fd") else 0
_tmpfile_unsupported = False


def _link_if_absent(url: str, link: Callable[[], None]) -> bool:
    """Run ``link`` (a hard link of a written, fsynced file to its final name): True if it
    made the name, False if the name exists (another writer won put-if-absent)."""
    try:
        link()
    except FileExistsError:
        return False
    except OSError as e:
        raise BlobStoreError(f"put_if_absent needs hard links, which failed for {url}: {e}") from e
    return True


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class LocalBlobStore(BlobStore):
    """Blobs as files under a local directory, with crash-safe writes and appends."""

    supports_append = True

    def __init__(self, directory: str) -> None:
        self._dir = os.path.abspath(directory)
        self.root = f"file://{self._dir}"

    def _path(self, key: str, *, allow_root: bool = False) -> str:
        key = _check_key(key, allow_root=allow_root)
        return os.path.join(self._dir, *key.split("/")) if key else self._dir

    def local_path(self, key: str) -> str | None:
        return self._path(key)

    def _make_parents(self, path: str) -> None:
        """Create the missing parent directories of ``path``, each made durable."""
        missing = []
        directory = os.path.dirname(path)
        while not os.path.isdir(directory):
            missing.append(directory)
            directory = os.path.dirname(directory)
        for directory in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(directory)
            _fsync_dir(os.path.dirname(directory))

    def _write_tmp(self, path: str, data: bytes | memoryview) -> str:
        """Write ``data`` to a fresh, fsynced temporary file beside ``path``; return its path."""
        self._make_parents(path)
        head, name = os.path.split(path)
        tmp = os.path.join(head, f".{name}.{uuid.uuid4().hex}{TMP_SUFFIX}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            with open(fd, "wb", closefd=True) as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            _unlink_quietly(tmp)
            raise
        return tmp

    def put(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        with _translate(self.url(key), "put", reading=False):
            tmp = self._write_tmp(path, data)
            try:
                os.replace(tmp, path)
            except BaseException:
                _unlink_quietly(tmp)
                raise
            _fsync_dir(os.path.dirname(path))

    def _put_if_absent_anonymous(
        self, path: str, url: str, data: bytes | memoryview
    ) -> bool | None:
        """put-if-absent through an ``O_TMPFILE`` file linked by ``linkat`` (one create and
        one unlink fewer than a named temporary file); None if the filesystem has no
        ``O_TMPFILE`` (the caller then uses a named one)."""
        global _tmpfile_unsupported
        self._make_parents(path)
        directory, name = os.path.split(path)
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            try:
                fd = os.open(".", _O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o644, dir_fd=dfd)
            except OSError as e:
                if e.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                    _tmpfile_unsupported = True
                    return None
                raise
            try:
                view = memoryview(data).cast("B")
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
                # With a dir_fd, os.link is linkat(..., AT_SYMLINK_FOLLOW): it links the file
                # the /proc link names, not the link itself.
                won = _link_if_absent(
                    url,
                    lambda: os.link(
                        f"/proc/self/fd/{fd}", name, dst_dir_fd=dfd, follow_symlinks=True
                    ),
                )
            finally:
                os.close(fd)
            if won:
                os.fsync(dfd)
            return won
        finally:
            os.close(dfd)

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        path = self._path(key)
        url = self.url(key)
        with _translate(url, "put_if_absent", reading=False):
            if _O_TMPFILE and not _tmpfile_unsupported:
                won = self._put_if_absent_anonymous(path, url, data)
                if won is not None:
                    return won
            tmp = self._write_tmp(path, data)
            try:
                won = _link_if_absent(url, lambda: os.link(tmp, path))
            finally:
                _unlink_quietly(tmp)
            if won:
                _fsync_dir(os.path.dirname(path))
            return won

    def get(self, key: str) -> bytes:
        with _translate(self.url(key), "get", reading=True), open(self._path(key), "rb") as f:
            return f.read()

    def get_range(self, key: str, start: int, end: int) -> bytes:
        path = self._path(key)
        _check_range(key, start, end)
        with _translate(self.url(key), "get_range", reading=True), open(path, "rb") as f:
            f.seek(start)
            data = f.read(end - start)
        if len(data) != end - start:
            raise BlobTruncated(
                f"short read from {self.url(key)}: wanted bytes [{start}, {end}), "
                f"got {len(data)} bytes"
            )
        return data

    def get_range_view(self, key: str, start: int, end: int) -> bytes | memoryview:
        """Ranges of at least :data:`MAP_MIN_BYTES` are memory-mapped, not copied.

        Why this is safe: it is called only for committed bytes of data blobs, and no
        filepulsar code ever rewrites or truncates a data blob (writers only append; retention
        and compaction delete whole files, and a deleted file's mapped pages stay readable
        until unmapped). The file's size is checked when it is mapped, so a blob already
        shorter than the range raises :class:`BlobTruncated` as :meth:`get_range` does. Only
        a truncation by something outside filepulsar *while* the mapped bytes are in use
        cannot be reported that way: the OS then stops the reading process with SIGBUS (a
        Spark task fails with a crashed Python worker) -- a file of committed messages
        shortened under a reader has lost data either way.
        """
        if end - start < MAP_MIN_BYTES:
            return self.get_range(key, start, end)
        path = self._path(key)
        _check_range(key, start, end)
        with _translate(self.url(key), "get_range", reading=True):
            # pyarrow's map, not Python's mmap: its buffers stay valid after close() and
            # hold no file descriptor (a Python mmap keeps a duplicate open while it lives).
            mapped = pa.memory_map(path, "r")
            try:
                size = mapped.size()
                if size < end:
                    raise BlobTruncated(
                        f"short read from {self.url(key)}: wanted bytes [{start}, {end}), "
                        f"the blob has {size} bytes"
                    )
                mapped.seek(start)
                view = mapped.read_buffer(end - start)
            finally:
                mapped.close()
        return memoryview(view)

    def exists(self, key: str) -> bool:
        return os.path.isfile(self._path(key))

    def _stat(self, key: str, operation: str) -> os.stat_result:
        path = self._path(key)
        with _translate(self.url(key), operation, reading=True):
            st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise BlobNotFound(f"{operation}: no blob at {self.url(key)} (a directory)")
        return st

    def size(self, key: str) -> int:
        return self._stat(key, "size").st_size

    def mtime_ms(self, key: str) -> int:
        return self._stat(key, "mtime_ms").st_mtime_ns // 1_000_000

    def list(self, prefix: str) -> builtins.list[str]:
        top = self._path(prefix, allow_root=True)
        keys: builtins.list[str] = []

        def fail(error: OSError) -> None:
            # A directory deleted while we walk is simply gone; anything else is an error.
            if not isinstance(error, (FileNotFoundError, NotADirectoryError)):
                raise error

        with _translate(self.url(prefix), "list", reading=False):
            for directory, _, files in os.walk(top, onerror=fail):
                rel = os.path.relpath(directory, self._dir).replace(os.sep, "/")
                base = "" if rel == "." else f"{rel}/"
                keys.extend(base + name for name in files if not _is_tmp_name(name))
        return sorted(keys)

    def list_dirs(self, prefix: str) -> builtins.list[str]:
        path = self._path(prefix, allow_root=True)
        try:
            with os.scandir(path) as entries:
                return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            raise BlobStoreError(f"list_dirs failed for {self.url(prefix)}: {e}") from e

    def delete(self, key: str) -> None:
        path = self._path(key)
        with _translate(self.url(key), "delete", reading=False):
            try:
                os.unlink(path)
            except FileNotFoundError:
                return
            _fsync_dir(os.path.dirname(path))

    def delete_prefix(self, prefix: str) -> None:
        path = self._path(_check_prefix_to_delete(prefix))
        with _translate(self.url(prefix), "delete_prefix", reading=False):
            try:
                shutil.rmtree(path)
            except FileNotFoundError:
                return
            _fsync_dir(os.path.dirname(path))

    def open_append(self, key: str) -> Appender:
        path = self._path(key)
        url = self.url(key)
        with _translate(url, "open_append", reading=False):
            self._make_parents(path)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            except FileExistsError as e:
                raise BlobExists(f"open_append: {url} already exists") from e
            try:
                _fsync_dir(os.path.dirname(path))
            except BaseException:
                os.close(fd)
                raise
        return Appender(fd, url)


class FsspecBlobStore(BlobStore):
    """Blobs on any fsspec filesystem; the base of the memory and S3 stores.

    Used directly for protocols without a dedicated store. Such a store reads, lists, puts
    and deletes with the backend's own guarantees, but :meth:`put_if_absent` raises
    :class:`BlobStoreError`: atomic create must be proven for a backend (a race test, as for
    S3) before the commit protocol can run on it, and fsspec's generic ``mode="create"`` is
    check-then-write.
    """

    #: Exceptions the backend raises besides ``OSError``, reported as :class:`BlobStoreError`.
    _errors: tuple[type[Exception], ...] = (OSError,)

    def __init__(self, fs: Any, base: str, root: str) -> None:
        self._fs = fs
        self._base = base.rstrip("/")
        self.root = root.rstrip("/")

    def _guard(
        self, key: str, operation: str, *, reading: bool
    ) -> contextlib.AbstractContextManager[None]:
        return _translate(self.url(key), operation, reading=reading, errors=self._errors)

    def _path(self, key: str, *, allow_root: bool = False) -> str:
        key = _check_key(key, allow_root=allow_root)
        return f"{self._base}/{key}" if key else self._base

    def _key_of(self, path: str) -> str:
        return path[len(self._base) + 1 :]

    def put(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        with self._guard(key, "put", reading=False):
            self._fs.pipe_file(path, bytes(data))

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        _check_key(key)
        raise BlobStoreError(
            f"put_if_absent is not proven atomic for {self.root} "
            f"({type(self._fs).__name__}); the commit protocol needs an atomic create, "
            "use a local, memory:// or s3:// root"
        )

    def get(self, key: str) -> bytes:
        path = self._path(key)
        with self._guard(key, "get", reading=True):
            return bytes(self._fs.cat_file(path))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        path = self._path(key)
        _check_range(key, start, end)
        if start == end:
            if self.size(key) < start:
                raise BlobTruncated(f"range [{start}, {end}) is past the end of {self.url(key)}")
            return b""
        try:
            with self._guard(key, "get_range", reading=True):
                data = bytes(self._fs.cat_file(path, start=start, end=end))
        except BlobNotFound:
            raise
        except BlobStoreError as e:
            # S3 answers a range that starts past the end with 416 InvalidRange.
            if self.exists(key):
                raise BlobTruncated(
                    f"short read from {self.url(key)}: wanted bytes [{start}, {end})"
                ) from e
            raise BlobNotFound(f"get_range: no blob at {self.url(key)}") from e
        if len(data) != end - start:
            raise BlobTruncated(
                f"short read from {self.url(key)}: wanted bytes [{start}, {end}), "
                f"got {len(data)} bytes"
            )
        return data

    def _info(self, key: str, operation: str) -> dict[str, Any]:
        path = self._path(key)
        with self._guard(key, operation, reading=True):
            info: dict[str, Any] = self._fs.info(path)
        if info.get("type") != "file":
            raise BlobNotFound(f"{operation}: no blob at {self.url(key)} (a directory)")
        return info

    def exists(self, key: str) -> bool:
        try:
            self._info(key, "exists")
        except BlobNotFound:
            return False
        return True

    def size(self, key: str) -> int:
        return int(self._info(key, "size")["size"])

    def mtime_ms(self, key: str) -> int:
        path = self._path(key)
        self._info(key, "mtime_ms")
        with self._guard(key, "mtime_ms", reading=True):
            return int(self._fs.modified(path).timestamp() * 1000)

    def list(self, prefix: str) -> builtins.list[str]:
        path = self._path(prefix, allow_root=True)
        with self._guard(prefix, "list", reading=False):
            found = self._fs.find(path)
        below = f"{path}/"
        return sorted(self._key_of(p) for p in found if p.startswith(below) and p[-1] != "/")

    def list_dirs(self, prefix: str) -> builtins.list[str]:
        path = self._path(prefix, allow_root=True)
        try:
            with self._guard(prefix, "list_dirs", reading=True):
                entries = self._fs.ls(path, detail=True)
        except BlobNotFound:
            return []
        names = {
            e["name"].rstrip("/").rsplit("/", 1)[-1]
            for e in entries
            if e["type"] == "directory" and e["name"].rstrip("/") != path
        }
        return sorted(names)

    def delete(self, key: str) -> None:
        path = self._path(key)
        with contextlib.suppress(BlobNotFound), self._guard(key, "delete", reading=True):
            self._fs.rm_file(path)

    def delete_prefix(self, prefix: str) -> None:
        keys = self.list(_check_prefix_to_delete(prefix))
        if keys:
            with self._guard(prefix, "delete_prefix", reading=False):
                self._fs.rm([self._path(k) for k in keys])


class MemoryBlobStore(FsspecBlobStore):
    """Blobs in fsspec's memory filesystem under ``memory://<name>``.

    The memory filesystem is global to the process: every store with the same name in this
    process sees the same blobs, and nothing is shared with other processes or survives
    exit. For tests and notebooks. Mutations take one process-wide lock, which makes
    :meth:`put_if_absent` atomic.
    """

    def put(self, key: str, data: bytes | memoryview) -> None:
        with _MEMORY_LOCK:
            super().put(key, data)

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        path = self._path(key)
        with _MEMORY_LOCK, self._guard(key, "put_if_absent", reading=False):
            if self._fs.isfile(path):
                return False
            self._fs.pipe_file(path, bytes(data))
            return True

    def exists(self, key: str) -> bool:
        return bool(self._fs.isfile(self._path(key)))

    def delete(self, key: str) -> None:
        with _MEMORY_LOCK:
            super().delete(key)

    def delete_prefix(self, prefix: str) -> None:
        with _MEMORY_LOCK:
            super().delete_prefix(prefix)


def _s3_error_code(error: BaseException) -> str | None:
    """Return the S3 error code behind an s3fs exception (its botocore cause), if any."""
    cause = error.__cause__
    response = getattr(cause, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return str(code) if code is not None else None
    return None


class S3BlobStore(FsspecBlobStore):
    """Blobs as S3 objects under ``s3://bucket/prefix``, through s3fs.

    A PUT is atomic and durable when acknowledged; listings and existence checks always go to
    the server (s3fs's listing cache is off), since a stale answer would break the commit
    protocol. :meth:`put_if_absent` is a conditional PUT with ``If-None-Match: *`` (also on
    the completion of a multipart upload, for blobs above s3fs's 100 MB threshold).
    """

    def __init__(self, fs: Any, base: str, root: str) -> None:
        from botocore.exceptions import BotoCoreError  # s3fs's own dependency

        super().__init__(fs, base, root)
        # s3fs passes botocore's connection and timeout errors through untranslated.
        self._errors = (OSError, BotoCoreError)

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        path = self._path(key)
        url = self.url(key)
        body = bytes(data)
        conflicts = 0
        while True:
            try:
                self._fs.pipe_file(path, body, mode="create")
            except FileExistsError:
                return False
            except self._errors as e:
                code = _s3_error_code(e)
                if code == "PreconditionFailed":
                    return False
                conflicts += 1
                if code != "ConditionalRequestConflict" or conflicts >= _CONFLICT_RETRIES:
                    raise BlobStoreError(f"put_if_absent failed for {url}: {e}") from e
                # S3 answers 409 while another conditional write to the key is in flight;
                # the retry then gets 412 or succeeds.
                SYSTEM.sleep(random.uniform(0.01, 0.05) * conflicts)
                continue
            return True

    def get(self, key: str) -> bytes:
        path = self._path(key)
        with self._guard(key, "get", reading=True):
            # One GET: a concurrent chunked download could mix two versions of the object.
            return bytes(self._fs.cat_file(path, max_concurrency=1))

    def _info(self, key: str, operation: str) -> dict[str, Any]:
        # One HEAD. s3fs's ``info`` follows a 404 with a LIST of ``<key>/`` (is it a
        # "directory"?): that doubled the cost of every existence check of a missing key
        # (the idle check for the next manifest version), and a LIST is priced as a PUT.
        bucket, name, _ = self._fs.split_path(self._path(key))
        with self._guard(key, operation, reading=True):
            out = self._fs.call_s3("head_object", self._fs.kwargs, Bucket=bucket, Key=name)
        return {"type": "file", "size": out["ContentLength"], "LastModified": out["LastModified"]}

    def mtime_ms(self, key: str) -> int:
        return int(self._info(key, "mtime_ms")["LastModified"].timestamp() * 1000)


def open_blob_store(root: str, *, storage_options: dict[str, Any] | None = None) -> BlobStore:
    """Open the blob store for ``root``.

    Parameters
    ----------
    root : str
        A local path or ``file://`` URL, ``memory://<name>``, ``s3://bucket/prefix``, or any
        other fsspec URL (a :class:`FsspecBlobStore` whose ``put_if_absent`` is refused).
    storage_options : dict, optional
        Passed to the fsspec filesystem (for S3: ``endpoint_url``, ``key``, ``secret``,
        ``client_kwargs`` ...). Local and memory roots take none. For S3, s3fs's instance
        and listing caches are always turned off.

    Raises
    ------
    InvalidConfiguration
        (a ``ValueError``) The root is empty or malformed, its scheme is unknown, or options
        were given for a local or memory root or are not accepted by the backend.
    """
    if not isinstance(root, str):
        raise InvalidConfiguration(f"storage root must be a string, got {type(root).__name__}")
    if storage_options is not None and not isinstance(storage_options, dict):
        raise InvalidConfiguration(
            f"storage_options must be a dict, got {type(storage_options).__name__}"
        )
    options = dict(storage_options or {})
    if "://" not in root and "::" not in root:
        # A plain local path: no need to import fsspec (it costs every Spark task's worker).
        if options:
            raise InvalidConfiguration(_no_options(options, root))
        if not root:
            raise InvalidConfiguration(_EMPTY_ROOT)
        return LocalBlobStore(root)
    import fsspec

    protocol, path = fsspec.core.split_protocol(root)
    if protocol in (None, *_LOCAL_PROTOCOLS) or protocol == "memory":
        if options:
            raise InvalidConfiguration(_no_options(options, root))
        if protocol == "memory":
            name = path.strip("/")
            if not name:
                raise InvalidConfiguration(f"memory root {root!r} needs a name: memory://<name>")
            fs = fsspec.filesystem("memory")
            return MemoryBlobStore(fs, f"/{name}", f"memory://{name}")
        if not path:
            raise InvalidConfiguration(_EMPTY_ROOT)
        return LocalBlobStore(path)
    known = fsspec.available_protocols()
    if any(p not in known for p in str(protocol).split("::")):
        raise InvalidConfiguration(
            f"storage root {root!r} has an unknown scheme {protocol!r}: use a local path, "
            "file://, memory://<name> or s3://bucket/prefix"
        )
    try:
        fs, base = fsspec.core.url_to_fs(
            root,
            **(
                {**options, "skip_instance_cache": True, "use_listings_cache": False}
                if protocol in _S3_PROTOCOLS
                else options
            ),
        )
        if protocol in _S3_PROTOCOLS:
            fs.connect()  # builds the client now: options it does not take fail here, not later
    except (ImportError, TypeError, ValueError) as e:
        # A missing backend package or options the backend does not take.
        raise InvalidConfiguration(f"cannot open storage root {root!r}: {e}") from e
    if protocol in _S3_PROTOCOLS:
        base = base.rstrip("/")
        if not base:
            raise InvalidConfiguration(f"S3 root {root!r} needs a bucket: s3://bucket/prefix")
        return S3BlobStore(fs, base, f"s3://{base}")
    return FsspecBlobStore(fs, base, fs.unstrip_protocol(base))


_EMPTY_ROOT = "storage root must not be empty: give a local path, memory://<name> or s3://..."


def _no_options(options: dict[str, Any], root: str) -> str:
    return (
        f"storage_options {sorted(options)} do not apply to {root!r}: only object stores "
        "(s3://...) take options"
    )
