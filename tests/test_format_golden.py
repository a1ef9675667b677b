"""Pins storage/FORMAT.md: golden bytes, and an independent decoder written from the document.

Regenerate (only with a deliberate format change, which must bump the version and the doc):
``FILEPULSAR_REGEN_GOLDEN=1 pytest tests/test_format_golden.py``.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import crc32c
import pyarrow as pa
import pytest

from filepulsar.storage.codec import Codec
from filepulsar.storage.entry import ChunkInfo, encode_entry, iter_entries
from filepulsar.storage.manifest import Fragment, LedgerInfo, ManifestState, ProducerLease

GOLDEN = Path(__file__).parent / "golden"
REGEN = os.environ.get("FILEPULSAR_REGEN_GOLDEN") == "1"


def _entries() -> bytes:
    plain = pa.record_batch([pa.array([b"hello", b"world", None], pa.binary())], names=["value"])
    full = pa.RecordBatch.from_arrays(
        [
            pa.array([b"a", b"bb"], pa.binary()),
            pa.array(["k1", None], pa.string()),
            pa.array([None, b"ord"], pa.binary()),
            pa.array([[("x", "1")], None], pa.map_(pa.string(), pa.string())),
            pa.array([1700000000000, None], pa.int64()),
            pa.array([7, 9], pa.int64()),
        ],
        names=["value", "key", "ordering_key", "properties", "event_time", "sequence_id"],
    )
    single = pa.record_batch([pa.array([b"delayed"], pa.binary())], names=["value"])
    return b"".join(
        [
            encode_entry(
                plain, producer_name="golden", publish_time=1700000000001, first_sequence_id=0
            ),
            encode_entry(
                full, producer_name="golden", publish_time=1700000000002, codec=Codec.ZLIB
            ),
            encode_entry(
                single,
                producer_name="golden",
                publish_time=1700000000003,
                batched=False,
                deliver_at=1700000009999,
                first_sequence_id=10,
            ),
            encode_entry(
                single,
                producer_name="golden",
                publish_time=1700000000004,
                batched=False,
                first_sequence_id=11,
                codec=Codec.LZ4,
                chunk=ChunkInfo("golden-11", 0, 1, 7),
            ),
        ]
    )


def _manifest() -> bytes:
    return ManifestState(
        topic="persistent://public/default/golden",
        partition=-1,
        version=3,
        next_ledger_id=2,
        ledgers=[
            LedgerInfo(0, 4, 7, 512, 1, 2, 1, 4, None, "ledgers/x.index"),
            LedgerInfo(1, 1, 3, 100, 5, None, 5, 5, [Fragment("s-000001", 0, 1, 0, 100, 3, 5, 5)]),
        ],
        producers={"golden": ProducerLease("golden", "s", "Shared", 0, 99)},
        dedup={"golden": 11},
        sink_batches={"q": 4},
        updated_ms=6,
        commit_id="golden-commit",
    ).encode()


@pytest.mark.parametrize(
    ("name", "make"), [("entries.bin", _entries), ("manifest.json", _manifest)]
)
def test_golden_bytes(name: str, make) -> None:
    path = GOLDEN / name
    data = make()
    if REGEN:
        path.write_bytes(data)
    assert path.read_bytes() == data, f"{name} changed: the format is pinned by FORMAT.md"


def test_independent_decoder_agrees_with_format_md() -> None:
    """Decode the golden entries following FORMAT.md's tables alone."""
    data = (GOLDEN / "entries.bin").read_bytes()
    pos = 0
    seen = []
    while pos < len(data):
        magic, version, codec, flags, hlen, plen, crc = struct.unpack_from("<4sBBHIII", data, pos)
        assert magic == b"FPLE" and version == 1
        header = data[pos + 20 : pos + 20 + hlen]
        payload = data[pos + 20 + hlen : pos + 20 + hlen + plen]
        assert crc == crc32c.crc32c(
            payload, crc32c.crc32c(header, crc32c.crc32c(data[pos : pos + 16]))
        )
        assert (pos + 20 + hlen) % 8 == 0
        pub, seq, hseq, deliver, n, usize, chunk_id, nchunks, total = struct.unpack_from(
            "<qqqqiIiiq", header
        )
        (plen_name,) = struct.unpack_from("<H", header, 56)
        producer = header[58 : 58 + plen_name].decode()
        if codec == 2:
            payload = zlib.decompress(payload)
        elif codec == 1:
            import lz4.block

            payload = lz4.block.decompress(payload, uncompressed_size=usize)
        assert len(payload) == usize
        cols = ["value"] + [
            c
            for bit, c in (
                (0x100, "key"),
                (0x200, "ordering_key"),
                (0x400, "properties"),
                (0x800, "event_time"),
                (0x1000, "sequence_id"),
            )
            if flags & bit
        ]
        reader = pa.ipc.read_message(pa.py_buffer(payload))
        assert reader.type == "record batch"
        seen.append(
            (producer, pub, seq, hseq, deliver, n, flags & 0x3, chunk_id, nchunks, total, cols)
        )
        end = pos + 20 + hlen + plen
        pos = end + (-end % 8)
    assert seen == [
        ("golden", 1700000000001, 0, 2, 0, 3, 1, -1, 0, 0, ["value"]),
        (
            "golden",
            1700000000002,
            7,
            9,
            0,
            2,
            1,
            -1,
            0,
            0,
            ["value", "key", "ordering_key", "properties", "event_time", "sequence_id"],
        ),
        ("golden", 1700000000003, 10, 10, 1700000009999, 1, 0, -1, 0, 0, ["value"]),
        ("golden", 1700000000004, 11, 11, 0, 1, 2, 0, 1, 7, ["value"]),
    ]


def test_golden_entries_read_back() -> None:
    data = (GOLDEN / "entries.bin").read_bytes()
    entries = list(iter_entries(data, 4))
    assert entries[0].messages().column("value").to_pylist() == [b"hello", b"world", None]
    assert entries[0].messages().column("sequence_id").to_pylist() == [0, 1, 2]
    full = entries[1].messages().to_pylist()
    assert full[0]["properties"] == [("x", "1")] and full[1]["ordering_key"] == b"ord"
    assert entries[2].header.deliver_at == 1700000009999 and not entries[2].header.batched
    assert entries[3].header.chunk == ChunkInfo("golden-11", 0, 1, 7)


def test_golden_manifest_reads_back() -> None:
    raw = (GOLDEN / "manifest.json").read_bytes()
    state = ManifestState.decode(raw, "golden")
    assert state.encode() == raw
    assert state.ledgers[1].fragments == [Fragment("s-000001", 0, 1, 0, 100, 3, 5, 5)]
