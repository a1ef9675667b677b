"""The entry: the unit of write, one message or a batch of messages (format version 1).

Byte layout (little-endian; storage/FORMAT.md is the normative description)::

    prefix   20 B  magic "FPLE" | version u8 | codec u8 | flags u16 |
                   header_len u32 | payload_len u32 | crc32c u32
    header   header_len B   fixed fields (56 B) + producer name + chunk uuid + schema version,
                            zero-padded so the payload starts 8-byte aligned
    payload  payload_len B  the messages as one Arrow IPC record-batch message (no schema
                            message), compressed with ``codec``; it holds ``value`` and the
                            optional columns whose bit is set in ``flags``
    padding  zero bytes up to the next multiple of 8

An absent optional column is null for every message, except ``sequence_id``: when absent, the
messages carry ``header.sequence_id + i``.

The CRC32C covers prefix bytes 0..15, the header and the payload; padding must be zero. Messages
are stored column-wise so a reader turns a run of entries into Arrow record batches without a
per-message Python loop.

This module holds the layout's constants, the header and raw-entry types, the Arrow helpers and
the verifying decoder (:func:`iter_entries`, :func:`entry_offsets`); the one encoder is
:mod:`filepulsar.storage.entry_encode`.
"""

from __future__ import annotations

import contextlib
import functools
import struct
import sys
import threading
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import crc32c
import numpy as np
import pyarrow as pa

from filepulsar.storage import ipc_value
from filepulsar.storage.codec import Codec, decompress
from filepulsar.storage.errors import CorruptDataError

MAGIC = b"FPLE"
FORMAT_VERSION = 1
FLAG_BATCH = 0x1
FLAG_CHUNK = 0x2
#: Bit of each optional column in ``flags`` (``value`` is always stored).
COLUMN_FLAGS = {
    "key": 0x100,
    "ordering_key": 0x200,
    "properties": 0x400,
    "event_time": 0x800,
    "sequence_id": 0x1000,
}
#: The flag bits saying which columns beside the value an entry stores (none: the value alone).
COLUMN_BITS = sum(COLUMN_FLAGS.values())
_SEQ_BIT = COLUMN_FLAGS["sequence_id"]
_KEY_BIT = COLUMN_FLAGS["key"]
_KEY_BITS = _KEY_BIT | COLUMN_FLAGS["ordering_key"]
KNOWN_FLAGS = FLAG_BATCH | FLAG_CHUNK | COLUMN_BITS

PREFIX = struct.Struct("<4sBBHIII")
HEADER = struct.Struct("<qqqqiIiiq")
#: The little-endian u16 length before each of the header's three strings.
STR_LEN = struct.Struct("<H")
ALIGN = 8
#: Largest uncompressed payload (the Arrow record batch of one entry) the format allows. A
#: reader rejects a header that declares more before it decompresses anything, so one entry
#: never costs a reader more memory than this.
MAX_PAYLOAD_SIZE = 256 * 1024 * 1024
#: Largest ``header_len``: the fixed fields, three strings of at most 65,535 bytes, padding.
MAX_HEADER_SIZE = HEADER.size + 3 * (STR_LEN.size + 0xFFFF) + ALIGN - 1
#: Largest stored entry: prefix, header, a payload no codec expands past 2x the limit, padding.
MAX_ENTRY_SIZE = PREFIX.size + MAX_HEADER_SIZE + 2 * MAX_PAYLOAD_SIZE + ALIGN

#: Columns of the stored messages (one row per message of the entry).
MESSAGE_SCHEMA = pa.schema(
    [
        pa.field("value", pa.binary()),
        pa.field("key", pa.string()),
        pa.field("ordering_key", pa.binary()),
        pa.field("properties", pa.map_(pa.string(), pa.string())),
        pa.field("event_time", pa.int64()),
        pa.field("sequence_id", pa.int64(), nullable=False),
    ]
)
_FIELDS = {f.name: f for f in MESSAGE_SCHEMA}
_SCHEMAS: dict[int, pa.Schema] = {}


