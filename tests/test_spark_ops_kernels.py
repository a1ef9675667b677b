"""The plain kernels behind filepulsar.dispatch.spark, checked against the reference rules
(no Spark).

* ``dedup_keep_mask`` against :class:`filepulsar.dispatch.dedup.DedupTracker`, message by message;
* ``apply_consumers``: membership changes move only what Pulsar's selectors move;
* the Arrow block helpers round-trip every source column exactly.
"""

from __future__ import annotations

import io
import pickle
import sys
import types

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filepulsar.connector.schema import SOURCE_ARROW_SCHEMA
from filepulsar.dispatch.dedup import DedupStatus, DedupTracker
from filepulsar.dispatch.selectors.auto_split import AutoSplitHashRangeSelector
from filepulsar.dispatch.selectors.base import ConsumerAssignError
from filepulsar.dispatch.selectors.consistent import ConsistentHashingSelector
from filepulsar.dispatch.selectors.sticky import StickyHashRangeSelector
from filepulsar.dispatch.spark import apply_consumers, dedup_keep_mask
from filepulsar.dispatch.spark.blocks import (
    BLOCK_COLUMN,
    BLOCK_ONLY_SCHEMA,
    BLOCK_ROWS,
    DRIVER_WORKER_MODULE,
    DRIVER_WORKER_STATUS,
    BlockProcessor,
    block_bytes,
    blocks_frames,
    explode_blocks,
    read_block,
    split_into_blocks,
)
from tests.test_spark_ops_support import message

pytestmark = pytest.mark.property

SLOTS = np.arange(1, 65536, dtype=np.int64)


def reference_keep(sequence_ids: list[int], highest: int | None) -> list[bool]:
    tracker = DedupTracker()
    if highest is not None:
        tracker.replay_entry("p", highest)
    keep = []
    for seq in sequence_ids:
        status = tracker.check("p", seq)
        assert status is not DedupStatus.UNKNOWN
        if status is DedupStatus.NOT_DUP:
            tracker.record_persisted("p", seq)
        keep.append(status is DedupStatus.NOT_DUP)
    return keep


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(min_value=-3, max_value=40), max_size=60),
    st.one_of(st.none(), st.integers(min_value=0, max_value=40)),
)
def test_dedup_keep_mask_matches_dedup_tracker(sequence_ids: list[int], highest: int | None):
    """Negative ids (no producer-assigned id) included: both keep them and neither counts
    them in the highest."""
    keep, new_highest = dedup_keep_mask(np.array(sequence_ids, dtype=np.int64), highest)
    assert keep.tolist() == reference_keep(sequence_ids, highest)
    assigned = [s for s in sequence_ids if s >= 0]
    expected = max([*assigned, *([] if highest is None else [highest])], default=None)
    assert new_highest == expected


def test_dedup_keep_mask_passes_ids_the_producer_did_not_assign():
    keep, highest = dedup_keep_mask([-1, -1, -1], None)
    assert keep.tolist() == [True, True, True] and highest is None
    keep, highest = dedup_keep_mask([-1, 3, -1, 3, -1, 2, 4], 1)
    assert keep.tolist() == [True, True, True, False, True, False, True]
    assert highest == 4


def test_dedup_keep_mask_drops_out_of_order_lower_ids():
    keep, highest = dedup_keep_mask([0, 1, 1, 3, 2, 5], None)
    assert keep.tolist() == [True, True, False, True, False, True]
    assert highest == 5
    keep, highest = dedup_keep_mask([4, 5, 6], 5)
    assert keep.tolist() == [False, False, True]
    assert highest == 6


def owners(selector) -> np.ndarray:
    return selector.select_slots(SLOTS, as_names=True)


def test_auto_split_removing_a_consumer_moves_only_its_slots():
    selector = AutoSplitHashRangeSelector()
    assert apply_consumers(selector, ["c1", "c2", "c3", "c4"])
    before = owners(selector)
    assert apply_consumers(selector, ["c1", "c2", "c4"])
    after = owners(selector)
    moved = before != after
    assert moved.any()
    assert set(before[moved]) == {"c3"}
    assert "c3" not in set(after)


