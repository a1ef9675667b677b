"""Hostile entries: framing and CRC right, contents wrong (a writer bug or a hostile writer).

Each entry is built with storage.entry's own encoder (a wrong body) or framing function
(valid framing around garbage) and committed through a producer session's real writer, as a
buggy writer would. Every read path must answer with CorruptDataError naming topic, ledger
and entry -- never a raw Arrow, numpy, Unicode or codec error -- and decoding must stay
bounded in time and memory whatever sizes the header claims.
"""

from __future__ import annotations

import re
import struct
import time
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from filepulsar.connector.client import Client, InitialPosition, MessageId
from filepulsar.connector.source.partition import FilePulsarPartition
from filepulsar.connector.source.read import read_partition
from filepulsar.jobs.cli import main
from filepulsar.storage import (
    Codec,
    CorruptDataError,
    ManagedLedger,
    Producer,
    Reader,
    open_blob_store,
)
from filepulsar.storage.commit import PendingEntry
from filepulsar.storage.entry import (
    COLUMN_FLAGS,
    FLAG_BATCH,
    FLAG_CHUNK,
    HEADER,
    MAX_PAYLOAD_SIZE,
    PREFIX,
    EntryFormatError,
    iter_entries,
    stored_schema,
)
from filepulsar.storage.entry_encode import encode_entry, frame_entry_parts
from filepulsar.storage.ledger import EARLIEST
from filepulsar.storage.names import TopicName
from filepulsar.storage.read_range import WHOLE

pytestmark = pytest.mark.unit

TOPIC = "persistent://public/default/hostile"


def _header(
    n: int,
    usize: int,
    *,
    producer: bytes = b"hostile",
    chunk: tuple[int, int, int] = (-1, 0, 0),
    uuid: bytes = b"",
) -> bytes:
    cid, nch, tot = chunk
    fixed = HEADER.pack(1_700_000_000_000, 0, n - 1, 0, n, usize, cid, nch, tot)
    strings = b"".join(struct.pack("<H", len(s)) + s for s in (producer, uuid, b""))
    return fixed + strings


def _framed(
    payload: bytes,
    *,
    n: int = 1,
    usize: int | None = None,
    codec: Codec = Codec.NONE,
    flags: int = FLAG_BATCH,
    **header: Any,
) -> bytes:
    size = len(payload) if usize is None else usize
    return b"".join(
        bytes(p) for p in frame_entry_parts(codec, flags, _header(n, size, **header), payload)
    )


def _batch(values: list[bytes], key: pa.Array | None = None) -> pa.RecordBatch:
    cols = [pa.array(values, pa.binary())]
    flags = FLAG_BATCH
    if key is not None:
        cols.append(key)
        flags |= COLUMN_FLAGS["key"]
    return pa.RecordBatch.from_arrays(cols, schema=stored_schema(flags))


def _encoded(batch: pa.RecordBatch, codec: Codec = Codec.NONE) -> bytes:
    return encode_entry(
        batch,
        producer_name="hostile",
        publish_time=1_700_000_000_000,
        codec=codec,
        first_sequence_id=0,
    )


def _bad_offsets() -> bytes:
    """A real entry whose value offsets point 16 MiB past the value bytes."""
    body = _batch([b"x" * 77]).serialize().to_pybytes()
    good = struct.pack("<ii", 0, 77)
    at = body.rindex(good)  # the offsets buffer, in the body after the metadata
    assert body[at + 8 : at + 8 + 77] == b"x" * 77
    bad = body[:at] + struct.pack("<ii", 0, 1 << 24) + body[at + 8 :]
    return _framed(bad)


def _zlib_bomb(inflated: int) -> bytes:
    """A zlib stream of ``inflated`` zero bytes (whole MiBs, at least 2): one compressed MiB
    repeated. After a full flush the compressor starts afresh, so every further MiB of zeros
    compresses to the same bytes; the stream ends with the last block and the checksum of
    all of it (Adler-32 of n zeros: 1 + (n << 16), mod 65521). Compressing 1 GiB took 4 s."""
    mib = b"\0" * (1 << 20)
    z = zlib.compressobj(9)
    first = z.compress(mib) + z.flush(zlib.Z_FULL_FLUSH)
    again = z.compress(mib) + z.flush(zlib.Z_FULL_FLUSH)
    assert z.compress(mib) + z.flush(zlib.Z_FULL_FLUSH) == again
    end = z.flush()[:-4]  # the last block, without the checksum of the 3 MiB compressed
    checksum = ((inflated % 65521) << 16) | 1
    return first + again * ((inflated >> 20) - 1) + end + checksum.to_bytes(4, "big")