def stored_schema(flags: int) -> pa.Schema:
    """The schema of the payload for an entry with these ``flags`` (cached)."""
    cols = flags & COLUMN_BITS
    schema = _SCHEMAS.get(cols)
    if schema is None:
        names = ["value"] + [n for n, bit in COLUMN_FLAGS.items() if cols & bit]
        schema = pa.schema([_FIELDS[n] for n in names])
        _SCHEMAS[cols] = schema
    return schema


_NAMES: dict[int, tuple[str, ...]] = {}


def _stored_names(flags: int) -> tuple[str, ...]:
    """The column names of :func:`stored_schema` (cached: a schema's ``names`` is a new list
    per call, asked for each keyed one-message entry a Key_Shared look reads)."""
    names = _NAMES.get(flags & COLUMN_BITS)
    if names is None:
        names = _NAMES[flags & COLUMN_BITS] = tuple(stored_schema(flags).names)
    return names


_SELECTIONS: dict[tuple[int, Collection[str]], list[str] | None] = {}


def _selection(flags: int, columns: Collection[str]) -> list[str] | None:
    """The stored columns (in stored order) of an entry with ``flags`` that ``columns``
    names, or None when that is all of them (nothing to select). Cached per flags and
    hashable ``columns`` (a reader asks with the same set for every entry)."""
    try:
        key = (flags & COLUMN_BITS, columns)
        return _SELECTIONS[key]
    except TypeError:  # an unhashable collection: not cached
        names = stored_schema(flags).names
        keep = [n for n in names if n in columns]
        return None if len(keep) == len(names) else keep
    except KeyError:
        pass
    names = stored_schema(flags).names
    keep = [n for n in names if n in columns]
    if len(_SELECTIONS) >= 256:
        _SELECTIONS.clear()
    sel = _SELECTIONS[key] = None if len(keep) == len(names) else keep
    return sel


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    """Pulsar's chunk metadata: this entry is chunk ``chunk_id`` of ``num_chunks``."""

    uuid: str
    chunk_id: int
    num_chunks: int
    total_size: int


class EntryHeader(NamedTuple):
    """Entry-level metadata, as Pulsar's ``MessageMetadata`` records it for the entry.

    Immutable; a named tuple rather than a frozen dataclass because a reader builds one per
    entry it reads (a frozen dataclass costs four times as much to build)."""

    publish_time: int
    producer_name: str
    sequence_id: int
    highest_sequence_id: int
    num_messages: int
    codec: Codec
    uncompressed_size: int
    batched: bool
    deliver_at: int = 0
    chunk: ChunkInfo | None = None
    schema_version: bytes = b""


#: Payloads up to this many bytes are copied out of what was read (:func:`iter_entries`);
#: larger ones are views of it (no copy of a batch, or of a mapped fragment).
COPY_MAX = 4096


