"""route_retry_dlq: Pulsar's reconsumeLater copies, as a streaming (stateless) operator."""

from __future__ import annotations

import datetime

import pytest
from pyspark.sql import functions as F

from filepulsar.connector.schema import SINK_COLUMNS
from filepulsar.dispatch.redelivery import (
    MultiplierRedeliveryBackoff,
    dead_letter_topic,
    retry_goes_to_dead_letter,
    retry_letter_topic,
)
from filepulsar.dispatch.spark import route_retry_dlq, route_with_retry
from tests.test_spark_ops_support import (
    TOPIC,
    flat,
    message,
    run_available_now,
    source,
    write_messages,
)

pytestmark = pytest.mark.spark

RETRY = retry_letter_topic(TOPIC, "sub")
DLQ = dead_letter_topic(TOPIC, "sub")


def failed_where(df, entries: set[int]):
    return df.withColumn("failed", F.col("entryId").isin(*entries))


def ms(ts: datetime.datetime) -> int:
    return round(ts.timestamp() * 1000)


def test_retry_and_dead_letter_copies_across_a_restart(spark, tmp_path):
    folder, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    from_retry_topic = {
        "RECONSUMETIMES": "3",
        "REAL_TOPIC": TOPIC,
        "ORIGIN_MESSAGE_ID": "7:7:0",
        "DELAY_TIME": "5",
        "user": "kept",
    }
    write_messages(
        folder,
        [
            message(0, key="a", properties={"user": "x"}, eventTime=1_000),
            message(1, key="b"),  # not failed: acknowledged, no copy
            message(2, properties=from_retry_topic, topic=RETRY),
            message(3, properties={"RECONSUMETIMES": "16"}),
            message(4, properties={"RECONSUMETIMES": "not a number"}),
        ],
    )
    failed = {0, 2, 3, 4}

    def build():
        df = failed_where(source(spark, folder), failed)
        return route_retry_dlq(df, subscription="sub", delay_ms=30_000)

    started = datetime.datetime.now().timestamp() * 1000
    out = flat(run_available_now(build(), checkpoint))
    ended = datetime.datetime.now().timestamp() * 1000

    assert set(build().columns) <= set(SINK_COLUMNS)
    by_value = {r.value: r for r in out}
    assert sorted(by_value) == [b"payload-0", b"payload-2", b"payload-3", b"payload-4"]

    first = by_value[b"payload-0"]
    assert first.topic == RETRY
    assert first.key == "a"
    assert first.properties == {
        "user": "x",
        "REAL_TOPIC": TOPIC,
        "ORIGIN_MESSAGE_ID": "1:0:0",
        "RECONSUMETIMES": "1",
        "DELAY_TIME": "30000",
    }
    assert started + 30_000 - 1_000 <= ms(first.deliverAt) <= ended + 30_000

    again = by_value[b"payload-2"]
    assert again.topic == RETRY  # named after REAL_TOPIC, not the retry topic it came from
    assert again.properties == {**from_retry_topic, "RECONSUMETIMES": "4", "DELAY_TIME": "30000"}

    dead = by_value[b"payload-3"]
    assert retry_goes_to_dead_letter(17, 16)
    assert dead.topic == DLQ
    assert dead.properties["RECONSUMETIMES"] == "17"
    assert dead.deliverAt is None

    assert by_value[b"payload-4"].properties["RECONSUMETIMES"] == "1"

    write_messages(folder, [message(5), message(6)])
    failed.add(6)
    restarted = flat(run_available_now(build(), checkpoint))
    assert [r.value for r in restarted] == [b"payload-6"]


def test_backoff_delay_and_explicit_topics(spark, tmp_path):
    folder = tmp_path / "in"
    backoff = MultiplierRedeliveryBackoff(1_000, 60_000, 2.0)
    rows = [message(n, properties={"RECONSUMETIMES": str(n)} if n else {}) for n in range(9)]
    write_messages(folder, rows)
    df = failed_where(source(spark, folder), set(range(9)))
    routed = route_retry_dlq(
        df,
        subscription="sub",
        backoff=backoff,
        max_reconsume_times=7,
        retry_topic="persistent://public/default/my-retry",
        dead_letter_topic_name="persistent://public/default/my-dlq",
    )
    out = flat(run_available_now(routed, tmp_path / "checkpoint"))
    by_times = {int(r.properties["RECONSUMETIMES"]): r for r in out}
    assert sorted(by_times) == list(range(1, 10))
    for times, row in by_times.items():
        # The delay follows the previous count: next(0) on the first retry.
        assert row.properties["DELAY_TIME"] == str(backoff.next(times - 1))
        dead = retry_goes_to_dead_letter(times, 7)
        assert row.topic == (
            "persistent://public/default/my-dlq" if dead else "persistent://public/default/my-retry"
        )
        assert (row.deliverAt is None) == dead
    gaps = {t: ms(r.deliverAt) - ms(by_times[1].deliverAt) for t, r in by_times.items() if t <= 7}
    assert gaps == {t: backoff.next(t - 1) - backoff.next(0) for t in gaps}


def test_options_are_checked(spark, tmp_path):
    write_messages(tmp_path / "in", [message(0)])
    df = failed_where(source(spark, tmp_path / "in"), {0})
    with pytest.raises(ValueError, match="exactly one"):
        route_retry_dlq(df, subscription="s")
    with pytest.raises(ValueError, match="exactly one"):
        route_retry_dlq(df, subscription="s", delay_ms=1, backoff=MultiplierRedeliveryBackoff())
    with pytest.raises(ValueError, match="failed"):
        route_retry_dlq(df.drop("failed"), subscription="s", delay_ms=1)
    with pytest.raises(ValueError, match="subscription"):
        route_retry_dlq(df, subscription="", delay_ms=1)


def test_route_with_retry_is_route_retry_dlq_plus_the_good_rows(spark, tmp_path):
    """One projection: failed rows become exactly route_retry_dlq's copies, the others go to
    the output topic with the properties given (or their own) and no deliverAt."""
    rows = [message(n, properties={"RECONSUMETIMES": str(n)} if n % 2 else {}) for n in range(8)]
    write_messages(tmp_path / "in", rows)
    failed = {1, 2, 5}
    letters = route_retry_dlq(
        failed_where(source(spark, tmp_path / "in"), failed),
        subscription="sub",
        delay_ms=5_000,
        max_reconsume_times=3,
    )
    expected = {r.value: r for r in flat(run_available_now(letters, tmp_path / "c1"))}
    routed = route_with_retry(
        failed_where(source(spark, tmp_path / "in"), failed),
        output_topic="persistent://public/default/out",
        output_properties=F.create_map(F.lit("seen"), F.lit("yes")),
        subscription="sub",
        delay_ms=5_000,
        max_reconsume_times=3,
    )
    out = {r.value: r for r in flat(run_available_now(routed, tmp_path / "c2"))}
    assert len(out) == 8
    for value, row in out.items():
        if value in expected:
            want = expected[value]
            assert (row.topic, row.properties["RECONSUMETIMES"]) == (
                want.topic,
                want.properties["RECONSUMETIMES"],
            )
            assert (row.deliverAt is None) == (want.deliverAt is None)
        else:
            assert row.topic == "persistent://public/default/out"
            assert row.properties == {"seen": "yes"} and row.deliverAt is None
    assert set(expected) == {f"payload-{n}".encode() for n in failed}
    with pytest.raises(ValueError, match="output_topic"):
        route_with_retry(letters, output_topic="", subscription="s", delay_ms=1)