def test_auto_split_adding_a_consumer_takes_half_of_the_biggest_range():
    selector = AutoSplitHashRangeSelector()
    apply_consumers(selector, ["c1", "c2", "c3"])
    before = owners(selector)
    assert apply_consumers(selector, ["c1", "c2", "c3", "c4"])
    after = owners(selector)
    moved = before != after
    # Only the split range changes hands, and only to the newcomer.
    assert set(after[moved]) == {"c4"}
    # c1 held the biggest range, (32768, 65536]; the newcomer takes its lower half.
    assert set(before[moved]) == {"c1"}
    assert SLOTS[moved].tolist() == list(range(32769, 49153))


def test_apply_consumers_is_a_no_op_for_the_same_list():
    selector = AutoSplitHashRangeSelector()
    apply_consumers(selector, ["a", "b"])
    state = selector.to_dict()
    assert not apply_consumers(selector, ["a", "b"])
    assert selector.to_dict() == state


def test_consistent_hashing_leave_and_join_move_only_that_consumers_points():
    selector = ConsistentHashingSelector()
    apply_consumers(selector, ["c1", "c2", "c3"])
    before = owners(selector)
    apply_consumers(selector, ["c1", "c3"])
    after = owners(selector)
    moved = before != after
    assert set(before[moved]) == {"c2"}
    apply_consumers(selector, ["c1", "c3", "c4"])
    joined = owners(selector)
    moved = after != joined
    assert set(joined[moved]) == {"c4"}


def test_consistent_hashing_counts_same_named_consumers():
    selector = ConsistentHashingSelector()
    apply_consumers(selector, ["w", "w", "x"])
    assert sorted(selector.instances()) == [("w", 0), ("w", 1), ("x", 0)]
    apply_consumers(selector, ["w", "x"])
    assert sorted(selector.instances()) == [("w", 0), ("x", 0)]


def test_sticky_ranges_change_and_uncovered_slots_have_no_owner():
    selector = StickyHashRangeSelector()
    apply_consumers(selector, ["a", "b"], sticky_ranges={"a": [(0, 999)], "b": [(1000, 1999)]})
    assert selector.select_slot(500) == "a"
    assert selector.select_slot(5000) is None
    apply_consumers(selector, ["a", "b"], sticky_ranges={"a": [(0, 999)], "b": [(2000, 2999)]})
    assert selector.select_slot(1500) is None
    assert selector.select_slot(2500) == "b"
    with pytest.raises(ConsumerAssignError):
        apply_consumers(selector, ["a", "b"], sticky_ranges={"a": [(0, 10)], "b": [(5, 20)]})


def test_auto_split_rejects_duplicate_names():
    with pytest.raises(ConsumerAssignError):
        apply_consumers(AutoSplitHashRangeSelector(), ["a", "a"])


def test_blocks_round_trip_every_source_column():
    rows = [
        message(0, key="k", properties={"a": "1"}, eventTime=5, deliverAt=7),
        message(1, orderingKey=b"", value=b"\x00\xff", key="𝄞 ключ", partition=1),
        message(2, value=None, properties={}, producerName="other"),
        message(3, partition=1),
    ]
    table = pa.Table.from_pylist(rows, schema=SOURCE_ARROW_SCHEMA)
    groups = pa.array([f"g{r['partition']}" for r in rows], pa.string())
    batch = pa.RecordBatch.from_arrays(
        [groups, *table.combine_chunks().to_batches()[0].columns],
        schema=SOURCE_ARROW_SCHEMA.insert(0, pa.field("pulsar_group", pa.string())),
    )
    blocks = list(split_into_blocks(iter([batch])))
    assert [b.column(0).to_pylist() for b in blocks] == [["g0", "g1"]]
    back = pa.Table.from_batches(list(explode_blocks(iter(b.select([1]) for b in blocks))))
    assert back.schema == SOURCE_ARROW_SCHEMA
    by_entry = sorted(back.to_pylist(), key=lambda r: r["entryId"])
    assert by_entry == table.to_pylist()