class RawEntry(NamedTuple):
    """A decoded, checksum-verified entry whose payload is still compressed (immutable; a
    named tuple for the same reason as :class:`EntryHeader`). The payload is ``bytes`` when
    it is at most :data:`COPY_MAX` bytes, else a view of the bytes read."""

    header: EntryHeader
    flags: int
    payload: bytes | memoryview
    offset: int
    size: int

    def stored(self, columns: Collection[str] | None = None) -> pa.RecordBatch:
        """The stored columns (``value`` plus the optional columns present), fully validated.

        ``columns`` (names of :data:`MESSAGE_SCHEMA`): only those of them that are stored, in
        stored order; only they are fully validated (the others pass the structural checks
        that cost no pass over the data), so a narrow read never scans what it does not emit.

        Raises
        ------
        EntryFormatError
            (kind ``decode``) If the payload does not decompress to the declared size, is not
            one Arrow record batch of the stored schema with ``num_messages`` rows, or its
            arrays are malformed (offsets out of bounds, invalid UTF-8, null map keys or
            sequence ids). The checksum passed, so the bytes are as written: a writer bug or a
            hostile writer. :meth:`filepulsar.storage.ledger.ReadEntry.stored` adds the location.
        """
        h = self.header
        flags = self.flags
        try:
            body = decompress(h.codec, self.payload, h.uncompressed_size)
            batch = pa.ipc.read_record_batch(pa.py_buffer(body), stored_schema(flags))
            keep = None if columns is None else _selection(flags, columns)
            if keep is not None:
                batch.validate()
                batch = batch.select(keep)
            batch.validate(full=True)
        except (
            ValueError,  # also pa.ArrowInvalid, UnicodeDecodeError
            TypeError,
            OSError,  # pa.ArrowIOError: not an IPC record batch message
            IndexError,
            OverflowError,
            MemoryError,
            NotImplementedError,
            pa.ArrowException,
        ) as e:
            raise self._undecodable(str(e)) from e
        if batch.num_rows != h.num_messages:
            raise self._undecodable(
                f"payload holds {batch.num_rows} messages, header says {h.num_messages}"
            )
        if (
            flags & _SEQ_BIT
            and (keep is None or "sequence_id" in keep)
            and batch.column(batch.num_columns - 1).null_count  # the last stored column
        ):
            raise self._undecodable("payload has null sequence ids")
        return batch

    def single_value(self) -> bytes | None:
        """The value of an entry of one message that has only a value (what every unbatched
        plain send stores), read without pyarrow (:mod:`filepulsar.storage.ipc_value`); None when
        the entry is anything else, or is not exactly as :mod:`filepulsar.storage.ipc_value` writes
        it: :meth:`stored` then decodes it (and reports what is wrong with it)."""
        h = self.header
        if h.num_messages != 1 or self.flags & COLUMN_BITS:
            return None
        try:
            body = decompress(h.codec, self.payload, h.uncompressed_size)
        except Exception:  # stored() decodes it again and says what is wrong
            return None
        return ipc_value.decode(body)

    def single_row(self) -> dict[str, Any] | None:
        """The stored columns of an entry of one message that has a value and a key and/or
        an ordering key and nothing else (what every unbatched keyed send stores: each entry
        of a live Key_Shared topic), by name, read without pyarrow
        (:func:`filepulsar.storage.ipc_value.decode_row`): ``key`` a str, the others bytes,
        as :meth:`stored` gives them. None when the entry is anything else, or is not
        exactly as that module writes it: :meth:`stored` then decodes it (and reports what
        is wrong with it)."""
        h = self.header
        return single_row_of(self.flags, h.num_messages, h.codec, h.uncompressed_size, self.payload)

    def _undecodable(self, why: str) -> EntryFormatError:
        return EntryFormatError(
            f"entry at byte {self.offset} does not decode: {why}", -1, self.offset, kind="decode"
        )

    def messages(self) -> pa.Table:
        """The entry's messages as a table in :data:`MESSAGE_SCHEMA` (all columns)."""
        return complete(self.stored(), [self.header.sequence_id], [self.header.num_messages])


def single_row_of(
    flags: int, num_messages: int, codec: int, uncompressed_size: int, payload: bytes | memoryview
) -> dict[str, Any] | None:
    """:meth:`RawEntry.single_row` of an entry with these fields (``codec``: a
    :class:`~filepulsar.storage.codec.Codec` or its id)."""
    cols = flags & COLUMN_BITS
    if num_messages != 1 or not cols or cols & ~_KEY_BITS:
        return None
    body = payload
    if codec or len(body) != uncompressed_size:  # (codec 0: Codec.NONE)
        try:
            body = decompress(_CODECS[codec], body, uncompressed_size)
        except Exception:  # stored() decodes it again and says what is wrong
            return None
    names = _stored_names(flags)
    values: list[Any] | None = ipc_value.decode_row(body, len(names))
    if values is None:
        return None
    if cols & _KEY_BIT:
        # (The columns are value, then key and/or ordering key in that order: the key is
        # the second.)
        try:
            values[1] = values[1].decode()
        except UnicodeDecodeError:  # stored() says what is wrong
            return None
    return dict(zip(names, values))


