"""delay_until_due as a streaming operator: held state, timers, restarts, tick vs strict.

``deliverAt`` values are placed far from the run's processing time (a day ahead, ten minutes,
the past), so what is held or released does not depend on how fast the machine is. One test
lets real time pass to see a timer fire after a restart; it synchronises on query ends, never
on sleeps, and checks that nothing is emitted before it is due.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from filepulsar.dispatch.spark import NO_DATA_BATCHES_CONF, delay_until_due
from filepulsar.dispatch.spark.blocks import read_block
from tests.test_spark_ops_support import (
    flat,
    message,
    no_data_batches_off,
    relocated,
    run_available_now,
    source,
    write_messages,
)

pytestmark = pytest.mark.spark

DAY_US = 86_400_000_000


def now_us() -> int:
    return time.time_ns() // 1000


def delayed_run(spark, folder: Path, checkpoint: Path, **options: Any) -> list[Any]:
    with no_data_batches_off(spark):
        df = delay_until_due(source(spark, folder, files_per_batch=1), **options)
        return flat(run_available_now(df, checkpoint))


def held_state(spark, checkpoint: Path) -> tuple[list[int], list[int]]:
    """Entry ids held in the operator's state, and its registered timers."""
    held = spark.read.format("statestore").option("stateVarName", "chunks").load(str(checkpoint))
    entries = []
    for row in held.collect():
        entries += read_block(row.user_map_value.rows).column("entryId").to_pylist()
    timers = (
        spark.read.format("statestore")
        .option("readRegisteredTimers", "true")
        .load(str(checkpoint))
        .collect()
    )
    return sorted(entries), sorted(t.expiration_timestamp_ms for t in timers)


