"""A versioned state's journal on a local disk (FORMAT.md, "Journal").

On a local disk the versions of a folder (a topic's ``manifest/``, a subscription's state) are
records appended to segment files ``<folder>/<first version:020>.journal``, preallocated so
that a commit changes no file metadata. A commit, holding the folder's lock (an exclusive
``flock`` of the folder), reads the newest record, writes its own after it with the mark byte
clear, and lets the lock go; then it flushes its record with one ``fdatasync``, waits for the
records before it to be marked, and sets its own mark byte: a reader takes only marked
records. One flush per commit (one flush may cover several writers' records), against a new
file's fsync, link and folder fsync (two flushes in sequence) for a version written as its
own file; and the next writer appends while this one flushes.

A record between its write and its mark is *in flight*: its writer holds the lock of its first
byte (an open-file-description lock, released by the kernel when the writer dies). A record
that is complete (its checksum holds) but neither marked nor in flight was left by a writer
that died. Whoever finds it first settles it, holding its first byte: if the files it depends
on (the data blobs its state names, with the lengths it needs) are all there, they and the
record are flushed and the record is marked (it is committed: the writer may have told its
caller so before the mark reached the disk); otherwise it is cancelled (its magic becomes
``FPJX``: it never was, its writer cannot have returned), and so is every record built on it.

Bytes that start no record where one belongs are a torn write (the end of the records, written
over by the next commit) only if nothing committed is there or after them; otherwise they are
damage, reported with the segment and offset, and nothing is written past them. That is told
only when such bytes are met, never on a commit's usual path (FORMAT.md, "Damage and torn
tails").
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import resource
import struct
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from filepulsar.storage import paths
from filepulsar.storage.errors import CommitConflict, CorruptDataError
from filepulsar.storage.forks import in_forked_child
from filepulsar.storage.versioned.protocol import FlockWaiter
from filepulsar.storage.versioned.record import (
    HEAD_SIZE,
    MAGIC,
    MARK,
    SEAL_SIZE,
    VOID,
    Record,
    Tail,
    committed_at_or_after,
    decode_deps,
    encode_record,
    encode_seal,
    scan,
    scan_marked,
    takes,
)

#: Bytes preallocated per segment (more for a state whose record is large).
SEGMENT_BYTES = 1 << 20

_held = threading.local()  # folders whose lock this thread holds, or whose record it flies


def _held_dirs() -> set[str]:
    dirs: set[str] | None = getattr(_held, "dirs", None)
    if dirs is None:
        dirs = _held.dirs = set()
    return dirs


# Pipelined commits (FORMAT.md, "Journal"): a writer holds an open-file-description lock on
# the first byte of its record from before it writes the record until it has marked or
# cancelled it, so others tell a record in flight (locked) from one whose writer died (not
# locked). Linux only; elsewhere (or where the filesystem has no such locks) a commit stays
# whole under the folder's lock.
_OFD = sys.platform.startswith("linux") and hasattr(fcntl, "F_OFD_SETLK")
_FLOCK = struct.Struct("hh4xqqi4x")  # struct flock (64-bit Linux)
_PROBE_AT = 1 << 60  # where a journal checks that byte-range locks work
#: Sleeps between tries while waiting for a record in flight (seconds; the last repeats).
_POLL_S = (0.0, 0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001)


def _lock_byte(fd: int, offset: int) -> bool:
    """Take the lock of byte ``offset`` of ``fd``'s file without waiting; whether taken."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0))
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _unlock_byte(fd: int, offset: int) -> None:
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_UNLCK, os.SEEK_SET, offset, 1, 0))


def _byte_locked(fd: int, offset: int) -> bool:
    """Whether another open file description holds the lock of byte ``offset``."""
    got = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0))
    return bool(_FLOCK.unpack(got)[0] != fcntl.F_UNLCK)


# Every segment and folder this process holds open: a forked child closes its copies at once.
# They share the parent's open file descriptions, and so its locks (a record's first byte,
# the folder's flock): kept open in a child, they would outlive the parent, and a record of a
# parent that died in flight would look in flight for as long as the child lives.
_open_here: weakref.WeakSet[Any] = weakref.WeakSet()


def _close_inherited() -> None:
    global _budget_lock
    _budget_lock = threading.Lock()  # (another thread of the parent may have held it)
    for f in list(_open_here):
        with contextlib.suppress(Exception):
            f.forget()
    _open_here.clear()


