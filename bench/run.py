"""``make bench``: run every benchmark module, each in a fresh process, and print one table.

Results also go to ``bench/out/results.json``, and every figure that has a goal is drawn
against it in ``bench/out/results.png`` (``python -m bench.run --plot`` redraws it from the
JSON). Benchmarks are never unit tests: nothing here asserts; the closing notes of issues
quote these figures.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

MODULES = [
    "bench.bench_storage",
    "bench.bench_dispatch",
    "bench.bench_client",
    "bench.bench_source",
    "bench.bench_sink",
    "bench.bench_operators",
    "bench.bench_cli",
    "bench.bench_schema",
    "bench.bench_scale",
    "bench.bench_latency",
    "bench.bench_rollover",
    "bench.bench_commit",
    "bench.bench_iot",
    "bench.bench_iot_floor",
    "bench.bench_gateway",
]


def _run_module(mod_name: str) -> list[dict] | None:
    """Run one benchmark module in a fresh interpreter (and so a fresh JVM), so no module's
    figures depend on what ran before it; None if the module does not exist."""
    code = (
        "import json, importlib, sys\n"
        f"m = importlib.import_module({mod_name!r})\n"
        "print('BENCH-RESULT ' + json.dumps(m.run()), flush=True)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH-RESULT "):
            return list(json.loads(line[len("BENCH-RESULT ") :]))
    if f"No module named '{mod_name}'" in proc.stderr:
        return None
    sys.stderr.write(proc.stderr[-4000:])
    raise RuntimeError(f"benchmark {mod_name} failed (exit {proc.returncode})")


_GOAL = re.compile(r"\s*(<=|>=)\s*([0-9.]+)\s*(.*)")


def plot(results: list[dict], path: str) -> int:
    """Draw every result that has a goal (``">= 1.5"``, ``"<= 1.2"``) as a bar of how far it
    is from its goal, on one axis: the value over the bound for ``>=`` goals, the bound over
    the value for ``<=`` goals, so 1 is the goal and right of it is met. Returns the number
    of figures drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    for r in results:
        m = _GOAL.match(str(r.get("goal", "")))
        if not m or not r.get("value"):
            continue
        op, bound = m.group(1), float(m.group(2))
        score = r["value"] / bound if op == ">=" else bound / r["value"]
        note = f" {m.group(3)}" if m.group(3) else ""
        label = f"{r['name'][:80]}  [{r['value']:.3g} {r['unit']}, goal {op} {bound:g}{note}]"
        rows.append((label, score))
    if not rows:
        return 0
    fig, ax = plt.subplots(figsize=(13, 0.42 * len(rows) + 1.6))
    ys = range(len(rows))
    scores = [min(max(sc, 1 / 16), 16) for _, sc in rows]  # drawn within 1/16 .. 16
    colours = ["#2a9d4b" if sc >= 1 else "#d1495b" for _, sc in rows]
    # Bars start at the goal: rightwards for a goal met, leftwards for one missed.
    ax.barh(list(ys), [sc - 1 for sc in scores], left=1, color=colours)
    ax.set_xscale("log", base=2)
    ax.set_xlim(min([*scores, 1.0]) / 1.6, max([*scores, 1.0]) * 1.6)  # room for the labels
    ax.axvline(1.0, color="black", linewidth=1.2)
    ax.set_yticks(list(ys), [label for label, _ in rows], fontsize=8)
    ax.invert_yaxis()
    for y, (_, sc) in zip(ys, rows, strict=True):
        x = min(max(sc, 1 / 16), 16)
        ax.text(
            x * (1.04 if sc >= 1 else 0.96),
            y,
            f"{sc:.2f}x",
            va="center",
            fontsize=7,
            ha="left" if sc >= 1 else "right",
        )
    met = sum(sc >= 1 for _, sc in rows)
    ax.set_xlabel(
        "value / goal (for '<=' goals: goal / value); 1 = the goal, right of the line = met"
    )
    ax.set_title(f"filepulsar benchmarks against their goals: {met} of {len(rows)} met")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return len(rows)


def main(argv: list[str]) -> int:
    if argv[1:] == ["--plot"]:
        with open("bench/out/results.json") as f:
            n = plot(json.load(f), "bench/out/results.png")
        print(f"bench/out/results.png: {n} figures against their goals")
        return 0
    wanted = argv[1:] or MODULES
    results = []
    for name in wanted:
        mod_name = name if name.startswith("bench.") else f"bench.{name}"
        t0 = time.perf_counter()
        rows = _run_module(mod_name)
        if rows is None:
            print(f"-- {mod_name}: not present, skipped", flush=True)
            continue
        for r in rows:
            r["module"] = mod_name
            results.append(r)
            goal = f"  (goal {r['goal']})" if "goal" in r else ""
            print(f"{r['name']:<70} {r['value']:>9.3f} {r['unit']}{goal}", flush=True)
        print(f"-- {mod_name} took {time.perf_counter() - t0:.1f} s", flush=True)
    os.makedirs("bench/out", exist_ok=True)
    with open("bench/out/results.json", "w") as f:
        json.dump(results, f, indent=1)
    n = plot(results, "bench/out/results.png")
    print(f"-- bench/out/results.json; bench/out/results.png: {n} figures against their goals")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
