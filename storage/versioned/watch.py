"""Wake-ups when a commit lands: what a consumer, reader or tailing read waits on.

On a local disk (Linux) one inotify descriptor per process watches the folders waiters care
about (a topic's ``manifest/`` folder, a subscription's ``state/`` folder): a file created or
moved into one of them, or a write to a journal segment in one of them (a commit's mark:
FORMAT.md, "Journal"), wakes every waiter on it at once. A waiting thread sleeps in ``poll`` on
the descriptor itself and reads what woke it (one thread switch from a commit to its reader,
instead of two through a watcher thread: 0.08 instead of 0.2 ms here); a thread runs beside
only while callbacks wait (the asyncio client's receive; the push dispatcher reads the events
of its callbacks itself: :class:`Wakeup`). Elsewhere
(object stores, ``memory://``, a platform without inotify, a folder that does not exist yet)
waiters poll: 1 ms doubling to ``FILEPULSAR_POLL_INTERVAL_MS`` (default 50). A watched waiter
still looks every ``FILEPULSAR_WATCH_RECHECK_MS`` (default 250) when nothing wakes it, so a
change inotify cannot see (a write from another host on a network filesystem, a timer due in
the consumer) is still found. ``FILEPULSAR_WATCH=0`` turns inotify off (every wait polls).

inotify is reached through ``ctypes`` on the C library (three calls: ``inotify_init1``,
``inotify_add_watch``, ``inotify_rm_watch``; events are read with ``os.read``): no dependency,
and waiters sleep in ``poll``, so an idle process costs no CPU.

A wake-up is a hint, never a promise: a waiter always looks at the store after waking, and a
commit that lands between its look and its wait is not lost (:meth:`CommitWaiter.wait`
returns at once when anything happened in its folders since it last returned).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import select
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterable

from filepulsar.dispatch.clock import SYSTEM, Clock
from filepulsar.storage import paths
from filepulsar.storage.blobstore.port import TMP_SUFFIX, BlobStore
from filepulsar.storage.forks import in_forked_child

log = logging.getLogger(__name__)

__all__ = [
    "CommitWaiter",
    "Wakeup",
    "drain_events",
    "folder_stamp",
    "poll_interval_s",
    "recheck_interval_s",
    "wait_events",
    "watching_enabled",
]

_IN_MODIFY = 0x00000002
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_DELETE_SELF = 0x00000400
_IN_MOVE_SELF = 0x00000800
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_IN_ONLYDIR = 0x01000000
_IN_CLOEXEC = 0o2000000
_IN_NONBLOCK = os.O_NONBLOCK
_EVENT_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event)
_TMP_SUFFIX = TMP_SUFFIX.encode()
_MASK = _IN_CREATE | _IN_MOVED_TO | _IN_MODIFY | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR
_JOURNAL = paths.JOURNAL_SUFFIX.encode()


def _is_tmp(name: bytes) -> bool:
    return name.startswith(b".") and name.endswith(_TMP_SUFFIX)


def env_ms(name: str, default: int, *, minimum: int = 1) -> float:
    """Seconds from the environment variable ``name`` (whole milliseconds >= ``minimum``;
    unset or empty: ``default`` ms). Any other value is logged and ``default`` used."""
    raw = os.environ.get(name, "")
    if not raw:
        return default / 1000
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        log.warning(
            "%s=%r ignored: allowed is a whole number of milliseconds >= %d", name, raw, minimum
        )
        return default / 1000
    return value / 1000


def poll_interval_s() -> float:
    """Longest pause between two looks of a polling waiter (``FILEPULSAR_POLL_INTERVAL_MS``)."""
    return env_ms("FILEPULSAR_POLL_INTERVAL_MS", 50)


def recheck_interval_s() -> float:
    """Longest wait of a watched waiter with no wake-up (``FILEPULSAR_WATCH_RECHECK_MS``)."""
    return env_ms("FILEPULSAR_WATCH_RECHECK_MS", 250)


def watching_enabled() -> bool:
    """Whether waits on local folders use inotify (``FILEPULSAR_WATCH``, default on)."""
    return os.environ.get("FILEPULSAR_WATCH", "1") not in ("0", "false", "no", "off")


class _Inotify:
    """The process's one inotify descriptor (non-blocking), and what its events counted.

    Whoever waits reads it: a waiter polls the descriptor and, woken, reads every queued event
    under ``lock`` (:meth:`drain`), for every folder, so any waiter (or :meth:`drain` before a
    look) brings the counts up to date. A thread polls it too while callbacks are registered
    whose callers do not read the events themselves (nobody else may be waiting when an event
    comes; the push dispatcher reads its callbacks' events itself: :class:`Wakeup`).
    """

    def __init__(self) -> None:
        name = ctypes.util.find_library("c")
        libc = ctypes.CDLL(name or None, use_errno=True)
        self._add = libc.inotify_add_watch
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._add.restype = ctypes.c_int
        self._rm = libc.inotify_rm_watch
        self._rm.argtypes = [ctypes.c_int, ctypes.c_int]
        self._rm.restype = ctypes.c_int
        fd = libc.inotify_init1(_IN_CLOEXEC | _IN_NONBLOCK)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        self.fd: int = fd
        # Whether events are queued, asked before each read: a look drains first, and an
        # empty queue answered by a read is a BlockingIOError raised and caught (4-5x this).
        self._queued = select.poll()
        self._queued.register(fd, select.POLLIN)
        # Each thread's own poll object for :meth:`events_queued` (asked without ``lock``: a
        # poll object polled by two threads at once raises).
        self._polls = threading.local()
        # Guards the watches and counts (re-entrant: close() unwatches while holding it).
        # Nobody waits on it: waiters sleep in poll() on the descriptor.
        self.lock = threading.RLock()
        self._wd_of: dict[str, int] = {}
        self._path_of: dict[int, str] = {}
        self._refs: dict[str, int] = {}
        #: events seen per watched folder (only ever grows while the folder is watched)
        self.counts: dict[str, int] = {}
        self.generation = 0  # bumped on queue overflow: every waiter looks again
        #: functions called after events in a folder (by whoever read them, outside ``lock``)
        self.callbacks: dict[str, set[Callable[[], None]]] = {}
        #: the callbacks whose callers do not read the events themselves (see
        #: :meth:`CommitWaiter.add_callback`): the thread polls while there are any
        self.threaded: set[Callable[[], None]] = set()
        self._thread: threading.Thread | None = None  # polls while threaded callbacks exist
        #: the waiters whose thread is in (or about to enter) a poll, woken through their pipe
        #: by whoever reads the events they wait for
        self.waiting: set[CommitWaiter] = set()
        self.failed = False  # reading failed: every wait polls the store

    def watch(self, path: str) -> bool:
        """Start (or share) a watch on folder ``path``; False if it cannot be watched now."""
        with self.lock:
            if self.failed:
                return False
            if path in self._wd_of:
                self._refs[path] = self._refs.get(path, 0) + 1
                return True
            wd = self._add(self.fd, os.fsencode(path), _MASK)
            if wd < 0:
                err = ctypes.get_errno()
                if err not in (errno.ENOENT, errno.ENOTDIR):
                    log.debug("inotify_add_watch(%s): %s", path, os.strerror(err))
                return False
            self._wd_of[path] = wd
            self._path_of[wd] = path
            self._refs[path] = self._refs.get(path, 0) + 1
            self.counts.setdefault(path, 0)
            return True

    def unwatch(self, path: str) -> None:
        """Drop one reference taken by :meth:`watch`; the last one removes the watch."""
        with self.lock:
            n = self._refs.get(path, 0) - 1
            if n > 0:
                self._refs[path] = n
                return
            self._refs.pop(path, None)
            wd = self._wd_of.pop(path, None)
            if wd is not None:
                self._path_of.pop(wd, None)
                self._rm(self.fd, wd)  # fails harmlessly if the folder is already gone

    def is_watched(self, path: str) -> bool:
        with self.lock:
            return path in self._wd_of

    def events_queued(self) -> bool:
        """Whether events wait on the descriptor, asked without ``lock`` (on this thread's
        own poll object): True where it cannot tell (the descriptor closed or replaced).
        Events are queued by the system call that causes them, before it returns: False
        says every commit marked or linked before this call was read already, by some
        thread (which counts it under ``lock`` before it lets it go)."""
        fd = self.fd
        if fd < 0 or self.failed:
            return True
        local = self._polls
        p = getattr(local, "poll", None)
        if p is None or local.fd != fd:
            p = select.poll()
            p.register(fd, select.POLLIN)
            local.poll, local.fd = p, fd
        return bool(p.poll(0))

    def drain(self) -> set[Callable[[], None]]:
        """Under ``lock``: read every queued event and count it; the callbacks to call (by
        the caller, once it has released ``lock``)."""
        calls: set[Callable[[], None]] = set()
        while self.fd >= 0 and not self.failed:
            if not self._queued.poll(0):
                break
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            except InterruptedError:
                continue
            except OSError:
                log.exception("inotify read failed: waits fall back to polling")
                self.failed = True
                self._wd_of.clear()
                self._path_of.clear()
                self.generation += 1
                break
            generation = self.generation
            touched = self._count_events(data)
            calls.update(fn for path in touched for fn in self.callbacks.get(path, ()))
            # The events are read now: no other poller will see them. Wake the threads
            # waiting for these folders (between their look and their poll, or in it).
            for waiter in self.waiting:
                if self.generation != generation or not touched.isdisjoint(waiter.paths):
                    waiter.nudge()
        return calls

    def _count_events(self, data: bytes) -> set[str]:
        touched: set[str] = set()
        pos = 0
        while pos + _EVENT_HEADER.size <= len(data):
            wd, mask, _, length = _EVENT_HEADER.unpack_from(data, pos)
            name = data[pos + _EVENT_HEADER.size : pos + _EVENT_HEADER.size + length]
            pos += _EVENT_HEADER.size + length
            name = name.rstrip(b"\0")
            if _is_tmp(name):
                continue  # a writer's temporary file: its commit is the link after
            if mask & _IN_MODIFY and not name.endswith(_JOURNAL):
                continue  # only a journal's records are commits written in place
            if mask & _IN_Q_OVERFLOW:
                self.generation += 1
                touched.update(self.callbacks)
                continue
            path = self._path_of.get(wd)
            if path is None:
                continue
            self.counts[path] = self.counts.get(path, 0) + 1
            touched.add(path)
            if mask & (_IN_IGNORED | _IN_DELETE_SELF | _IN_MOVE_SELF):
                # The folder is gone (topic deleted): waiters poll until it is back.
                self._path_of.pop(wd, None)
                if self._wd_of.get(path) == wd:
                    del self._wd_of[path]
        return touched

    def poll(self, timeout_s: float, wake_fd: int = -1) -> None:
        """Sleep until an event is queued, ``wake_fd`` is readable, or ``timeout_s`` passed
        (``lock`` not held)."""
        p = select.poll()
        p.register(self.fd, select.POLLIN)
        if wake_fd >= 0:
            p.register(wake_fd, select.POLLIN)
        with contextlib.suppress(InterruptedError):
            p.poll(max(0, int(timeout_s * 1000) + 1))

    def start_callbacks(self) -> None:
        """Under ``lock``: make sure a thread reads events while threaded callbacks are
        registered."""
        if self._thread is None and not self.failed:
            self._thread = threading.Thread(target=self._run, name="filepulsar-watch", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self.lock:
                if not self.threaded or self.failed or self.fd < 0:
                    self._thread = None
                    return
            self.poll(1.0)
            with self.lock:
                calls = self.drain()
            run_callbacks(calls)


def wait_events(timeout_s: float, wake_fd: int) -> None:
    """Sleep until an event is queued on the process's inotify descriptor, ``wake_fd`` is
    readable or ``timeout_s`` passed, then read the queued events and run the callbacks of
    the folders they touched, on this thread (:meth:`CommitWaiter.add_callback` with
    ``thread=False``: the caller reads what wakes it, no thread hands it over). Without
    inotify, a sleep on ``wake_fd`` alone."""
    ino = _inotify
    if ino is None or ino.failed or ino.fd < 0:
        p = select.poll()
        p.register(wake_fd, select.POLLIN)
        with contextlib.suppress(InterruptedError):
            p.poll(max(0, int(timeout_s * 1000) + 1))
        return
    ino.poll(timeout_s, wake_fd)
    drain_events()


class Wakeup:
    """A flag with :class:`threading.Event`'s ``set``, ``clear`` and ``wait``,
    whose ``wait`` sleeps on the process's inotify descriptor too and, woken, reads the
    queued events and runs their callbacks on the waiting thread (:func:`wait_events`): a
    thread that reads the events of its folders itself (callbacks added with
    ``thread=False`` that ``set`` it) sleeps until a commit lands or the flag is set, and
    no watcher thread wakes for each commit while it is busy or pausing.

    Its pipe is closed when the object is collected (whoever could still ``set`` it holds
    it), never before: a pipe closed while a callback could still write to it might write
    to another file that got its number."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = False
        self._sleeping = False
        self._pipe = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        weakref.finalize(self, _close_fds, *self._pipe)

    def set(self) -> None:
        with self._lock:
            self._set = True
            if not self._sleeping:
                return
        with contextlib.suppress(OSError):  # (a full pipe wakes the sleeper already)
            os.write(self._pipe[1], b"x")

    def clear(self) -> None:
        with self._lock:
            self._set = False

    def wait(self, timeout_s: float) -> bool:
        """Sleep until the flag is set (by another thread, or by a callback of the events
        read here), at most ``timeout_s``; whether it is set. Events of other folders (the
        process's other waiters') wake the sleep, are read and counted, and it sleeps again."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if self._set:
                    return True
                self._sleeping = True
            try:
                wait_events(timeout_s, self._pipe[0])
            finally:
                with self._lock:
                    self._sleeping = False
                with contextlib.suppress(OSError):
                    while os.read(self._pipe[0], 64):  # (the wake-ups taken)
                        pass
            if self._set:
                return True
            timeout_s = deadline - time.monotonic()
            if timeout_s <= 0:
                return False


def _close_fds(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def run_callbacks(calls: Iterable[Callable[[], None]]) -> None:
    for fn in calls:
        try:
            fn()
        except Exception:  # a waiter's callback must not stop the others
            log.exception("commit wake-up callback failed")


_inotify: _Inotify | None = None
_inotify_failed = False
_inotify_lock = threading.Lock()


def _shared_inotify() -> _Inotify | None:
    global _inotify, _inotify_failed
    with _inotify_lock:
        if _inotify is None and not _inotify_failed:
            try:
                _inotify = _Inotify()
            except (OSError, AttributeError) as e:  # no inotify here (not Linux, limits hit)
                log.info("inotify unavailable (%s): waits poll", e)
                _inotify_failed = True
        return _inotify


def _forget_after_fork() -> None:
    # A forked child (a Spark Python worker) shares the descriptor's queue with its parent
    # (and has no callback thread): new waiters get a fresh one on first use; waiters made
    # before the fork poll.
    global _inotify, _inotify_failed, _inotify_lock
    if _inotify is not None:
        _inotify._wd_of.clear()  # no watch works here: waiters made before the fork poll
        _inotify._path_of.clear()
        _inotify.failed = True
        _inotify._thread = None
        with contextlib.suppress(OSError):
            os.close(_inotify.fd)  # the child's copy
        _inotify.fd = -1
    _inotify = None
    _inotify_failed = False
    _inotify_lock = threading.Lock()


in_forked_child(_forget_after_fork)


def folder_stamp(path: str, *, drain: bool = True) -> tuple[int, int] | None:
    """A value that changes whenever a commit may have landed in local folder ``path`` (an
    OS path), or None when this process does not watch it now (only a look can tell then).

    Queued events are read first, so every commit marked or linked before this call is
    counted. Taken before a look and compared before the next, an unchanged stamp says the
    folder holds nothing new for this process to read (a cache validator; writes inotify
    cannot see, from another host, are the caller's to bound).

    ``drain=False``: the events queued are not read first (no system call): the stamp counts
    the commits marked or linked before the last read of the events, by any thread. For a
    caller that reads them itself at known moments (:func:`drain_events`, the push
    dispatcher at the start of each round): an unchanged stamp then says nothing landed
    between the two reads that preceded the two stamps."""
    ino = _inotify
    if ino is None or ino.failed:
        return None
    # (Nothing queued, most calls: the counts under the lock, with no system call made
    # while it is held. Every thread's look takes a stamp, and a lock held across a poll
    # and a read gathered them all behind it: the holder's system call lets another
    # thread run, which then waits for the lock.)
    if not drain or not ino.events_queued():
        with ino.lock:
            return (ino.generation, ino.counts.get(path, 0)) if path in ino._wd_of else None
    with ino.lock:
        if path not in ino._wd_of:
            return None
        calls = ino.drain()
        stamp = (ino.generation, ino.counts.get(path, 0)) if path in ino._wd_of else None
    run_callbacks(calls)
    return stamp


def drain_events() -> None:
    """Read the events queued on the process's inotify descriptor now and run the callbacks
    of the folders they touched (:meth:`CommitWaiter.add_callback`), on this thread: every
    commit marked or linked before this call is counted (see :func:`folder_stamp`)."""
    ino = _inotify
    if ino is None or ino.failed:
        return
    with ino.lock:
        calls = ino.drain()
    run_callbacks(calls)


class CommitWaiter:
    """Waits until a commit may have landed in some folders of a store.

    Parameters
    ----------
    store
        The blob store the folders are on; only a local one is watched.
    folders
        Keys of folders (e.g. ``paths.manifest_dir(topic)``) whose new files wake the waiter.
    clock
        The clock polling pauses are taken on. Only the system clock is watched: with another
        (a test's :class:`~filepulsar.dispatch.clock.ManualClock`) every wait is a polling pause
        on that clock, so nothing waits for real.

    Use: look at the store; if nothing is new, :meth:`wait`; look again. :meth:`wait` returns
    at once if anything happened in the folders since it last returned (or since the waiter was
    made), so no commit is missed between a look and a wait. One waiter is used by one thread
    at a time; any number of waiters share the process's one inotify descriptor (and its
    watcher thread, while callbacks that need one are registered).
    """

    def __init__(self, store: BlobStore, folders: Iterable[str], clock: Clock = SYSTEM) -> None:
        self._clock = clock
        self._ino = _shared_inotify() if watching_enabled() and clock is SYSTEM else None
        self._paths: list[str] = []
        if self._ino is not None:
            for key in folders:
                path = store.local_path(key)
                if path is not None:
                    self._paths.append(path)
        self._watched: set[str] = set()
        # A pipe that wakes the thread waiting in wait(): when the waiter is closed, or when
        # another thread read the events it waits for (made on the first watched wait).
        self._wake: tuple[int, int] | None = None
        self._seen = -1
        self._delay = 0.001
        self._closed = False
        self._rewatch()
        if self._ino is not None:
            with self._ino.lock:
                calls = self._ino.drain()  # (events queued before now are not news to it)
                self._seen = self._count()
            run_callbacks(calls)

    def _rewatch(self) -> None:
        """Watch the folders not yet watched (one may have been created or re-created)."""
        if self._ino is None:
            return
        for path in self._paths:
            if path in self._watched and not self._ino.is_watched(path):
                self._ino.unwatch(path)  # deleted: drop our reference, then watch afresh
                self._watched.discard(path)
            if path not in self._watched and self._ino.watch(path):
                self._watched.add(path)

    def _count(self) -> int:
        if self._ino is None:
            return 0
        return self._ino.generation + sum(self._ino.counts.get(p, 0) for p in self._paths)

    def changes(self) -> int:
        """A number that changes whenever something happens in a watched folder: taken
        before a look and compared after it, it tells whether a commit may have landed in
        between (always 0 when nothing is watched)."""
        if self._ino is None:
            return 0
        with self._ino.lock:
            calls = self._ino.drain()
            n = self._count()
        run_callbacks(calls)
        return n

    def add_callback(self, fn: Callable[[], None], *, thread: bool = True) -> None:
        """Call ``fn`` (on the thread that reads the events; it must not block) after events
        in the watched folders, until :meth:`remove_callback`. For waits that cannot block a
        thread (the asyncio client's receive): a watcher thread reads the events while such
        callbacks are registered. ``thread=False``: the caller reads them itself
        (:func:`wait_events`, :func:`drain_events`; any other reader runs ``fn`` too), and
        no thread wakes for them meanwhile (the push dispatcher, which reads them once per
        round, not once per commit)."""
        if self._ino is None:
            return
        with self._ino.lock:
            for path in self._paths:
                self._ino.callbacks.setdefault(path, set()).add(fn)
            if thread:
                self._ino.threaded.add(fn)
                self._ino.start_callbacks()

    def remove_callback(self, fn: Callable[[], None]) -> None:
        """Stop calling ``fn``; idempotent."""
        if self._ino is None:
            return
        with self._ino.lock:
            for path in self._paths:
                fns = self._ino.callbacks.get(path)
                if fns is not None:
                    fns.discard(fn)
                    if not fns:
                        del self._ino.callbacks[path]
            self._ino.threaded.discard(fn)

    def restart(self) -> None:
        """Start a new wait sequence: the next polling pause is 1 ms again."""
        self._delay = 0.001

    @property
    def watched(self) -> bool:
        """True when every folder is watched, so waits end on a commit, not on a poll."""
        return bool(self._paths) and len(self._watched) == len(self._paths)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until a commit may have landed, at most ``timeout`` seconds (None: no limit
        but the waiter's own: the re-check interval when watched, else the polling pause,
        1 ms doubling to the poll interval and reset by every wake-up).

        Returns True when a watched folder changed since the last wait (a commit may have
        landed), False when the wait ended for another reason (its time was up, the waiter
        was closed, or the waiter polls: a polling pause knows nothing, the caller looks)."""
        if self._closed:
            return False
        ino = self._ino
        if ino is not None and self._paths:
            with ino.lock:
                calls = ino.drain()  # (a folder's removal stops its watch)
            run_callbacks(calls)
            self._rewatch()
        if ino is None or not self.watched:
            pause = self._delay if timeout is None else min(self._delay, max(timeout, 0.0))
            self._delay = min(self._delay * 2, poll_interval_s())
            if pause > 0:
                self._clock.sleep(pause)
            return False
        limit = recheck_interval_s() if timeout is None else min(timeout, recheck_interval_s())
        end = time.monotonic() + limit
        while True:  # the events are read: before the first pass above, after each poll below
            with ino.lock:
                if self._closed:
                    return False
                now_count = self._count()
                if now_count != self._seen:
                    self._seen = now_count
                    self._delay = 0.001
                    return True
                left = end - time.monotonic()
                if left <= 0 or ino.failed:
                    return False
                if self._wake is None:
                    self._wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
                wake_r = self._wake[0]
                ino.waiting.add(self)
            try:
                ino.poll(left, wake_r)  # this thread reads what wakes it: no hand-off
            finally:
                with ino.lock:
                    ino.waiting.discard(self)
                    if self._closed:
                        self._close_wake()
                    else:
                        with contextlib.suppress(OSError):
                            while os.read(wake_r, 64):  # nudges taken
                                pass
                    calls = ino.drain()
            run_callbacks(calls)

    def close(self) -> None:
        """Stop watching (the shared watch ends when its last waiter closes); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._ino is not None:
            with self._ino.lock:
                for path in self._watched:
                    self._ino.unwatch(path)
                if self in self._ino.waiting:
                    self.nudge()  # the waiting thread returns now
                else:
                    self._close_wake()  # (else the waiting thread closes it as it returns)
        self._watched.clear()

    @property
    def paths(self) -> list[str]:
        """The OS paths of the folders it waits on."""
        return self._paths

    def nudge(self) -> None:
        """Under the watch's lock: make the thread waiting in :meth:`wait` look again."""
        if self._wake is not None:
            with contextlib.suppress(OSError):  # (a full pipe already wakes it)
                os.write(self._wake[1], b"x")

    def _close_wake(self) -> None:
        wake, self._wake = self._wake, None
        if wake is not None:
            for fd in wake:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def __enter__(self) -> CommitWaiter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