class _LockFd:
    """A descriptor holding (or waiting for) a folder's lock in a commit that found it busy."""

    __slots__ = ("__weakref__", "fd")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        _open_here.add(self)

    def forget(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


in_forked_child(_close_inherited)


class Cancelled(Exception):
    """A commit built on a record in flight that was then cancelled (its writer failed, or
    died before its dependencies were written): the commit cancelled its own record and
    starts again from the newest committed state."""


# Segments kept open between calls, per process: at most a quarter of the open-file limit
# (a process reading a thousand partitions must not run out of descriptors); beyond it a
# journal opens its segment for each call and closes it after.
_budget_lock = threading.Lock()
_budget: list[int] = []  # [segments kept open, most allowed], set on first use


def _take_slot() -> list[int] | None:
    """A slot of the budget (the budget itself, to give it back to), or None if spent."""
    with _budget_lock:
        budget = _budget
        if not budget:
            try:
                soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            except (OSError, ValueError):
                soft = 1024
            if soft == resource.RLIM_INFINITY:
                soft = 1 << 20
            budget.extend((0, max(0, min(4096, soft // 4))))
        if budget[0] >= budget[1]:
            return None
        budget[0] += 1
        return budget


def _give_slot(budget: list[int]) -> None:
    with _budget_lock:
        budget[0] -= 1


@dataclass(slots=True)
class Ticket:
    """A commit :meth:`Journal.begin` started: its record (``size`` bytes at ``offset`` of
    ``segment``), the records in flight before it (``before``), whether it holds the record's
    first byte; or, when it started a new segment, its reading position after it (``pos``)."""

    seg: int
    version: int
    segment: _Segment | None = None
    offset: int = 0
    size: int = 0
    before: tuple[Record, ...] = ()
    locked: bool = False  # holds the record's first byte (pipelined)
    written: bool = False  # the record is written, neither marked nor cancelled yet
    pos: tuple[int, int, int, int] | None = None


class _Segment:
    """One segment file open for reading (and writing, where allowed)."""

    def __init__(self, path: str, first: int) -> None:
        self.path = path
        self.first = first
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            self.writable = True
        except OSError as e:
            if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # a reader may read only
            self.writable = False
        self.fd = fd
        self.pid = os.getpid()
        self.map: mmap.mmap | None = None  # for writing records (see _write_unseen)
        self.kept: list[int] | None = None  # the budget whose slot it holds (kept open)
        # The torn write found last (its offset and header): until those bytes change, nothing
        # can be committed after them (a writer writes there first), so it is not checked again.
        self.torn_at: tuple[int, bytes] | None = None
        self.size = 0
        self.ino = 0
        self.stat()
        _open_here.add(self)

    def forget(self) -> None:
        """In a forked child: close the inherited descriptor (the parent still uses it)."""
        if self.map is not None:
            self.map.close()
            self.map = None
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)
        if self.kept is not None:  # (the child's copy of the budget; no lock: one thread)
            self.kept[0] -= 1
            self.kept = None

    def stat(self) -> bool:
        """Refresh the size; False if the file was deleted (no name links to it now)."""
        st = os.fstat(self.fd)
        self.size = st.st_size
        self.ino = st.st_ino
        return st.st_nlink > 0

    def close(self) -> None:
        """Close it (again: nothing). Its descriptor's number is dropped first: a number the
        process reuses for another file is never read, written or closed through it."""
        if self.map is not None:
            self.map.close()
            self.map = None
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)
        if self.kept is not None:
            _give_slot(self.kept)
            self.kept = None

    def torn(self, where: int, version: int, why: str) -> bool:
        """At ``where`` (where version ``version`` belongs) are bytes that start no record the
        scan can take (``why``): whether they are a torn write, the end of the records (True),
        or were being written when read (False: read them again). Read afresh to the end of
        the segment; they are damage if something committed is there or after them, or a
        newer segment follows this one (its seal was here or after).

        Raises
        ------
        CorruptDataError
            Naming the segment, the offset and what follows.
        """
        if self.torn_at is not None and self.torn_at == (
            where,
            os.pread(self.fd, HEAD_SIZE, where),
        ):
            return True
        end = os.fstat(self.fd).st_size
        data = os.pread(self.fd, max(0, end - where), where)
        if takes(data, version):
            return False
        after = committed_at_or_after(data, where) or self._newer_segment()
        if after is None:
            self.torn_at = (where, data[:HEAD_SIZE])
            return True
        # (A reader racing a writer may have read the record half written, and its successors
        # since committed: they are committed only after it is written whole.)
        if takes(os.pread(self.fd, max(0, end - where), where), version):
            return False
        raise CorruptDataError(
            f"journal segment {self.path} at offset {where} is damaged ({why}) and is not a torn "
            f"write: {after}"
        )

    def _newer_segment(self) -> str | None:
        """Why a newer segment of this folder shows this one's records ended at a seal."""
        folder, _ = os.path.split(self.path)
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(folder):
                first = paths.journal_first(name)
                if first is not None and first > self.first:
                    return f"segment {name} follows it"
        return None

    def in_flight(self, offset: int) -> bool:
        """Whether the record at ``offset`` is in flight (its writer holds its first byte)."""
        return _byte_locked(self.fd, offset)

    def scan(
        self,
        start: int,
        expect: int | None,
        into: list[Record] | None = None,
        *,
        writer: bool = False,
    ) -> Tail:
        """This segment's records from ``start`` (:func:`record.scan
        <filepulsar.storage.versioned.record.scan>`)."""
        return scan(self, start, expect, into, writer=writer)


class Journal:
    """The journal segments of one folder (``directory``, an OS path).

    ``resolve`` turns a dependency's store key into an OS path. Reading needs nothing held;
    :meth:`locked` takes the folder's lock for a commit. Not thread-safe: its owner (a
    :class:`~filepulsar.storage.versioned.journaled.JournalEngine`) serialises calls, and
    takes its own lock before :meth:`locked`. The current segment and the folder stay open
    between calls (closed by :meth:`close`, or when the journal is collected); a process
    forked with them open opens its own.
    """

    def __init__(self, directory: str, resolve: Callable[[str], str | None], what: str) -> None:
        self.dir = directory
        self.resolve = resolve
        self.what = what
        self._seg: _Segment | None = None  # the segment read or written last
        self._segs_open: list[_Segment] = []  # what close() closes
        # The folder, open for its lock between commits (within the budget of descriptors
        # kept open). A folder deleted meanwhile is opened again by its name.
        self._dir = _DirHandle()
        self._ofd: bool | None = None  # byte-range locks work here (see _pipelined)
        self._paths: dict[int, str] = {}  # segment paths by first version (named per record)
        self._finalizer = weakref.finalize(self, _close_all, self._segs_open, self._dir)

    def close(self) -> None:
        self._finalizer()

    def path(self, first: int) -> str:
        known = self._paths.get(first)
        if known is None:
            if len(self._paths) >= 64:
                self._paths.clear()
            known = self._paths[first] = os.path.join(self.dir, paths.journal_segment(first))
        return known

    def segments(self) -> list[int]:
        """The segments' first versions, ascending ([] if the folder does not exist)."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return sorted(f for n in names if (f := paths.journal_first(n)) is not None)

    def _open(self, seg: int) -> _Segment:
        """Segment ``seg``, open (the cached one if it is that segment and still linked).

        Raises FileNotFoundError if it does not exist (deleted, or never written)."""
        cur = self._seg
        if cur is not None:
            if cur.first == seg and cur.pid == os.getpid() and cur.stat():
                return cur
            self._drop_segment()
        s = _Segment(self.path(seg), seg)
        self._keep(s)
        return s

    def _keep(self, s: _Segment) -> None:
        self._seg = s
        self._segs_open.append(s)
        s.kept = _take_slot()

    def _drop_segment(self) -> None:
        cur, self._seg = self._seg, None
        if cur is not None:
            # (Not there once the journal was closed: close() closed it already, and a read
            # of a closed journal raises the OSError of its descriptor, not a ValueError.)
            with contextlib.suppress(ValueError):
                self._segs_open.remove(cur)
            if cur.pid == os.getpid():
                cur.close()

    def _done(self) -> None:
        """End of a call: a segment kept beyond the process's budget is closed now."""
        cur = self._seg
        if cur is not None and cur.kept is None:
            self._drop_segment()

    # ------------------------------------------------------------------ reading
    def read_from(
        self,
        pos: tuple[int, int, int, int] | None,
        *,
        settle: bool = True,
        into: list[Record] | None = None,
    ) -> tuple[Record | None, tuple[int, int, int, int] | None]:
        """The newest marked record after ``pos`` (segment, offset, next version, inode; None:
        from the start of the newest segment) and the position after it. Returns (None, pos)
        when nothing is new, (None, None) when there is no segment at all. ``into`` collects
        every marked record read after ``pos``, oldest first (what a reader folds delta records
        with: FORMAT.md, "Delta records"); where the read started again from the newest
        segment's start, only those read since.

        A complete record left unmarked by a writer that stopped is settled first when the
        folder's lock is free (``settle``)."""
        try:
            rec, here, _ = self._read_from(pos, settle, into=into)
            return rec, here
        finally:
            self._done()

    def read_new(
        self, pos: tuple[int, int, int, int]
    ) -> tuple[list[Record], tuple[int, int, int, int]] | None:
        """:meth:`read_from` ``pos`` collecting every record (``into``), on a look's usual
        path only: the segment read last is still open and linked (the position's inode),
        and the records after the position are marked (:func:`record.scan_marked
        <filepulsar.storage.versioned.record.scan_marked>`) up to the end of the records or
        a record in flight. Returns those records, oldest first, and the position after
        them. None where anything else is there (another segment, a seal, a cancelled
        record, a torn write, damage, a record this call settled): :meth:`read_from` reads
        it then, and finds what this call found."""
        got = self._marked_after(pos)
        if got is None:
            return None
        recs, end, pending = got
        s = self._seg
        assert s is not None  # (the segment _marked_after read)
        if pending is not None and self._try_settle(s, pending):
            return None  # settled meanwhile: read again (read_from does)
        return recs, (pos[0], end, pos[2] + len(recs), s.ino)

    def _marked_after(
        self, pos: tuple[int, int, int, int]
    ) -> tuple[list[Record], int, Record | None] | None:
        """The usual path of a read after ``pos`` (:meth:`read_new`'s): where the segment
        read last (``_seg``) is still open and linked (the position's inode), what
        :func:`~filepulsar.storage.versioned.record.scan_marked` finds in it after ``pos``;
        else None."""
        s = self._seg
        seg, off, expect, ino = pos
        if (
            s is None
            or s.first != seg
            or s.kept is None  # (closed after each call: see _done)
            or s.pid != os.getpid()
            or not s.stat()
            or s.ino != ino
        ):
            return None
        return scan_marked(s, off, expect)

    def _read_from(
        self,
        pos: tuple[int, int, int, int] | None,
        settle: bool,
        writer: bool = False,
        into: list[Record] | None = None,
    ) -> tuple[Record | None, tuple[int, int, int, int] | None, Tail | None]:
        """:meth:`read_from`, and the tail it ended at (None when it ended at a segment that
        is not there). A ``writer``'s tail also lists the records in flight after the
        position returned (which is after the newest marked record)."""
        best: Record | None = None
        sealed_at: tuple[int, int, int, int] | None = None  # the seal followed last
        sealed_tail: Tail | None = None
        for _ in range(20):
            fresh = pos is None
            if pos is None:
                if into is not None:
                    into.clear()  # (read again from a segment's start)
                segs = self.segments()
                if not segs:
                    return None, None, None
                pos = (segs[-1], 0, segs[-1], -1)
            seg, off, expect, ino = pos
            try:
                s = self._open(seg)
            except FileNotFoundError:
                if sealed_at is not None and pos[0] == sealed_at[2]:
                    # The segment a seal names is not linked yet (its writer is between the
                    # seal and the link, or died there): nothing after the seal yet.
                    return best, sealed_at, sealed_tail
                pos = None  # deleted (an older segment, or the topic): list again
                continue
            if ino != -1 and s.ino != ino:
                self._drop_segment()
                pos = None  # replaced: the folder was deleted and created again
                continue
            had = len(into) if into is not None else 0
            tail = scan(s, off, expect, into, writer=writer and self._pipelined(s))
            if tail.pending is not None and settle and self._try_settle(s, tail.pending):
                if into is not None:
                    del into[had:]
                continue  # read the same place again, now settled
            if tail.last is not None:
                best = tail.last
            elif fresh and off == 0 and not tail.inflight:
                raise CorruptDataError(f"journal segment {self.path(seg)} holds no record")
            nxt = tail.last.version + 1 if tail.last is not None else expect
            if tail.inflight:
                first = tail.inflight[0]
                here = (seg, first.offset, first.version, tail.ino)
            else:
                here = (seg, tail.end, nxt, tail.ino)
            if tail.sealed >= 0:
                sealed_at, sealed_tail = here, tail
                pos = (tail.sealed, 0, tail.sealed, -1)  # the records go on in the next
                continue
            return best, here, tail
        raise CommitConflict(f"could not read a stable state of {self.what}")

    def records(self) -> Iterator[Record]:
        """Every marked record of every segment, oldest first (for maintenance)."""
        for seg in self.segments():
            try:
                s = _Segment(self.path(seg), seg)
            except FileNotFoundError:
                continue
            out: list[Record] = []
            try:
                s.scan(0, None, out)
            finally:
                s.close()
            yield from out

    def _pipelined(self, s: _Segment) -> bool:
        """Whether commits to this folder are pipelined: byte-range locks work on its
        filesystem (checked once, on segment ``s``)."""
        if self._ofd is None:
            self._ofd = _OFD
            if _OFD:
                try:  # (a byte far beyond any record: no record's lock)
                    _byte_locked(s.fd, _PROBE_AT)
                    if s.writable and _lock_byte(s.fd, _PROBE_AT):
                        _unlock_byte(s.fd, _PROBE_AT)
                except OSError:
                    self._ofd = False
        return self._ofd

    def _try_settle(self, s: _Segment, rec: Record) -> bool:
        """Settle ``rec``, the pending record a reader found (every record before it marked),
        if its writer is gone: pipelined, nobody holds its first byte; else, nobody holds the
        folder's lock. Whether it is settled now (by this call or meanwhile by another)."""
        if self.dir in _held_dirs() or not s.writable:
            return False  # this thread is its writer; or a reader that may only read
        try:
            with self._claim(s, rec) as got:
                if got and self._state(s, rec) is None:
                    self._settle_record(s, rec)
                return got
        except OSError:
            return False  # leave it to a writer

    @contextlib.contextmanager
    def _claim(self, s: _Segment, rec: Record) -> Iterator[bool]:
        """Hold what makes a pending record ``rec`` this caller's to settle, without waiting
        (its first byte; the folder's lock when not pipelined); yields whether held."""
        if not self._pipelined(s):
            with self.locked(0) as got:
                yield got
            return
        if not _lock_byte(s.fd, rec.offset):
            yield False  # in flight
            return
        try:
            yield True
        finally:
            _unlock_byte(s.fd, rec.offset)

    # ------------------------------------------------------------------ writing
    def locked(self, timeout_ms: int) -> _FolderLock:
        """Hold the folder's lock (an exclusive ``flock`` of the folder itself), waiting at
        most ``timeout_ms``; a context that gives whether it is held (0: do not wait). A
        timeout over 0 that expires raises :class:`CommitConflict`."""
        return _FolderLock(self, timeout_ms)

    def _take_lock(self) -> int | None:
        """The folder's lock taken without waiting through the folder's kept descriptor
        (opened on first use, and again in a forked process or once the folder it names
        was deleted); the descriptor, or None if another writer holds the lock."""
        kept = self._dir
        for _ in range(2):
            if kept.fd < 0 or kept.pid != os.getpid():
                kept.close()  # (a forked process closes its copy of its parent's)
                kept.fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                kept.pid = os.getpid()
                kept.budget = _take_slot()
                _open_here.add(kept)
            fd = kept.fd
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None
            if os.fstat(fd).st_nlink > 0:
                return fd
            # The folder was deleted since (its name may now be a new folder): unlock and
            # open it again by its name.
            fcntl.flock(fd, fcntl.LOCK_UN)
            kept.close()
        raise CommitConflict(f"could not lock the folder of {self.what}: it was deleted twice")

    def _state(self, s: _Segment, rec: Record) -> bool | None:
        """Whether ``rec`` (read complete at its offset before) is marked (True), cancelled
        or gone (False), or still pending (None)."""
        if os.pread(s.fd, 4, rec.offset) != MAGIC:
            return False  # cancelled (or a seal written over a cancelled record)
        return True if os.pread(s.fd, 1, rec.end - 1) == bytes((MARK,)) else None

    def _settle_record(self, s: _Segment, rec: Record) -> bool:
        """Settle ``rec``, a pending record whose writer is gone, every record before it
        marked (the caller holds its first byte, or the folder's lock when not pipelined):
        with every dependency there, mark it (committed); else cancel it. Whether marked."""
        deps = decode_deps(rec.deps, s.path, rec.offset)  # (only settling needs them)
        if self._deps_present(deps):
            for key, _ in deps:
                path = self.resolve(key)
                if path is not None:
                    _fsync_path(path)
            os.fdatasync(s.fd)
            os.pwrite(s.fd, bytes((MARK,)), rec.end - 1)
            return True
        os.pwrite(s.fd, VOID, rec.offset)
        os.fdatasync(s.fd)
        return False

    def _deps_present(self, deps: Sequence[tuple[str, int]]) -> bool:
        for key, length in deps:
            path = self.resolve(key)
            try:
                if path is None or os.stat(path).st_size < length:
                    return False
            except FileNotFoundError:
                return False
        return True

    def _hold(self, s: _Segment, rec: Record, deadline: float) -> None:
        """Take ``rec``'s first byte, waiting while its writer holds it (until ``deadline``,
        a ``time.monotonic()``; then CommitConflict)."""
        polls = iter(_POLL_S)
        pause = 0.0
        while not _lock_byte(s.fd, rec.offset):
            if time.monotonic() > deadline:
                raise CommitConflict(
                    f"commit to {self.what}: the record of version {rec.version} before it "
                    f"({s.path} at offset {rec.offset}) stayed in flight past the commit "
                    "timeout"
                )
            pause = next(polls, pause)
            time.sleep(pause)

    def _await(self, s: _Segment, recs: Sequence[Record], deadline: float) -> bool:
        """Wait for records in flight, oldest first, to be marked or cancelled (settling one
        whose writer died); whether all were marked. Stops at the first cancelled one."""
        for rec in recs:
            self._hold(s, rec, deadline)
            try:
                state = self._state(s, rec)
                if state is None:
                    state = self._settle_record(s, rec)
            finally:
                _unlock_byte(s.fd, rec.offset)
            if not state:
                return False
        return True

    def settled(self, seg: int, tail: Tail, deadline: float) -> bool:
        """Under the lock: wait for ``tail``'s records in flight (of segment ``seg``) to be
        marked or cancelled; whether all were marked."""
        try:
            return self._await(self._open(seg), tail.inflight, deadline)
        finally:
            self._done()

    def tail_for_write(
        self,
        pos: tuple[int, int, int, int] | None,
        deadline: float,
        into: list[Record] | None = None,
    ) -> tuple[Record | None, tuple[int, int, int, int], Tail] | None:
        """Under the lock: the record to build on (the newest in flight, else the newest
        marked after ``pos``; None if there is none after ``pos``), the reading position after
        the newest marked record, and the newest segment's tail. A record whose writer is
        gone is settled first; where that, or a cancelled record, follows records in flight,
        they are waited for first. None if there is no segment. ``into`` collects the marked
        records read (as :meth:`read_from`; the tail lists those in flight)."""
        best: Record | None = None
        try:
            if pos is not None and into is not None:
                # The usual path: the records after the position all marked, up to the end
                # of the records (nothing in flight, to settle or to wait for), read in one
                # read and one scan as a look reads them; anything else is read as below.
                got = self._marked_after(pos)
                seg = self._seg
                if got is not None and got[2] is None and seg is not None:
                    recs, end, _ = got
                    into.extend(recs)
                    last = recs[-1] if recs else None
                    after = (pos[0], end, pos[2] + len(recs), seg.ino)
                    return last, after, Tail(last, end, None, seg.size, seg.ino)
            for _ in range(64):
                rec, here, tail = self._read_from(pos, settle=False, writer=True, into=into)
                if here is None or tail is None:
                    return None
                best = rec or best
                if tail.pending is not None or (tail.cancelled and tail.inflight):
                    s = self._open(here[0])
                    if tail.inflight:
                        self._await(s, tail.inflight, deadline)  # then read again
                    elif not self._pipelined(s):
                        self._settle_record(s, tail.pending)  # type: ignore[arg-type]
                    else:
                        self._await(s, (tail.pending,), deadline)  # type: ignore[arg-type]
                    pos = here
                    continue
                return (tail.inflight[-1] if tail.inflight else best), here, tail
        finally:
            self._done()
        raise CommitConflict(f"could not read a stable state of {self.what}")

    def begin(
        self,
        seg: int,
        tail: Tail,
        version: int,
        payload: bytes,
        deps: Sequence[tuple[str, int]],
        before_mark: Callable[[], None] | None,
        deadline: float,
        full: Callable[[], bytes] | None = None,
    ) -> Ticket:
        """Under the lock: write ``version`` unmarked after ``tail`` of segment ``seg``,
        holding its first byte (pipelined); :meth:`finish` completes it. When it does not
        fit with room for a seal after it (or ``tail`` ends at a seal or a cancelled record),
        the records in flight are waited for, the segment sealed and a new one started:
        the ticket is then complete. A segment starts with a full state: ``full`` gives it
        where ``payload`` is a delta record. Raises :class:`Cancelled` if a record in flight
        it builds on was cancelled."""
        raw = encode_record(version, payload, deps, marked=False)
        try:
            s = self._seg
            if s is None or s.first != seg or s.ino != tail.ino or s.pid != os.getpid():
                s = self._open(seg)
            # (else the segment ``tail`` was just read from, under this same lock: its size
            # and inode are as that read found them, and finish() checks it is still linked
            # before it marks the record)
            if s.ino != tail.ino:
                raise CommitConflict(f"journal segment {s.path} was replaced during a commit")
            if (
                tail.sealed >= 0
                or tail.cancelled
                or tail.end + len(raw) + SEAL_SIZE > max(SEGMENT_BYTES, s.size)
            ):
                if not s.stat() or s.ino != tail.ino:  # (rolling over: linked still?)
                    raise CommitConflict(f"journal segment {s.path} was replaced during a commit")
                if tail.inflight and not self._await(s, tail.inflight, deadline):
                    raise Cancelled(f"a record before version {version} was cancelled")
                if tail.sealed < 0:
                    # Sealed (and flushed) before the next segment is linked: a reader or
                    # writer at this tail then always finds the way on.
                    os.pwrite(s.fd, encode_seal(version), tail.end)
                    os.fdatasync(s.fd)
                first = payload if full is None else full()
                return Ticket(
                    seg, version, pos=self.start_segment(version, first, deps, before_mark)
                )
            if s.size < SEGMENT_BYTES:  # written by create(): the record alone
                _zero_fill(s.fd, s.size, SEGMENT_BYTES)
                os.fsync(s.fd)
                s.stat()
            pipelined = self._pipelined(s)
            if pipelined and not _lock_byte(s.fd, tail.end):
                raise CommitConflict(
                    f"journal segment {s.path}: offset {tail.end} is held by another writer"
                )
            try:
                _write_unseen(s, raw, tail.end)
            except BaseException:
                if pipelined:
                    _unlock_byte(s.fd, tail.end)
                raise
        except BaseException:
            self._done()
            raise
        return Ticket(seg, version, s, tail.end, len(raw), tail.inflight, pipelined, True)

    def finish(
        self, t: Ticket, before_mark: Callable[[], None] | None, deadline: float
    ) -> tuple[int, int, int, int]:
        """Complete a commit :meth:`begin` started: flush the record, run ``before_mark``,
        wait for the records in flight before it, mark it, let go of its first byte. Returns
        the reading position after it. On any failure the record is cancelled (and
        :class:`Cancelled` raised if a record before it was)."""
        if t.pos is not None:
            return t.pos
        s = t.segment
        assert s is not None
        # (A read of this folder from ``before_mark`` must not settle this very record.)
        held = _held_dirs()
        held.add(self.dir)
        try:
            try:
                os.fdatasync(s.fd)
                if before_mark is not None:
                    before_mark()
                # The records before it first: behind a cancelled one, this record may be in a
                # segment sealed and deleted since (that is a Cancelled, not a deletion).
                if t.before and not self._await(s, t.before, deadline):
                    raise Cancelled(f"a record before version {t.version} was cancelled")
                if not s.stat():  # the folder was deleted (the topic or subscription)
                    raise FileNotFoundError(errno.ENOENT, "deleted during a commit", s.path)
            except BaseException:
                self._cancel(t)  # not committed: nobody may settle it as committed
                raise
            os.pwrite(s.fd, bytes((MARK,)), t.offset + t.size - 1)
            t.written = False
        finally:
            held.discard(self.dir)
            self._release(t)
        return (t.seg, t.offset + t.size, t.version + 1, s.ino)

    def cancel(self, t: Ticket) -> None:
        """Cancel a commit :meth:`begin` started and :meth:`finish` did not complete (the
        caller was interrupted between them); nothing if it completed or failed already."""
        if t.written:
            try:
                self._cancel(t)
            finally:
                self._release(t)

    def _cancel(self, t: Ticket) -> None:
        assert t.segment is not None
        t.written = False
        with contextlib.suppress(OSError):
            os.pwrite(t.segment.fd, VOID, t.offset)
            os.fdatasync(t.segment.fd)

    def _release(self, t: Ticket) -> None:
        """Let go of a ticket's first byte (if held), and of its segment past the budget."""
        if t.locked and t.segment is not None:
            t.locked = False
            with contextlib.suppress(OSError):
                _unlock_byte(t.segment.fd, t.offset)
        self._done()

    def start_segment(
        self,
        version: int,
        payload: bytes,
        deps: Sequence[tuple[str, int]],
        before_mark: Callable[[], None] | None,
    ) -> tuple[int, int, int, int]:
        """Under the lock: ``version`` as the first record of a new segment (a new file,
        linked whole and marked: visible once linked); then the segments before the previous
        one, and version files of the format before journals, are deleted."""
        if before_mark is not None:
            before_mark()
        raw = encode_record(version, payload, deps, marked=True)
        path = self.path(version)
        tmp = os.path.join(self.dir, paths.journal_segment_temp(version, uuid.uuid4().hex))
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            os.pwrite(fd, raw, 0)
            _zero_fill(fd, len(raw), max(SEGMENT_BYTES, 4 * len(raw) + SEAL_SIZE))
            os.fsync(fd)  # the record and the zeros after it
            try:
                os.link(tmp, path)
            except FileExistsError as e:
                raise CorruptDataError(
                    f"journal segment {path} exists already though version {version} is new"
                ) from e
        finally:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        _fsync_path(self.dir)
        self._drop_segment()
        # Opened again by its name: writes through the temporary file's descriptor would be
        # reported to inotify under the temporary name, which waiting readers ignore.
        kept = self._open(version)
        ino = kept.ino
        self._gc(version)
        self._done()
        return (version, len(raw), version + 1, ino)

    def create(self, payload: bytes) -> bool:
        """Write version 0 as segment 0 if no segment exists; whether this call did."""
        raw = encode_record(0, payload, (), marked=True)
        tmp = os.path.join(self.dir, paths.journal_segment_temp(0, uuid.uuid4().hex))
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            os.pwrite(fd, raw, 0)
            os.fsync(fd)
            try:
                os.link(tmp, self.path(0))
            except FileExistsError:
                return False
        finally:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        _fsync_path(self.dir)
        return True

    def _gc(self, newest: int) -> None:
        """Delete the segments before the one before ``newest``'s (best effort), and the
        version files and turn files of the format before journals."""
        segs = [s for s in self.segments() if s < newest]
        for s in segs[:-1]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path(s))
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(self.dir):
                if paths.manifest_version(name) is not None or paths.turn_version(name) is not None:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(self.dir, name))


class _FolderLock:
    """:meth:`Journal.locked`'s context: the lock taken on entering (raising
    :class:`CommitConflict`, or RuntimeError for a thread that holds it already), let go on
    leaving. (A class, not a generator's context: every commit takes it, and this costs a
    few calls less.)"""

    __slots__ = ("fd", "journal", "own", "timeout_ms")

    def __init__(self, journal: Journal, timeout_ms: int) -> None:
        self.journal = journal
        self.timeout_ms = timeout_ms
        self.fd = -1  # the descriptor locked (-1: not held)
        self.own: _LockFd | None = None  # the descriptor of its own a wait opened

    def __enter__(self) -> bool:
        j = self.journal
        if j.dir in _held_dirs():
            raise RuntimeError(f"nested commit to {j.what} in one thread")
        fd = j._take_lock()
        if fd is None:
            timeout_ms = self.timeout_ms
            if timeout_ms <= 0:
                return False
            # Wait in the kernel's queue, through a descriptor of its own (a waiter that
            # gives up leaves it to its thread, which unlocks and closes it).
            fd = os.open(j.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                got = FlockWaiter(fd).wait(timeout_ms / 1000)
            except BaseException:
                os.close(fd)
                raise
            if not got:
                raise CommitConflict(
                    f"commit to {j.what}: another writer held the folder's lock for {timeout_ms} ms"
                ) from None
            self.own = _LockFd(fd)  # (closed by a forked child)
        _held_dirs().add(j.dir)
        self.fd = fd
        return True

    def __exit__(self, *exc: object) -> None:
        fd = self.fd
        if fd < 0:
            return
        j = self.journal
        self.fd = -1
        _held_dirs().discard(j.dir)
        own = self.own
        if own is not None:
            own.fd = -1
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            if j._dir.budget is None:
                j._dir.close()  # past the budget: not kept open


class _DirHandle:
    """A journal's folder kept open for its lock: the descriptor (-1: none), the process that
    opened it, and the budget whose slot it holds (None: opened past the budget)."""

    __slots__ = ("__weakref__", "budget", "fd", "pid")

    def __init__(self) -> None:
        self.fd = -1
        self.pid = 0
        self.budget: list[int] | None = None

    def close(self) -> None:
        """Close it (a forked process closes its copy; only the opener gives the slot back)."""
        fd, mine, budget = self.fd, self.pid == os.getpid(), self.budget
        self.fd, self.pid, self.budget = -1, 0, None
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
            if budget is not None and mine:
                _give_slot(budget)

    def forget(self) -> None:
        """In a forked child: close the inherited descriptor (the parent still uses it)."""
        fd, budget = self.fd, self.budget
        self.fd, self.pid, self.budget = -1, 0, None
        if fd >= 0:
            os.close(fd)
        if budget is not None:  # (the child's copy of the budget; no lock: one thread)
            budget[0] -= 1


def _close_all(segments: list[_Segment], folder: _DirHandle) -> None:
    """Close the segments and the folder a journal holds open (only those this process
    opened)."""
    pid = os.getpid()
    for s in segments:
        if s.pid == pid:
            with contextlib.suppress(OSError):
                s.close()
    segments.clear()
    folder.close()


def _write_unseen(s: _Segment, data: bytes, offset: int) -> None:
    """Write ``data`` at ``offset`` of a writable segment through a shared memory map of it:
    the same page cache as a ``pwrite`` (``fdatasync`` flushes it), but inotify reports no
    ``IN_MODIFY`` for it, so waiting readers are woken once, by the mark, not also by a
    record they cannot take yet."""
    if s.map is None or len(s.map) != s.size:
        if s.map is not None:
            s.map.close()
        s.map = mmap.mmap(s.fd, s.size)
    s.map[offset : offset + len(data)] = data


def _zero_fill(fd: int, start: int, end: int) -> None:
    """Write zeros from ``start`` to ``end`` (the caller flushes them): a segment's blocks are
    written before any record goes there, so a commit's flush writes data only (no block
    allocation or extent conversion to journal: a third of the time on this project's test
    disk)."""
    zeros = bytes(min(end - start, 1 << 20))
    at = start
    while at < end:
        at += os.pwrite(fd, zeros[: end - at], at)


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)
