"""The publishing side of ``bench_iot`` alone: CPU per published message of gateway processes.

Issue 27's gateways each hold one producer per topic (dedup on, explicit monotonic sequence
ids, ``KeyBased`` batching) and send small keyed messages at a steady rate, so most entries
hold one or a few messages and every entry is a commit. This times exactly that, without the
applications: ``--gateways`` processes, each with a producer per topic on the same topics
(their commits meet on every topic's journal), together sending ``--rate`` 64-byte messages a
second (``send_async``, a random device's key, each message to the topic ``device % topics``)
for ``--duration`` seconds. Each process reports its CPU (``getrusage``) and the
``send_async``-to-callback latency of every message; the figures are the CPU per published
message (all gateways) and the publish latency p50/p99.

Run::

    python -m bench.bench_gateway --gateways 4 --topics 10 --rate 500 --duration 20
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

from bench.bench_iot import gateway_producers


def _cpu_s() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def role_gateway(cfg: dict[str, Any]) -> None:
    """One gateway process: a producer per topic, ``rate`` msg/s for ``duration`` s, then one
    JSON line (messages, CPU s, latencies in ms) on stdout."""
    from filepulsar import Client

    client = Client(cfg["root"])
    topics = cfg["topics"]
    g = cfg["index"]
    producers = gateway_producers(client, topics, g)  # bench_iot's gateways' own
    seqs = [p.last_sequence_id() + 1 for p in producers]
    rng = random.Random(g)
    latencies: list[float] = []
    lock = threading.Lock()
    failed = [0]
    rate, duration = cfg["rate"], cfg["duration"]
    n = int(rate * duration)
    payload = b"x" * 64
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()
    cpu0 = _cpu_s()
    start = time.perf_counter()
    for i in range(n):
        due = start + i / rate
        now = time.perf_counter()
        if due > now:
            time.sleep(due - now)
        device = rng.randrange(cfg["devices"])
        t = device % len(topics)
        seq = seqs[t]
        seqs[t] = seq + 1
        t0 = time.perf_counter()

        def callback(res: Any, _mid: Any, t0: float = t0) -> None:
            if res.value != 0:
                failed[0] += 1
            with lock:
                latencies.append((time.perf_counter() - t0) * 1000)

        producers[t].send_async(payload, callback, partition_key=str(device), sequence_id=seq)
    for p in producers:
        p.flush()
    cpu1 = _cpu_s()
    user, system = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
    for p in producers:
        p.close()
    client.close()
    sys.stdout.write(
        json.dumps(
            {
                "sent": n,
                "failed": failed[0],
                "cpu_s": user + system,
                "sys_s": system,
                "lat": latencies,
            }
        )
    )
    sys.stdout.write("\n")
    sys.stdout.flush()


def measure(
    *, gateways: int, topics: int, rate: float, duration: float, devices: int = 10_000
) -> dict[str, float]:
    """Run the gateways once; return CPU per message (ms) and publish latency p50/p99 (ms)."""
    from filepulsar.admin import Admin

    base = tempfile.mkdtemp(prefix="fp-bench-gw-")
    root = os.path.join(base, "store")
    try:
        admin = Admin(root)
        admin.namespaces().set_deduplication_status("public/default", True)
        names = [f"persistent://public/default/gw-{i}" for i in range(topics)]
        for t in names:
            admin.topics().create_non_partitioned_topic(t)
        procs = []
        for g in range(gateways):
            cfg = {
                "index": g,
                "root": root,
                "topics": names,
                "rate": rate / gateways,
                "duration": duration,
                "devices": devices,
            }
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "bench.bench_gateway", "gateway", json.dumps(cfg)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        if any(p.stdout is None or p.stdout.readline().strip() != "ready" for p in procs):
            raise RuntimeError("a gateway did not start")
        for stdin in [p.stdin for p in procs]:  # all set up: start them together
            assert stdin is not None
            stdin.write("go\n")
            stdin.flush()
        outs = []
        for p in procs:
            out, _ = p.communicate(timeout=duration * 10 + 120)
            outs.append(json.loads(out.strip().splitlines()[-1]))
        sent = sum(o["sent"] for o in outs)
        lat = np.asarray([x for o in outs for x in o["lat"]])
        return {
            "sent": sent,
            "failed": sum(o["failed"] for o in outs),
            "cpu_ms_per_msg": sum(o["cpu_s"] for o in outs) / sent * 1000,
            "sys_ms_per_msg": sum(o["sys_s"] for o in outs) / sent * 1000,
            "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)),
        }
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run() -> list[dict[str, Any]]:
    """``make bench``: 2 gateways x 10 topics at 200 msg/s for 10 s."""
    f = measure(gateways=2, topics=10, rate=200, duration=10)
    what = "gateways (2 x 10 KeyBased dedup producers, 200 msg/s of 64 B)"
    return [
        {"name": f"{what}: CPU per published message", "value": f["cpu_ms_per_msg"], "unit": "ms"},
        {"name": f"{what}: publish p50", "value": f["p50_ms"], "unit": "ms"},
        {"name": f"{what}: publish p99", "value": f["p99_ms"], "unit": "ms", "goal": "<= 50"},
    ]


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "gateway":
        role_gateway(json.loads(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(prog="python -m bench.bench_gateway", description=__doc__)
    ap.add_argument("--gateways", type=int, default=4)
    ap.add_argument("--topics", type=int, default=10)
    ap.add_argument("--rate", type=float, default=500, help="msg/s, all gateways")
    ap.add_argument("--duration", type=float, default=20, help="s")
    ap.add_argument("--devices", type=int, default=10_000)
    a = ap.parse_args()
    f = measure(
        gateways=a.gateways, topics=a.topics, rate=a.rate, duration=a.duration, devices=a.devices
    )
    la = os.getloadavg()[0]
    print(
        f"gateways {a.gateways} x topics {a.topics}, {a.rate:g} msg/s for {a.duration:g} s: "
        f"sent {f['sent']:,} (failed {f['failed']}), CPU {f['cpu_ms_per_msg']:.3f} ms/msg "
        f"(system {f['sys_ms_per_msg']:.3f}), "
        f"publish p50 {f['p50_ms']:.1f} ms p99 {f['p99_ms']:.1f} ms (load {la:.2f})"
    )


if __name__ == "__main__":
    main()