def test_the_zlib_bomb_is_the_stream_of_its_zeros() -> None:
    """The bomb's construction, checked in full where inflating it is cheap."""
    for mib in (2, 5):
        assert zlib.decompress(_zlib_bomb(mib << 20)) == b"\0" * (mib << 20)


#: name -> (entry bytes, num_messages the writer claims)
HOSTILE: dict[str, Callable[[], bytes]] = {
    "garbage-payload": lambda: _framed(b"\x07" * 64, n=4),
    "not-a-record-batch": lambda: _framed(stored_schema(FLAG_BATCH).serialize().to_pybytes()),
    "invalid-utf8-key": lambda: _encoded(
        _batch([b"v"], pa.array([b"\xff\xfe"], pa.binary()).view(pa.string()))
    ),
    "offsets-out-of-bounds": _bad_offsets,
    "fewer-rows-than-header": lambda: _framed(_batch([b"a"]).serialize().to_pybytes(), n=2),
    "invalid-utf8-producer": lambda: _framed(
        _batch([b"a"]).serialize().to_pybytes(), producer=b"\xff\xfe"
    ),
    "non-batched-with-many": lambda: _framed(
        _batch([b"a", b"b"]).serialize().to_pybytes(), n=2, flags=0
    ),
    "impossible-chunk": lambda: _framed(
        _batch([b"a"]).serialize().to_pybytes(), flags=FLAG_CHUNK, chunk=(5, 2, 10), uuid=b"u"
    ),
    "zlib-garbage": lambda: _framed(b"\x78\x9c" + b"\xff" * 40, usize=1000, codec=Codec.ZLIB),
    "zlib-truncated": lambda: _framed(
        zlib.compress(_batch([b"a" * 1000]).serialize().to_pybytes())[:-10],
        usize=_batch([b"a" * 1000]).serialize().size,
        codec=Codec.ZLIB,
    ),
    "lz4-claims-too-much": lambda: _framed(b"\x1f" * 32, usize=100 << 20, codec=Codec.LZ4),
    "snappy-wrong-size": lambda: _framed(
        b"\x80\x80\x80\x40" + b"\0" * 8, usize=64, codec=Codec.SNAPPY
    ),
    "zstd-garbage": lambda: _framed(
        b"\x28\xb5\x2f\xfd" + b"\xee" * 30, usize=512, codec=Codec.ZSTD
    ),
    "size-over-the-limit": lambda: _framed(
        b"\0" * 64, usize=MAX_PAYLOAD_SIZE + 1, codec=Codec.ZLIB
    ),
}


def _commit(store: Any, entries: list[bytes]) -> None:
    """Commit ``entries`` through a producer session's own writer (a buggy writer)."""
    with Producer(store, TOPIC, producer_name="hostile") as p:
        pending = [
            PendingEntry.of([e], 1, 1_700_000_000_000, "hostile", i, i)
            for i, e in enumerate(entries)
        ]
        p._parts[0].writer.append(pending, dedup=False)


def _assert_located(err: BaseException, entry_id: int = 1) -> None:
    text = str(err)
    assert TOPIC in text and "ledger 0" in text, text
    assert re.search(rf"\bentry {entry_id}\b", text), text
    assert isinstance(err, CorruptDataError)
    assert "\n" not in text


@pytest.fixture
def good() -> bytes:
    return _encoded(_batch([b"fine"]))


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_entry_is_corrupt_data_on_every_read_path(
    tmp_path: Path, capsys: Any, good: bytes, case: str
) -> None:
    store = open_blob_store(str(tmp_path))
    _commit(store, [good, HOSTILE[case](), good])

    # storage: the tailing reader and entries_to_table
    r = Reader(store, TOPIC)
    with pytest.raises(CorruptDataError) as info:
        while r.read_batch(10, timeout_ms=0).num_rows:
            pass
    _assert_located(info.value)
    assert info.value.entry_id == 1 and info.value.ledger_id == 0

    # the client's reader (one entry at a time) and consumer
    with Client(str(tmp_path)) as client:
        reader = client.create_reader(TOPIC, MessageId.earliest)
        with pytest.raises(CorruptDataError) as info:
            for _ in range(3):
                reader.read_next(timeout_millis=1000)
        _assert_located(info.value)
        consumer = client.subscribe(TOPIC, "s", initial_position=InitialPosition.Earliest)
        with pytest.raises(CorruptDataError) as info:
            for _ in range(3):
                consumer.acknowledge(consumer.receive(timeout_millis=1000))
        _assert_located(info.value)

    # the CLI's peek
    capsys.readouterr()
    assert main(["--root", str(tmp_path), "peek", TOPIC]) == 1  # an error, not bad usage (2)
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "entry 1" in err

    # the Spark executor's read
    part = FilePulsarPartition(str(tmp_path), {}, TOPIC, (-1, -1, WHOLE), (0, 2, WHOLE))
    with pytest.raises(CorruptDataError) as info:
        list(read_partition(part))
    _assert_located(info.value)


