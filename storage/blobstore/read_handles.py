"""Read handles of local blob files kept open per process, for
:meth:`LocalBlobStore.get_range <filepulsar.storage.blobstore.local.LocalBlobStore.get_range>`.

A live consumer reads one small entry per message, and opening the entry's file for each read
(the path's lookup, ``open``, ``close``) cost as much as the read itself. The handles here make
a read one ``fstat`` and one ``pread``:

1. One read-only descriptor per OS path, at most :data:`MAX_OPEN` of them, each closed once
   unused for :data:`IDLE_S` (by the next read, or a timer while any handle is kept). A blob
   another process deletes keeps its disk space while a handle holds it: at most
   :data:`IDLE_S` after this process last read it. With :data:`MAX_OPEN` kept, a read of
   another path closes the least recently read handle only if that one went unread for
   :data:`BUSY_S`; else the read opens its file for itself, keeping none. A process that
   reads more blobs in turn than it keeps handles (an application of ``bench_iot``'s
   host-sized variant reads 300: 10 writers' blobs in each of 30 topics, one entry of each
   after another) keeps :data:`MAX_OPEN` of them, read through their handles, instead of
   closing the handle it will read next each time (the least recently read first: every
   read opened and closed a file).
2. Before each read through a kept descriptor, ``fstat`` says whether its file is still linked:
   a file unlinked by any process (retention, compaction, a topic deleted) or replaced under
   its name (``put``) is read through its path, opened for that read, so a deleted blob reads
   as missing (``FileNotFoundError``) and a replaced one as the new file, as without the
   handles; so is a read through a kept descriptor that fails (a stale handle on a network
   filesystem) or comes back short. The check is of the file, not of its name: a blob with a
   second hard link (an operator's snapshot by ``cp -al``) reads as the file the handle
   holds until it is closed (filepulsar never renames or links a blob once written).
   Data blobs are only ever appended to (``storage/FORMAT.md``), and ``pread`` sees every byte
   any process appended before it.
3. A descriptor is closed only when no read is using it (a count of readers), so a read never
   goes to a number the OS has since given to another file.
4. :func:`forget` closes the handles of a path or of everything under a folder (the store's
   ``delete`` and ``delete_prefix``), and a forked child closes its copies of its parent's
   (also those a parent's read was still using).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

try:
    import resource
except ImportError:  # (not a Unix)
    resource = None  # type: ignore[assignment]

from filepulsar.dispatch.lru import LruCache
from filepulsar.storage.forks import in_forked_child

__all__ = ["IDLE_S", "MAX_OPEN", "forget", "open_count", "pread"]


def _max_open() -> int:
    """A quarter of the process's limit on open files (``RLIMIT_NOFILE``'s soft limit), at
    least 64 and at most 1,024: 256 under the usual 1,024."""
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0] if resource is not None else 256
    except (OSError, ValueError):
        soft = 256
    if soft < 0:  # (RLIM_INFINITY)
        return 1024
    return max(64, min(1024, soft // 4))


#: Read handles kept open per process at most.
MAX_OPEN = _max_open()
#: Seconds a handle unused is kept open at most.
IDLE_S = 30.0
#: With :data:`MAX_OPEN` handles kept, the least recently read makes room for another path's
#: only once unread this long.
BUSY_S = 1.0


class _Handle:
    __slots__ = ("closing", "fd", "readers", "used")

    def __init__(self, fd: int, now: float) -> None:
        self.fd = fd
        self.readers = 0
        self.closing = False
        self.used = now


_lock = threading.Lock()
#: The kept handles by OS path, the least recently read first (the bound is :func:`_retire`'s).
_open: LruCache[str, _Handle] = LruCache()
#: Handles dropped while a read was using them (closed by their last reader).
_lingering: set[_Handle] = set()
#: Closes idle handles while any is kept (see _sweep).
_sweeper: threading.Timer | None = None


def pread(path: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of the file at ``path`` (fewer when the file ends first: the
    caller checks the length). Raises what ``os.open`` or ``os.pread`` raise (OSError)."""
    h = _take(path)
    try:
        if os.fstat(h.fd).st_nlink > 0:
            data = _read(h.fd, start, end)
            if len(data) == end - start:
                return data
    except OSError:
        pass
    finally:
        _give(h)
    # Unlinked since it was opened (deleted, or replaced under its name), failing (a stale
    # handle on a network filesystem), or short (a size cached with it): not kept, and this
    # read goes through the path, opened for it alone, as without the handles.
    _drop(path, h)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _read(fd, start, end)
    finally:
        os.close(fd)


