"""The Arrow IPC record batch of one message with only a value: written and read without
pyarrow.

Every unbatched ``send()`` of a plain message (no key, properties or event time) stores an
entry whose payload is an Arrow IPC record batch message of one row and one ``binary`` column.
Its bytes are fixed but for two numbers (the body length and the value's length), so they are
written here from a template (:func:`encode`) and recognised by comparing with it
(:func:`decode`), instead of building and serializing a record batch (about 0.25 ms on a CPU
that idled between sends: a tenth of a publish's end-to-end latency).

:func:`encode_row` does the same for one row of several binary or string columns without
nulls (a live producer's keyed message: ``value`` and ``key``, perhaps ``ordering_key``): an
IPC record batch message names no types, only each column's buffers (validity, offsets, data)
by offset and length, so its bytes too are a template with a few numbers to fill in;
:func:`decode_row` reads such a row back (a consumer's Key_Shared hash and delivery of every
such entry) by writing it again and comparing.

Nothing here is trusted on its own: each template is taken from pyarrow's own output when
first used and checked against pyarrow for several value lengths; if pyarrow writes anything
else (another version's layout), these functions answer ``None`` and the callers use pyarrow.
:func:`decode` accepts only the exact bytes :func:`encode` (and pyarrow) write for the value it
finds there, so whatever it accepts pyarrow decodes to the same value and validates in full;
anything else (including valid IPC written another way) goes to pyarrow.
"""

from __future__ import annotations

import re
import struct
import threading
from collections.abc import Sequence

import pyarrow as pa

from filepulsar.storage.forks import in_forked_child

_I64 = struct.Struct("<q")
_OFFSETS = struct.Struct("<ii")
_PROBE_LENGTHS = (0, 1, 7, 8, 9, 100, 4093, 70_001)


class _Template:
    __slots__ = ("body_at", "head", "len_at")

    def __init__(self, head: bytes, body_at: int, len_at: int) -> None:
        self.head = head  # the message's bytes before its body, with both numbers zero
        self.body_at = body_at  # where the body length (int64) is in ``head``
        self.len_at = len_at  # where the value buffer's length (int64) is in ``head``


_template: _Template | None = None
_checked = False
_lock = threading.Lock()


@in_forked_child
def _fresh_lock() -> None:
    """A forked child gets a lock of its own (the template is kept): the parent's copy may have been
    held by one of its threads at the fork, and would stay held in the child for ever."""
    global _lock
    _lock = threading.Lock()


def _pyarrow_bytes(value: bytes) -> bytes:
    offsets = pa.py_buffer(_OFFSETS.pack(0, len(value)))
    array = pa.Array.from_buffers(pa.binary(), 1, [None, offsets, pa.py_buffer(value)])
    return bytes(pa.RecordBatch.from_arrays([array], names=["value"]).serialize().to_pybytes())


def _pad(n: int) -> int:
    return (-n) % 8


def _body_len(n: int) -> int:
    return _OFFSETS.size + n + _pad(n)


