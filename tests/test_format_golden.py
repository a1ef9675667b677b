"""Pins storage/FORMAT.md: golden bytes, and an independent decoder written from the document.

Regenerate (only with a deliberate format change, which must bump the version and the doc):
``FILEPULSAR_REGEN_GOLDEN=1 pytest tests/test_format_golden.py``.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

import crc32c
import pyarrow as pa
import pytest

from filepulsar.dispatch.modes import ConsumerType, ProducerAccessMode
from filepulsar.storage import jsontext, paths
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.catalog import Catalog, SegmentRef, encode_segment
from filepulsar.storage.codec import Codec
from filepulsar.storage.cursor import ConsumerInfo, SubscriptionState
from filepulsar.storage.entry import ChunkInfo, iter_entries
from filepulsar.storage.entry_encode import encode_entry
from filepulsar.storage.errors import CorruptDataError
from filepulsar.storage.fragments import Fragment
from filepulsar.storage.ledger import decode_index, encode_index
from filepulsar.storage.manifest import LedgerInfo, ManifestState, ProducerLease
from filepulsar.storage.names import TopicName
from filepulsar.storage.versioned import journal, record

pytestmark = pytest.mark.golden

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


_GOLDEN_TOPIC = "persistent://public/default/golden"
_CLOSED = LedgerInfo(0, 4, 7, 512, 1, 2, 1, 4, None, "ledgers/x.index")
_SEGMENT = SegmentRef(0, 0, 1, "0123456789abcdef")


def _manifest_state() -> ManifestState:
    return ManifestState(
        topic=_GOLDEN_TOPIC,
        partition=-1,
        version=3,
        next_ledger_id=2,
        ledgers=[
            _CLOSED,
            LedgerInfo(1, 1, 3, 100, 5, None, 5, 5, [Fragment("s-000001", 0, 1, 0, 100, 3, 5, 5)]),
        ],
        producers={"golden": ProducerLease("golden", "s", ProducerAccessMode.Shared, 0, 99)},
        dedup={"golden": 11},
        dedup_used={"golden": 5},
        sink_batches={"q": 4},
        sink_used={"q": 6},
        updated_ms=6,
        commit_id="golden-commit",
        catalog_refs=[_SEGMENT],
    )


def _manifest() -> bytes:
    return _manifest_state().encode()


def _manifest_created_state() -> ManifestState:
    state = _manifest_state()
    state.incarnation = "9b1e"
    state.created_ms = 2
    return state


def _manifest_created() -> bytes:
    return _manifest_created_state().encode()


def _segment() -> bytes:
    return encode_segment([_CLOSED], _GOLDEN_TOPIC, -1)


_INDEX_FRAGMENTS = [
    Fragment("s-000001", 0, 3, 0, 768, 5, 1, 3),
    Fragment("s-000002", 3, 1, 0, 256, 1, 4, 4),
]
_INDEX_KEY = "ledgers/00000000000000000000-00000000000000000005-0123456789abcdef.index"


def _index() -> bytes:
    return encode_index(0, _INDEX_FRAGMENTS)


def _subscription() -> SubscriptionState:
    return SubscriptionState(
        topic="persistent://public/default/golden",
        name="billing",
        sub_type=ConsumerType.KeyShared,
        version=7,
        updated_ms=1700000000100,
        commit_id="golden-sub-commit",
        created_ms=1700000000000,
        last_active_ms=1700000000090,
        mark_delete=(0, 3),
        acked=[[0, 5, 0, 6]],
        batch_acks={"0:4": [0, 2]},
        consumers={
            "c1": ConsumerInfo("c1", "worker", 0, 1700000030000, 1, "worker\x000", 30000, 42),
            "c2": ConsumerInfo("c2", "spare", 1, 1700000031000, 2, "c2", 5000, 3),
        },
        join_seq=2,
        pending={"1:0": ["c1", 0, 6067]},
        redeliver={"0:4": [1, 1700000001000, 812]},
        dispatched=(1, 0),
        properties={"region": "eu"},
    )


def _subscription_state() -> bytes:
    return _subscription().encode()


def _journal_segment() -> bytes:
    first = jsontext.encode_framed({"items": ["a"], "version": 7})
    second = jsontext.encode_framed({"items": ["a", "b"], "version": 8})
    return record.encode_record(7, first, (), marked=True) + record.encode_record(
        8,
        second,
        [("topics/persistent/public/default/t/data/s-000001.entries", 120)],
        marked=True,
    )


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("journal.segment", _journal_segment),
        ("entries.bin", _entries),
        ("manifest.json", _manifest),
        ("manifest-created.json", _manifest_created),
        ("catalog.segment", _segment),
        ("ledger.index", _index),
        ("subscription.json", _subscription_state),
    ],
)
def test_golden_bytes(name: str, make) -> None:
    path = GOLDEN / name
    data = make()
    if REGEN:
        path.write_bytes(data)
    assert path.read_bytes() == data, f"{name} changed: the format is pinned by FORMAT.md"


def test_journal_decoder_from_format_md_agrees(tmp_path: Path) -> None:
    """Decode the golden journal segment following FORMAT.md's table alone, and read it as a
    folder's journal: both give versions 7 and 8 with their payloads."""
    data = (GOLDEN / "journal.segment").read_bytes()
    pos, seen = 0, []
    while pos < len(data):
        magic, version, dlen, plen, crc = struct.unpack_from("<4sQIII", data, pos)
        assert magic == b"FPJ3"
        deps = data[pos + 24 : pos + 24 + dlen]
        payload = data[pos + 24 + dlen : pos + 24 + dlen + plen]
        assert crc == crc32c.crc32c(
            payload, crc32c.crc32c(deps, crc32c.crc32c(data[pos + 4 : pos + 20]))
        )
        assert data[pos + 24 + dlen + plen] == 0xA5
        seen.append((version, json.loads(deps) if deps else [], payload))
        pos += 24 + dlen + plen + 1
    assert [(v, d) for v, d, _ in seen] == [
        (7, []),
        (8, [["topics/persistent/public/default/t/data/s-000001.entries", 120]]),
    ]
    folder = tmp_path / "state"
    folder.mkdir()
    (folder / paths.journal_segment(7)).write_bytes(data + bytes(4096))
    recs = list(journal.Journal(str(folder), lambda k: None, "golden").records())
    assert [(r.version, r.payload) for r in recs] == [(v, p) for v, _, p in seen]


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


