"""Compression codecs of an entry payload, numbered as Pulsar's ``CompressionType``.

LZ4 is the raw LZ4 block format and needs the uncompressed size (recorded in the entry header),
ZLIB is zlib-wrapped deflate, ZSTD is a zstd frame, SNAPPY is raw snappy — the same choices
Pulsar's clients make.
"""

from __future__ import annotations

import enum
import threading
import zlib

import cramjam
import lz4.block
import zstandard

from filepulsar.storage.errors import InvalidConfiguration


class Codec(enum.IntEnum):
    NONE = 0
    LZ4 = 1
    ZLIB = 2
    ZSTD = 3
    SNAPPY = 4

    @classmethod
    def parse(cls, value: object) -> Codec:
        """Accept a Codec, its number, or its name in any case (``"ZLib"``, ``"zstd"``)."""
        if isinstance(value, Codec):
            return value
        if isinstance(value, int):
            try:
                return cls(value)
            except ValueError as e:
                raise InvalidConfiguration(_bad(value)) from e
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError as e:
                raise InvalidConfiguration(_bad(value)) from e
        name = getattr(value, "name", None)  # other enums that share the names
        if isinstance(name, str):
            return cls.parse(name)
        raise InvalidConfiguration(_bad(value))


def _bad(value: object) -> str:
    return f"compression {value!r} is not supported: use one of {', '.join(c.name for c in Codec)}"


_local = threading.local()


def _zstd() -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
    pair = getattr(_local, "zstd", None)
    if pair is None:
        pair = (zstandard.ZstdCompressor(level=3), zstandard.ZstdDecompressor())
        _local.zstd = pair
    return pair


def compress(codec: Codec, data: bytes | memoryview) -> bytes | memoryview:
    """Compress ``data``; NONE returns it unchanged."""
    if codec is Codec.NONE:
        return data
    if codec is Codec.LZ4:
        return lz4.block.compress(data, store_size=False)
    if codec is Codec.ZLIB:
        return zlib.compress(data)
    if codec is Codec.ZSTD:
        return _zstd()[0].compress(data)
    if codec is Codec.SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    raise InvalidConfiguration(_bad(codec))


def decompress(
    codec: Codec, data: bytes | memoryview, uncompressed_size: int
) -> bytes | memoryview:
    """Decompress ``data`` to exactly ``uncompressed_size`` bytes.

    Raises
    ------
    ValueError
        If the codec's decoder fails or the size does not match (the caller adds the location).
    """
    if codec is Codec.NONE:
        out: bytes | memoryview = data
    elif codec is Codec.LZ4:
        out = lz4.block.decompress(data, uncompressed_size=uncompressed_size)
    elif codec is Codec.ZLIB:
        out = zlib.decompress(data)
    elif codec is Codec.ZSTD:
        out = _zstd()[1].decompress(data, max_output_size=uncompressed_size)
    elif codec is Codec.SNAPPY:
        out = bytes(cramjam.snappy.decompress_raw(data))
    else:
        raise ValueError(f"unknown codec {codec!r}")
    if len(out) != uncompressed_size:
        raise ValueError(
            f"{codec.name} payload decompressed to {len(out)} bytes, "
            f"header says {uncompressed_size}"
        )
    return out
