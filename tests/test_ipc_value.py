"""The one-value Arrow IPC message written and read without pyarrow (storage/ipc_value.py,
issue 14: a quarter of a millisecond per unbatched send).

Its bytes must be pyarrow's, and it must accept only what pyarrow decodes to the same value:
checked here against pyarrow itself, for any value and for every single-byte change.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filepulsar.storage import ipc_value
from filepulsar.storage.blobstore.local import LocalBlobStore
from filepulsar.storage.codec import Codec
from filepulsar.storage.entry import COLUMN_FLAGS, ChunkInfo, stored_schema
from filepulsar.storage.entry_encode import encode_entry_parts, encode_value_entry_parts
from filepulsar.storage.producer.messages import binary_array as _binary_array

pytestmark = pytest.mark.property

_SCHEMA = stored_schema(0)


def _pyarrow(value: bytes) -> bytes:
    batch = pa.RecordBatch.from_arrays([_binary_array([value])], names=["value"])
    return bytes(batch.serialize().to_pybytes())


def _pyarrow_value(body: bytes) -> bytes | None:
    """The value pyarrow decodes from ``body`` (validated in full), None if it refuses it."""
    try:
        batch = pa.ipc.read_record_batch(pa.py_buffer(body), _SCHEMA)
        batch.validate(full=True)
    except (pa.ArrowException, ValueError, OSError, IndexError):
        return None
    if batch.num_rows != 1:
        return None
    got = batch.column(0)[0].as_py()
    return got if isinstance(got, bytes) else None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=3000))
def test_the_template_writes_pyarrows_bytes_and_reads_them_back(value: bytes) -> None:
    parts = ipc_value.encode(value)
    assert parts is not None
    body = b"".join(parts)
    assert body == _pyarrow(value)
    assert ipc_value.decode(body) == value
    assert ipc_value.decode(memoryview(body)) == value


@settings(max_examples=40, deadline=None)
@given(st.binary(min_size=0, max_size=40), st.data())
def test_a_changed_byte_is_refused_or_read_as_pyarrow_reads_it(
    value: bytes, data: st.DataObject
) -> None:
    body = bytearray(_pyarrow(value))
    at = data.draw(st.integers(0, len(body) - 1))
    body[at] ^= data.draw(st.integers(1, 255))
    got = ipc_value.decode(bytes(body))
    if got is not None:  # accepted only where pyarrow reads the same value
        assert _pyarrow_value(bytes(body)) == got


def test_every_single_byte_change_of_one_message() -> None:
    body = _pyarrow(b"hello, pulsar")
    for at in range(len(body)):
        for flip in (0x01, 0x80, 0xFF):
            changed = bytearray(body)
            changed[at] ^= flip
            got = ipc_value.decode(bytes(changed))
            if got is not None:
                assert _pyarrow_value(bytes(changed)) == got, at


def test_other_messages_go_to_pyarrow() -> None:
    two = pa.RecordBatch.from_arrays([_binary_array([b"a", b"b"])], names=["value"])
    null = pa.RecordBatch.from_arrays([_binary_array([None])], names=["value"])
    other = pa.RecordBatch.from_arrays([_binary_array([b"a"]), pa.array([1])], names=["value", "n"])
    for batch in (two, null, other):
        assert ipc_value.decode(batch.serialize().to_pybytes()) is None
    assert ipc_value.decode(b"") is None
    assert ipc_value.decode(_pyarrow(b"abc")[:-1]) is None  # cut short
    assert ipc_value.decode(_pyarrow(b"abc") + bytes(8)) is None  # longer than it says


def _entry_args(
    codec: Codec,
    batched: bool,
    *,
    deliver_at: int = 0,
    chunk: ChunkInfo | None = None,
    schema_version: bytes = b"",
) -> dict[str, object]:
    """The entry encoders' keyword arguments both paths are given."""
    return {
        "producer_name": "p",
        "publish_time": 1_700_000_000_000,
        "codec": codec,
        "batched": batched,
        "deliver_at": deliver_at,
        "chunk": chunk,
        "schema_version": schema_version,
    }


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.LZ4, Codec.ZSTD, Codec.ZLIB])
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("chunk", [None, ChunkInfo("p-7", 1, 3, 300)])
@pytest.mark.parametrize("value", [b"", b"v", b"x" * 1000])
def test_value_entries_equal_the_record_batch_path(
    codec: Codec, batched: bool, chunk: ChunkInfo | None, value: bytes
) -> None:
    kw = _entry_args(
        codec, batched, deliver_at=12, chunk=chunk, schema_version=(9).to_bytes(8, "big")
    )
    batch = pa.RecordBatch.from_arrays([_binary_array([value])], names=["value"])
    general = encode_entry_parts(batch, first_sequence_id=7, **kw)  # type: ignore[arg-type]
    fast = encode_value_entry_parts(value, sequence_id=7, **kw)  # type: ignore[arg-type]
    assert fast is not None
    assert b"".join(map(bytes, fast)) == b"".join(map(bytes, general))


