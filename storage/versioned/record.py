"""A journal's bytes (FORMAT.md, "Journal"): records, seals, and the scan that reads them.

A segment file is a run of records, each ``header | dependencies | payload | mark byte``, then
zeros, or a seal naming the segment the records go on in. This module holds that format only:
:func:`encode_record` and :func:`encode_seal` write it, :func:`scan` reads a segment's records
through a :class:`SegmentFile` (a descriptor, its size, and two questions only the file around
it answers: is a record in flight, are these bytes a torn write), and the helpers above
:class:`Record` tell a torn tail from damage. Segments, locks and flushes are
:mod:`~filepulsar.storage.versioned.journal`'s.
"""

from __future__ import annotations

import functools
import json
import os
import struct
from collections.abc import Iterator, Sequence
from typing import NamedTuple, Protocol

import crc32c

from filepulsar.storage.errors import CorruptDataError
from filepulsar.storage.jsontext import dumps_compact

MAGIC = b"FPJ3"
#: A seal's magic: the segment's records end here and go on in segment ``<version>.journal``.
SEAL = b"FPJE"
#: A cancelled record's magic (written over ``MAGIC``): it is not committed, and neither is any
#: record after it in its segment; the next writer seals the segment there.
VOID = b"FPJX"
#: The mark byte's value once a record is visible.
MARK = 0xA5
# magic, version, dependencies' length, payload's length, crc32c of the rest of the record
HEAD = struct.Struct("<4sQIII")
HEAD_SIZE = HEAD.size
#: A seal: a header (no dependencies, no payload) and a mark byte. A record is appended only
#: where a seal still fits after it, so a writer can always close a segment with one.
SEAL_SIZE = HEAD_SIZE + 1
READ_CHUNK = 64 * 1024


def encode_record(
    version: int, payload: bytes, deps: Sequence[tuple[str, int]] = (), *, marked: bool
) -> bytes:
    """A record's bytes: header, dependencies (JSON ``[[key, length], ...]`` or empty),
    payload, mark byte."""
    dep = dumps_compact([[k, n] for k, n in deps]).encode() if deps else b""
    tail = HEAD.pack(MAGIC, version, len(dep), len(payload), 0)[4:20]
    crc = crc32c.crc32c(payload, crc32c.crc32c(dep, crc32c.crc32c(tail)))
    return b"".join(
        (
            HEAD.pack(MAGIC, version, len(dep), len(payload), crc),
            dep,
            payload,
            bytes((MARK if marked else 0,)),
        )
    )


def encode_seal(next_version: int) -> bytes:
    """A seal: the next version is the first record of segment ``<next_version>.journal``."""
    tail = HEAD.pack(SEAL, next_version, 0, 0, 0)[4:20]
    return HEAD.pack(SEAL, next_version, 0, 0, crc32c.crc32c(tail)) + bytes((MARK,))


# Telling a torn tail from damage (FORMAT.md, "Journal", "Damage and torn tails"). These run
# only where a scan meets bytes that start no record it can take (neither zeros, a seal nor a
# cancelled record): never on a commit's usual path.
_VERSION_LENGTHS = struct.Struct("<QII")
NO_RECORD = bytes(4)  # the magic of the zeros after the records


def crc_holds(data: bytes, i: int, dlen: int, plen: int) -> bool:
    """Whether the record at ``i`` of ``data``, taken to have dependencies of ``dlen`` and a
    payload of ``plen`` bytes (whatever its header says), is whole in ``data`` with its mark
    byte, and its stored CRC holds over its stored version, these lengths and its bytes."""
    end = i + HEAD_SIZE + dlen + plen
    if end >= len(data):
        return False
    _, version, _, _, crc = HEAD.unpack_from(data, i)
    head = _VERSION_LENGTHS.pack(version, dlen, plen)
    return crc == crc32c.crc32c(data[i + HEAD_SIZE : end], crc32c.crc32c(head))


def seal_holds(data: bytes, i: int) -> bool:
    """Whether the seal at ``i`` of ``data`` holds (its CRC over its version and lengths)."""
    return HEAD.unpack_from(data, i)[4] == crc32c.crc32c(data[i + 4 : i + 20])


def _find_all(data: bytes, sub: bytes, start: int) -> Iterator[int]:
    k = data.find(sub, start)
    while k >= 0:
        yield k
        k = data.find(sub, k + 1)