_SUBSETS: dict[tuple[int, frozenset[str]], pa.Schema] = {}


def schema_subset(schema: pa.Schema, columns: Collection[str] | None) -> pa.Schema:
    """``schema``, or the part of it naming ``columns`` (in schema order), built once per
    schema and set of names (a small bounded cache: a query asks for one or two sets)."""
    if columns is None:
        return schema
    key = (id(schema), columns if isinstance(columns, frozenset) else frozenset(columns))
    sub = _SUBSETS.get(key)
    if sub is None:
        sub = pa.schema([f for f in schema if f.name in key[1]])
        if len(_SUBSETS) >= 64:
            _SUBSETS.clear()
        _SUBSETS[key] = sub
    return sub


def message_schema(columns: Collection[str] | None = None) -> pa.Schema:
    """:data:`MESSAGE_SCHEMA`, or the part of it naming ``columns`` (in schema order; built
    once per set of names)."""
    return schema_subset(MESSAGE_SCHEMA, columns)


_pandas_preload: threading.Thread | None = None


def preload_pandas() -> None:
    """Start importing pandas in a background thread, once per process.

    pyarrow imports pandas the first time an array goes to or from NumPy (``to_numpy``,
    ``pa.array``), which a consumer's first received message would pay (0.25-1.2 s on this
    machine). A consumer or reader calls this when it is made, so the import runs while it
    waits for its first message. Nothing depends on it finishing; without pandas it does
    nothing.
    """
    global _pandas_preload
    if _pandas_preload is not None or "pandas" in sys.modules:
        return

    def load() -> None:
        with contextlib.suppress(ImportError):
            import pandas  # noqa: F401

    _pandas_preload = threading.Thread(target=load, name="filepulsar-preload", daemon=True)
    _pandas_preload.start()


def numpy_to_arrow(values: np.ndarray, mask: np.ndarray | None = None) -> pa.Array:
    """A 1-D NumPy array of a fixed-width number type or bool as an Arrow array (nulls where
    ``mask`` is true), built from its buffers.

    ``pa.array`` on NumPy or Python input first imports pandas (pyarrow looks for
    pandas-like input): 0.25-1.2 s that a process's first send or first receive paid.
    """
    values = np.ascontiguousarray(values)
    n = len(values)
    validity = None
    null_count = 0
    if mask is not None:
        mask = np.asarray(mask, np.bool_)
        null_count = int(mask.sum())
        if null_count:
            validity = pa.py_buffer(np.packbits(~mask, bitorder="little"))
    if values.dtype == np.bool_:
        typ: pa.DataType = pa.bool_()
        data = pa.py_buffer(np.packbits(values, bitorder="little"))
    else:
        typ = pa.from_numpy_dtype(values.dtype)
        data = pa.py_buffer(values)
    return pa.Array.from_buffers(typ, n, [validity, data], null_count=null_count)


#: Up to this many rows, :func:`small_int_array` packs the values itself (a fetch woken by one
#: commit builds its columns for a message or a few; NumPy's round trip costs more there).
SMALL_ROWS = 16

_PACK = {pa.int64(): "q", pa.int32(): "i"}


@functools.lru_cache(maxsize=256)
def _nulls(n: int, typ: pa.DataType) -> pa.Array:
    return pa.nulls(n, typ)


