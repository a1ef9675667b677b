"""Command-line benchmark (issue 15): ``filepulsar produce -f`` of 1M lines and
``filepulsar consume -n`` of them, as a user runs them (a fresh process each, output to
/dev/null), on a local disk.

Peers in the same run, on the same file: ``wc -l`` (reading the lines) and ``cat`` (copying
them to /dev/null) give the I/O ceiling of the machine for this file. Figures are messages (or
lines) per second over the whole command, process start included.

Run: ``python -m bench.bench_cli`` (or ``make bench``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

N = 1_000_000
#: The goal of issue 15 for ``produce -f``.
GOAL_PRODUCE = 100_000


def _script() -> list[str]:
    exe = Path(sys.executable).with_name("filepulsar")
    return [str(exe)] if exe.exists() else [sys.executable, "-P", "-m", "filepulsar.jobs.cli"]


def _timed(cmd: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    with open(os.devnull, "wb") as devnull:
        subprocess.run(cmd, stdout=devnull, check=True, env=env)
    return time.perf_counter() - t0


def run() -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    try:
        src = work / "orders.txt"
        with open(src, "wb") as f:
            f.write(
                b"".join(
                    b'{"order": %d, "customer": "c%05d", "amount": %d.%02d}\n'
                    % (i, i % 50_000, i % 997, i % 100)
                    for i in range(N)
                )
            )
        size_mb = src.stat().st_size / 1e6
        env = {**os.environ, "FILEPULSAR_URL": str(work / "root")}
        t_wc = _timed(["wc", "-l", str(src)])
        t_cat = _timed(["cat", str(src)])
        t_produce = _timed([*_script(), "produce", "orders", "-f", str(src)], env)
        t_consume = _timed(
            [*_script(), "consume", "orders", "-s", "bench", "-p", "Earliest", "-n", str(N)], env
        )
        t_consume_json = _timed(
            [
                *_script(),
                "consume",
                "orders",
                "-s",
                "bench-json",
                "-p",
                "Earliest",
                "-n",
                str(N),
                "--output",
                "json",
            ],
            env,
        )
        label = f"{N // 1_000_000}M lines of ~{size_mb / N * 1e6:.0f} B"
        return [
            {
                "name": f"cli: filepulsar produce -f ({label}), msg/s",
                "value": N / t_produce,
                "unit": "msg/s",
                "goal": f">= {GOAL_PRODUCE}",
            },
            {
                "name": f"cli: filepulsar consume -n {N} (values), msg/s",
                "value": N / t_consume,
                "unit": "msg/s",
            },
            {
                "name": f"cli: filepulsar consume -n {N} --output json, msg/s",
                "value": N / t_consume_json,
                "unit": "msg/s",
            },
            {
                "name": "cli peer: wc -l of the same file, lines/s",
                "value": N / t_wc,
                "unit": "lines/s",
            },
            {
                "name": "cli peer: cat of the same file, lines/s",
                "value": N / t_cat,
                "unit": "lines/s",
            },
        ]
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    for row in run():
        print(f"{row['name']:<70} {row['value']:>14,.0f} {row['unit']}")
