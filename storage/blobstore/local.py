"""The local-disk blob store: :class:`LocalBlobStore` (crash-safe put and put-if-absent by
linking a fsynced temporary file, memory-mapped ranged reads) and the :class:`Appender` its
``open_append`` returns.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import os
import shutil
import stat
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from filepulsar.storage import paths
from filepulsar.storage.blobstore import read_handles
from filepulsar.storage.blobstore.port import (
    BlobStore,
    check_byte_range,
    check_key,
    check_prefix_to_delete,
    is_tmp_name,
    translate_errors,
    translated,
)
from filepulsar.storage.errors import BlobExists, BlobNotFound, BlobStoreError, BlobTruncated

#: Local ranged reads of committed data at least this large are memory-mapped
#: (:meth:`LocalBlobStore.get_range_view`); smaller ones are cheaper to copy.
MAP_MIN_BYTES = 256 * 1024

_IOV_MAX = 1024

#: Blocks an appender reserves ahead of its writes (``fallocate`` keeping the size): a write
#: into reserved blocks needs no block allocation at its fsync, which then flushes the data
#: and the file's size only (about a third of the time on this project's test disk, where
#: the commit waits for that fsync). The reserve beyond the written end is released when
#: the appender closes; a process that dies leaves it to the blob's deletion.
PREALLOCATE_BYTES = 1 << 20
_FALLOC_FL_KEEP_SIZE = 1
_libc_fallocate: Any = None
_fallocate_unsupported = False


def _reserve(fd: int, offset: int, length: int) -> bool:
    """Reserve blocks for ``offset..offset+length`` without changing the file's size; False
    where the filesystem or platform cannot (then appends allocate as they go)."""
    global _libc_fallocate, _fallocate_unsupported
    if _fallocate_unsupported:
        return False
    if _libc_fallocate is None:
        try:
            import ctypes
            import ctypes.util

            libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
            fn = libc.fallocate
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
            _libc_fallocate = fn
        except (OSError, AttributeError, TypeError):
            _fallocate_unsupported = True
            return False
    if _libc_fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length) == 0:
        return True
    import ctypes

    if ctypes.get_errno() in (errno.EOPNOTSUPP, errno.ENOSYS):
        _fallocate_unsupported = True
    return False


#: An appender's background fsync thread (:meth:`Appender.start_sync`) ends after this many
#: seconds without a request; the next request starts a new one.
SYNC_THREAD_IDLE_S = 2.0

#: How long :meth:`Appender.start_sync` waits for its thread to take the request (it is
#: normally a thread switch; the bound only keeps a stalled thread from stalling the caller).
SYNC_START_WAIT_S = 0.005


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
        # Offset up to which an fsync (start_sync's or sync's own) made the file durable, once
        # that fsync has succeeded: a sync() that finds nothing written since skips its own.
        self._bg_synced = -1
        # The background fsync thread (one per appender, reused; it ends after
        # SYNC_THREAD_IDLE_S without work): _sync_want is the offset asked for, _sync_busy
        # whether a request is taken or pending, all under _sync_cv.
        self._sync_cv = threading.Condition(threading.Lock())
        self._syncer: threading.Thread | None = None
        self._sync_want = -1
        self._sync_busy = False
        self._sync_stop = False
        self._sync_taken = -1  # the offset of the last request the thread has taken
        self._reserved = 0  # blocks are reserved up to here (PREALLOCATE_BYTES)
        # Zeros are written up to here (:meth:`write_ahead`; 0: off).
        self._ahead = 0
        self._zeros = b""
        self._filled = 0

    def write_ahead(self, nbytes: int) -> None:
        """From now on keep ``nbytes`` of zeros written after the appended bytes (the file
        then ends in zeros until :meth:`close` cuts them off), so that a :meth:`sync` after an
        append is an ``fdatasync`` of data alone: no file size or block allocation to commit
        to the filesystem's journal (on ext4 about 0.6x the CPU of an append's ``fsync``, and
        no wait for the filesystem-wide journal commit). A reader of the blob's bytes by
        range sees no difference; one reading it whole while it is appended to sees the
        zeros."""
        if nbytes < 0:
            raise ValueError(f"write_ahead needs nbytes >= 0, got {nbytes}")
        self._ahead = nbytes
        self._zeros = bytes(nbytes)

    def _reserve_for(self, fd: int, n: int) -> None:
        """Prepare the file for ``n`` bytes appended at :attr:`offset`: zeros written ahead
        (:meth:`write_ahead`) or blocks reserved. Raises OSError (the caller's error path
        marks the appender failed and reports it as BlobStoreError)."""
        if self._ahead:
            end = self.offset + n
            if end > self._filled:
                # Zeros after the bytes about to be written (they cover the rest themselves:
                # a large append is not written twice).
                zeros = memoryview(self._zeros)
                at = end
                while zeros:
                    written = os.pwrite(fd, zeros, at)
                    if written == 0:  # not expected from a regular file; never loop forever
                        raise OSError(errno.EIO, f"pwrite wrote nothing at offset {at}")
                    zeros = zeros[written:]
                    at += written
                self._filled = end + self._ahead
            return
        if self.offset + n > self._reserved:
            length = max(n, PREALLOCATE_BYTES)
            if _reserve(fd, self.offset, length):
                self._reserved = self.offset + length

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
        """Start the sync of what is written so far in the background (``fsync``, or
        ``fdatasync`` with zeros written ahead: :meth:`write_ahead`), so the caller can do
        other work (prepare and write the commit that will name these bytes) while the disk
        works. The bytes are durable only once :meth:`sync` has returned: it waits for this
        sync, reports its failure, and syncs again only if more was written since.

        The sync runs on this appender's own thread, started on first use and reused; it
        ends after :data:`SYNC_THREAD_IDLE_S` without a request (a later call starts it
        again)."""
        if self._flusher is not None:
            self._flusher.join()
            self._flusher = None
        self._usable_fd("sync")
        with self._sync_cv:
            self._sync_want = self.offset
            self._sync_busy = True
            if self._syncer is None or not self._syncer.is_alive():  # (gone after a fork)
                self._syncer = threading.Thread(
                    target=self._sync_loop, name=f"fsync {self._url}", daemon=True
                )
                self._syncer.start()
            else:
                self._sync_cv.notify_all()
            # Wait (briefly) until the thread has taken the request: waiting lets it have
            # the GIL now, so the fsync starts at once instead of after the caller's next
            # stretch of Python (the commit's encoding), which would otherwise hold the GIL
            # for up to the switch interval while the disk sits idle.
            want = self._sync_want
            self._sync_cv.wait_for(
                lambda: self._sync_taken >= want or not self._sync_busy, SYNC_START_WAIT_S
            )

    def _sync_loop(self) -> None:
        cv = self._sync_cv
        while True:
            with cv:
                while not self._sync_busy or self._sync_want <= self._bg_synced:
                    if self._sync_busy:  # already covered: nothing to do
                        self._sync_busy = False
                        cv.notify_all()
                    # Stop when asked, or after an idle wait that brought no request.
                    if (self._sync_stop or not cv.wait(SYNC_THREAD_IDLE_S)) and (
                        self._sync_stop or not self._sync_busy
                    ):
                        self._syncer = None
                        cv.notify_all()
                        return
                upto = self._sync_want
                fd = self._fd
                self._sync_taken = upto
                cv.notify_all()
            error: OSError | None = None
            if fd is None:
                error = OSError(errno.EBADF, "appender closed")
            else:
                try:
                    self._sync_fd(fd)
                except OSError as e:
                    error = e
            with cv:
                if error is not None:
                    self._flush_error = error
                else:
                    self._bg_synced = max(self._bg_synced, upto)
                if error is not None or self._sync_want <= upto:
                    self._sync_busy = False
                cv.notify_all()

    def _wait_background_sync(self) -> None:
        """Wait until no background fsync is asked for or running."""
        with self._sync_cv:
            while self._sync_busy and self._syncer is not None and self._syncer.is_alive():
                self._sync_cv.wait(1.0)
            self._sync_busy = False

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
            self._reserve_for(fd, len(view))
            while view:
                written = os.write(fd, view)
                view = view[written:]
                self.offset += written
        except OSError as e:
            self._failed = True
            raise BlobStoreError(
                f"append at offset {self.offset} failed for {self._url}: {e}"
            ) from e
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
            self._reserve_for(fd, sum(len(v) for v in views))
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
            raise BlobStoreError(
                f"append at offset {self.offset} failed for {self._url}: {e}"
            ) from e
        return start

    def sync(self) -> None:
        """Make everything written so far durable: ``fsync``, or ``fdatasync`` with zeros
        written ahead (:meth:`write_ahead`; their size and blocks were committed by the first
        such sync).

        Raises
        ------
        BlobStoreError
            The sync (or an earlier background one) failed, or the appender is closed or
            failed before; the appender is then failed.
        """
        fd = self._usable_fd("sync")
        if self._flusher is not None:
            self._flusher.join()
            self._flusher = None
        self._wait_background_sync()
        try:
            if self._flush_error is not None:
                raise self._flush_error
            if self._bg_synced == self.offset:
                return  # an fsync that started after the last write succeeded
            self._sync_fd(fd)
            self._bg_synced = self.offset
        except OSError as e:
            self._failed = True
            raise BlobStoreError(f"fsync failed for {self._url}: {e}") from e

    def _sync_fd(self, fd: int) -> None:
        """Make the file's bytes durable: ``fsync``, or with zeros written ahead (whose size
        and blocks the first such sync commits) ``fdatasync``, which flushes what reading
        the data needs and skips the timestamps."""
        if self._ahead:
            os.fdatasync(fd)
        else:
            os.fsync(fd)

    def close(self) -> None:
        """Close the file without syncing; idempotent. Stops the background fsync thread.

        Cuts off the zeros written ahead (or releases the reserved blocks) beyond the
        written bytes, except on a failed appender (whose tail is unknown); the cut is not
        synced, so after an OS crash a closed blob may still end in zeros."""
        if self._flusher is not None:
            self._flusher.join()
            self._flusher = None
        with self._sync_cv:
            self._sync_stop = True
            self._sync_cv.notify_all()
            syncer = self._syncer
        if syncer is not None and syncer is not threading.current_thread():
            syncer.join()
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                if max(self._reserved, self._filled) > self.offset and not self._failed:
                    # release the reserve (or cut the zeros written ahead) beyond what was
                    # written
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, self.offset)
            finally:
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

    def __init__(self, directory: str, *, journal: bool = True) -> None:
        """``journal=False`` keeps versioned states as one file per version (the protocol
        object stores use) instead of journals: for tests of that protocol on a local
        folder. Every process on one root must use the same setting."""
        self._dir = os.path.abspath(directory)
        self.root = f"file://{self._dir}"
        self._journal = journal
        # key -> its OS path, checked and joined once per key (ranged reads: one per entry).
        self._read_paths: dict[str, str] = {}

    def _path(self, key: str, *, allow_root: bool = False) -> str:
        key = check_key(key, allow_root=allow_root)
        return os.path.join(self._dir, *key.split("/")) if key else self._dir

    def local_path(self, key: str) -> str | None:
        return self._path(key)

    def journal_dir(self, folder: str, *, create: bool = False) -> str | None:
        if not self._journal:
            return None
        path = self._path(folder)
        if create and not os.path.isdir(path):
            with translate_errors(self.url(folder), "create folder", reading=False):
                self._make_parents(os.path.join(path, "x"))
        return path

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
        tmp = os.path.join(head, paths.temp_name(name, uuid.uuid4().hex))
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
        with translate_errors(self.url(key), "put", reading=False):
            tmp = self._write_tmp(path, data)
            try:
                os.replace(tmp, path)
            except BaseException:
                _unlink_quietly(tmp)
                raise
            _fsync_dir(os.path.dirname(path))

    def _put_if_absent_anonymous(
        self,
        path: str,
        url: str,
        data: bytes | memoryview,
        before_link: Callable[[], None] | None,
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
                if before_link is not None:
                    before_link()
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

    def put_if_absent(
        self,
        key: str,
        data: bytes | memoryview,
        *,
        before_link: Callable[[], None] | None = None,
    ) -> bool:
        """As :meth:`BlobStore.put_if_absent`; ``before_link`` (if given) runs once the bytes
        are written and fsynced in the unnamed or temporary file, just before it is linked to
        its name (visible): the manifest commit waits there for the fsync of the data it
        names, which thus overlaps with writing the manifest. If it raises, nothing is
        linked and the error propagates."""
        path = self._path(key)
        url = self.url(key)
        with translate_errors(url, "put_if_absent", reading=False):
            if _O_TMPFILE and not _tmpfile_unsupported:
                won = self._put_if_absent_anonymous(path, url, data, before_link)
                if won is not None:
                    return won
            tmp = self._write_tmp(path, data)
            try:
                if before_link is not None:
                    before_link()
                won = _link_if_absent(url, lambda: os.link(tmp, path))
            finally:
                _unlink_quietly(tmp)
            if won:
                _fsync_dir(os.path.dirname(path))
            return won

    #: :meth:`put_if_absent` takes ``before_link`` (a store that wraps or overrides it
    #: without this mark gets ``before_link`` run before the call instead).
    put_if_absent.accepts_before_link = True  # type: ignore[attr-defined]

    def get(self, key: str) -> bytes:
        with translate_errors(self.url(key), "get", reading=True), open(self._path(key), "rb") as f:
            return f.read()

    def get_range(self, key: str, start: int, end: int) -> bytes:
        check_byte_range(key, start, end)
        path = self._read_paths.get(key)
        if path is None:
            path = self._path(key)
            if len(self._read_paths) >= 4096:
                self._read_paths.clear()
            self._read_paths[key] = path
        try:
            # One pread on a descriptor kept open (read_handles: a consumer reads one small
            # entry per message, where opening the file cost as much as the read).
            data = read_handles.pread(path, start, end)
        except OSError as e:
            raise translated(e, self.url(key), "get_range", reading=True) from e
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
        check_byte_range(key, start, end)
        with translate_errors(self.url(key), "get_range", reading=True):
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
        with translate_errors(self.url(key), operation, reading=True):
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

        with translate_errors(self.url(prefix), "list", reading=False):
            for directory, _, files in os.walk(top, onerror=fail):
                rel = os.path.relpath(directory, self._dir).replace(os.sep, "/")
                base = "" if rel == "." else f"{rel}/"
                keys.extend(base + name for name in files if not is_tmp_name(name))
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
        with translate_errors(self.url(key), "delete", reading=False):
            read_handles.forget(path)
            try:
                os.unlink(path)
            except FileNotFoundError:
                return
            _fsync_dir(os.path.dirname(path))

    def delete_prefix(self, prefix: str) -> None:
        path = self._path(check_prefix_to_delete(prefix))
        with translate_errors(self.url(prefix), "delete_prefix", reading=False):
            read_handles.forget(path, folder=True)
            try:
                shutil.rmtree(path)
            except FileNotFoundError:
                return
            _fsync_dir(os.path.dirname(path))

    def open_append(self, key: str) -> Appender:
        path = self._path(key)
        url = self.url(key)
        with translate_errors(url, "open_append", reading=False):
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
