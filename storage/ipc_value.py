"""The Arrow IPC record batch of one message with only a value: written and read without
pyarrow.

Every unbatched ``send()`` of a plain message (no key, properties or event time) stores an
entry whose payload is an Arrow IPC record batch message of one row and one ``binary`` column.
Its bytes are fixed but for two numbers (the body length and the value's length), so they are
written here from a template (:func:`encode`) and recognised by comparing with it
(:func:`decode`), instead of building and serializing a record batch (about 0.25 ms on a CPU
that idled between sends: a tenth of a publish's end-to-end latency).

Nothing here is trusted on its own: the template is taken from pyarrow's own output when this
module is first used and checked against pyarrow for several value lengths; if pyarrow writes
anything else (another version's layout), both functions answer ``None`` and the callers use
pyarrow. :func:`decode` accepts only the exact bytes :func:`encode` (and pyarrow) write for
the value it finds there, so whatever it accepts pyarrow decodes to the same value and
validates in full; anything else (including valid IPC written another way) goes to pyarrow.
"""

from __future__ import annotations

import struct
import threading

import pyarrow as pa

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