def test_holds_future_messages_across_restarts_and_passes_the_rest(spark, tmp_path):
    folder, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    now = now_us()
    far = now + DAY_US
    first = [
        message(0),  # no deliverAt
        message(1, deliverAt=now - 60_000_000),  # due a minute ago
        message(2, deliverAt=far, partition=1),
        message(3, deliverAt=far + 5_000_000),
        message(4, deliverAt=0),  # zero means "not delayed"
    ]
    write_messages(folder, first[:3])
    write_messages(folder, first[3:])
    out_1 = delayed_run(spark, folder, checkpoint)
    assert sorted(r.entryId for r in out_1) == [0, 1, 4]

    write_messages(folder, [message(5), message(6, deliverAt=far + 10_000_000, partition=1)])
    out_2 = delayed_run(spark, folder, checkpoint)
    assert [r.entryId for r in out_2] == [5]

    entries, timers = held_state(spark, checkpoint)
    assert entries == [2, 3, 6]
    # Default tick: a message may go a tick (1 s) early, so timers are due at deliverAt - 1 s.
    tick_us = 1_000_000
    want = {(d - tick_us) // 1000 for d in (far, far + 5_000_000, far + 10_000_000)}
    assert set(timers) <= want and (far - tick_us) // 1000 in timers


def test_tick_versus_strict_cutoff_and_options_apply_to_held_messages(spark, tmp_path):
    folder = tmp_path / "in"
    soon = now_us() + 10 * 60_000_000  # ten minutes ahead
    write_messages(folder, [message(0, deliverAt=soon), message(1)])

    # A one-hour tick lets a message due in ten minutes go now; strict mode holds it.
    ticked = delayed_run(spark, folder, tmp_path / "tick", tick_ms=3_600_000)
    assert sorted(r.entryId for r in ticked) == [0, 1]
    strict_checkpoint = tmp_path / "strict"
    strict = delayed_run(spark, folder, strict_checkpoint, tick_ms=3_600_000, strict=True)
    assert [r.entryId for r in strict] == [1]

    # Restarted with the tick rule, the held message is due at the group's next visit.
    write_messages(folder, [message(2, deliverAt=soon + DAY_US)])
    restarted = delayed_run(spark, folder, strict_checkpoint, tick_ms=3_600_000)
    assert [r.entryId for r in restarted] == [0]
    assert held_state(spark, strict_checkpoint)[0] == [2]


def test_timer_releases_a_held_message_after_a_restart(spark, tmp_path):
    folder, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    deliver_at = now_us() + 3_000_000
    write_messages(folder, [message(0, deliverAt=deliver_at)])
    seen: list[tuple[float, list[int]]] = []
    deadline = time.monotonic() + 90
    entry = 1
    while time.monotonic() < deadline:
        out = delayed_run(spark, folder, checkpoint, strict=True)
        seen.append((time.time(), [r.entryId for r in out]))
        if 0 in seen[-1][1]:
            break
        # A message in another partition makes the next run carry data; timers fire then.
        write_messages(folder, [message(entry, partition=1)])
        entry += 1
    released = [ended for ended, ids in seen if 0 in ids]
    assert len(released) == 1, seen
    # Strict: never before deliverAt -- a run that ended before it cannot have emitted it.
    assert released[0] * 1_000_000 >= deliver_at
    assert held_state(spark, checkpoint)[0] == []
    others = sorted(i for _, ids in seen for i in ids if i)
    assert others == list(range(1, entry))


def bounded_run(df: Any, checkpoint: Path, timeout_s: float = 300) -> list[Any]:
    """Rows of a Trigger.AvailableNow run that must end by itself within ``timeout_s``."""
    rows: list[Any] = []
    query = (
        df.writeStream.foreachBatch(lambda batch, _id: rows.extend(batch.collect()))
        .trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    ended = query.awaitTermination(timeout_s)
    if not ended:
        query.stop()
    assert ended, f"still running after {timeout_s} s, {len(query.recentProgress)} batches"
    assert query.exception() is None
    return rows


def test_available_now_ends_with_no_data_batches_on_and_a_later_run_delivers(spark, tmp_path):
    """Spark's default (no-data micro-batches on): an AvailableNow run ends once its source is
    drained; what is not due yet stays held, and a later run delivers it once due."""
    assert spark.conf.get(NO_DATA_BATCHES_CONF, "true") == "true"
    folder, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    soon = now_us() + 10 * 60_000_000  # ten minutes ahead
    write_messages(folder, [message(0, deliverAt=soon), message(1), message(2, deliverAt=soon)])
    first = bounded_run(delay_until_due(source(spark, folder)), checkpoint)
    assert [r.entryId for r in first] == [1]
    assert held_state(spark, checkpoint)[0] == [0, 2]

    # The next run, once they are due (a one-hour tick makes ten minutes ahead due now).
    write_messages(folder, [message(3, deliverAt=soon + DAY_US)])
    second = bounded_run(delay_until_due(source(spark, folder), tick_ms=3_600_000), checkpoint)
    assert sorted(r.entryId for r in second) == [0, 2]
    assert held_state(spark, checkpoint)[0] == [3]


def test_options_are_checked(spark, tmp_path):
    write_messages(tmp_path / "in", [message(0)])
    df = source(spark, tmp_path / "in")
    with pytest.raises(ValueError, match="tick_ms"):
        delay_until_due(df, tick_ms=-1)
    with pytest.raises(ValueError, match="deliverAt"):
        delay_until_due(df.drop("deliverAt"))


GOLDEN_LAYOUT_1 = Path(__file__).parent / "golden" / "delay-layout1"
Y2095_MS = 3_944_678_400_000  # 2095-01-01


def test_a_layout_1_checkpoint_restores_and_releases_what_it_held(spark, tmp_path):
    """A checkpoint the layout-1 code wrote (tests/golden/make_delay_layout1.py: entries 1-4
    held, 1 and 4 due in 2090, 2 in 2100, 3 a day after 1 in partition 1) restarts with this
    code: due messages come out, the rest move into layout 2 and stay held."""
    query = relocated(GOLDEN_LAYOUT_1, tmp_path / "query")
    folder, checkpoint = query / "input", query / "checkpoint"
    write_messages(folder, [message(10), message(11, deliverAt=DAY_US * 365 * 200, partition=1)])
    # A tick reaching 2095 makes the 2090 messages due now; 2100 stays held.
    tick_ms = Y2095_MS - now_us() // 1000
    out = delayed_run(spark, folder, checkpoint, tick_ms=tick_ms)
    assert sorted(r.entryId for r in out) == [1, 3, 4, 10]
    assert held_state(spark, checkpoint)[0] == [2, 11]
    old = spark.read.format("statestore").option("stateVarName", "held").load(str(checkpoint))
    assert old.count() == 0

    write_messages(folder, [message(12)])
    again = delayed_run(spark, folder, checkpoint, tick_ms=tick_ms)
    assert [r.entryId for r in again] == [12]
    assert held_state(spark, checkpoint)[0] == [2, 11]