def small_int_array(values: Sequence[int | None], typ: pa.DataType) -> pa.Array:
    """A few (``<= SMALL_ROWS``) values of ``typ`` (``pa.int64()`` or ``pa.int32()``) as an
    Arrow array, packed directly; None is null. Arrays of only nulls are shared (Arrow arrays
    are immutable)."""
    n = len(values)
    if all(v is None for v in values):
        return _nulls(n, typ)
    validity = None
    null_count = 0
    if any(v is None for v in values):
        bits = sum(1 << i for i, v in enumerate(values) if v is not None)
        validity = pa.py_buffer(bits.to_bytes((n + 7) // 8, "little"))
        null_count = sum(v is None for v in values)
        values = [0 if v is None else v for v in values]
    data = pa.py_buffer(struct.pack(f"<{n}{_PACK[typ]}", *values))
    return pa.Array.from_buffers(typ, n, [validity, data], null_count=null_count)


def strings_to_arrow(values: Sequence[str]) -> pa.Array:
    """Python strings (no nulls, < 2 GiB in all) as an Arrow string array, from its buffers
    (see :func:`numpy_to_arrow`)."""
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)), out=offsets[1:])
    return pa.Array.from_buffers(
        pa.string(), len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    )


def complete(
    stored: pa.RecordBatch | pa.Table,
    first_sequence_ids: Sequence[int],
    counts: Sequence[int],
    columns: Collection[str] | None = None,
) -> pa.Table:
    """Messages of consecutive entries with the same stored columns, in :data:`MESSAGE_SCHEMA`
    (only its ``columns`` when given, in schema order; nothing else is built).

    ``stored`` holds the entries' stored columns back to back; entry ``k`` has ``counts[k]``
    messages and, when no ``sequence_id`` column is stored, sequence ids from
    ``first_sequence_ids[k]`` up. Absent columns become nulls; nothing loops per message.
    """
    table = pa.Table.from_batches([stored]) if isinstance(stored, pa.RecordBatch) else stored
    n = table.num_rows
    schema = message_schema(columns)
    cols = []
    for f in schema:
        i = table.schema.get_field_index(f.name)
        if i >= 0:
            cols.append(table.column(i))
        elif f.name == "sequence_id" and n <= SMALL_ROWS:
            cols.append(
                small_int_array(
                    [s + k for s, c in zip(first_sequence_ids, counts) for k in range(c)],
                    pa.int64(),
                )
            )
        elif f.name == "sequence_id":
            c = np.asarray(counts, np.int64)
            starts = np.cumsum(c) - c
            within = np.arange(n, dtype=np.int64) - np.repeat(starts, c)
            cols.append(
                numpy_to_arrow(np.repeat(np.asarray(first_sequence_ids, np.int64), c) + within)
            )
        else:
            cols.append(_nulls(n, f.type) if n <= SMALL_ROWS else pa.nulls(n, f.type))
    return pa.Table.from_arrays(cols, schema=schema)


#: Kinds of :class:`EntryFormatError`.
FRAMING = "framing"  # truncated, bad magic, lengths past the fragment, bytes left over
VERSION = "version"  # an entry format version or flag/codec this code does not know
CHECKSUM = "checksum"  # the CRC32C does not match
HEADER_KIND = "header"  # framing and CRC fine, header fields impossible or padding non-zero
DECODE = "decode"  # framing and CRC fine, the payload does not decode


class EntryFormatError(CorruptDataError, ValueError):
    """Raised by :func:`iter_entries` with the index of the bad entry in ``entry_index``
    (-1 when raised by :meth:`RawEntry.stored`, which does not know it).

    ``kind`` says what failed: :data:`FRAMING`, :data:`VERSION`, :data:`CHECKSUM`,
    :data:`HEADER_KIND` or :data:`DECODE`. ``resume`` is where the next entry starts when the
    bad entry's framing (magic, lengths) is intact -- a checksum, header or padding error -- so
    a reader that skips damaged entries can go on there; None when the entries after it
    cannot be located. It names no topic: the managed ledger re-raises it with the location.
    """

    def __init__(
        self,
        message: str,
        entry_index: int,
        offset: int,
        resume: int | None = None,
        *,
        kind: str = FRAMING,
    ):
        super().__init__(message)
        self.entry_index = entry_index
        self.offset = offset
        self.resume = resume
        self.kind = kind