def test_golden_manifest_reads_back_and_follows_format_md() -> None:
    raw = (GOLDEN / "manifest.json").read_bytes()
    body, check = raw.rstrip(b"\n").split(b"\n")
    assert check == b"crc32c=%08x" % crc32c.crc32c(body)
    d = json.loads(body)
    assert d["format"] == 2 and d["catalog"] == [_SEGMENT.to_json()]
    assert [lg["id"] for lg in d["ledgers"]] == [1]  # only the open ledger is in the head
    assert d["dedup"] == {"golden": [11, 5]} and d["sinkBatches"] == {"q": [4, 6]}
    seg_body = (GOLDEN / "catalog.segment").read_bytes().rstrip(b"\n").split(b"\n")[0]
    assert json.loads(seg_body)["ledgers"][0]["index"] == "ledgers/x.index"
    store = open_blob_store("memory://golden-catalog")
    topic = TopicName.parse(_GOLDEN_TOPIC)
    store.put(f"topics/persistent/public/default/golden/{_SEGMENT.name}", _segment())
    state = ManifestState.decode(raw, "golden", Catalog(store, topic))
    assert state == _manifest_state()
    assert state.encode() == raw  # intact segment: carried over by name, nothing written
    assert len(store.list("topics/persistent/public/default/golden/catalog")) == 1


