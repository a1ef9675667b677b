"""``make demo``: the mission run end to end, and its self-check."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from filepulsar.jobs.demo import Observed, Published, _rates, checks

pytestmark = pytest.mark.spark


def _observed(**changes: object) -> Observed:
    base = {
        "per_consumer": Counter({"c1": 3, "c2": 3}),
        "output_orders": Counter({i: 1 for i in range(6)}),
        "keys_with_two_consumers": 0,
        "delayed_early": 0,
        "delayed_released": 1,
        "dlq_orders": Counter({7: 1}),
        "dlq_redeliveries": {"2"},
        "consumed_input": 8,
        "backlog": 0,
    }
    base.update(changes)
    return Observed(**base)  # type: ignore[arg-type]


def test_the_summary_check_flags_every_kind_of_mismatch() -> None:
    pub = Published(orders=8, duplicates=1, delayed={3: 0}, invalid={7})
    pub_ok = Published(orders=7, duplicates=1, delayed={3: 0}, invalid={6})
    good = _observed(output_orders=Counter({i: 1 for i in range(6)}), dlq_orders=Counter({6: 1}))
    assert [n for n, exp, got in checks(pub_ok, good, ["c1", "c2"]) if exp != got] == []
    twice = _observed(
        output_orders=Counter({**{i: 1 for i in range(5)}, 5: 2}), dlq_orders=Counter({6: 1})
    )
    bad = [n for n, exp, got in checks(pub_ok, twice, ["c1", "c2"]) if exp != got]
    assert bad == [
        "duplicates dropped",
        "orders written exactly once",
        "orders written more than once",
    ]
    assert "dead letters = invalid orders" in [
        n for n, exp, got in checks(pub, good, ["c1", "c2"]) if exp != got
    ]


def _progress(rows: int, ms: int) -> Any:
    return SimpleNamespace(
        durationMs={"triggerExecution": ms}, sources=[SimpleNamespace(numInputRows=rows)]
    )


def test_the_steady_rate_is_of_full_batches_not_of_the_tail() -> None:
    """Issue 29, defect 5: after the first batch (start-up), the rate is of the full
    micro-batches; the tail (a few retries, timers releasing delayed orders, empty batches
    of a processing-time trigger) is waiting, not throughput (it made the default demo
    report 4 orders/s)."""
    progress = [
        _progress(1000, 60_000),  # start-up
        *[_progress(1000, 500)] * 3,
        _progress(20, 3_000),  # retries
        _progress(0, 2_000),  # a timer's release
        _progress(0, 1_500),
    ]
    assert _rates(progress, 90.0, full=1000) == (60.0, 2000.0)
    assert _rates(progress[:1] + progress[4:], 90.0, full=1000) == (60.0, None)
    assert _rates([], 90.0, full=1000) == (90.0, None)


@pytest.mark.slow
@pytest.mark.spark
def test_demo_shows_the_mission_and_checks_its_summary(tmp_path: Path) -> None:
    got = subprocess.run(
        [
            sys.executable,
            "-P",
            "-m",
            "filepulsar.jobs.demo",
            "--root",
            str(tmp_path / "demo"),
            "--orders",
            "600",
            "--duplicates",
            "40",
            "--delayed",
            "12",
            "--delay-ms",
            "4000",
            "--invalid",
            "6",
            "--timeout",
            "400",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = got.stdout
    assert got.returncode == 0, out + got.stderr[-3000:]
    assert "demo OK" in out and "MISMATCH" not in out
    for row in (
        "duplicates dropped               40        40        ok",
        "dead-letter topic size           6         6         ok",
        "delayed orders released          12        12        ok",
        "orders written exactly once      594       594       ok",
    ):
        assert row in out, out
    assert "Key_Shared consumers" in out
    # Start-up and steady state apart (issue 29): the first micro-batch's seconds, then the
    # rate of the batches after it, never the whole run's orders over its time.
    assert re.search(r"start-up \(s, 1st micro-batch\)\s+\d+\.\d", out), out
    assert re.search(r"orders/s, full batches after it\s+[\d,]+\s", out), out
    # Spark's own log (issue 29, defect 7): no INFO line, no progress bar, of PySpark's
    # driver-side worker status lines only the one printed before our code loads, short.
    log = (tmp_path / "demo" / "spark.log").read_text()
    lines = log.splitlines()
    assert lines and not [line for line in lines if " INFO " in line], log[-3000:]
    assert "[Stage " not in log, log[-3000:]
    status = {line for line in lines if "TransformWithStateInPandas Python worker" in line}
    assert status <= {"Starting Streaming TransformWithStateInPandas Python worker."}, status
    assert len(lines) < 60, log


def test_a_demo_whose_spark_cannot_start_says_so_on_screen(tmp_path: Path) -> None:
    """Spark's output goes to spark.log while the demo runs; a failure there (here: no Java
    where JAVA_HOME points) must still reach the screen as one line naming the log, with the
    traceback in the log. Before, the screen stopped at "starting Spark" and the exit code
    alone said something went wrong."""
    env = {k: v for k, v in os.environ.items() if k != "SPARK_HOME"}
    env["JAVA_HOME"] = str(tmp_path / "no-java")
    root = tmp_path / "demo"
    args = ["--root", str(root), "--orders", "40", "--duplicates", "4", "--delayed", "2"]
    got = subprocess.run(
        [sys.executable, "-P", "-m", "filepulsar.jobs.demo", *args, "--invalid", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert got.returncode == 1, got.stdout + got.stderr[-3000:]
    last = got.stdout.strip().splitlines()[-1]
    assert last.startswith("demo FAILED: ") and f"(details: {root / 'spark.log'})" in last, (
        got.stdout
    )
    assert "Traceback" in (root / "spark.log").read_text()
