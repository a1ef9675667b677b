"""Writing entries: Arrow record batches -> the framed bytes of one entry (format version 1).

The byte layout is described in :mod:`filepulsar.storage.entry` (and normatively in
storage/FORMAT.md); this module is its one encoder: :func:`encode_entry_parts` (what the write
path calls), :func:`encode_entry`, :func:`frame_entry_parts` (prefix, CRC32C and padding around
an encoded header and payload) and :func:`reframe_entry` (a verified entry's stored bytes, for
compaction). Reading and verifying entries is :mod:`filepulsar.storage.entry`'s side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import crc32c
import pyarrow as pa

from filepulsar.storage import ipc_value
from filepulsar.storage.codec import Codec, compress
from filepulsar.storage.entry import (
    ALIGN,
    COLUMN_FLAGS,
    FLAG_BATCH,
    FLAG_CHUNK,
    FORMAT_VERSION,
    HEADER,
    MAGIC,
    MAX_PAYLOAD_SIZE,
    PREFIX,
    STR_LEN,
    ChunkInfo,
    EntryHeader,
    stored_schema,
)
from filepulsar.storage.errors import MessageTooBig

if TYPE_CHECKING:
    from filepulsar.storage.entry import RawEntry


def _pad(n: int) -> int:
    return (-n) % ALIGN


def _lp(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise ValueError(f"header string of {len(data)} bytes exceeds 65535")
    return STR_LEN.pack(len(data)) + data


def encode_entry(
    messages: pa.RecordBatch,
    *,
    producer_name: str,
    publish_time: int,
    codec: Codec = Codec.NONE,
    batched: bool = True,
    deliver_at: int = 0,
    chunk: ChunkInfo | None = None,
    schema_version: bytes = b"",
    first_sequence_id: int | None = None,
) -> bytes:
    """Encode one entry as bytes; see :func:`encode_entry_parts` for the arguments."""
    return b"".join(
        encode_entry_parts(
            messages,
            producer_name=producer_name,
            publish_time=publish_time,
            codec=codec,
            batched=batched,
            deliver_at=deliver_at,
            chunk=chunk,
            schema_version=schema_version,
            first_sequence_id=first_sequence_id,
        )
    )


def encode_entry_parts(
    messages: pa.RecordBatch,
    *,
    producer_name: str,
    publish_time: int,
    codec: Codec = Codec.NONE,
    batched: bool = True,
    deliver_at: int = 0,
    chunk: ChunkInfo | None = None,
    schema_version: bytes = b"",
    first_sequence_id: int | None = None,
    header_sequence_id: int | None = None,
) -> list[Any]:
    """Encode one entry from a record batch of the stored columns, as a list of buffers to be
    written back to back (no joining copy).

    ``messages`` holds ``value`` first, then any optional columns of :data:`MESSAGE_SCHEMA` in
    schema order; leave a column out when it is null for every message. Without a
    ``sequence_id`` column pass ``first_sequence_id``: message ``i`` gets ``first + i``. The
    header's ``sequence_id``/``highest_sequence_id`` are the first and highest sequence ids.
    A non-batched entry must hold exactly one message. ``header_sequence_id`` overrides both
    header fields (key-based batching records the highest id there, as Pulsar's client does,
    because a key's sequence ids interleave with other keys').
    """
    n = messages.num_rows
    if n == 0:
        raise ValueError("an entry needs at least one message")
    if not batched and n != 1:
        raise ValueError(f"a non-batched entry holds one message, got {n}")
    flags = (FLAG_BATCH if batched else 0) | (FLAG_CHUNK if chunk else 0)
    for name in messages.schema.names[1:]:
        flags |= COLUMN_FLAGS[name]
    schema = stored_schema(flags)
    if messages.schema.names != schema.names or messages.schema.types != schema.types:
        raise ValueError(
            f"entry columns {messages.schema} do not match the stored schema {schema} "
            "(value first, optional columns in schema order)"
        )
    if flags & COLUMN_FLAGS["sequence_id"]:
        seq = messages.column(messages.num_columns - 1)
        first_seq = seq[0].as_py()
        highest = first_seq if n == 1 else pa.compute.max(seq).as_py()
    elif first_sequence_id is None:
        raise ValueError("first_sequence_id is required when there is no sequence_id column")
    else:
        first_seq = first_sequence_id
        highest = first_seq + n - 1
    if header_sequence_id is not None:
        first_seq = highest = header_sequence_id
    if messages.schema is not schema:
        messages = pa.RecordBatch.from_arrays(messages.columns, schema=schema)
    body = messages.serialize()
    return _frame_body(
        body,
        flags,
        EntryHeader(
            publish_time=publish_time,
            producer_name=producer_name,
            sequence_id=first_seq,
            highest_sequence_id=highest,
            num_messages=n,
            codec=codec,
            uncompressed_size=body.size,
            batched=batched,
            deliver_at=deliver_at,
            chunk=chunk,
            schema_version=schema_version,
        ),
    )


def encode_value_entry_parts(
    value: bytes,
    *,
    producer_name: str,
    publish_time: int,
    sequence_id: int,
    codec: Codec = Codec.NONE,
    batched: bool = True,
    deliver_at: int = 0,
    chunk: ChunkInfo | None = None,
    schema_version: bytes = b"",
    key: str | None = None,
    ordering_key: bytes | None = None,
) -> list[Any] | None:
    """:func:`encode_entry_parts` for an entry of one message that has a value and perhaps
    a ``key`` and an ``ordering_key`` (no properties, no event time; sequence id
    ``sequence_id``): the same bytes, with the payload written by
    :mod:`filepulsar.storage.ipc_value` instead of through a pyarrow record batch. None when
    that module cannot write it (the caller then builds the record batch).

    Raises
    ------
    UnicodeEncodeError
        If ``key`` is not valid text (a ``string`` column holds UTF-8).
    """
    flags = (FLAG_BATCH if batched else 0) | (FLAG_CHUNK if chunk else 0)
    if key is None and ordering_key is None:
        parts = ipc_value.encode(value)
    else:
        row = [value]
        if key is not None:
            row.append(key.encode())
            flags |= COLUMN_FLAGS["key"]
        if ordering_key is not None:
            row.append(ordering_key)
            flags |= COLUMN_FLAGS["ordering_key"]
        parts = ipc_value.encode_row(row)
    if parts is None:
        return None
    body = b"".join(parts)
    _check_payload(len(body))
    # _header's bytes, its strings (the same for every entry of a producer) remembered.
    c = chunk or _NO_CHUNK
    fixed = HEADER.pack(
        publish_time,
        sequence_id,
        sequence_id,
        deliver_at,
        1,
        len(body),
        c.chunk_id,
        c.num_chunks,
        c.total_size,
    )
    return frame_entry_parts(
        codec, flags, fixed + _strings(producer_name, c.uuid, schema_version), compress(codec, body)
    )


_NO_CHUNK = ChunkInfo("", -1, 0, 0)
_STRINGS: dict[tuple[str, str, bytes], bytes] = {}


def _strings(producer_name: str, uuid: str, schema_version: bytes) -> bytes:
    """The header's length-prefixed strings (as :func:`_header` writes them), remembered for
    entries that are not chunks (a chunk's uuid differs per message)."""
    k = (producer_name, uuid, bytes(schema_version))  # (a bytearray too: hashable)
    got = _STRINGS.get(k)
    if got is None:
        got = _lp(producer_name.encode()) + _lp(uuid.encode()) + _lp(schema_version)
        if uuid:
            return got
        if len(_STRINGS) >= 4096:
            _STRINGS.clear()
        _STRINGS[k] = got
    return got


def _frame_body(body: Any, flags: int, h: EntryHeader) -> list[Any]:
    """Frame an uncompressed payload ``body`` (bytes or a pyarrow buffer) under header ``h``."""
    _check_payload(len(body))
    return frame_entry_parts(h.codec, flags, _header(h), compress(h.codec, body))


def _check_payload(size: int) -> None:
    """Raise MessageTooBig if an uncompressed payload of ``size`` bytes exceeds the format."""
    if size > MAX_PAYLOAD_SIZE:
        raise MessageTooBig(
            f"an entry of {size} bytes (uncompressed) exceeds the format's limit of "
            f"{MAX_PAYLOAD_SIZE} bytes per entry; send smaller batches or messages"
        )


def _header(h: EntryHeader) -> bytes:
    """The header's bytes (fixed fields, then the length-prefixed strings), unpadded."""
    c = h.chunk or ChunkInfo("", -1, 0, 0)
    return b"".join(
        (
            HEADER.pack(
                h.publish_time,
                h.sequence_id,
                h.highest_sequence_id,
                h.deliver_at,
                h.num_messages,
                h.uncompressed_size,
                c.chunk_id,
                c.num_chunks,
                c.total_size,
            ),
            _lp(h.producer_name.encode()),
            _lp(c.uuid.encode()),
            _lp(h.schema_version),
        )
    )


def reframe_entry(raw: RawEntry) -> list[Any]:
    """A verified entry's bytes as they were stored (same header, payload, CRC and padding),
    to copy it elsewhere without decoding it (topic compaction)."""
    return frame_entry_parts(raw.header.codec, raw.flags, _header(raw.header), raw.payload)


def frame_entry_parts(
    codec: Codec | int, flags: int, header: bytes, payload: bytes | memoryview
) -> list[Any]:
    """Frame an encoded ``header`` (fixed fields and strings, unpadded) and a ``payload`` as
    one entry: prefix with lengths and CRC32C, zero padding. :func:`encode_entry_parts` uses it;
    tools and tests use it to build entries whose framing is valid around any contents."""
    header += b"\0" * _pad(PREFIX.size + len(header))
    plen = len(payload)
    head16 = PREFIX.pack(MAGIC, FORMAT_VERSION, int(codec), flags, len(header), plen, 0)[:16]
    crc = crc32c.crc32c(payload, crc32c.crc32c(header, crc32c.crc32c(head16)))
    parts: list[Any] = [head16 + crc.to_bytes(4, "little") + header, payload]
    if _pad(plen):
        parts.append(b"\0" * _pad(plen))
    return parts
