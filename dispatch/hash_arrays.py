"""Pulsar's key hashes over whole arrays: what the Spark paths call.

The ``*_array`` functions give exactly the scalar value of :mod:`filepulsar.dispatch.hashing` for
every element. They take a pyarrow ``binary``/``string`` array (plain, large, view or chunked), a
numpy object array, or any sequence of ``str``/``bytes``. This module owns the Arrow plumbing,
the vectorised MurmurHash3 and Java string hash, and slots and sticky keys of whole columns.

Nulls: an array hash never guesses what a missing key means. By default a null element raises
:class:`ValueError`; pass ``null_key=b"NONE_KEY"`` (or any bytes/str) to hash nulls as that key
instead, which is what Key_Shared does for keyless messages (see
:func:`filepulsar.dispatch.hashing.sticky_key`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import mmh3
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from filepulsar.dispatch.hashing import (
    MASK_31,
    NONE_KEY,
    check_hash_range,
    java_string_hash,
    java_utf8,
    murmur3_32,
)

__all__ = [
    "KeyArrayLike",
    "java_string_hash_array",
    "murmur3_32_array",
    "slot_array",
    "sticky_key_array",
]

KeyArrayLike: TypeAlias = (
    pa.Array | pa.ChunkedArray | npt.NDArray[Any] | Sequence[str | bytes | None]
)

_U32 = np.uint32
_C1 = _U32(0xCC9E2D51)
_C2 = _U32(0x1B873593)
_TAIL_MASKS = np.array([0, 0xFF, 0xFFFF, 0xFFFFFF], dtype=np.uint32)


# --------------------------------------------------------------------------------------------
# Arrow plumbing shared by the vectorised hashes
# --------------------------------------------------------------------------------------------


def _as_arrow(keys: KeyArrayLike, target: pa.DataType) -> pa.Array | pa.ChunkedArray:
    """Turn any accepted key container into an Arrow array of ``target`` (binary or string)."""
    if isinstance(keys, pa.ChunkedArray | pa.Array):
        typ = keys.type
        if pa.types.is_dictionary(typ):
            keys = keys.cast(typ.value_type)
            typ = keys.type
        if target == pa.binary() and (pa.types.is_binary(typ) or pa.types.is_large_binary(typ)):
            return keys
        if pa.types.is_string(typ) or pa.types.is_large_string(typ):
            return keys
        if pa.types.is_null(typ):
            return keys.cast(target)
        try:
            large = pa.types.is_large_binary(typ) or pa.types.is_large_string(typ)
            cast_to = (
                target
                if not large
                else (pa.large_binary() if target == pa.binary() else pa.large_string())
            )
            return keys.cast(cast_to)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise TypeError(f"cannot hash an Arrow array of type {typ}: {e}") from e
    values = keys.tolist() if isinstance(keys, np.ndarray) else list(keys)
    for v in values:
        if v is not None and not isinstance(v, str | bytes | bytearray | memoryview):
            raise TypeError(f"keys must be str, bytes or None, got {type(v).__name__}")
    if target == pa.binary():
        values = [java_utf8(v) if isinstance(v, str) else v for v in values]
    return pa.array(values, type=target)


def _chunks(arr: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    if isinstance(arr, pa.ChunkedArray):
        return list(arr.chunks)
    return [arr]


def _offsets_and_data(
    arr: pa.Array,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.uint8]]:
    """Start offsets and lengths (rebased to 0) and the data bytes of a binary/string array."""
    n = len(arr)
    large = pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type)
    off_type = np.int64 if large else np.int32
    bufs = arr.buffers()
    offsets = np.frombuffer(
        bufs[1], dtype=off_type, count=n + 1, offset=arr.offset * np.dtype(off_type).itemsize
    ).astype(np.int64)
    lo, hi = int(offsets[0]), int(offsets[-1])
    if bufs[2] is None or hi == lo:
        data = np.zeros(0, dtype=np.uint8)
    else:
        data = np.frombuffer(bufs[2], dtype=np.uint8, count=hi - lo, offset=lo)
    starts = offsets[:-1] - lo
    lengths = np.diff(offsets)
    return starts, lengths, data


def _null_mask(arr: pa.Array) -> npt.NDArray[np.bool_] | None:
    if arr.null_count == 0:
        return None
    return np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)


def _fill_nulls(
    out: npt.NDArray[np.uint32],
    masks: list[npt.NDArray[np.bool_] | None],
    sizes: list[int],
    null_value: int | None,
    what: str,
) -> None:
    pos = 0
    for mask, size in zip(masks, sizes):
        if mask is not None:
            if null_value is None:
                raise ValueError(
                    f"{what}: {int(mask.sum())} null key(s); pass null_key= to hash nulls as a "
                    "fixed key (Key_Shared uses b'NONE_KEY')"
                )
            out[pos : pos + size][mask] = null_value
        pos += size


# --------------------------------------------------------------------------------------------
# Vectorised MurmurHash3 x86_32
# --------------------------------------------------------------------------------------------


def _rotl_inplace(x: npt.NDArray[np.uint32], r: int, tmp: npt.NDArray[np.uint32]) -> None:
    np.left_shift(x, _U32(r), out=tmp)
    np.right_shift(x, _U32(32 - r), out=x)
    np.bitwise_or(x, tmp, out=x)


def _murmur3_chunk(arr: pa.Array) -> npt.NDArray[np.uint32]:
    """Unmasked MurmurHash3 x86_32 (seed 0) of every element of one binary/string array.

    Block ``i`` of every key is mixed in one numpy pass; keys shorter than ``i + 1`` blocks keep
    their state through a masked copy. The tail is read as a whole little-endian word and masked
    to its length, which turns a missing tail into a zero word that leaves ``h`` unchanged.
    """
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.uint32)
    starts, lengths, data = _offsets_and_data(arr)
    nblocks = lengths >> 2
    max_blocks = int(nblocks.max())
    # Keys that have run out of blocks keep reading (ignored) words further on, and the tail
    # read takes a whole word: pad so that every such read stays inside the buffer.
    padded = np.zeros(len(data) + 4 * max_blocks + 4, dtype=np.uint8)
    padded[: len(data)] = data
    words = np.ndarray((len(padded) - 3,), dtype="<u4", buffer=padded, strides=(1,))

    h = np.zeros(n, dtype=np.uint32)
    tmp = np.empty(n, dtype=np.uint32)
    hn = np.empty(n, dtype=np.uint32)
    pos = starts.copy()
    min_blocks = int(nblocks.min())
    for i in range(max_blocks):
        k = words[pos]
        k *= _C1
        _rotl_inplace(k, 15, tmp)
        k *= _C2
        np.bitwise_xor(h, k, out=hn)
        _rotl_inplace(hn, 13, tmp)
        hn *= _U32(5)
        hn += _U32(0xE6546B64)
        if i < min_blocks:
            h, hn = hn, h
        else:
            np.copyto(h, hn, where=nblocks > i)
        pos += 4
    tail_pos = starts + (nblocks << 2)
    k = words[tail_pos]
    k &= _TAIL_MASKS[lengths & 3]
    k *= _C1
    _rotl_inplace(k, 15, tmp)
    k *= _C2
    h ^= k
    h ^= lengths.astype(np.uint32)
    h ^= h >> _U32(16)
    h *= _U32(0x85EBCA6B)
    h ^= h >> _U32(13)
    h *= _U32(0xC2B2AE35)
    h ^= h >> _U32(16)
    return h


def _murmur3_sequence(
    keys: npt.NDArray[Any] | Sequence[str | bytes | None], null_key: bytes | str | None
) -> npt.NDArray[np.uint32]:
    """Hash Python values one by one: for Python objects this beats converting to Arrow."""
    values = keys.tolist() if isinstance(keys, np.ndarray) else keys
    null_bytes = None if null_key is None else _key_bytes(null_key)

    def as_bytes(value: object) -> bytes:
        if value is None:
            if null_bytes is None:
                raise ValueError(
                    "murmur3_32_array: null key; pass null_key= to hash nulls as a fixed key "
                    "(Key_Shared uses b'NONE_KEY')"
                )
            return null_bytes
        return _key_bytes(value)

    hash_ = mmh3.hash
    out = np.fromiter(
        (hash_(v if type(v) is bytes else as_bytes(v), 0, False) for v in values),
        dtype=np.uint32,
        count=len(values),
    )
    out &= _U32(MASK_31)
    return out


def _key_bytes(value: object) -> bytes:
    if isinstance(value, str):
        return java_utf8(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"keys must be str, bytes or None, got {type(value).__name__}")


def murmur3_32_array(
    keys: KeyArrayLike, *, null_key: bytes | str | None = None
) -> npt.NDArray[np.uint32]:
    """:func:`murmur3_32` of every key, vectorised with numpy.

    Parameters
    ----------
    keys
        A pyarrow ``binary``/``string`` array (large, view, dictionary and chunked variants are
        accepted), a numpy object array, or a sequence of ``str``/``bytes``/``None``. Strings are
        hashed over their UTF-8 bytes.
    null_key
        How to hash a null element. ``None`` (default) refuses nulls; otherwise every null is
        hashed as this key (``b"NONE_KEY"`` gives Key_Shared's keyless behaviour).

    Returns
    -------
    numpy.ndarray
        ``uint32`` hashes masked to 31 bits, one per key, equal element-wise to
        :func:`murmur3_32`.

    Raises
    ------
    ValueError
        If ``keys`` holds a null and ``null_key`` is ``None``.
    TypeError
        If an element or the Arrow type is not a string or binary value.
    """
    if not isinstance(keys, pa.Array | pa.ChunkedArray):
        return _murmur3_sequence(keys, null_key)
    arrow = _as_arrow(keys, pa.binary())
    chunks = _chunks(arrow)
    if not chunks:
        return np.zeros(0, dtype=np.uint32)
    parts = [_murmur3_chunk(c) for c in chunks]
    out = np.concatenate(parts) if len(parts) > 1 else parts[0]
    out &= _U32(MASK_31)
    _fill_nulls(
        out,
        [_null_mask(c) for c in chunks],
        [len(c) for c in chunks],
        None if null_key is None else murmur3_32(null_key),
        "murmur3_32_array",
    )
    return out


# --------------------------------------------------------------------------------------------
# Vectorised Java String.hashCode
# --------------------------------------------------------------------------------------------


def _java_hash_chunk(arr: pa.Array) -> npt.NDArray[np.uint32]:
    """Unmasked ``String.hashCode()`` of every element of one (valid UTF-8) string array.

    ``hashCode`` is the polynomial ``sum(u[j] * 31**(L-1-j))`` over the UTF-16 units ``u`` of a
    string of ``L`` units, mod 2**32. The UTF-8 bytes are decoded to code points in bulk (ASCII
    data skips that step), each code point contributes its one or two units times the matching
    power of 31, and a wrapping cumulative sum split at the key boundaries adds them per key.
    """
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.uint32)
    starts, lengths, data = _offsets_and_data(arr)
    if len(data) == 0:
        return np.zeros(n, dtype=np.uint32)
    ends = starts + lengths
    if int(data.max()) < 0x80:
        cp = data.astype(np.uint32)
        first_cp, end_cp = starts, ends
        supplementary = None
    else:
        is_lead = (data & 0xC0) != 0x80
        leads_before = np.zeros(len(data) + 1, dtype=np.int64)
        np.cumsum(is_lead, out=leads_before[1:])
        first_cp, end_cp = leads_before[starts], leads_before[ends]
        lead_pos = np.flatnonzero(is_lead)
        cp = data[lead_pos].astype(np.uint32)
        multi = np.flatnonzero(cp >= 0xC0)
        padded = np.zeros(len(data) + 3, dtype=np.uint8)
        padded[: len(data)] = data
        at = lead_pos[multi]
        lead = cp[multi]
        c1 = padded[at + 1].astype(np.uint32) & 0x3F
        c2 = padded[at + 2].astype(np.uint32) & 0x3F
        c3 = padded[at + 3].astype(np.uint32) & 0x3F
        decoded = np.where(
            lead < 0xE0,
            ((lead & 0x1F) << 6) | c1,
            np.where(
                lead < 0xF0,
                ((lead & 0x0F) << 12) | (c1 << 6) | c2,
                ((lead & 0x07) << 18) | (c1 << 12) | (c2 << 6) | c3,
            ),
        )
        cp[multi] = decoded
        supplementary = np.flatnonzero(cp >= 0x10000)
        if len(supplementary) == 0:
            supplementary = None

    # Position of each code point's first UTF-16 unit, and where each key's units end.
    if supplementary is None:
        unit_before = np.arange(len(cp), dtype=np.int64)
        key_unit_end = end_cp
    else:
        units = np.ones(len(cp), dtype=np.int64)
        units[supplementary] = 2
        unit_before = np.zeros(len(cp) + 1, dtype=np.int64)
        np.cumsum(units, out=unit_before[1:])
        key_unit_end = unit_before[end_cp]
        unit_before = unit_before[:-1]
    exponent = np.repeat(key_unit_end - 1, end_cp - first_cp)
    exponent -= unit_before

    max_exp = int(exponent.max()) if len(exponent) else 0
    powers = np.full(max_exp + 1, 31, dtype=np.uint32)
    powers[0] = 1
    powers = np.cumprod(powers, dtype=np.uint32)

    contrib = cp * powers[exponent]
    if supplementary is not None:
        offset = cp[supplementary] - 0x10000
        high = 0xD800 + (offset >> 10)
        low = 0xDC00 + (offset & 0x3FF)
        e = exponent[supplementary]
        contrib[supplementary] = high * powers[e] + low * powers[e - 1]
    running = np.zeros(len(contrib) + 1, dtype=np.uint32)
    np.cumsum(contrib, dtype=np.uint32, out=running[1:])
    result: npt.NDArray[np.uint32] = running[end_cp] - running[first_cp]
    return result


def _null_or(value: str | None, null_key: str | None) -> str:
    if value is not None:
        return value
    if null_key is None:
        raise ValueError("java_string_hash_array: null key; pass null_key= to hash nulls")
    return null_key


def java_string_hash_array(
    keys: KeyArrayLike, *, null_key: str | None = None
) -> npt.NDArray[np.uint32]:
    """:func:`java_string_hash` of every key, vectorised with numpy.

    Parameters
    ----------
    keys
        A pyarrow ``string`` array (large, view, dictionary and chunked variants are accepted;
        ``binary`` arrays must hold valid UTF-8), a numpy object array, or a sequence of ``str``
        or ``None``.
    null_key
        How to hash a null element: ``None`` (default) refuses nulls, otherwise nulls hash as
        this string.

    Returns
    -------
    numpy.ndarray
        ``uint32`` hashes masked to 31 bits, equal element-wise to :func:`java_string_hash`.

    Raises
    ------
    ValueError
        If ``keys`` holds a null and ``null_key`` is ``None``.
    TypeError
        If an element is not a ``str`` or an Arrow array is not valid UTF-8 text.
    """
    if not isinstance(keys, pa.Array | pa.ChunkedArray):
        values = keys.tolist() if isinstance(keys, np.ndarray) else list(keys)
        for v in values:
            if v is not None and not isinstance(v, str):
                raise TypeError(f"java_string_hash_array takes str keys, got {type(v).__name__}")
        try:
            keys = pa.array(values, type=pa.string())
        except (UnicodeEncodeError, pa.ArrowException):
            # Lone surrogates cannot live in Arrow text; hash those one by one.
            return np.array(
                [java_string_hash(_null_or(v, null_key)) for v in values], dtype=np.uint32
            )
    arrow = _as_arrow(keys, pa.string())
    chunks = _chunks(arrow)
    if not chunks:
        return np.zeros(0, dtype=np.uint32)
    parts = [_java_hash_chunk(c) for c in chunks]
    out = np.concatenate(parts) if len(parts) > 1 else parts[0]
    out &= _U32(MASK_31)
    _fill_nulls(
        out,
        [_null_mask(c) for c in chunks],
        [len(c) for c in chunks],
        None if null_key is None else java_string_hash(null_key),
        "java_string_hash_array",
    )
    return out


# --------------------------------------------------------------------------------------------
# Slots and sticky keys, vectorised
# --------------------------------------------------------------------------------------------


def slot_array(hashes: npt.ArrayLike, start: int, end: int) -> npt.NDArray[np.int64]:
    """:func:`hash_slot` of every hash.

    Parameters
    ----------
    hashes
        Non-negative integer hashes, normally from :func:`murmur3_32_array`.
    start, end
        The selector's inclusive hash range.

    Returns
    -------
    numpy.ndarray
        ``int64`` slots: ``hash % (end - start + 1) + start`` with 0 replaced by 1.

    Raises
    ------
    ValueError
        If the range is invalid or a hash is negative.
    TypeError
        If ``hashes`` is not an integer array.
    """
    check_hash_range(start, end)
    h = np.asarray(hashes)
    if h.size == 0:
        return np.zeros(h.shape, dtype=np.int64)
    if not np.issubdtype(h.dtype, np.integer):
        raise TypeError(f"hashes must be integers, got dtype {h.dtype}")
    h64 = h.astype(np.int64, copy=False)
    if np.issubdtype(h.dtype, np.signedinteger) and int(h64.min()) < 0:
        raise ValueError("hashes must be non-negative")
    size = end - start + 1
    if size & (size - 1) == 0 and start == 0:
        slots = h64 & (size - 1)
    else:
        slots = h64 % size
        if start:
            slots += start
    if start == 0:
        slots[slots == 0] = 1
    return slots


def sticky_key_array(
    ordering_keys: KeyArrayLike | None,
    partition_keys: KeyArrayLike | None,
    length: int | None = None,
) -> pa.Array:
    """:func:`sticky_key` of every message: ordering key, else partition key, else ``NONE_KEY``.

    Parameters
    ----------
    ordering_keys
        Ordering keys (null when unset), or ``None`` when no message has one.
    partition_keys
        Message keys (null when unset), or ``None`` when no message has one.
    length
        Number of messages; needed only when both key columns are ``None``.

    Returns
    -------
    pyarrow.Array
        A ``binary`` array without nulls.

    Raises
    ------
    ValueError
        If the two columns differ in length, or both are ``None`` and ``length`` is not given.
    """
    columns = [
        _combine(_as_arrow(col, pa.binary())).cast(pa.binary())
        for col in (ordering_keys, partition_keys)
        if col is not None
    ]
    if not columns:
        if length is None:
            raise ValueError("sticky_key_array needs a key column or length=")
        return pa.array([NONE_KEY] * length, type=pa.binary())
    sizes = {len(c) for c in columns}
    if len(sizes) != 1 or (length is not None and sizes != {length}):
        raise ValueError(f"key columns have different lengths: {sorted(sizes)} (length={length})")
    result = pc.coalesce(*columns, pa.scalar(NONE_KEY, type=pa.binary()))
    return _combine(result)


def _combine(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        return arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    return arr