def takes(data: bytes, version: int) -> bool:
    """Whether ``data`` starts with what a scan takes there without asking whether it is
    damage: a whole record of ``version`` whose CRC holds, a cancelled record, a valid seal."""
    if len(data) < HEAD_SIZE:
        return False
    magic, v, dlen, plen, _ = HEAD.unpack_from(data, 0)
    if magic == VOID:
        return True
    if magic == SEAL:
        return v == version and seal_holds(data, 0)
    return magic == MAGIC and v == version and crc_holds(data, 0, dlen, plen)


def committed_at_or_after(data: bytes, base: int) -> str | None:
    """Why ``data``, a segment's bytes from offset ``base`` to its end, which start with no
    record a scan can take, is damage and not a torn write: a record committed there (whole
    under a damaged magic, or whole and marked with a bit of a length field flipped), or a
    committed record or a seal after it (records are marked in order, and a seal follows
    committed records only: a torn write has nothing committed after it). None if there is
    nothing."""
    if len(data) < HEAD_SIZE:
        return None
    magic, _, dlen, plen, _ = HEAD.unpack_from(data, 0)
    if magic != MAGIC and crc_holds(data, 0, dlen, plen):
        return f"the record there is whole under a damaged magic {magic!r}"
    for k in _find_all(data, MAGIC, 1):
        if k + HEAD_SIZE > len(data):
            break
        _, v, d, p, _ = HEAD.unpack_from(data, k)
        end = k + HEAD_SIZE + d + p
        if end < len(data) and data[end] == MARK and crc_holds(data, k, d, p):
            return f"a committed record (version {v}) follows at offset {base + k}"
    for k in _find_all(data, SEAL, 1):
        if k + SEAL_SIZE <= len(data) and seal_holds(data, k):
            return f"a seal follows at offset {base + k}"
    # The record there, committed, with a bit of a length field flipped (which may also make
    # it run past the end of the file): 64 candidates, each checked only where its mark is.
    for b in range(32):
        for d, p in ((dlen ^ (1 << b), plen), (dlen, plen ^ (1 << b))):
            m = HEAD_SIZE + d + p
            if m < len(data) and data[m] == MARK and crc_holds(data, 0, d, p):
                return "the record there is whole and marked under a flipped length bit"
    return None


class Record(NamedTuple):
    """A complete record read from a segment (a tuple: a scan makes one per record it
    passes, and a tuple is made at C speed)."""

    version: int
    payload: bytes
    deps: bytes  # the dependencies' JSON as stored (decoded by settling only)
    segment: int  # the first version of the segment holding it
    offset: int
    end: int  # the offset after its mark byte
    marked: bool


#: A marked record from its fields, without a Python call (``Record``'s own constructor is one).
_new_record = functools.partial(tuple.__new__, Record)


class Tail(NamedTuple):
    """Where a segment's records end: the last marked record read (None if the scan found
    none after its start), the offset after it, and what lies there. A writer's scan also
    passes records in flight (``inflight``: complete, not marked, their writers alive);
    ``end`` is then after them."""

    last: Record | None
    end: int  # offset where the next record goes
    pending: Record | None  # a complete record, not marked, at ``end`` (its writer gone)
    size: int  # the segment file's size
    ino: int
    sealed: int = -1  # the next segment's first version when a seal is at ``end``
    inflight: tuple[Record, ...] = ()  # records in flight before ``end`` (a writer's scan)
    cancelled: bool = False  # a cancelled record is at ``end``


def decode_deps(raw: bytes, path: str, offset: int) -> list[tuple[str, int]]:
    if not raw:
        return []
    try:
        return [(str(k), int(n)) for k, n in json.loads(raw)]
    except (ValueError, TypeError) as e:
        raise CorruptDataError(
            f"journal record in {path} at offset {offset} has malformed dependencies: {e}"
        ) from e


