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

from filepulsar.dispatch.modes import CompressionType, allowed_spellings
from filepulsar.storage.errors import InvalidConfiguration


class Codec(enum.IntEnum):
    NONE = 0
    LZ4 = 1
    ZLIB = 2
    ZSTD = 3
    SNAPPY = 4

    @classmethod
    def parse(cls, value: object) -> Codec:
        """Accept a Codec, its number, or either spelling of a
        :class:`filepulsar.dispatch.modes.CompressionType` (``"ZLib"``, ``"ZLIB"``, ``"zstd"``)."""
        if isinstance(value, Codec):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError as e:
                raise InvalidConfiguration(_bad(value)) from e
        return cls(CompressionType.parse(value, "compression").value)


def _bad(value: object) -> str:
    return (
        f"compression {value!r} is not supported: use one of "
        f"{', '.join(allowed_spellings(CompressionType))}"
    )


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


#: Most bytes one stored byte can decompress to, for the codecs whose decoder allocates the
#: declared size up front (an LZ4 sequence adds at most 255 bytes per length byte; a snappy
#: copy element of 3 bytes yields at most 64). Checked before decoding, so a hostile size
#: cannot make them allocate more than this multiple of the payload.
_MAX_RATIO = {Codec.LZ4: 256, Codec.SNAPPY: 24}
_RATIO_SLACK = 64


def _snappy_length(data: bytes | memoryview) -> int:
    """The uncompressed length a raw snappy block declares in its varint preamble."""
    n = shift = 0
    for i in range(min(len(data), 5)):
        b = data[i]
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n
        shift += 7
    raise ValueError("SNAPPY payload has a malformed length preamble")


def decompress(
    codec: Codec, data: bytes | memoryview, uncompressed_size: int
) -> bytes | memoryview:
    """Decompress ``data`` to exactly ``uncompressed_size`` bytes, never producing (or
    allocating for) more: a payload that would inflate past the size fails as soon as it does.

    Raises
    ------
    ValueError
        If the codec's decoder fails, the size does not match, or the size is more than the
        payload could decompress to (the caller adds the location).
    """
    if codec is Codec.NONE:  # the common case, per entry read: no copy, no library call
        if len(data) != uncompressed_size:
            raise ValueError(
                f"uncompressed payload of {len(data)} bytes, header says {uncompressed_size}"
            )
        return data
    if uncompressed_size < 0:
        raise ValueError(f"negative uncompressed size {uncompressed_size}")
    ratio = _MAX_RATIO.get(codec)
    if ratio is not None and uncompressed_size > ratio * len(data) + _RATIO_SLACK:
        raise ValueError(
            f"{codec.name} payload of {len(data)} bytes cannot decompress to the "
            f"{uncompressed_size} bytes the header says"
        )
    try:
        out = _decompress(codec, data, uncompressed_size)
    except ValueError:
        raise
    except Exception as e:  # each codec library has its own error classes
        raise ValueError(f"{codec.name} payload does not decompress: {e}") from e
    if len(out) != uncompressed_size:
        raise ValueError(
            f"{codec.name} payload decompressed to {len(out)} bytes, "
            f"header says {uncompressed_size}"
        )
    return out


def _decompress(codec: Codec, data: bytes | memoryview, size: int) -> bytes | memoryview:
    """The codecs that compress (NONE is handled by :func:`decompress`)."""
    if codec is Codec.LZ4:
        out: bytes = lz4.block.decompress(data, uncompressed_size=size)
        return out
    if codec is Codec.ZLIB:
        d = zlib.decompressobj()
        out = d.decompress(data, size + 1)  # one byte more reveals a payload that is too big
        if len(out) <= size and not d.eof:
            raise ValueError("ZLIB payload is truncated")
        if d.unused_data:
            raise ValueError(f"ZLIB payload has {len(d.unused_data)} bytes after its stream")
        return out
    if codec is Codec.ZSTD:
        with _zstd()[1].stream_reader(data, read_across_frames=False) as reader:
            parts: list[bytes] = []
            got = 0
            while got <= size:
                # Bounded steps: read(n) allocates n up front, whatever the frame holds.
                chunk = reader.read(min(size + 1 - got, 1 << 20))
                if not chunk:
                    break
                parts.append(chunk)
                got += len(chunk)
        return b"".join(parts)
    if codec is Codec.SNAPPY:
        declared = _snappy_length(data)
        if declared != size:
            raise ValueError(f"SNAPPY payload declares {declared} bytes, header says {size}")
        return bytes(cramjam.snappy.decompress_raw(data))
    raise ValueError(f"unknown codec {codec!r}")