def test_entry_format_errors_carry_their_kind(good: bytes) -> None:
    flipped = bytearray(good)
    flipped[-9] ^= 1  # a payload byte: the CRC fails
    with pytest.raises(EntryFormatError) as info:
        list(iter_entries(bytes(flipped), 1))
    assert info.value.kind == "checksum"
    with pytest.raises(EntryFormatError) as info:
        list(iter_entries(HOSTILE["invalid-utf8-producer"](), 1))
    assert info.value.kind == "header" and "checksum" not in str(info.value)
    (raw,) = iter_entries(HOSTILE["garbage-payload"](), 1)
    with pytest.raises(EntryFormatError) as info:
        raw.stored()
    assert info.value.kind == "decode"


def test_a_checksum_word_in_a_header_error_is_not_a_checksum_error(tmp_path: Path) -> None:
    """The kind, not the message text, decides: a producer named 'checksum' whose header is
    bad is CorruptDataError, not ChecksumError."""
    from filepulsar.storage import ChecksumError

    store = open_blob_store(str(tmp_path))
    bad = _framed(_batch([b"a", b"b"]).serialize().to_pybytes(), n=2, flags=0, producer=b"checksum")
    _commit(store, [bad])
    ml = ManagedLedger(store, TopicName.parse(TOPIC))
    with pytest.raises(CorruptDataError) as info:
        ml.read_entries(ml.state(), EARLIEST)
    assert not isinstance(info.value, ChecksumError)


