"""``make bench``: run every benchmark module and print one table of figures.

Results also go to ``bench/out/results.json``. Benchmarks are never unit tests: nothing here
asserts; the closing notes of issues quote these figures.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time

MODULES = [
    "bench.bench_storage",
    "bench.bench_dispatch",
    "bench.bench_client",
    "bench.bench_source",
    "bench.bench_sink",
    "bench.bench_operators",
]


def main(argv: list[str]) -> int:
    wanted = argv[1:] or MODULES
    results = []
    for name in wanted:
        mod_name = name if name.startswith("bench.") else f"bench.{name}"
        t0 = time.perf_counter()
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            if e.name != mod_name:
                raise
            print(f"-- {mod_name}: not present, skipped", flush=True)
            continue
        rows = mod.run()
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
