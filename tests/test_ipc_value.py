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
from filepulsar.storage.entry import ChunkInfo, stored_schema
from filepulsar.storage.entry_encode import encode_entry_parts, encode_value_entry_parts
from filepulsar.storage.producer_messages import _binary_array

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


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.LZ4, Codec.ZSTD, Codec.ZLIB])
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("chunk", [None, ChunkInfo("p-7", 1, 3, 300)])
@pytest.mark.parametrize("value", [b"", b"v", b"x" * 1000])
def test_value_entries_equal_the_record_batch_path(
    codec: Codec, batched: bool, chunk: ChunkInfo | None, value: bytes
) -> None:
    kw = dict(
        producer_name="p",
        publish_time=1_700_000_000_000,
        codec=codec,
        batched=batched,
        deliver_at=12,
        chunk=chunk,
        schema_version=(9).to_bytes(8, "big"),
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