#: Codec by its id (an index, not an enum look-up per entry).
_CODECS = tuple(Codec(i) for i in range(Codec.SNAPPY + 1))
_ZEROS = bytes(ALIGN)

#: Longest header string region (the three strings and the padding) whose parse is cached,
#: and how many are kept.
_STRINGS_CACHE_MAX_LEN = 256
_STRINGS_CACHE_SIZE = 1024


def _parse_strings(region: bytes) -> tuple[str, bytes, bytes]:
    """The producer name, chunk uuid (raw) and schema version of a header's string region
    (three length-prefixed strings, then zero padding); ValueError naming what is wrong."""
    out: list[Any] = []
    p, end = 0, len(region)
    for _ in range(3):
        if p + 2 > end:
            raise ValueError("header string runs past the header")
        (k,) = STR_LEN.unpack_from(region, p)
        p += 2
        if p + k > end:
            raise ValueError("header string runs past the header")
        out.append(region[p : p + k])
        p += k
    if any(region[p:]):
        raise ValueError("non-zero header padding")
    # strict: UnicodeDecodeError (a ValueError) on bad bytes
    return (out[0].decode(), out[1], out[2])


class _Strings:
    """Header string regions parsed once: a producer writes the same name, uuid (none, but
    for chunks) and schema version in entry after entry.

    Keyed by the region's exact bytes (a parse is only ever that of its own key, so hostile
    bytes cannot make one entry's strings stand for another's); a region that does not parse
    raises before anything is stored. Bounded in entries and in the length of a key, and
    emptied when full, so no sequence of headers grows it past
    ``_STRINGS_CACHE_SIZE * _STRINGS_CACHE_MAX_LEN`` bytes of keys.
    """

    __slots__ = ("_d", "parsed")

    def __init__(self) -> None:
        self._d: dict[bytes, tuple[str, bytes, bytes]] = {}
        #: ``parsed(region)``: the parse of a region kept (None: not kept; :meth:`parse`
        #: parses it). The dict's own ``get``, bound once.
        self.parsed = self._d.get

    def parse(self, region: bytes) -> tuple[str, bytes, bytes]:
        got = self._d.get(region)
        if got is None:
            got = _parse_strings(region)
            if len(region) <= _STRINGS_CACHE_MAX_LEN:
                if len(self._d) >= _STRINGS_CACHE_SIZE:
                    self._d.clear()
                self._d[region] = got
        return got


_strings = _Strings()


#: An entry as :func:`iter_records` gives it: one exact tuple of the header's fields (the
#: codec as its id), then ``flags``, ``payload``, ``offset`` and ``size`` (:class:`RawEntry`'s).
#: Numbers, strings and bytes only (but for a chunk's :class:`ChunkInfo` or a large entry's
#: view), so the cyclic GC stops tracking it at its first pass: an entry a process keeps
#: (:class:`filepulsar.storage.ledger.ReadEntry`) is then one object it goes over, not three.
Record = tuple[Any, ...]
#: Indexes of a :data:`Record`'s fields past the header's.
R_FLAGS, R_PAYLOAD, R_OFFSET, R_SIZE = 11, 12, 13, 14


def raw_entry(rec: Record, header: EntryHeader | None = None) -> RawEntry:
    """The :class:`RawEntry` of a :data:`Record` (a new one per call; ``header``: its
    :func:`header_of`, built already)."""
    return tuple.__new__(
        RawEntry,
        (
            header_of(rec) if header is None else header,
            rec[R_FLAGS],
            rec[R_PAYLOAD],
            rec[R_OFFSET],
            rec[R_SIZE],
        ),
    )