def test_a_processors_output_blocks_reach_pyspark_without_a_copy():
    """``blocks_frames`` cuts its tables into blocks of at most BLOCK_ROWS, in order, and its
    column is the Arrow array PySpark's conversion of a processor's output sends on: the
    blocks' bytes are not copied again on their way to the JVM."""
    from pyspark.sql.conversion import PandasToArrowConversion
    from pyspark.sql.types import StructField, StructType

    n = np.arange(BLOCK_ROWS + 5, dtype=np.int64)
    big = pa.table({"n": n, "topic": pa.array(["persistent://public/default/t"] * len(n))})
    small = pa.table({"n": [-1, -2], "topic": ["u", "v"]})
    (frame,) = blocks_frames(big, small.slice(0, 0), small)
    # What PySpark's transformWithStateInPandas worker does with a processor's output.
    converted = PandasToArrowConversion.convert(
        [frame],
        StructType([StructField("_0", BLOCK_ONLY_SCHEMA)]),
        timezone="UTC",
        safecheck=True,
        arrow_cast=True,
    )
    sent = converted.column(0).field(BLOCK_COLUMN)
    tables = [read_block(sent[i].as_buffer()) for i in range(len(sent))]
    assert [t.num_rows for t in tables] == [BLOCK_ROWS, 5, 2]
    assert pa.concat_tables(tables).column("n").to_pylist() == [*range(BLOCK_ROWS + 5), -1, -2]
    backing = pa.array(frame[BLOCK_COLUMN].array)
    assert sent.buffers()[2].address == backing.buffers()[2].address
    # LZ4-compressed on their way: the first block is a fraction of its table's bytes.
    assert len(sent[0].as_buffer()) < len(block_bytes(big.slice(0, BLOCK_ROWS))) / 2
    assert list(blocks_frames(small.slice(0, 0))) == []


def test_a_processors_output_over_one_arrays_bytes_goes_out_in_several_frames(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What one call outputs is not bounded by a micro-batch (``delay_until_due`` releases
    at once what came due together, held over many triggers): blocks beyond what one binary
    array holds (2 GiB; a few blocks' worth here) start another frame, every block once, in
    order. Before, the one frame raised ArrowInvalid telling to lower maxMessagesPerTrigger,
    which bounds no release. One block over the bound raises, saying so."""
    import filepulsar.dispatch.spark.blocks as blocks_module

    n = np.arange(10 * BLOCK_ROWS + 3, dtype=np.int64)
    table = pa.table({"n": n, "payload": pa.array([b"%d" % i * 3 for i in n])})
    one = len(block_bytes(table.slice(0, BLOCK_ROWS), compression="lz4"))
    monkeypatch.setattr(blocks_module, "_MAX_BINARY_BYTES", 3 * one + one // 2)
    frames = list(blocks_frames(table))
    assert len(frames) >= 3
    got = [
        read_block(pa.array(f[BLOCK_COLUMN].array)[i].as_buffer())
        for f in frames
        for i in range(len(f))
    ]
    assert [t.num_rows for t in got] == [BLOCK_ROWS] * 10 + [3]
    assert pa.concat_tables(got).column("n").to_pylist() == n.tolist()
    monkeypatch.setattr(blocks_module, "_MAX_BINARY_BYTES", one // 2)
    with pytest.raises(pa.ArrowInvalid, match="cannot pass through a stateful operator"):
        list(blocks_frames(table))


class _Empty(BlockProcessor):
    """A processor whose instances hold nothing (an empty ``__dict__``)."""

    def init(self, handle: object) -> None:
        pass

    def handleInputRows(self, key: object, rows: object, timerValues: object) -> object:
        return iter(())


class _Holding(_Empty):
    """A processor whose instances hold something."""

    def __init__(self) -> None:
        self.tick_ms = 1000


@pytest.mark.parametrize("kind", [_Holding, _Empty])
def test_a_processor_unpickled_in_the_driver_worker_drops_its_status_lines(
    kind: type[BlockProcessor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In PySpark's driver-side worker, unpickling any processor (its instance holding
    something or not: pickle skips ``__setstate__`` for an empty ``__dict__``) drops the
    worker's status lines from its stdout; what else is printed passes."""
    monkeypatch.setattr(
        sys.modules["__main__"], "__spec__", types.SimpleNamespace(name=DRIVER_WORKER_MODULE)
    )
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    processor = kind()
    again = pickle.loads(pickle.dumps(processor))
    assert type(again) is kind and again.__dict__ == processor.__dict__
    print(f"{DRIVER_WORKER_STATUS} init", flush=True)
    print("other", flush=True)
    assert out.getvalue() == "other\n"