def test_golden_manifest_with_creation_time_reads_back() -> None:
    """The optional ``created`` (the topic's creation time, PIP-431's
    ``topicCreationTimeStamp``) is read and written back; ``manifest.json``, written before it
    existed, reads as None and is written back without it (older code reads both)."""
    store = open_blob_store("memory://golden-created")
    store.put(f"topics/persistent/public/default/golden/{_SEGMENT.name}", _segment())
    catalog = Catalog(store, TopicName.parse(_GOLDEN_TOPIC))
    raw = (GOLDEN / "manifest-created.json").read_bytes()
    d = json.loads(raw.split(b"\n")[0])
    assert d["created"] == 2 and d["incarnation"] == "9b1e" and d["updated"] == 6
    state = ManifestState.decode(raw, "golden-created", catalog)
    assert state.created_ms == 2 and state == _manifest_created_state()
    assert state.copy().encode() == raw  # every later version carries it
    old_raw = (GOLDEN / "manifest.json").read_bytes()
    assert "created" not in json.loads(old_raw.split(b"\n")[0])
    old = ManifestState.decode(old_raw, "golden", catalog)
    assert old.created_ms is None and old.copy().encode() == old_raw


def test_golden_manifest_v1_still_reads() -> None:
    """Format 1 (every ledger in the head, dedup as name -> sequence id) is still read."""
    raw = (GOLDEN / "manifest-v1.json").read_bytes()
    assert json.loads(raw.split(b"\n")[0])["format"] == 1
    state = ManifestState.decode(raw, "golden-v1")
    assert [lg.ledger_id for lg in state.ledgers] == [0, 1]
    assert state.ledgers[0].index == "ledgers/x.index"
    assert state.ledgers[1].fragments == [Fragment("s-000001", 0, 1, 0, 100, 3, 5, 5)]
    assert state.dedup == {"golden": 11} and state.dedup_used == {"golden": 6}
    assert state.sink_batches == {"q": 4}


def test_golden_subscription_state_reads_back_and_follows_format_md() -> None:
    raw = (GOLDEN / "subscription.json").read_bytes()
    body, check = raw.rstrip(b"\n").split(b"\n")
    assert check == b"crc32c=%08x" % crc32c.crc32c(body)
    assert json.loads(body)["markDelete"] == [0, 3]
    state = SubscriptionState.decode(raw, "golden")
    assert state == _subscription()
    assert state.encode() == raw


def test_golden_subscription_state_before_renewal_counts_still_reads() -> None:
    """Consumer entries written before leases counted renewals (four or five items): read as
    lease 0 (the watch assumes the default), their expiry telling renewals apart."""
    raw = (GOLDEN / "subscription-before-renewals.json").read_bytes()
    state = SubscriptionState.decode(raw, "golden-before-renewals")
    c1 = state.consumers["c1"]
    assert (c1.sel_id, c1.lease_ms, c1.renewals) == ("worker\x000", 0, 0)
    assert c1.renewal() == (1, 0, 1700000030000)
    assert state.encode() == raw  # written back as it was (older code reads it alike)


def test_golden_index_reads_back_and_follows_format_md() -> None:
    raw = (GOLDEN / "ledger.index").read_bytes()
    body, check = raw.rstrip(b"\n").split(b"\n")
    assert check == b"crc32c=%08x" % crc32c.crc32c(body)
    assert body.startswith(b'{"ledger":0,"fragments":[["s-000001",0,3,0,768,5,1,3],')
    assert decode_index(raw, 0, _INDEX_KEY) == _INDEX_FRAGMENTS


def test_legacy_unframed_index_still_reads() -> None:
    body = b'{"ledger":0,"fragments":[["s-000001",0,3,0,768,5,1,3]]}'
    legacy_key = "ledgers/00000000000000000000-00000000000000000005.index"
    assert decode_index(body, 0, legacy_key) == _INDEX_FRAGMENTS[:1]
    with pytest.raises(CorruptDataError, match="no checksum line"):
        decode_index(body, 0, _INDEX_KEY)  # a name with a nonce must be framed
    with pytest.raises(CorruptDataError, match="another ledger"):
        decode_index(body, 1, legacy_key)