class SegmentFile(Protocol):
    """What :func:`scan` reads: a segment file open as ``fd`` (``size`` bytes, inode ``ino``,
    first version ``first``, at ``path``), and what only the file around it can answer."""

    fd: int
    path: str
    first: int
    size: int
    ino: int

    def in_flight(self, offset: int) -> bool:
        """Whether the record at ``offset`` is in flight (its writer holds its first byte)."""
        ...

    def torn(self, where: int, version: int, why: str) -> bool:
        """Whether the bytes at ``where`` that start no record (``why``) are a torn write
        (True), or were being written when read (False: read them again).

        Raises
        ------
        CorruptDataError
            If they are damage.
        """
        ...


def scan_marked(
    seg: SegmentFile, start: int, expect: int
) -> tuple[list[Record], int, Record | None] | None:
    """:func:`scan`'s usual path alone, for a reader (what a look finds after its position
    nearly always): from ``start``, where version ``expect`` begins, the marked records of
    the versions expected, whole and their CRC holding, up to the end of the records (zeros,
    the end of the file) or a record not marked (complete, its CRC holding, mark byte 0: in
    flight, or to settle). Returns those records (oldest first), the offset after them, and
    the record not marked there (else None): what :func:`scan` returns for the same bytes.
    None where anything else is there (a seal, a cancelled record, a torn write, damage):
    then :func:`scan` reads it, and says which it is."""
    out: list[Record] = []
    size, first = seg.size, seg.first
    where, version = start, expect
    buf = os.pread(seg.fd, 4096, start)  # (a look usually finds one small record or none)
    at = start  # the offset of ``buf`` in the file
    crc = crc32c.crc32c
    while True:
        if where + HEAD_SIZE > size:
            return out, where, None
        i = where - at
        if i + HEAD_SIZE > len(buf):
            at, i, buf = where, 0, os.pread(seg.fd, READ_CHUNK, where)
            if len(buf) < HEAD_SIZE:
                return None
        magic, v, dlen, plen, stored = HEAD.unpack_from(buf, i)
        if magic != MAGIC:
            return (out, where, None) if magic == NO_RECORD else None
        total = HEAD_SIZE + dlen + plen + 1
        if v != version or where + total > size:
            return None
        if i + total > len(buf):
            at, i, buf = where, 0, os.pread(seg.fd, max(READ_CHUNK, total), where)
            if total > len(buf):
                return None
        p = i + HEAD_SIZE + dlen
        mark_at = i + total - 1
        payload, dep = buf[p:mark_at], buf[i + HEAD_SIZE : p]
        if stored != crc(payload, crc(dep, crc(buf[i + 4 : i + 20]))):
            return None
        mark = buf[mark_at]
        if mark != MARK:
            if mark:
                return None
            return out, where, Record(v, payload, dep, first, where, where + total, False)
        out.append(_new_record((v, payload, dep, first, where, where + total, True)))
        where += total
        version += 1