def test_sent_values_read_back_by_both_paths(tmp_path: Path) -> None:
    """Entries a producer wrote through the template: the fast read and pyarrow's agree."""
    from filepulsar.storage import Producer
    from filepulsar.storage.ledger import ManagedLedger, Position
    from filepulsar.storage.names import TopicName

    store = LocalBlobStore(str(tmp_path))
    values = [b"", b"a", bytes(range(256)) * 3]
    for codec in (Codec.NONE, Codec.LZ4):
        p = Producer(store, "t", batching_enabled=False, compression_type=codec)
        for v in values:
            p.send(v)
        p.close()
    ml = ManagedLedger(store, TopicName.parse("t"))
    entries = ml.read_entries(ml.state(), Position(0, 0))
    assert len(entries) == 2 * len(values)
    for e, v in zip(entries, values * 2):
        assert e.raw.single_value() == v
        assert e.stored().column(0).to_pylist() == [v]


@pytest.mark.parametrize(
    ("values", "typ"),
    [
        ([b"abc"], None),
        ([b""], pa.binary()),
        (["device-17"], pa.string()),
        (["é"], pa.string()),
        ([None], pa.string()),
        ([None], None),
        (["k", None], pa.string()),
    ],
)
def test_one_value_arrays_are_pyarrows_own(values: list, typ: pa.DataType | None) -> None:
    """The one-value fast path of ``_binary_array`` (a key or a value of one send) builds the
    array pyarrow builds from the same list, nulls included."""
    got = _binary_array(values, typ)
    got.validate(full=True)
    want = pa.array(values, typ or pa.binary())
    assert got.type == want.type and got.equals(want)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=4))
def test_the_row_template_writes_pyarrows_bytes(values: list[bytes]) -> None:
    """One row of several binary columns (a keyed message: value, key, ordering key): the
    template's bytes are pyarrow's for any lengths."""
    parts = ipc_value.encode_row(values)
    assert parts is not None
    arrays = [_binary_array([v]) for v in values]
    batch = pa.RecordBatch.from_arrays(arrays, names=[f"c{i}" for i in range(len(values))])
    assert b"".join(parts) == bytes(batch.serialize().to_pybytes())


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.LZ4])
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize(
    ("key", "ordering_key"), [("device-17", None), (None, b"ok"), ("é", b""), ("", b"\x00" * 9)]
)
@pytest.mark.parametrize("value", [b"", b"v", b"x" * 1000])
def test_keyed_entries_equal_the_record_batch_path(
    codec: Codec, batched: bool, key: str | None, ordering_key: bytes | None, value: bytes
) -> None:
    """A one-message entry with a key and/or an ordering key (every entry of a live
    KeyBased producer) written from the template is byte for byte the record batch path's,
    key-based header sequence id included."""
    kw = _entry_args(codec, batched)
    cols, names = [_binary_array([value])], ["value"]
    if key is not None:
        cols.append(_binary_array([key], pa.string()))
        names.append("key")
    if ordering_key is not None:
        cols.append(_binary_array([ordering_key]))
        names.append("ordering_key")
    flags = sum(COLUMN_FLAGS[n] for n in names[1:])
    batch = pa.RecordBatch.from_arrays(cols, schema=stored_schema(flags))
    general = encode_entry_parts(
        batch,
        first_sequence_id=41,
        header_sequence_id=41,
        **kw,  # type: ignore[arg-type]
    )
    fast = encode_value_entry_parts(
        value,
        sequence_id=41,
        key=key,
        ordering_key=ordering_key,
        **kw,  # type: ignore[arg-type]
    )
    assert fast is not None
    assert b"".join(map(bytes, fast)) == b"".join(map(bytes, general))


def test_keyed_sends_read_back_with_their_keys(tmp_path: Path) -> None:
    """A KeyBased producer's one-message entries (written from the template) read back
    through pyarrow with their keys, ordering keys and sequence ids."""
    from filepulsar.storage import Producer
    from filepulsar.storage.ledger import ManagedLedger, Position
    from filepulsar.storage.names import TopicName

    store = LocalBlobStore(str(tmp_path))
    p = Producer(store, "t", batching_type="KeyBased", batching_max_publish_delay_ms=0)
    sent = [(b"a", "k1", None, 5), (b"", "k2", b"o", 6), (b"c" * 300, None, b"o2", 9)]
    for value, key, okey, seq in sent:
        p.send(value, partition_key=key, ordering_key=okey, sequence_id=seq)
    p.close()
    ml = ManagedLedger(store, TopicName.parse("t"))
    entries = ml.read_entries(ml.state(), Position(0, 0))
    assert len(entries) == len(sent)
    for e, (value, key, okey, seq) in zip(entries, sent):
        t = e.stored()
        row = {n: t.column(n)[0].as_py() for n in t.column_names}
        assert row.get("value") == value
        assert row.get("key") == key and row.get("ordering_key") == okey
        assert e.raw.header.sequence_id == e.raw.header.highest_sequence_id == seq
        assert e.raw.single_row() == row  # the path without pyarrow reads the same