def header_of(rec: Record) -> EntryHeader:
    """The :class:`EntryHeader` of a :data:`Record` (a new one per call)."""
    return tuple.__new__(
        EntryHeader,
        (
            rec[0],
            rec[1],
            rec[2],
            rec[3],
            rec[4],
            _CODECS[rec[5]],
            rec[6],
            rec[7],
            rec[8],
            rec[9],
            rec[10],
        ),
    )


def record_of(raw: RawEntry) -> Record:
    """The :data:`Record` of a :class:`RawEntry` (the inverse of :func:`raw_entry`)."""
    h = raw.header
    return (*h[:5], int(h.codec), *h[6:], *raw[1:])


def iter_entries(data: bytes | memoryview, count: int, base_offset: int = 0) -> Iterator[RawEntry]:
    """Yield ``count`` verified entries laid back to back in ``data``.

    Each entry is verified (framing, checksum, header) when it is reached, so a reader that
    stops early checks only what it read.

    Raises
    ------
    EntryFormatError
        At the first entry that is truncated, has a bad magic, version, flag, padding or
        checksum, or when bytes are left over after ``count`` entries. ``entry_index`` says which.
    """
    for rec in iter_records(data, count, base_offset):
        yield raw_entry(rec)


def iter_records(data: bytes | memoryview, count: int, base_offset: int = 0) -> Iterator[Record]:
    """:func:`iter_entries`, each entry as its :data:`Record` (what a reader that keeps
    entries holds: no :class:`RawEntry` and :class:`EntryHeader` built per entry)."""
    buf = memoryview(data)
    end = len(buf)
    pos = 0
    unpack_prefix = PREFIX.unpack_from
    unpack_header = HEADER.unpack_from
    crc32 = crc32c.crc32c
    parse_strings = _strings.parse
    parsed = _strings.parsed  # (a region parsed before, without a call of parse)
    check_header = _check_header
    zeros = _ZEROS
    copy_max = COPY_MAX
    psize, hsize = PREFIX.size, HEADER.size
    for i in range(count):
        off = base_offset + pos
        if pos + psize > end:
            raise EntryFormatError(f"truncated entry prefix at byte {off}", i, off)
        magic, version, codec_id, flags, hlen, plen, crc = unpack_prefix(buf, pos)
        if magic != MAGIC:
            raise EntryFormatError(f"bad magic {bytes(magic)!r} at byte {off}", i, off)
        if version != FORMAT_VERSION:
            raise EntryFormatError(
                f"unsupported entry format version {version}", i, off, kind=VERSION
            )
        if flags & ~KNOWN_FLAGS or codec_id > Codec.SNAPPY:
            raise EntryFormatError(
                f"unknown flags {flags:#x} or codec {codec_id}", i, off, kind=VERSION
            )
        hstart = pos + psize
        pstart = hstart + hlen
        pend = pstart + plen
        total = pend + (-plen) % ALIGN
        if not hsize <= hlen <= MAX_HEADER_SIZE or total > end:
            raise EntryFormatError(f"entry at byte {off} overruns its fragment", i, off)
        nxt = base_offset + total
        actual = crc32(buf[hstart:pend], crc32(buf[pos : pos + 16]))
        if actual != crc:
            raise EntryFormatError(
                f"checksum mismatch at byte {off}: stored {crc:#010x}, computed {actual:#010x}",
                i,
                off,
                nxt,
                kind=CHECKSUM,
            )
        if total != pend and buf[pend:total] != zeros[: total - pend]:
            raise EntryFormatError(
                f"non-zero padding after entry at byte {off}", i, off, nxt, kind=HEADER_KIND
            )
        try:
            (pub, seq, hseq, dat, n, usize, cid, nch, tot) = unpack_header(buf, hstart)
            region = bytes(buf[hstart + hsize : pstart])
            producer, uuid, schema_version = parsed(region) or parse_strings(region)
            # (An entry of one uncompressed message, not a chunk -- every entry of a live
            # topic whose producer neither batches nor compresses -- passes every check of
            # _check_header, which is asked of the others and says what is wrong.)
            if (
                codec_id
                or n != 1
                or flags & FLAG_CHUNK
                or not 4 <= usize == plen <= MAX_PAYLOAD_SIZE
            ):
                check_header(flags, codec_id, plen, n, usize, cid, nch, tot)
            chunk = ChunkInfo(uuid.decode(), cid, nch, tot) if flags & FLAG_CHUNK else None
        except (ValueError, struct.error) as e:  # UnicodeDecodeError is a ValueError
            raise EntryFormatError(
                f"bad entry header at byte {off}: {e}", i, off, nxt, kind=HEADER_KIND
            ) from e
        # A small payload is copied out: an entry a process keeps (its entry cache, 50,000
        # of them) then holds bytes, which the cyclic GC never looks at, not a view of the
        # read (a view and the read's buffer are two objects it goes over at every pass).
        payload = buf[pstart:pend]
        yield (
            pub,
            producer,
            seq,
            hseq,
            n,
            codec_id,
            usize,
            flags & FLAG_BATCH != 0,
            dat,
            chunk,
            schema_version,
            flags,
            payload.tobytes() if plen <= copy_max else payload,
            off,
            total - pos,
        )
        pos = total
    if pos != end:
        raise EntryFormatError(
            f"{end - pos} unexpected bytes after {count} entries at byte {base_offset + pos}",
            count,
            base_offset + pos,
        )


