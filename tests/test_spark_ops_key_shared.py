"""key_shared_assign as a streaming operator: AvailableNow runs and restarts from a checkpoint.

Expected owners come from the plain selectors (dispatch.selectors) driven through the same
membership history with ``apply_consumers``, one selector per topic partition.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from filepulsar.dispatch.hashing import sticky_key
from filepulsar.dispatch.selectors.auto_split import AutoSplitHashRangeSelector
from filepulsar.dispatch.selectors.base import StickyKeyConsumerSelector
from filepulsar.dispatch.selectors.consistent import ConsistentHashingSelector
from filepulsar.dispatch.selectors.sticky import StickyHashRangeSelector
from filepulsar.dispatch.spark import apply_consumers, key_shared_assign
from tests.test_spark_ops_support import flat, message, run_available_now, source, write_messages

pytestmark = pytest.mark.spark

SELECTORS: dict[str, type[StickyKeyConsumerSelector]] = {
    "AUTO_SPLIT": AutoSplitHashRangeSelector,
    "CONSISTENT_HASHING": ConsistentHashingSelector,
    "STICKY": StickyHashRangeSelector,
}
#: The model labels above as key_shared_assign's arguments: AUTO_SPLIT means one thing (the
#: subscription's mode); use_consistent_hashing picks its selector, as on a subscription.
MODE_ARGS: dict[str, dict[str, Any]] = {
    "AUTO_SPLIT": {"mode": "AUTO_SPLIT", "use_consistent_hashing": False},
    "CONSISTENT_HASHING": {"mode": "AUTO_SPLIT"},
    "STICKY": {"mode": "STICKY"},
}
STICKY_RANGES = {"c1": [(0, 20000)], "c2": [(20001, 40000)], "c3": [(50000, 65535)]}


def keyed_messages(start: int, count: int) -> list[dict[str, Any]]:
    """Messages over two partitions: keys, ordering keys (which win) and keyless ones."""
    rows = []
    for i in range(start, start + count):
        fields: dict[str, Any] = {"partition": i % 2, "entryId": i}
        if i % 7 == 0:
            fields["orderingKey"] = f"ok-{i % 5}".encode()
            fields["key"] = f"ignored-{i}"
        elif i % 11 != 0:
            fields["key"] = f"key-{i % 37}"
        rows.append(message(i, **fields))
    return rows


class Model:
    """Reference: one plain selector per partition, advanced run by run."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.selectors: dict[int, Any] = {}

    def run(self, consumers: list[str], partitions: set[int], sticky=None) -> None:
        for p in partitions:
            selector = self.selectors.setdefault(p, SELECTORS[self.mode]())
            apply_consumers(selector, consumers, sticky_ranges=sticky)

    def owner(self, row: Any) -> str | None:
        return self.selectors[row.partition].select(sticky_key(row.orderingKey, row.key))


def assign_run(spark, folder: Path, checkpoint: Path, consumers, **options) -> list[Any]:
    df = key_shared_assign(source(spark, folder, files_per_batch=1), consumers, **options)
    return flat(run_available_now(df, checkpoint))


@pytest.mark.parametrize("mode", ["AUTO_SPLIT", "CONSISTENT_HASHING", "STICKY"])
def test_assignment_matches_the_selector_across_batches_and_restarts(spark, tmp_path, mode):
    folder, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    consumers = ["c1", "c2", "c3"]
    sticky = STICKY_RANGES if mode == "STICKY" else None
    write_messages(folder, keyed_messages(0, 40))
    write_messages(folder, keyed_messages(40, 40))
    model = Model(mode)
    model.run(consumers, {0, 1}, sticky)

    first = assign_run(
        spark, folder, checkpoint, consumers, **MODE_ARGS[mode], sticky_ranges=sticky
    )
    write_messages(folder, keyed_messages(80, 40))
    second = assign_run(
        spark, folder, checkpoint, consumers, **MODE_ARGS[mode], sticky_ranges=sticky
    )

    assert sorted(r.entryId for r in first) == list(range(80))
    assert sorted(r.entryId for r in second) == list(range(80, 120))
    for row in first + second:
        assert row.consumer == model.owner(row), row
    owners = {r.consumer for r in first + second}
    assert owners >= {"c1", "c2", "c3"}
    if mode == "STICKY":
        assert None in owners  # slots outside every range wait: no consumer
    # Every input column comes through unchanged.
    assert {r.value for r in second} == {f"payload-{i}".encode() for i in range(80, 120)}


@pytest.mark.parametrize("mode", ["AUTO_SPLIT", "CONSISTENT_HASHING"])
def test_membership_changes_move_only_what_pulsar_moves(spark, tmp_path, mode):
    folder, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    model = Model(mode)
    runs = [["c1", "c2", "c3", "c4"], ["c1", "c2", "c4"], ["c1", "c2", "c4", "c5"]]
    owner_by_key: list[dict[tuple[int, bytes], str]] = []
    for n, consumers in enumerate(runs):
        # The same keys every run, so ownership can be compared run to run.
        rows = [message(n * 1000 + i, key=f"key-{i}", partition=i % 2) for i in range(300)]
        write_messages(folder, rows)
        model.run(consumers, {0, 1})
        out = assign_run(spark, folder, checkpoint, consumers, **MODE_ARGS[mode])
        assert len(out) == 300
        for row in out:
            assert row.consumer == model.owner(row), (n, row)
        owner_by_key.append({(r.partition, r.key.encode()): r.consumer for r in out})

    removed = {k for k, c in owner_by_key[0].items() if c != owner_by_key[1][k]}
    assert removed and {owner_by_key[0][k] for k in removed} == {"c3"}
    added = {k for k, c in owner_by_key[1].items() if c != owner_by_key[2][k]}
    assert added and {owner_by_key[2][k] for k in added} == {"c5"}
    if mode == "AUTO_SPLIT":
        # c5 split one consumer's range: all its keys came from a single owner per partition.
        for partition in (0, 1):
            donors = {owner_by_key[1][k] for k in added if k[0] == partition}
            assert len(donors) <= 1


def test_options_are_checked_on_the_driver(spark, tmp_path):
    write_messages(tmp_path / "in", keyed_messages(0, 2))
    df = source(spark, tmp_path / "in")
    with pytest.raises(
        ValueError, match="mode 'ROUND_ROBIN' is not allowed: use one of AUTO_SPLIT"
    ):
        key_shared_assign(df, ["a"], mode="ROUND_ROBIN")
    with pytest.raises(ValueError, match="is mode='AUTO_SPLIT'"):
        key_shared_assign(df, ["a"], mode="CONSISTENT_HASHING")
    with pytest.raises(ValueError, match="sticky_ranges"):
        key_shared_assign(df, ["a"], mode="STICKY")
    with pytest.raises(ValueError, match="overlap"):
        key_shared_assign(
            df, ["a", "b"], mode="STICKY", sticky_ranges={"a": [(0, 10)], "b": [(10, 20)]}
        )
    with pytest.raises(ValueError, match="unique"):
        key_shared_assign(df, ["a", "a"], mode="AUTO_SPLIT", use_consistent_hashing=False)
    with pytest.raises(TypeError):
        key_shared_assign(df, "abc")
    with pytest.raises(ValueError, match="lacks"):
        key_shared_assign(df.drop("partition"), ["a"])