def scan(
    seg: SegmentFile,
    start: int,
    expect: int | None,
    into: list[Record] | None = None,
    *,
    writer: bool = False,
) -> Tail:
    """Read ``seg``'s records from ``start`` (where version ``expect`` should begin; None:
    the segment's first record) to the first that is not marked and complete; ``into``
    collects every marked record read. A ``writer`` (pipelined) goes on past records in
    flight, to the first record that is neither marked nor in flight. Bytes there that
    start no record end the records only if they are a torn write (``seg.torn``).

    Raises
    ------
    CorruptDataError
        For damage (FORMAT.md, "Damage and torn tails"), naming the segment and offset.
    """
    where = start
    version = seg.first if expect is None else expect
    # The last marked record read: made (``made``) where ``into`` collects them, else made
    # only when returned (a writer passes the records of every commit since its last):
    # (buffer, its offset in it, ...).
    made: Record | None = None
    seen: tuple[bytes, int, int, int, int, int] | None = None
    flying: list[Record] = []
    buf = b""
    buf_at = start
    chunk = 4096  # a tail read usually finds one small record or none
    size, ino, first = seg.size, seg.ino, seg.first

    def last() -> Record | None:
        if seen is None:
            return made
        b, i, at, total, v, dlen = seen
        dep = b[i + HEAD_SIZE : i + HEAD_SIZE + dlen]
        return Record(v, b[i + HEAD_SIZE + dlen : i + total - 1], dep, first, at, at + total, True)

    while True:
        if where + HEAD_SIZE > size:
            return Tail(last(), where, None, size, ino, inflight=tuple(flying))
        if where + HEAD_SIZE > buf_at + len(buf):
            buf_at = where
            buf = os.pread(seg.fd, chunk, where)
            chunk = READ_CHUNK
        i = where - buf_at
        if len(buf) - i < HEAD_SIZE or buf[i : i + 4] != MAGIC:
            h = buf[i : i + HEAD_SIZE]
            magic = h[:4]
            sealed = -1
            if magic != NO_RECORD and magic != VOID and len(h) == HEAD_SIZE:
                if magic == SEAL:
                    _, v, _, _, crc = HEAD.unpack(h)
                    if v == version and crc == crc32c.crc32c(h[4:20]):
                        sealed = v
                if sealed < 0 and not seg.torn(
                    where,
                    version,
                    "a seal that does not hold" if magic == SEAL else f"magic {magic!r}",
                ):
                    buf = b""  # written meanwhile: read it again
                    continue
            # zeros, a seal, a cancelled record, or a torn write
            return Tail(last(), where, None, size, ino, sealed, tuple(flying), magic == VOID)
        _, v, dlen, plen, crc = HEAD.unpack_from(buf, i)
        total = HEAD_SIZE + dlen + plen + 1
        if where + total > size:  # cut short by the end of the file
            if seg.torn(where, version, "its length runs past the end of the file"):
                return Tail(last(), where, None, size, ino, inflight=tuple(flying))
            buf = b""
            continue
        if i + total > len(buf):
            buf_at = where
            buf = os.pread(seg.fd, max(READ_CHUNK, total), where)
            i = 0
        mark_at = i + total - 1
        if into is not None and not flying and v == version and mark_at < len(buf):
            # The usual record (whole, marked, of the version expected) taken at once, its
            # checksum over the two slices it is made of; anything else goes the long way.
            p = i + HEAD_SIZE + dlen
            payload, dep = buf[p:mark_at], buf[i + HEAD_SIZE : p]
            if buf[mark_at] == MARK and crc == crc32c.crc32c(
                payload, crc32c.crc32c(dep, crc32c.crc32c(buf[i + 4 : i + 20]))
            ):
                made = _new_record((v, payload, dep, first, where, where + total, True))
                into.append(made)
                where += total
                version += 1
                continue
        whole = len(buf) >= i + total  # (else a short read)
        mark = buf[i + total - 1] if whole else 0
        marked = mark == MARK
        crc_ok = whole and crc == crc32c.crc32c(
            buf[i + HEAD_SIZE : i + total - 1], crc32c.crc32c(buf[i + 4 : i + 20])
        )
        if not (crc_ok and v == version and (marked or mark == 0)):
            if crc_ok and v != version:
                why = f"it holds version {v}, not {version}"
            elif crc_ok:  # (a whole record's mark byte is 0 or MARK: else it is damaged)
                why = f"its mark byte (offset {where + total - 1}) is {mark:#04x}"
            else:
                why = "its checksum does not match" if whole else "it is cut short"
            if marked or (crc_ok and mark != 0):
                raise CorruptDataError(
                    f"journal record of version {v} in {seg.path} at offset {where} is "
                    f"damaged ({why})"
                )
            if seg.torn(where, version, why):  # torn or being written
                return Tail(last(), where, None, size, ino, inflight=tuple(flying))
            buf = b""
            continue
        if not marked:
            rec = Record(
                v,
                buf[i + HEAD_SIZE + dlen : i + total - 1],
                buf[i + HEAD_SIZE : i + HEAD_SIZE + dlen],
                first,
                where,
                where + total,
                False,
            )
            if writer and seg.in_flight(where):
                flying.append(rec)
                where += total
                version += 1
                continue
            return Tail(last(), where, rec, size, ino, inflight=tuple(flying))
        if flying:
            # Marks go in order: a record read in flight was marked meanwhile (between the
            # read of its bytes and this one), or is being settled (after a crash lost its
            # mark but kept a later one). The first is returned as pending: the writer
            # waits for it, then reads again.
            return Tail(last(), flying[0].offset, flying[0], size, ino)
        if into is not None:
            p = i + HEAD_SIZE + dlen
            made = _new_record(
                (v, buf[p : i + total - 1], buf[p - dlen : p], first, where, where + total, True)
            )
            into.append(made)
        else:
            seen = (buf, i, where, total, v, dlen)
        where += total
        version += 1