def _read(fd: int, start: int, end: int) -> bytes:
    n = end - start
    data = os.pread(fd, n, start) if n > 0 else b""
    while 0 < len(data) < n:  # a read stops at 2 GiB on Linux
        more = os.pread(fd, n - len(data), start + len(data))
        if not more:
            break
        data += more
    return data


def _take(path: str) -> _Handle:
    """The kept handle of ``path`` (opened if none), with one more reader."""
    now = time.monotonic()
    with _lock:
        h = _open.get(path)
        if h is not None:
            h.readers += 1
            h.used = now
            _retire(now)
            return h
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    fresh = _Handle(fd, now)
    fresh.readers = 1
    with _lock:
        h = _open.get(path)
        if h is not None:  # another thread opened it meanwhile: use that one
            h.readers += 1
        elif not _room(now):
            fresh.closing = True  # (kept by nobody: its reader closes it, _give)
            h = fresh
        else:
            _open.put(path, fresh)
            h = fresh
            _retire(now)
            _arm()
    if h is not fresh:
        os.close(fd)
    return h


def _give(h: _Handle) -> None:
    """A reader of ``h`` done: close it if it was dropped and this was its last reader."""
    with _lock:
        h.readers -= 1
        close = h.closing and h.readers == 0
        if close:
            _lingering.discard(h)
    if close:
        os.close(h.fd)


def _drop(path: str, h: _Handle) -> None:
    """``h`` is no longer ``path``'s handle (closed by its last reader)."""
    with _lock:
        if _open.peek(path) is h:
            _open.pop(path)
        if h.closing:
            return  # dropped already
        h.closing = True
        close = h.readers == 0
        if not close:
            _lingering.add(h)
    if close:
        os.close(h.fd)


def _room(now: float) -> bool:
    """Under ``_lock``: whether a new handle may be kept (fewer than :data:`MAX_OPEN` are, or
    the least recently read went unread for :data:`BUSY_S`: :func:`_retire` closes it)."""
    if len(_open) < MAX_OPEN:
        return True
    oldest = next(iter(_open.items()), None)
    return oldest is None or now - oldest[1].used >= BUSY_S


def _retire(now: float) -> None:
    """Under ``_lock``: drop the least recently read handles beyond :data:`MAX_OPEN` and those
    unused for :data:`IDLE_S` (each closed once its readers are done)."""
    kept = _open.items()
    while (oldest := next(iter(kept), None)) is not None:
        path, h = oldest
        if len(kept) <= MAX_OPEN and now - h.used < IDLE_S:
            break
        _open.pop(path)
        h.closing = True
        if h.readers == 0:
            os.close(h.fd)
        else:
            _lingering.add(h)


def _arm() -> None:
    """Under ``_lock``: make sure idle handles get closed while any is kept, also when this
    process reads nothing more (a blob deleted elsewhere frees its disk space then)."""
    global _sweeper
    if _sweeper is None and _open:
        _sweeper = threading.Timer(IDLE_S, _sweep)
        _sweeper.daemon = True
        _sweeper.start()


def _sweep() -> None:
    global _sweeper
    with _lock:
        _sweeper = None
        _retire(time.monotonic())
        _arm()


def forget(path: str, *, folder: bool = False) -> None:
    """Close the handle of ``path`` (``folder``: of every file under it) once its readers are
    done: the blob is being deleted."""
    with _lock:
        if folder:
            under = path.rstrip(os.sep) + os.sep
            gone = [(p, h) for p, h in _open.items() if p.startswith(under)]
        else:
            h = _open.peek(path)
            gone = [(path, h)] if h is not None else []
    for p, h in gone:
        _drop(p, h)


def open_count() -> int:
    """How many handles are kept open now."""
    with _lock:
        return len(_open)


@in_forked_child
def _forget_after_fork() -> None:
    # The child's copies of the parent's descriptors: closed (the parent's stay open), with a
    # fresh lock (a parent's thread may have held this one at the fork).
    global _lock, _sweeper
    for h in [*(h for _, h in _open.items()), *_lingering]:
        with contextlib.suppress(OSError):  # (closed already: nothing to give back)
            os.close(h.fd)
    _open.clear()
    _lingering.clear()
    _lock = threading.Lock()
    _sweeper = None  # (the parent's timer thread does not run in the child)