def _find_template() -> _Template | None:
    a, b = _pyarrow_bytes(b"x" * 8), _pyarrow_bytes(b"x" * 16)
    head_len = len(a) - _body_len(8)
    if head_len <= 0 or len(b) - _body_len(16) != head_len or head_len % 8:
        return None
    head_a, head_b = bytearray(a[:head_len]), bytearray(b[:head_len])
    body_at = head_a.find(_I64.pack(_body_len(8)))
    len_at = head_a.rfind(_I64.pack(8))
    if body_at < 0 or len_at < 0 or body_at == len_at:
        return None
    for buf, n in ((head_a, 8), (head_b, 16)):
        if _I64.unpack_from(buf, body_at)[0] != _body_len(n):
            return None
        if _I64.unpack_from(buf, len_at)[0] != n:
            return None
        _I64.pack_into(buf, body_at, 0)
        _I64.pack_into(buf, len_at, 0)
    if head_a != head_b:
        return None
    t = _Template(bytes(head_a), body_at, len_at)
    for n in _PROBE_LENGTHS:  # the template must give pyarrow's bytes for every length
        value = bytes(range(256)) * (n // 256) + bytes(range(n % 256))
        if b"".join(_encode_with(t, value)) != _pyarrow_bytes(value):
            return None
    return t


def _head(t: _Template, n: int) -> bytes:
    """The bytes before the value: the message's metadata and the offsets buffer (0, n)."""
    head = bytearray(t.head)
    _I64.pack_into(head, t.body_at, _body_len(n))
    _I64.pack_into(head, t.len_at, n)
    return bytes(head) + _OFFSETS.pack(0, n)


def _encode_with(t: _Template, value: bytes) -> list[bytes]:
    n = len(value)
    parts = [_head(t, n), value]
    if _pad(n):
        parts.append(bytes(_pad(n)))
    return parts


def _get() -> _Template | None:
    global _template, _checked
    if not _checked:
        with _lock:
            if not _checked:
                _template = _find_template()
                _checked = True
    return _template


def encode(value: bytes) -> list[bytes] | None:
    """The IPC record batch message of one row whose ``binary`` column holds ``value``, as
    buffers written back to back (pyarrow's ``RecordBatch.serialize()`` bytes); None if the
    template is unavailable or the value too long for 32-bit offsets."""
    t = _get()
    if t is None or len(value) > 0x7FFF_FFF0:
        return None
    return _encode_with(t, value)


def decode(body: bytes | memoryview) -> bytes | None:
    """The value of a message :func:`encode` would write, or None if ``body`` is anything
    else (the caller then decodes it with pyarrow)."""
    t = _get()
    if t is None:
        return None
    view = memoryview(body)
    head_len = len(t.head) + _OFFSETS.size
    if len(view) < head_len:
        return None
    n = _I64.unpack_from(view, t.len_at)[0]
    if n < 0 or n > 0x7FFF_FFF0 or len(view) != len(t.head) + _body_len(n):
        return None
    if view[:head_len] != _head(t, n):
        return None
    end = head_len + n
    if any(view[end:]):
        return None  # padding that is not zero: not what encode writes
    return bytes(view[head_len:end])


# ---------------------------------------------------------------------- one row, k columns
class _RowTemplate:
    __slots__ = ("body_at", "buffers_at", "head")

    def __init__(self, head: bytes, body_at: int, buffers_at: int) -> None:
        self.head = head  # the message's bytes before its body
        self.body_at = body_at  # where the body length (int64) is in ``head``
        self.buffers_at = buffers_at  # where the (offset, length) int64 pairs start


_row_templates: dict[int, _RowTemplate | None] = {}  # by column count; None: unavailable
_ROW_PROBES = ((0,), (1,), (7,), (8,), (9,), (100,), (4093,), (70_001,))


def _pyarrow_row(values: Sequence[bytes]) -> bytes:
    arrays = [
        pa.Array.from_buffers(
            pa.binary(), 1, [None, pa.py_buffer(_OFFSETS.pack(0, len(v))), pa.py_buffer(v)]
        )
        for v in values
    ]
    names = [f"c{i}" for i in range(len(values))]
    return bytes(pa.RecordBatch.from_arrays(arrays, names=names).serialize().to_pybytes())


def _row_layout(lengths: Sequence[int]) -> tuple[list[int], int]:
    """The int64 (offset, length) pairs of every buffer of a row with these value lengths,
    and the body length: per column validity (none), offsets (two int32), data (padded)."""
    pairs: list[int] = []
    at = 0
    for n in lengths:
        pairs += [at, 0, at, _OFFSETS.size]
        at += _OFFSETS.size
        pairs += [at, n]
        at += n + _pad(n)
    return pairs, at


#: Filled heads by template and value lengths (a producer's messages mostly repeat a few).
_heads: dict[tuple[_RowTemplate, tuple[int, ...]], bytes] = {}


def _fill_row(t: _RowTemplate, values: Sequence[bytes]) -> list[bytes]:
    lengths = tuple([len(v) for v in values])
    filled = _heads.get((t, lengths))
    if filled is None:
        pairs, body = _row_layout(lengths)
        head = bytearray(t.head)
        _I64.pack_into(head, t.body_at, body)
        struct.pack_into(f"<{len(pairs)}q", head, t.buffers_at, *pairs)
        filled = bytes(head)
        if len(_heads) >= 4096:
            _heads.clear()
        _heads[(t, lengths)] = filled
    parts: list[bytes] = [filled]
    for v, n in zip(values, lengths):
        parts.append(_OFFSETS.pack(0, n))
        parts.append(v)
        if _pad(n):
            parts.append(bytes(_pad(n)))
    return parts


def _find_row_template(k: int) -> _RowTemplate | None:
    lengths = [24 + 16 * i for i in range(k)]  # distinct, padded: the pairs are unambiguous
    probe = _pyarrow_row([b"x" * n for n in lengths])
    pairs, body = _row_layout(lengths)
    head_len = len(probe) - body
    if head_len <= 0 or head_len % 8:
        return None
    head = probe[:head_len]
    buffers = struct.pack(f"<{len(pairs)}q", *pairs)
    buffers_at = head.find(buffers)
    body_at = head.find(_I64.pack(body))
    if buffers_at < 0 or head.find(buffers, buffers_at + 1) >= 0:
        return None
    if body_at < 0 or buffers_at <= body_at < buffers_at + len(buffers):
        return None
    t = _RowTemplate(head, body_at, buffers_at)
    for i, (n,) in enumerate(_ROW_PROBES):  # every column length, every position
        values = [bytes(range(256)) * (m // 256) + bytes(range(m % 256)) for m in lengths]
        values[i % k] = b"\x01" * n
        if b"".join(_fill_row(t, values)) != _pyarrow_row(values):
            return None
    return t


def _row_template(k: int) -> _RowTemplate | None:
    if k not in _row_templates:
        with _lock:
            if k not in _row_templates:
                _row_templates[k] = _find_row_template(k) if k else None
    return _row_templates[k]


def encode_row(values: Sequence[bytes]) -> list[bytes] | None:
    """The IPC record batch message of one row of ``len(values)`` binary (or string: the
    same bytes) columns without nulls, as buffers written back to back (pyarrow's
    ``RecordBatch.serialize()`` bytes); None if no template (the caller then uses pyarrow)
    or a value is too long for 32-bit offsets."""
    t = _row_template(len(values))
    if t is None or any(len(v) > 0x7FFF_FFF0 for v in values):
        return None
    return _fill_row(t, values)


def decode_row(body: bytes | memoryview, k: int) -> list[bytes] | None:
    """The ``k`` values of the one row :func:`encode_row` would write as ``body`` (a keyed
    message's value, key, ordering key), or None if ``body`` is anything else (the caller
    then decodes it with pyarrow). Only those exact bytes are accepted (the row written
    again from the values found must be ``body``), so whatever is accepted pyarrow decodes
    to the same values; a ``string`` column's UTF-8 is the caller's to check.

    The bytes before the values' buffers (the head) name every buffer's offset and length,
    so they fix everything in ``body`` but the values: once a head was accepted, a row with
    the same head is checked by comparing its other bytes (offsets, padding) in place, not
    by writing it again (every entry of a live Key_Shared topic is decoded so)."""
    last = _last_layouts.get(k)
    if last is not None and type(body) is bytes:
        # The layout accepted last for ``k`` columns (live traffic repeats its lengths):
        # its head compared in place, not copied and hashed to look the layout up, the rest
        # (offsets, values, padding) matched by one pattern.
        head, (total, tail) = last
        if len(body) == total and body.startswith(head):
            m = tail.fullmatch(body, len(head))
            return None if m is None else list(m.groups())
    t = _row_template(k)
    if t is None:
        return None
    view = memoryview(body)
    head_len = len(t.head)
    if len(view) < head_len:
        return None
    key = (k, bytes(view[:head_len]))
    layout = _layouts.get(key)
    if layout is not None:
        total, tail = layout
        m = tail.fullmatch(view, head_len) if len(view) == total else None
        if m is None:
            return None
        _last_layouts[k] = (key[1], layout)
        return list(m.groups())
    pairs = struct.unpack_from(f"<{6 * k}q", view, t.buffers_at)
    values: list[bytes] = []
    for i in range(k):
        at, n = head_len + pairs[6 * i + 4], pairs[6 * i + 5]
        if n < 0 or n > 0x7FFF_FFF0 or at + n > len(view):
            return None
        values.append(bytes(view[at : at + n]))
    if b"".join(_fill_row(t, values)) != view:
        return None
    _remember_layout(key, head_len, [len(v) for v in values])
    return values


#: Heads :func:`decode_row` accepted, by (column count, head bytes): the row's length, and a
#: pattern of the bytes after the head matching exactly what the head fixes there (each
#: value's offsets and padding; its groups: the values).
_Layout = tuple[int, re.Pattern[bytes]]
_layouts: dict[tuple[int, bytes], _Layout] = {}
#: The head and layout :func:`decode_row` last accepted from ``_layouts``, by column count.
_last_layouts: dict[int, tuple[bytes, _Layout]] = {}
_MAX_LAYOUTS = 4096


def _remember_layout(key: tuple[int, bytes], head_len: int, lengths: list[int]) -> None:
    """Note the layout of a row accepted with head ``key[1]`` and these value lengths (where
    :func:`_fill_row` writes them)."""
    pattern: list[bytes] = []
    at = head_len
    for n in lengths:
        pattern += [re.escape(_OFFSETS.pack(0, n)), b"(.{%d})" % n, re.escape(bytes(_pad(n)))]
        at += _OFFSETS.size + n + _pad(n)
    if len(_layouts) >= _MAX_LAYOUTS:
        _layouts.clear()
    _layouts[key] = (at, re.compile(b"".join(pattern), re.DOTALL))