def entry_offsets(data: bytes | memoryview, count: int, base_offset: int = 0) -> list[int] | None:
    """Where each of ``count`` entries laid back to back in ``data`` starts, and where the
    last ends (``base_offset`` added), from their framing alone: prefix, magic, version,
    flags, codec and lengths as :func:`iter_entries` checks them, but no checksum (each entry
    is verified when it is read). None when that framing does not hold exactly ``count``
    entries; :func:`iter_entries` then says what is wrong and where."""
    buf = memoryview(data)
    end = len(buf)
    unpack_prefix = PREFIX.unpack_from
    psize, hsize = PREFIX.size, HEADER.size
    out = [0] * (count + 1)
    pos = 0
    for i in range(count):
        if pos + psize > end:
            return None
        magic, version, codec_id, flags, hlen, plen, _ = unpack_prefix(buf, pos)
        if (
            magic != MAGIC
            or version != FORMAT_VERSION
            or flags & ~KNOWN_FLAGS
            or codec_id > Codec.SNAPPY
            or not hsize <= hlen <= MAX_HEADER_SIZE
        ):
            return None
        out[i] = base_offset + pos
        pos += psize + hlen + plen + (-plen) % ALIGN
        if pos > end:
            return None
    if pos != end:
        return None
    out[count] = base_offset + end
    return out


def _check_header(
    flags: int, codec: int, plen: int, n: int, usize: int, cid: int, nch: int, tot: int
) -> None:
    """Header fields against what the format allows (ValueError naming the first that is not).

    The bounds keep a reader's work proportional to the stored bytes: every message takes at
    least the 4-byte offset of its ``value``, so ``num_messages <= uncompressed size / 4``.
    """
    if usize > MAX_PAYLOAD_SIZE:
        raise ValueError(f"uncompressed size {usize} exceeds the limit {MAX_PAYLOAD_SIZE}")
    if codec == Codec.NONE and usize != plen:
        raise ValueError(f"uncompressed payload of {plen} bytes, header says {usize}")
    if not 1 <= n <= usize // 4:
        raise ValueError(f"{n} messages cannot fit in {usize} payload bytes")
    if not flags & FLAG_BATCH and n != 1:
        raise ValueError(f"a non-batched entry holds one message, header says {n}")
    if flags & FLAG_CHUNK and not (0 <= cid < nch and tot >= 0):
        raise ValueError(f"chunk {cid} of {nch} (total size {tot}) is impossible")
