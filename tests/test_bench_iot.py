"""``bench.bench_iot``: a small topology passes Pulsar's rule, and the applications run with
the interpreter settings asked for (``--switch-interval``, ``--gc-freeze``) and with Python's
own otherwise, as the report says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.bench_iot import Topology, report, run_topology

pytestmark = pytest.mark.procs


def _small(**settings: Any) -> Topology:
    return Topology(
        name="small",
        gateways=1,
        topics=2,
        apps=2,
        clients=2,
        devices=100,
        rate_per_s=50,
        warmup_s=0.5,
        duration_s=2,
        drain_s=20,
        **settings,
    )


def test_the_applications_run_with_the_interpreter_settings_asked_for(tmp_path: Path) -> None:
    figures = run_topology(
        _small(switch_interval_ms=20, gc_freeze=True, gc_threshold=5000), out_dir=str(tmp_path)
    )
    assert figures["passed"], report(figures)
    for app in figures["apps"]:
        assert app["switch_interval_ms"] == pytest.approx(20)
        assert app["gc_frozen"] > 0  # (everything alive once its clients subscribed)
        assert app["gc_threshold"] == 5000
    text = report(figures)
    assert (
        "applications with switch interval 20 ms and gc young threshold 5000 and gc.freeze() "
        "once subscribed" in text
    )
    assert (
        "the applications ran with: switch interval 20 ms, gc frozen, gc young threshold 5000"
        in (text)
    )
    assert (tmp_path / "iot-small.json").exists()


def test_without_settings_the_applications_run_on_pythons_own(tmp_path: Path) -> None:
    figures = run_topology(_small(), out_dir=str(tmp_path))
    assert figures["passed"], report(figures)
    own_ms = 5.0  # (Python's own: sys.setswitchinterval's default)
    for app in figures["apps"]:
        assert app["switch_interval_ms"] == pytest.approx(own_ms)
        assert app["gc_frozen"] == 0
        assert app["gc_threshold"] == 700  # (Python's own)
    text = report(figures)
    assert "applications on Python's own interpreter settings" in text
    assert (
        f"the applications ran with: switch interval {own_ms:g} ms, gc not frozen, "
        "gc young threshold 700" in text
    )


def test_a_negative_switch_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="switch_interval_ms must be >= 0"):
        _small(switch_interval_ms=-1)


def test_a_negative_gc_threshold_is_refused() -> None:
    with pytest.raises(ValueError, match="gc_threshold must be >= 0"):
        _small(gc_threshold=-1)
