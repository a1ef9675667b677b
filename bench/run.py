"""``make bench``: run every benchmark module, each in a fresh process, and print one table.

Results also go to ``bench/out/results.json``. Benchmarks are never unit tests: nothing here
asserts; the closing notes of issues quote these figures.
"""

from __future__ import annotations

import json
import os
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


def main(argv: list[str]) -> int:
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
