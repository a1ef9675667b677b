"""Pulsar's key hashes, one key at a time.

Two hash functions decide where a message goes:

* ``Murmur3_32Hash``: MurmurHash3 x86_32 with seed 0 over the UTF-8 bytes of a key, masked to
  31 bits (``& 0x7FFFFFFF``). Key_Shared selectors, the failover ring and the optional producer
  hashing scheme use it.
* ``JavaStringHash``: Java's ``String.hashCode()`` over UTF-16 code units with 32-bit wrap-around,
  masked the same way. It is the producer's default hashing scheme for routing keyed messages.

This module owns the scalar hashes, slots and sticky keys; :mod:`filepulsar.dispatch.hash_arrays`
gives the same values over whole arrays (what the Spark paths call).
"""

from __future__ import annotations

import mmh3

__all__ = [
    "NONE_KEY",
    "hash_slot",
    "java_string_hash",
    "murmur3_32",
    "sign_safe_mod",
    "sticky_key",
    "sticky_key_hash",
]

MASK_31 = 0x7FFFFFFF
"""Pulsar masks both hashes to a non-negative Java ``int``."""

NONE_KEY = b"NONE_KEY"
"""Sticky key of a message with neither an ordering key nor a partition key."""

# --------------------------------------------------------------------------------------------
# Scalar hashes
# --------------------------------------------------------------------------------------------


def java_utf8(text: str) -> bytes:
    """Encode ``text`` as Java's ``String.getBytes(UTF_8)`` would.

    Python strings may hold surrogate code points that Java would read as UTF-16 units: a valid
    pair becomes one 4-byte character and a lone surrogate becomes ``?``.
    """
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        units = text.encode("utf-16-le", "surrogatepass")
        return units.decode("utf-16-le", "surrogatepass").encode("utf-8", "replace")


def murmur3_32(data: bytes | bytearray | memoryview | str) -> int:
    """Pulsar's ``Murmur3_32Hash`` of a key.

    Parameters
    ----------
    data
        The key. ``str`` is hashed over its UTF-8 bytes (lone surrogates become ``?`` as in
        Java); bytes-like values are hashed as they are.

    Returns
    -------
    int
        MurmurHash3 x86_32 (seed 0) of the bytes, masked with ``0x7FFFFFFF``; always in
        ``[0, 2**31)``.

    Raises
    ------
    TypeError
        If ``data`` is neither ``str`` nor bytes-like.
    """
    if isinstance(data, str):
        data = java_utf8(data)
    elif not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"murmur3_32 takes str or bytes, got {type(data).__name__}")
    return mmh3.hash(bytes(data), 0, False) & MASK_31


def java_string_hash(s: str) -> int:
    """Pulsar's ``JavaStringHash`` of a key: Java ``String.hashCode()`` masked to 31 bits.

    The hash runs over UTF-16 code units, so a character outside the Basic Multilingual Plane
    counts as its two surrogates, and the ``int`` arithmetic wraps at 32 bits.

    Parameters
    ----------
    s
        The key.

    Returns
    -------
    int
        ``s.hashCode() & 0x7FFFFFFF``, in ``[0, 2**31)``.

    Raises
    ------
    TypeError
        If ``s`` is not a ``str``.
    """
    if not isinstance(s, str):
        raise TypeError(f"java_string_hash takes str, got {type(s).__name__}")
    h = 0
    for unit in memoryview(s.encode("utf-16-le", "surrogatepass")).cast("H"):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h & MASK_31


def sign_safe_mod(dividend: int, divisor: int) -> int:
    """Pulsar's ``signSafeMod``: Java's ``%`` moved into ``[0, divisor)``.

    Parameters
    ----------
    dividend
        Any integer.
    divisor
        A positive integer (a partition count or a range size).

    Returns
    -------
    int
        The remainder in ``[0, divisor)``; the same as Python's ``dividend % divisor``.

    Raises
    ------
    ValueError
        If ``divisor`` is not positive.
    """
    if divisor <= 0:
        raise ValueError(f"sign_safe_mod needs a positive divisor, got {divisor}")
    mod = abs(dividend) % divisor
    if dividend < 0 and mod:
        mod = divisor - mod
    return mod


def hash_slot(hash_value: int, start: int, end: int) -> int:
    """Map a murmur hash to a slot of the inclusive hash range ``[start, end]``.

    This is Pulsar's sticky key hash: ``hash % (end - start + 1) + start``, where a result of 0
    becomes 1 because 0 means "no hash" inside Pulsar's dispatchers.

    Parameters
    ----------
    hash_value
        A non-negative hash, normally :func:`murmur3_32` of a sticky key.
    start, end
        The selector's inclusive hash range: ``[0, 65535]`` for auto-split and sticky
        selectors, ``[1, 65535]`` for consistent hashing.

    Returns
    -------
    int
        The slot, in ``[max(start, 1), end]``.

    Raises
    ------
    ValueError
        If the range is empty or negative, or ``hash_value`` is negative.
    """
    if start < 0 or end < start or hash_value < 0:  # (one test: a scan slots every entry)
        check_hash_range(start, end)
        raise ValueError(f"hash_value must be non-negative, got {hash_value}")
    slot = hash_value % (end - start + 1) + start
    return 1 if slot == 0 else slot


def check_hash_range(start: int, end: int) -> None:
    """Raise :class:`ValueError` unless ``0 <= start <= end``."""
    if start < 0 or end < start:
        raise ValueError(f"hash range [{start}, {end}] must satisfy 0 <= start <= end")


def sticky_key(ordering_key: bytes | None, partition_key: str | bytes | None) -> bytes:
    """The key a Key_Shared subscription hashes for a message.

    Parameters
    ----------
    ordering_key
        The message's ordering key, or ``None`` when it has none. An empty ordering key is a
        key (Pulsar checks presence, not length).
    partition_key
        The message key, or ``None``. ``str`` keys are encoded as UTF-8; ``bytes`` keys (set with
        ``keyBytes``) are used as they are.

    Returns
    -------
    bytes
        The ordering key if set, else the partition key, else ``b"NONE_KEY"``.
    """
    if ordering_key is not None:
        return bytes(ordering_key)
    if partition_key is not None:
        return java_utf8(partition_key) if isinstance(partition_key, str) else bytes(partition_key)
    return NONE_KEY


def sticky_key_hash(ordering_key: bytes | None, partition_key: str | bytes | None) -> int:
    """``murmur3_32(sticky_key(ordering_key, partition_key))`` with one call less (a
    Key_Shared dispatch hashes the key of every entry it scans): :func:`sticky_key` always
    gives bytes, which :func:`murmur3_32` hashes as they are."""
    return mmh3.hash(sticky_key(ordering_key, partition_key), 0, False) & MASK_31