@settings(max_examples=150, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=4))
def test_the_row_template_reads_its_rows_back(values: list[bytes]) -> None:
    """decode_row gives back the values of any row encode_row (that is, pyarrow) writes."""
    parts = ipc_value.encode_row(values)
    assert parts is not None
    body = b"".join(parts)
    assert ipc_value.decode_row(body, len(values)) == values
    assert ipc_value.decode_row(memoryview(body), len(values)) == values


def _pyarrow_row(body: bytes, k: int) -> list[bytes] | None:
    """The row pyarrow reads from ``body`` as ``k`` binary columns (None: it refuses it)."""
    schema = pa.schema([pa.field(f"c{i}", pa.binary()) for i in range(k)])
    try:
        batch = pa.ipc.read_record_batch(pa.py_buffer(body), schema)
        batch.validate(full=True)
    except (ValueError, TypeError, OSError, IndexError, pa.ArrowException):
        return None
    if batch.num_rows != 1:
        return None
    return [batch.column(i)[0].as_py() for i in range(k)]


@pytest.mark.parametrize("known", ["nothing", "head", "last"])
def test_every_single_byte_change_of_one_row_is_refused_or_read_as_pyarrow_reads_it(
    known: str,
) -> None:
    """A row that is not exactly what the template writes is refused (pyarrow decodes it
    then): whatever decode_row accepts, pyarrow reads the same. Also once the row's head was
    accepted (rows with a head seen before are checked in place, not written again), and
    once its layout is the last accepted (rows compared with it in place, no look-up)."""
    values = [b"hello, pulsar", b"device-17", b"\x00ok"]
    body = b"".join(ipc_value.encode_row(values) or [])
    ipc_value._layouts.clear()
    ipc_value._last_layouts.clear()
    if known != "nothing":
        assert ipc_value.decode_row(body, 3) == values
        assert ipc_value._layouts  # (the next ones are checked in place)
    if known == "last":
        assert ipc_value.decode_row(body, 3) == values
        assert ipc_value._last_layouts  # (the next ones are compared with it)
    for at in range(len(body)):
        for flip in (0x01, 0x80, 0xFF):
            changed = bytearray(body)
            changed[at] ^= flip
            got = ipc_value.decode_row(bytes(changed), 3)
            if got is not None:
                assert _pyarrow_row(bytes(changed), 3) == got, at
    assert ipc_value.decode_row(body[:-1], 3) is None  # cut short
    assert ipc_value.decode_row(body + bytes(8), 3) is None  # longer than it says
    assert ipc_value.decode_row(body, 2) is None  # another column count
    assert ipc_value.decode_row(b"", 3) is None


def test_a_key_that_is_not_utf8_goes_to_pyarrow() -> None:
    """single_row leaves a key column that is not UTF-8 to stored(), which reports it."""
    from filepulsar.storage.entry import EntryFormatError, EntryHeader, RawEntry

    def raw(key: bytes) -> RawEntry:
        body = b"".join(ipc_value.encode_row([b"v", key]) or [])
        header = EntryHeader(1, "p", 1, 1, 1, Codec.NONE, len(body), False)
        return RawEntry(header, COLUMN_FLAGS["key"], memoryview(body), 0, len(body))

    assert raw(b"k").single_row() == {"value": b"v", "key": "k"}
    assert raw(b"k").single_value() is None  # (keyed: not the value-only path)
    bad = raw(b"\xff")
    assert bad.single_row() is None
    with pytest.raises(EntryFormatError, match="does not decode"):
        bad.stored()


def test_a_bytearray_schema_version_still_sends(tmp_path: Path) -> None:
    """A producer's schema version set as a bytearray (typed bytes; the batch path always took
    it): a one-message entry's remembered header strings need it hashable (review of s22-gw:
    every unbatched send failed with 'unhashable type')."""
    from filepulsar.storage import Producer, create_topic
    from filepulsar.storage.blobstore import open_blob_store

    store = open_blob_store(str(tmp_path))
    create_topic(store, "sv")
    with Producer(store, "sv", batching_enabled=False) as p:
        p.schema_version = bytearray((3).to_bytes(8, "big"))
        p.send(b"x")
