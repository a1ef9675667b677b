"""The entry cutter's own rules (storage/batcher.py) and the bulk routing it is paired with."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from filepulsar.dispatch.routing import RoundRobinPartitionRouter, keyless_runs, route_rows
from filepulsar.storage import MessageTooBig
from filepulsar.storage.batcher import BatchPolicy, check_size, cut, message_size, too_big
from filepulsar.storage.codec import Codec
from filepulsar.storage.errors import InvalidConfiguration

pytestmark = pytest.mark.unit

_PROPS = pa.map_(pa.field("key", pa.string(), nullable=False), pa.string())


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.ZSTD])
def test_too_big_is_message_size_above_the_limit(codec: Codec) -> None:
    values = [b"a" * 50, bytes(range(60)), b"b" * 10, b"c"]
    keys = [None, "k", "kk" * 20, None]
    props = [None, [("p", "v")], None, [("n", "x" * 70)]]
    table = pa.table(
        {"value": values, "key": pa.array(keys, pa.string()), "properties": pa.array(props, _PROPS)}
    )
    policy = BatchPolicy(max_message_size=60, codec=codec)
    sizes = [
        message_size(v, codec, key=k, properties=dict(p) if p else None)
        for v, k, p in zip(values, keys, props)
    ]
    mask = too_big(table, policy)
    assert (mask if mask is not None else np.zeros(4, bool)).tolist() == [s > 60 for s in sizes]


def test_too_big_names_the_row_and_chunks_leave_room_for_metadata() -> None:
    table = pa.table({"value": [b"ok", bytes(300)], "key": ["a", "kkkk"]})
    with pytest.raises(MessageTooBig, match=r"row 1 has a value of 300 bytes plus 4 bytes"):
        check_size(table, BatchPolicy(max_message_size=100), where="w")
    policy = BatchPolicy(max_message_size=100, batching=False, chunking=True)
    big = check_size(table, policy, where="w")
    specs = cut(table, policy, big=big, seq_base=10)
    chunks = [s for s in specs if s.chunk is not None]
    # 96 bytes of value per chunk: the key's 4 bytes travel with every chunk.
    assert [len(s.batch.column(0)[0].as_py()) for s in chunks] == [96, 96, 96, 12]
    assert [s.highest_sequence_id for s in chunks] == [-1, -1, -1, 11]
    assert [len(s.rows) for s in specs] == [1, 0, 0, 0, 1]


def test_batch_policy_refuses_bad_limits() -> None:
    with pytest.raises(InvalidConfiguration, match="max_messages must be a positive integer"):
        BatchPolicy(max_message_size=10, max_messages=0)
    with pytest.raises(InvalidConfiguration, match="use one of Default, KeyBased"):
        BatchPolicy(max_message_size=10, batching_type="Time")


def test_keyless_runs_and_bulk_round_robin() -> None:
    assert keyless_runs(7, 3, start=2, step=2).tolist() == [2, 2, 0, 0, 1, 1, 2]
    assert keyless_runs(3, 3, start=2, offset=3, step=2).tolist() == [0, 1, 1]
    rr = RoundRobinPartitionRouter(3, start=1, batching_enabled=False)
    assert rr.keyless_partitions(4, batch_size=100).tolist() == [1, 2, 0, 1]
    assert rr.choose_partition(None) == 2  # the counter moved past the bulk messages
    timed = RoundRobinPartitionRouter(3, start=0, batching_enabled=True, clock=lambda: 10)
    assert timed.keyless_partitions(5, batch_size=2).tolist() == [1, 1, 2, 2, 0]
    keys = pa.array(["a", None, None], pa.string())
    parts = route_rows(keys, 3, 4, "JavaStringHash", lambda c: np.full(c, 9, np.int64))
    assert parts.tolist()[1:] == [9, 9] and 0 <= parts[0] < 4