@pytest.mark.parametrize("declared", [1000, 1 << 30], ids=["small-size", "1GiB-size"])
def test_a_zlib_bomb_fails_fast_in_bounded_memory(tmp_path: Path, declared: int) -> None:
    """1 MB of zlib inflating to 1 GiB: whatever size the header declares, the reader stops
    at the declared size (or refuses a size over the format's limit) without inflating it."""
    bomb = _zlib_bomb(1 << 30)
    assert len(bomb) < 2 << 20
    store = open_blob_store(str(tmp_path))
    _commit(store, [_framed(bomb, usize=declared, codec=Codec.ZLIB)])
    ml = ManagedLedger(store, TopicName.parse(TOPIC))
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(CorruptDataError, match="ledger 0, entry 0"):
            r = Reader(store, TOPIC)
            r.read_batch(10, timeout_ms=0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - t0 < 5
    assert peak < 16 << 20, peak  # the bomb itself is ~1 MB; nothing near 1 GiB
    del ml


def test_the_format_limit_is_enforced_on_write() -> None:
    from filepulsar.storage.errors import MessageTooBig

    big = pa.array([b"\0" * (MAX_PAYLOAD_SIZE // 2)] * 3, pa.binary())
    batch = pa.RecordBatch.from_arrays([big], schema=stored_schema(FLAG_BATCH))
    with pytest.raises(MessageTooBig, match="limit"):
        _encoded(batch)


def test_a_fragment_longer_than_its_entries_can_be_is_refused_before_reading(
    tmp_path: Path, good: bytes
) -> None:
    """Sizes read from storage are bounded by the format before anything is allocated."""
    from filepulsar.storage.entry import MAX_ENTRY_SIZE

    store = open_blob_store(str(tmp_path))
    _commit(store, [good])
    ml = ManagedLedger(store, TopicName.parse(TOPIC))
    state = ml.state()
    (frag,) = state.ledgers[0].fragments or []
    frag.length = 2 * MAX_ENTRY_SIZE  # what a damaged manifest could claim (in memory only)
    with pytest.raises(CorruptDataError, match="cannot hold 1 entries"):
        ml.read_entries(state, EARLIEST)
    assert PREFIX.size == 20


def test_producer_names_are_decoded_from_their_own_bytes() -> None:
    """The cache of parsed header strings is keyed by the header's exact bytes: names that
    differ in one byte decode to their own strings, a name that is not UTF-8 is refused every
    time (never cached), and no stream of headers grows the cache past its bounds."""
    from filepulsar.storage import entry as entry_mod

    body = _batch([b"a"]).serialize().to_pybytes()
    names = [b"p\xc3\xa9", b"p\xc3\xa8", b"pe", b"p\xff", b"p\xc3"]
    for _ in range(2):  # the second time from the cache
        for name in names:
            data = _framed(body, producer=name)
            if name in (b"p\xff", b"p\xc3"):
                with pytest.raises(EntryFormatError) as info:
                    list(iter_entries(data, 1))
                assert info.value.kind == "header"
            else:
                (raw,) = iter_entries(data, 1)
                assert raw.header.producer_name == name.decode()
    cache = entry_mod._strings
    assert all(not k.startswith(b"\x02\x00p\xff") for k in cache._d)

    def region(name: bytes) -> bytes:
        return len(name).to_bytes(2, "little") + name + bytes(4)

    for i in range(3 * entry_mod._STRINGS_CACHE_SIZE):
        assert cache.parse(region(f"producer-{i}".encode()))[0] == f"producer-{i}"
    assert cache.parse(region(b"x" * 60_000))[0] == "x" * 60_000
    assert len(cache._d) <= entry_mod._STRINGS_CACHE_SIZE
    assert all(len(k) <= entry_mod._STRINGS_CACHE_MAX_LEN for k in cache._d)
    with pytest.raises(ValueError, match="padding"):
        cache.parse(region(b"p") + b"\x01")


def test_an_entry_is_verified_when_it_is_read(tmp_path: Path, good: bytes) -> None:
    """Entries are checked when read, not a whole fragment at a time: a fragment whose entry
    2 fails its checksum reads entries 0-1 and 3-4, and any read reaching entry 2 fails
    naming it (the first read of the fragment and later ones alike); a reader that skips
    what is lost gets the other four."""
    from filepulsar.storage import ChecksumError
    from filepulsar.storage.ledger import Position

    flipped = bytearray(good)
    flipped[-9] ^= 1
    store = open_blob_store(str(tmp_path))
    _commit(store, [good, good, bytes(flipped), good, good])
    topic = TopicName.parse(TOPIC)
    ml = ManagedLedger(store, topic)
    s = ml.state()
    assert len(s.ledgers[0].fragments or []) == 1
    got = ml.read_entries(s, Position(0, 0), end=Position(0, 1))
    assert [e.entry_id for e in got] == [0, 1]
    assert [e.entry_id for e in ml.read_entries(s, Position(0, 3))] == [3, 4]
    for reader in (ml, ManagedLedger(store, topic)):  # offsets cached / a first read
        with pytest.raises(ChecksumError) as info:
            reader.read_entries(s, Position(0, 1), end=Position(0, 2))
        _assert_located(info.value, 2)
    skipped: list[Exception] = []
    got = ManagedLedger(store, topic).read_entries(s, EARLIEST, on_error=skipped.append)
    assert [e.entry_id for e in got] == [0, 1, 3, 4]
    assert len(skipped) == 1 and isinstance(skipped[0], ChecksumError)
    _assert_located(skipped[0], 2)


@pytest.mark.parametrize("flags", [0, FLAG_BATCH, FLAG_CHUNK, FLAG_BATCH | FLAG_CHUNK])
def test_a_header_is_refused_exactly_where_the_full_check_refuses_it(flags: int) -> None:
    """iter_entries accepts the common header (one uncompressed message, not a chunk)
    without calling _check_header: whatever it accepts or refuses, with any count of
    messages, declared size and chunk fields, is what _check_header says (the spec)."""
    from filepulsar.storage import entry as entry_mod

    payload = bytes(range(24))
    for n in (0, 1, 2, 6, 7):
        for usize in (0, 3, 4, 23, 24, 25, entry_mod.MAX_PAYLOAD_SIZE + 1):
            for chunk in ((-1, 0, 0), (0, 2, 48), (2, 2, 48), (0, 1, -1)):
                data = _framed(payload, n=n, usize=usize, flags=flags, chunk=chunk)
                try:
                    entry_mod._check_header(flags, 0, len(payload), n, usize, *chunk)
                except ValueError as e:
                    with pytest.raises(EntryFormatError) as info:
                        list(iter_entries(data, 1))
                    assert info.value.kind == "header" and str(e) in str(info.value)
                else:
                    (raw,) = iter_entries(data, 1)
                    assert (raw.header.num_messages, raw.header.uncompressed_size) == (n, usize)
